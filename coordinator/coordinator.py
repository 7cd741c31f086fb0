"""The coordinator: drives every running task superstep by superstep, on RQ workers.

Per superstep: write the GC as PREPARING, launch one step job per runnable agent, watch
their votes, retry a step whose attempt failed, timed out or whose worker died (the
heartbeat lapsed), and commit the GC in one atomic write once every vote is in; then
archive per policy. When no agent is runnable, have a worker run `verify` and judge its
verdict (`cairn.coordinator.verify`): the coordinator runs nothing a spec names. All of it
lives in Redis (the task's `run` and `steps` hashes): a coordinator that dies is replaced
by one that reads the same state and carries on, and only the holder of the lease acts.
Whatever advancing one task raises stays with that task (`cairn.coordinator.isolation`).

`Coordinator` is the loop: it holds the lease, looks at every active task once a tick,
and hands each to the part whose phase is due. The parts share one `Context` (its Redis,
store, lease and helpers, the task documents, the phase at hand) and call one another
through it:

- `Launcher` (`launcher.py`): begins a superstep, or says what else follows a GC
  (`begin`, `plan`), and launches steps as RQ jobs (`launch`).
- `Watcher` (`watcher.py`): watches a superstep's votes and failed steps (`watch`,
  `ingest`, `read_ahead`, `retry`).
- `Committer` (`committer.py`): commits it and does what follows: the next superstep,
  archiving, the verify (`commit`, `then`, `after_commit`, `archive`, `verify`).
- `Finisher` (`finisher.py`): rolls a superstep back, pauses or ends a task, and forgets
  an ended one in every part (`give_up`, `pause`, `finish`, `forget`).
- `TaskDocuments` (`documents.py`): each task's record and limits, read once.
"""

from __future__ import annotations

import threading
import time
from typing import cast

import redis
from rq import Queue
from rq.serializers import JSONSerializer

from cairn.coordinator import heap
from cairn.coordinator.archiver import Archiver
from cairn.coordinator.committer import Committer
from cairn.coordinator.context import Context, log
from cairn.coordinator.finisher import Finisher
from cairn.coordinator.isolation import PAUSE_AFTER, TaskFaults
from cairn.coordinator.jobs import STEPS_QUEUE
from cairn.coordinator.jobstate import backoff
from cairn.coordinator.launcher import Launcher
from cairn.coordinator.lease import Lease
from cairn.coordinator.numbering import restore_from_archive
from cairn.coordinator.restore import Restorer
from cairn.coordinator.runs import RESTORING, TERMINAL, Look, RunState, TaskState
from cairn.coordinator.verifier import Verifier
from cairn.coordinator.wakes import Wakes, wake
from cairn.coordinator.watcher import Watcher
from cairn.errors import CairnError, FencedWrite
from cairn.storage import keys
from cairn.storage.store import CheckpointStore

HEARTBEAT_GRACE = 3.0  # seconds a started step may go without a heartbeat
LOOK_EVERY = 1.0  # seconds between looks at every active task, woken or not
STANDBY_PAUSE = 0.2  # seconds a standby waits between its asks for the lease
WAKE_SLICE = 0.25  # seconds one wait for wakes blocks at most: how soon `stop` is obeyed
UNREACHABLE_PAUSE = 0.5  # seconds a coordinator waits after Redis did not answer
INTERRUPTED_REASON = "a restore stopped half-way"


