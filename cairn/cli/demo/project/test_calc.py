"""The project's tests: `python3 test_calc.py` exits 0 when they pass."""

import sys

from calc import add, mul

failures = []
for name, got, want in [
    ("add(2, 3)", add(2, 3), 5),
    ("add(-1, 1)", add(-1, 1), 0),
    ("mul(4, 5)", mul(4, 5), 20),
]:
    if got != want:
        failures.append(f"{name} = {got}, expected {want}")
print("\n".join(failures) or "all 3 tests passed")
sys.exit(1 if failures else 0)
