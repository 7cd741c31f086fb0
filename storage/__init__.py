"""Cairn's storage: checkpoint records, the hot Redis store and the cold disk archive.

Imports point one way: `cairn.coordinator` → `cairn.agents` → `cairn.storage`; this package
imports neither.
"""

if __name__ != "cairn.storage":  # by the root folder's own name: a second copy
    raise ImportError(f"import cairn.storage, not {__name__} (docs/design.md#code-layout)")
