"""Cairn's coordinator: supersteps, two-phase commit, coordinated restore. See issue 4."""
