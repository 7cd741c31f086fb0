"""`python -m cairn.testing.worker [REDIS_URL] [...]`: a worker whose scripted crashes kill it.

The same worker as `python -m cairn.coordinator.worker`, with the same arguments, and the
fault hook installed (`cairn.testing.faults`): a scripted turn's `crash` SIGKILLs it at
its point. The tests, the chaos suite and `cairn demo`'s workers run this one.
"""

from __future__ import annotations

import sys

from cairn.coordinator.worker import main
from cairn.testing.faults import install_fault_hook

if __name__ == "__main__":
    install_fault_hook()
    sys.exit(main())
