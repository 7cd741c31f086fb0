"""The seeded chaos suite: real processes, injected faults, and a checker of the history."""
