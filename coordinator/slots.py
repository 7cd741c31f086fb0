"""Cache slots: each worker process on a host holds its own `slot-N` directory while it lives.

Worker processes may share one cache directory (`CAIRN_CACHE_DIR`); each takes the first
free `slot-N` under it, held by an flock the kernel drops when the process dies, so two
never work in one tree and a restarted worker inherits a dead one's warm files. A
worker's metrics port follows its slot number (`coordinator.metrics.worker_port`).
"""

from __future__ import annotations

import fcntl
import itertools
import os
from functools import cache
from pathlib import Path

_HELD_SLOTS: list[int] = []  # open for the process's life: each lock is a claim


def claim_slot(root: Path) -> Path:
    """Return a directory under `root` that no other live process holds, held until exit."""
    root.mkdir(parents=True, exist_ok=True)
    for n in itertools.count():
        slot = root / f"slot-{n}"
        slot.mkdir(exist_ok=True)
        fd = os.open(slot / ".lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        _HELD_SLOTS.append(fd)
        return slot
    raise AssertionError("unreachable")


@cache
def worker_slot(root: Path) -> Path:
    """Return the process's slot under the cache directory `root`, claimed on first use."""
    return claim_slot(root)


def slot_number(slot: Path) -> int:
    """N of a `slot-N` directory."""
    return int(slot.name.removeprefix("slot-"))
