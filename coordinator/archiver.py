"""Archiving off the coordinator's loop: committed GCs go to disk in a thread of their own.

Writing a GC's LCs and blobs to disk and fsyncing them takes hundreds of milliseconds for
a large team; done inline it would hold every task's next superstep. The archiver takes
GCs in commit order, one at a time (so `archive_gc` and the trims of one task never run
concurrently), and acknowledges each in the task's run state (`archived`). It holds
nothing that is not in Redis: a GC it had not reached when its coordinator died stays
hot (`trim_hot` drops only archived GCs) and goes to disk with the next one archived.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from cairn.agents.logs import get_logger
from cairn.coordinator.runs import RunState
from cairn.errors import CairnError, FencedWrite
from cairn.storage.archive import archive_gc, trim_cold, trim_hot
from cairn.storage.records import GCStatus
from cairn.storage.store import CheckpointStore

log = get_logger(__name__)

# Seconds between two archives of one task. A GC committed sooner waits, and the next
# archive takes it along with the newest (`archive` takes every older GC still in Redis):
# a task committing a GC every few milliseconds is archived and trimmed twice a second,
# not at every GC, which took a third of the coordinator's CPU on the loop's heels.
PACE = 0.5


@dataclass(frozen=True, slots=True)
class ArchiveJob:
    """Archive GC `number` of `task`, then trim both tiers to the task's policy."""

    task: str
    number: int
    hot_keep: int
    cold_keep: int


def archive(store: CheckpointStore, job: ArchiveJob) -> bool:
    """Archive GC `job.number` and every older committed GC still only in Redis, then trim.

    False (logged, nothing damaged) when it failed. Taking the older ones too is what lets
    `archive_every` batch GCs, and a successor finish what a dead coordinator's archiver
    had not reached.
    """
    try:
        on_disk = set(store.cold.list_gcs(job.task))
        for info in store.hot.list_gcs(job.task):
            older = info.number < job.number and info.number not in on_disk
            if older and info.status is GCStatus.COMMITTED:
                archive_gc(store, job.task, info.number)
        archive_gc(store, job.task, job.number)
        trim_hot(store, job.task, job.hot_keep)
        # Trimming the archive re-reads the links of every kept chain (~0.4 s of CPU for
        # 64 agents at cold_keep=50): let a few GCs beyond cold_keep gather, then trim.
        if len(store.cold.list_gcs(job.task)) > job.cold_keep + cold_slack(job.cold_keep):
            trim_cold(store, job.task, job.cold_keep)
    except (CairnError, redis.RedisError) as exc:  # a full disk, a Redis gone: tried again later
        log.warning(
            "archiving failed; the GC stays in Redis", task=job.task, gc=job.number, error=str(exc)
        )
        return False
    return True


def acknowledge(runs: RunState, task: str, number: int) -> None:
    """Say GC `number` and every older one are on disk: in the run state, and in the log."""
    runs.write(task, {"archived": number})
    log.info("checkpoints archived", task=task, through=number)


