"""Cairn's storage: checkpoint records, the hot Redis store and the cold disk archive.

Imports point one way: `coordinator` → `agents` → `storage`; this package imports neither.
"""
