"""Golden files: stored records of each schema version, read back by tests/test_golden.py."""
