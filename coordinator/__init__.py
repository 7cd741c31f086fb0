"""Cairn's coordinator: supersteps, two-phase commit, coordinated restore, the user's side."""
