"""GC numbers are never handed out twice: what the archive holds is a floor under Redis.

A superstep's GC takes the number after Redis's latest. Redis can lose its last writes (an
AOF fsynced every second, a restart from an older RDB, a failover to a replica that
lagged) while the archive keeps every GC it was given: the ground truth once written. The
next number taken from Redis alone would then name a second, different GC N, and history
would fork under one name. So before it numbers a GC the coordinator compares Redis's
latest with the newest archived GC, and when the archive is ahead it does what Flink does
when its job restarts: it resumes from the latest completed checkpoint in durable
storage. The task is restored to the newest archived GC, under a new number above it and
a new epoch (fencing every job of the lost timeline), with a warning in the log and a
reason in each agent's context summary. Nothing committed is lost twice, and nothing
forks silently; were the archived GC unusable, the restore falls back as any restore does.

The newest archived number is read from disk when a coordinator first meets a task and
again every `ARCHIVE_RECHECK` seconds, and raised when this coordinator archives a GC:
no superstep pays for a disk read. (A GC archived by another process in between is still
never replaced: `archive_gc` refuses another GC under an archived number.)
"""

from __future__ import annotations

import threading
import time

from cairn.agents.logs import get_logger
from cairn.coordinator.restore import Restored, Restorer
from cairn.coordinator.runs import abort_in_flight
from cairn.storage.records import GCStatus
from cairn.storage.store import CheckpointStore

log = get_logger(__name__)
ARCHIVE_RECHECK = 30.0  # seconds between looks at a task's newest archived GC
LOST_REASON = "the live store lost checkpoints the archive holds"


class ArchiveFloor:
    """What a coordinator knows of each task's newest archived GC number."""

    def __init__(self, store: CheckpointStore, recheck: float = ARCHIVE_RECHECK) -> None:
        self.store = store
        self.recheck = recheck
        self._newest: dict[str, tuple[int, float]] = {}  # task → (number, when read)
        self._lock = threading.Lock()  # the archiver's thread notes what it archived

    def newest(self, task: str) -> int:
        """The newest archived GC number of `task` (-1: none), from disk once in a while."""
        now = time.monotonic()
        with self._lock:
            known = self._newest.get(task)
        if known is not None and now - known[1] < self.recheck:
            return known[0]
        numbers = self.store.cold.list_gcs(task)
        read = numbers[-1] if numbers else -1
        with self._lock:  # a GC noted while the disk was read stays noted
            noted = self._newest.get(task, (-1, 0.0))[0]
            self._newest[task] = (max(read, noted), now)
        return max(read, noted)

    def note(self, task: str, number: int) -> None:
        """Remember that GC `number` of `task` is archived."""
        with self._lock:
            known, when = self._newest.get(task, (-1, 0.0))
            self._newest[task] = (max(known, number), when)

    def behind(self, task: str, latest: int | None) -> bool:
        """True when Redis's latest committed GC is older than the newest archived one."""
        return (-1 if latest is None else latest) < self.newest(task)

    def forget(self, task: str) -> None:
        """Drop what is known of a task that ended."""
        with self._lock:
            self._newest.pop(task, None)


def restore_from_archive(restorer: Restorer, task: str, latest: int | None) -> Restored:
    """Restore `task`, whose Redis lost GCs the archive holds, to the newest archived GC.

    The lost timeline's jobs are fenced (a new epoch) and its superstep aborted first;
    then Redis's undecided GC records of numbers the archive decided are dropped, so they
    cannot hide the archived ones; then a coordinated restore picks the newest committed
    GC, which is the archive's, and commits it under a number above every one in use.
    """
    store, runs = restorer.store, restorer.runs
    on_disk = store.cold.list_gcs(task)
    log.warning(
        "Redis is behind the archive; restoring the task from it",
        task=task,
        redis_latest=latest,
        archived=on_disk[-1] if on_disk else None,
    )
    seen = max(store.hot.get_epoch(task), store.epoch_floor(task))
    store.raise_epoch(task, seen + 1, runs.token())
    abort_in_flight(runs, store, task)
    archived = set(on_disk)
    for info in store.hot.list_gcs(task):
        if info.number in archived and info.status is not GCStatus.COMMITTED:
            store.hot.delete_gc(task, info.number)
    return restorer.restore(task, reason=LOST_REASON)
