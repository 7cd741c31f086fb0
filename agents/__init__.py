"""Cairn's agents runtime: the step a worker runs (models, tools, workspace)."""

if __name__ != "cairn.agents":  # by the root folder's own name: a second copy
    raise ImportError(f"import cairn.agents, not {__name__} (docs/design.md#code-layout)")
