"""Cache slots: each worker process on a host holds its own `slot-N` directory while it lives.

Worker processes may share one cache directory (`CAIRN_CACHE_DIR`); each takes the first
free `slot-N` under it, held by an flock the kernel drops when the process dies, so two
never work in one tree and a restarted worker inherits a dead one's warm files. A
worker's metrics port follows its slot number (`cairn.coordinator.metrics.worker_port`).

Inside its slot a process gives each step it runs a lane, `slot-N/lane-K`, of its own
for the step's duration (`Lanes`): steps running at once in one process never share a
tree, and the slot's flock covers every lane, so no other process works in them either.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
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


_CLAIMING = threading.Lock()


def worker_slot(root: Path) -> Path:
    """Return the process's slot under the cache directory `root`, claimed on first use."""
    with _CLAIMING:  # steps of one process start on several threads at once
        return _worker_slot(root)


@cache
def _worker_slot(root: Path) -> Path:
    return claim_slot(root)


def slot_number(slot: Path) -> int:
    """N of a `slot-N` directory."""
    return int(slot.name.removeprefix("slot-"))


class Lanes:
    """The lanes of a slot: `lane-K` directories handed to one step at a time.

    `lease` gives the lowest free lane (so one step at a time always runs in `lane-0`,
    warm) and makes a new one only when every lane is in use.
    """

    def __init__(self, slot: Path) -> None:
        self.slot = slot
        self._guard = threading.Lock()
        self._free: list[int] = []
        self._made = 0

    @contextmanager
    def lease(self) -> Iterator[Path]:
        """Hold a lane no other step of this process holds, for the `with` block."""
        with self._guard:
            if self._free:
                self._free.sort()
                n = self._free.pop(0)
            else:
                n, self._made = self._made, self._made + 1
        lane = self.slot / f"lane-{n}"
        lane.mkdir(exist_ok=True)
        try:
            yield lane
        finally:
            with self._guard:
                self._free.append(n)
