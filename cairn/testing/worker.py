"""`python -m cairn.testing.worker [REDIS_URL] [...]`: a worker whose scripted crashes kill it.

The same worker as `python -m cairn.coordinator.worker`, with the same arguments, and the
fault hook installed (`cairn.testing.faults`): a scripted turn's `crash` SIGKILLs it at
its point; with `--kill-after-compaction PATH`, so does the compaction's point while
PATH exists (the first worker there removes it). The tests, the chaos suite and
`cairn demo`'s workers run this one.
"""

from __future__ import annotations

import sys
from pathlib import Path

from cairn.coordinator.worker import main
from cairn.testing.faults import KILL_AFTER_COMPACTION, install_fault_hook


def split_options(argv: list[str]) -> tuple[Path | None, list[str]]:
    """Split off `--kill-after-compaction PATH`: its path (or None), and the arguments left."""
    if KILL_AFTER_COMPACTION not in argv:
        return None, argv
    at = argv.index(KILL_AFTER_COMPACTION)
    if at + 1 >= len(argv):
        raise SystemExit(f"{KILL_AFTER_COMPACTION} needs a path")
    return Path(argv[at + 1]), argv[:at] + argv[at + 2 :]


if __name__ == "__main__":
    flag, rest = split_options(sys.argv[1:])
    install_fault_hook(flag)
    sys.exit(main(rest))