class Coordinator:
    """Drives the tasks of one Redis; `run` loops while holding the leader lease.

    What a user calls (submit, status, pause, resume, cancel) is `cairn.coordinator.tasks.Tasks`.
    """

    def __init__(
        self,
        client: redis.Redis,
        store: CheckpointStore,
        *,
        name: str = "coordinator",
        heartbeat_grace: float = HEARTBEAT_GRACE,
        lease_ttl_ms: int = 5_000,
        restore_on_workers: bool = True,
        pause_after: float = PAUSE_AFTER,
    ) -> None:
        self.redis = client
        self.store = store
        self.heartbeat_grace = heartbeat_grace
        self.queue = Queue(STEPS_QUEUE, connection=client, serializer=JSONSerializer)
        self.lease = Lease(client, name, lease_ttl_ms)
        self.wakes = Wakes(client)
        self.runs = RunState(client, store.hot, lambda: self.lease.token)
        self.restorer = Restorer(client, store, workers=restore_on_workers, runs=self.runs)
        self.verifier = Verifier(client, self.queue, self.runs, heartbeat_grace)
        ctx = self.ctx = Context(
            client,
            store,
            self.queue,
            self.lease,
            self.runs,
            self.restorer,
            self.verifier,
            heartbeat_grace,
        )
        self.launcher = ctx.launcher = Launcher(ctx)
        self.watcher = ctx.watcher = Watcher(ctx)
        self.committer = ctx.committer = Committer(ctx)
        self.finisher = ctx.finisher = Finisher(ctx)
        self.archiver = ctx.archiver = Archiver(
            store, self.committer.archived, lambda task: wake(client, task)
        )
        self.faults = ctx.faults = TaskFaults(self.finisher.pause, pause_after)
        self.taken, self.archived, self.replication = ctx.taken, ctx.archived, ctx.replication

    def run(self, stop: threading.Event, every: float = LOOK_EVERY) -> None:
        """Drive tasks until `stop` is set, acting only while holding the leader lease.

        A task is looked at the moment it is woken (`cairn.coordinator.wakes`): a step
        voted or failed, a verify ruled, a person submitted, resumed, restored or decided.
        A step waiting out a retry's backoff is looked at when it ends (`Timers`). And
        every active task is looked at `every` seconds, for what sends no wake (a worker
        that died, a job taken and never started) and for a wake that was lost: a lost
        wake costs latency, never progress.
        """
        heap.settle()  # what it built to start is never scanned again (`cairn.coordinator.heap`)
        timers = self.ctx.timers
        due = 0.0  # when every active task is looked at next (`time.monotonic()`)
        woken: list[str] = []
        try:
            while not stop.is_set():
                try:
                    if not self.lease.acquire():
                        woken = []  # a standby leaves wakes to the leader
                        stop.wait(STANDBY_PAUSE)
                        continue
                    if time.monotonic() >= due:
                        self.tick()
                        due = time.monotonic() + every
                    elif woken := [*woken, *timers.due(time.time())]:
                        self.tick(list(dict.fromkeys(woken)))
                    # Short waits: `stop` is obeyed, and the lease renewed, within a slice.
                    timer = timers.next()
                    wait = min(
                        WAKE_SLICE,
                        self.lease.ttl_ms / 4_000,
                        due - time.monotonic(),
                        WAKE_SLICE if timer is None else timer - time.time(),
                    )
                    woken = self.wakes.wait(wait)
                except (redis.ConnectionError, redis.TimeoutError) as exc:
                    # Redis restarting or failing over: every write is fenced by the lease
                    # token, so this coordinator waits and asks again instead of exiting.
                    log.warning("Redis unreachable; trying again", error=str(exc))
                    woken = []
                    stop.wait(UNREACHABLE_PAUSE)
        finally:
            self.archiver.drain()
            self.lease.release()

    def tick(self, only: list[str] | None = None) -> None:
        """Advance every active task (or those of `only` still active) by what is due now.

        One look (two round trips) reads the tasks; each is then advanced from it.
        """
        if only is None:
            members = cast(set[bytes], self.redis.smembers(keys.ACTIVE_TASKS))
            active = sorted(t.decode() for t in members)
        else:
            active = self.wakes.active(only)
            for task in active:  # woken: whatever it waited for may have come
                self.ctx.waiting.pop(task, None)
        above = 0  # the highest task owner token above this lease's
        for task, seen in self.runs.look(active).items():
            if not self.faults.due(task):
                continue  # its advance failed a moment ago: it waits out a backoff
            self.ctx.phase = "look"
            failure = seen if isinstance(seen, Exception) else None
            if not isinstance(seen, Exception):
                try:
                    self.advance(task, seen)
                except Exception as exc:  # noqa: BLE001 - one task's trouble is that task's alone
                    failure = exc
            if failure is None:
                running = isinstance(seen, Look) and seen.run.get("status") == TaskState.RUNNING
                self.faults.succeeded(task, running)
                continue
            self.faults.failed(task, failure, self.ctx.phase)
            if isinstance(failure, FencedWrite):  # a coordinator with a newer lease owns it
                above = max(above, self._owner_above(task))
        if above:
            self.lease.outrank(above)

    def _waiting(self, task: str, latest: int | None) -> bool:
        """Whether `task` waits at GC `latest` for a person's decision, as seen lately.

        Then nothing is due until the decision wakes it; a wake that was lost is made up
        by a look `LOOK_EVERY` seconds later.
        """
        at = self.ctx.waiting.get(task)
        if at is None:
            return False
        if at[0] == latest and time.monotonic() - at[1] < LOOK_EVERY:
            return True
        del self.ctx.waiting[task]
        return False

    def _owner_above(self, task: str) -> int:
        """The task's owner token if above this coordinator's lease token, else 0."""
        try:
            owner = int(cast(bytes | None, self.redis.get(keys.owner(task))) or 0)
        except redis.RedisError:
            return 0  # asked again on the next refusal
        return owner if self.lease.token is not None and owner > self.lease.token else 0

    def advance(self, task: str, seen: Look | None = None) -> None:
        """Do what is due for one task: start a superstep, watch one, or finish.

        `seen` is the task as `RunState.look` found it this tick (claimed); without it the
        task is looked at now. Raises `FencedWrite` when a coordinator with a newer lease
        owns the task.
        """
        if seen is None:
            found = self.runs.look([task])[task]
            if isinstance(found, Exception):
                raise found
            seen = found
        status = seen.run.get("status", "")
        if status in TERMINAL or not status:
            self.redis.srem(keys.ACTIVE_TASKS, task)
            self.finisher.forget(task)  # ended by a person (`Tasks.cancel`), not by this loop
            return
        if status == RESTORING:
            self._restore_again(task, seen.latest)
            return
        if status == TaskState.PAUSED and self.replication.resume_if_replicated(
            task, seen.run, seen.latest
        ):
            status = TaskState.RUNNING
        if int(seen.run.get("superstep", "0")):
            self.watcher.watch(task, seen)
        elif status == TaskState.RUNNING and not self._waiting(task, seen.latest):
            self.launcher.begin(task)

    def _restore_again(self, task: str, latest: int | None) -> None:
        """Restore a task that a restore left `restoring` when it stopped half-way.

        A restore holds the task's restore lock while it runs; a task `restoring` without
        it lost its restorer (a process killed, a coordinator fenced mid-way), and nothing
        else would move it again. Its superstep was aborted and its epoch raised already, so
        it goes back to its latest committed GC, every agent and file together.
        """
        self.ctx.phase = "restore"
        if self.redis.exists(keys.restore_lock(task)):
            return  # the restore runs still
        failed, due = self.ctx.restore_due.get(task, (0, 0.0))
        if time.monotonic() < due:
            return
        log.warning("a restore stopped half-way; restoring the task again", task=task)
        try:
            if self.archived.behind(task, latest):
                restore_from_archive(self.restorer, task, latest)
            else:
                self.restorer.restore(task, reason=INTERRUPTED_REASON)
        except (CairnError, redis.RedisError):
            # Each try raises the epoch and leaves an aborted GC: a failure that lasts (a
            # disk, a fenced write, no worker) is tried again ever more slowly, not each tick.
            pause = backoff(failed + 1)
            self.ctx.restore_due[task] = (failed + 1, time.monotonic() + pause)
            log.info("restore tried again later", task=task, failed=failed + 1, after_s=pause)
            raise
        self.ctx.restore_due.pop(task, None)
