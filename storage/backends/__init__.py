"""Storage backends: Redis and disk for real use, in-memory twins for fast unit tests."""
