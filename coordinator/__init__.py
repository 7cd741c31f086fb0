"""Cairn's coordinator: supersteps, two-phase commit, coordinated restore, the user's side."""

if __name__ != "cairn.coordinator":  # by the root folder's own name: a second copy
    raise ImportError(f"import cairn.coordinator, not {__name__} (docs/design.md#code-layout)")