def cold_slack(cold_keep: int) -> int:
    """How many GCs beyond `cold_keep` the archive may hold before it is trimmed (10%)."""
    return max(1, cold_keep // 10)


class Archiver:
    """One thread that archives the GCs it is given, in order; `acknowledge` is told of each.

    A task is archived at most once every `pace` seconds: what it committed meanwhile
    waits, and goes with its newest GC. A task's last GC before its end (`last`) and
    everything queued before a `drain` go at once. `reached` is told of each task whose
    last GC the thread has dealt with, archived or failed: the coordinator ends it then.
    """

    def __init__(
        self,
        store: CheckpointStore,
        acknowledge: Callable[[str, int], None],
        reached: Callable[[str], None] = lambda task: None,
        pace: float = PACE,
    ) -> None:
        self.store = store
        self.acknowledge = acknowledge
        self.reached = reached
        self.pace = pace
        # The thread's own: the newest GC waiting of each task, when it goes, and when
        # each task was last archived (kept for `pace` seconds).
        self._waiting: dict[str, tuple[ArchiveJob, float]] = {}
        self._archived_at: dict[str, float] = {}
        # Jobs, and events the thread sets when it reaches them (see `drain`).
        self._queue: queue.Queue[ArchiveJob | threading.Event] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        # task → (the GC its end waits for, when first asked: monotonic, reached yet)
        self._last: dict[str, tuple[int, float, bool]] = {}

    def submit(self, job: ArchiveJob) -> None:
        """Queue a GC for archiving."""
        self._put(job)

    def last(self, job: ArchiveJob, timeout: float = 60.0) -> bool:
        """Whether the task of `job`, about to end, may end now: its last GC's archive is done.

        The first call queues `job`; True once the thread has dealt with it (archived, or
        failed and left in Redis, as any archive may), or after `timeout` seconds of
        waiting, said in the log. Until then False, and the caller ends the task at a
        later look: the tasks ending at once never wait for one another's archives, nor
        the other tasks for theirs.
        """
        with self._lock:
            number, since, done = self._last.get(job.task, (-1, 0.0, False))
            if number != job.number:
                self._last[job.task] = (job.number, time.monotonic(), False)
                queued = True
            else:
                queued = False
        if queued:
            self._put(job)
            return False
        if done:
            return True
        if time.monotonic() - since > timeout:
            log.warning("archiving still running at the task's end", task=job.task)
            return True
        return False

    def forget(self, task: str) -> None:
        """Drop what was kept of a task that ended."""
        with self._lock:
            self._last.pop(task, None)

    def drain(self, timeout: float = 60.0) -> bool:
        """Wait until every GC queued so far is archived (or failed); False on timeout."""
        reached = threading.Event()
        self._put(reached)
        return reached.wait(timeout)

    def _put(self, item: ArchiveJob | threading.Event) -> None:
        with self._lock:  # start the thread on first use, or again if it ever died
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._work, name="archiver", daemon=True)
                self._thread.start()
        self._queue.put(item)

    def _work(self) -> None:
        while True:
            items = self._take()
            now = time.monotonic()
            for item in items:
                if isinstance(item, ArchiveJob):
                    self._hold(item, now)
            drained = any(isinstance(item, threading.Event) for item in items)
            for task, (job, due) in list(self._waiting.items()):
                if drained or due <= now:
                    del self._waiting[task]
                    self._archive(job)
            for item in items:
                if isinstance(item, threading.Event):
                    item.set()

    def _take(self) -> list[ArchiveJob | threading.Event]:
        """Every item queued, waiting at most until the first GC held back is due."""
        now = time.monotonic()
        self._archived_at = {t: at for t, at in self._archived_at.items() if now - at < self.pace}
        due = min((at for _, at in self._waiting.values()), default=None)
        try:
            items = [self._queue.get(timeout=None if due is None else max(due - now, 0.0))]
        except queue.Empty:
            return []
        with contextlib.suppress(queue.Empty):
            while True:
                items.append(self._queue.get_nowait())
        return items

    def _hold(self, job: ArchiveJob, now: float) -> None:
        """Keep `job` as its task's newest GC waiting; due at once if a task's end waits."""
        with self._lock:
            ending = self._last.get(job.task, (-1, 0.0, False))[0] == job.number
        due = now if ending else self._archived_at.get(job.task, -self.pace) + self.pace
        held, at = self._waiting.get(job.task, (job, due))
        newest = job if job.number >= held.number else held
        self._waiting[job.task] = (newest, min(at, due))

    def _archive(self, job: ArchiveJob) -> None:
        """Archive `job` (and the task's older GCs), acknowledge it, tell an end waiting."""
        if archive(self.store, job):
            try:
                self.acknowledge(job.task, job.number)
            except FencedWrite:  # a newer coordinator owns the task and archives on
                log.info("archive not acknowledged: another owns the task", task=job.task)
            except Exception as exc:  # noqa: BLE001 - the thread must outlive a bad Redis
                log.warning("archive not acknowledged", task=job.task, error=str(exc))
        self._archived_at[job.task] = time.monotonic()
        self._reached(job)

    def _reached(self, job: ArchiveJob) -> None:
        """Note the job done if a task's end waits for it (or an older GC), and say so."""
        with self._lock:
            number, since, _ = self._last.get(job.task, (-1, 0.0, False))
            if number == -1 or number > job.number:
                return
            self._last[job.task] = (number, since, True)
        try:
            self.reached(job.task)
        except Exception as exc:  # noqa: BLE001 - the thread must outlive a bad Redis
            log.warning("task's end not announced", task=job.task, error=str(exc))
