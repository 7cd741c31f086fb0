"""Cairn's test suite: every guarantee on a real redis-server and a real disk."""
