"""Cairn's agents runtime: the step a worker runs (models, tools, workspace)."""
