"""Cairn's benchmarks, run by `make bench` (`python -m bench [part ...]`).

Each part is a module with a `run()` that prints its tables and returns its targets;
`bench.__main__` runs the parts and prints one summary. Benchmarks measure and compare
within one run: they never fail on a timing, they report "met" or "NOT met".
"""
