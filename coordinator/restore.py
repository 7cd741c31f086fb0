"""Coordinated restore: every agent of a task back to one global checkpoint, or none.

1. Take the task's restore lock; raise the epoch (fencing every job of the old one); abort
   the superstep in flight (its queued jobs stay, fenced by the new epoch).
2. Pick the target: the GC asked for, else the latest committed one.
3. Prepare: for each agent, read its LC chain (Redis, else the archive), verify every link,
   rebuild its state, append its context summary, and stage it as a new LC under the new
   epoch with a vote (`cairn.coordinator.staging`: one job per agent on the workers' control
   queue, or inline).
4. Commit: one atomic write of a new GC naming the staged LCs, the target's workspace,
   inbox and statuses; it moves `latest`. If the target's own record is damaged, or an
   agent cannot be staged from it (a record damaged or missing everywhere, a state too
   large for one record), drop the staging and try the next older GC; with none left,
   the task is unrecoverable and its live state is untouched. Staging that failed in
   passing (`staging.PASSING`), or that no worker ran in time, says nothing of the
   target: the restore gives up, and the task stays `restoring` until its coordinator
   restores it again.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from dataclasses import dataclass
from typing import cast

import redis
from rq import Queue
from rq.serializers import JSONSerializer

from cairn.agents.logs import get_logger
from cairn.agents.spec import TaskRecord
from cairn.agents.team import team
from cairn.coordinator import metrics
from cairn.coordinator.archiver import ArchiveJob, acknowledge, archive
from cairn.coordinator.jobs import CONTROL_QUEUE, STAGE_JOB
from cairn.coordinator.replication import confirm
from cairn.coordinator.runs import REPLAY_UNTIL, RESTORING, RunState, TaskState, abort_in_flight
from cairn.coordinator.spec import CheckpointPolicy, read_policy
from cairn.coordinator.staging import PASSING, refusal, stage
from cairn.coordinator.tracing import restore_span
from cairn.coordinator.wakes import wake
from cairn.errors import CairnError, CorruptCheckpoint, RecordNotFound, RestoreFailed
from cairn.storage import keys
from cairn.storage.keys import SPEC_DOC
from cairn.storage.records import GCOrigin, GCStatus, GlobalCheckpoint
from cairn.storage.store import CheckpointStore

log = get_logger(__name__)
LOCK_TTL_MS = 120_000


@dataclass(frozen=True, slots=True)
class Restored:
    """The GC a task was restored to, the new GC recording it, and the new epoch."""

    restored_to: int
    number: int
    epoch: int


class Restorer:
    """Runs coordinated restores of tasks in one Redis; `workers` picks where staging runs."""

    def __init__(
        self,
        client: redis.Redis,
        store: CheckpointStore,
        *,
        workers: bool = True,
        runs: RunState | None = None,
    ) -> None:
        self.redis = client
        self.runs = runs or RunState(client, store.hot)
        self.store = store
        self.workers = workers
        self.control = Queue(CONTROL_QUEUE, connection=client, serializer=JSONSerializer)

    def restore(
        self,
        task: str,
        to: int | None = None,
        reason: str = "a person asked for it",
        wait: float = 60.0,
        origin: GCOrigin = GCOrigin.RESTORE,
    ) -> Restored:
        """Restore `task` to GC `to` (default: the latest committed) or an older sound one.

        The GC recording it says it was written by `origin` (a rollback is a restore to
        the latest committed GC) and names the GC restored to as its `source`.
        """
        token = uuid.uuid4().hex
        with restore_span(task, to, origin.value) as traced:
            self._lock(task, token, wait)
            try:
                done = self._restore(task, to, reason, wait, origin)
            finally:
                self._unlock(task, token)
            traced.restored(done.restored_to, done.number, done.epoch)
            return done

    def _restore(
        self, task: str, to: int | None, reason: str, wait: float, origin: GCOrigin
    ) -> Restored:
        record = self.store.read_doc(task, SPEC_DOC, TaskRecord)
        policy = read_policy(self.store, task)  # before anything is touched: it may be unreadable
        candidates = self._candidates(task, to)
        if not candidates:
            raise RestoreFailed(f"task {task} has no committed checkpoint {to or ''} to restore")
        # Above every epoch ever used, even when Redis lost its counter: an old job never
        # finds its epoch current again.
        seen = max(
            self.store.hot.get_epoch(task),
            self.store.epoch_floor(task),
            self._newest_epoch(task, candidates),
        )
        # Marked first, and active: a restore that fails from here on (a Redis refusing
        # writes, a full disk) leaves the task `restoring`, which a coordinator restores
        # again, ended or not, never running under an epoch it can no longer write with.
        self.runs.write(task, {"status": RESTORING})
        self.redis.sadd(keys.ACTIVE_TASKS, task)
        epoch = self.store.raise_epoch(task, seen + 1, self.runs.token())
        self._stop_superstep(task)
        listed = self.store.list_gcs(task)
        number = max(g.number for g in listed) + 1
        # The supersteps run from here up to this one redo work the restore discards.
        reached = max((g.superstep or 0 for g in listed), default=0)
        failures: list[str] = []
        for tried, target in enumerate(candidates):
            if tried:  # each try stages under an epoch of its own
                epoch = self.store.raise_epoch(task, epoch + 1, self.runs.token())
            try:
                gc = self.store.read_gc(task, target)
            except (CorruptCheckpoint, RecordNotFound) as exc:  # damaged: the next older
                failures.append(f"GC {target}: {exc}")
                continue
            attempt = gc.written(origin, target, number=number, epoch=epoch)
            try:
                refused = self._stage_all(task, record, gc, epoch, reason, wait)
            except RestoreFailed:  # given up: drop what was staged, as for a refusal
                with contextlib.suppress(redis.RedisError):  # a failing Redis: left to forget
                    self.store.abort_gc(attempt, self.runs.token())
                raise
            if refused is None:
                refused = self._promote_workspace(task, gc)
            if refused is None:
                restored = attempt
                restored.members = self.store.hot.get_votes(task, epoch, gc.superstep)
                self.store.prepare_gc(restored, self.runs.token())
                self.store.commit_gc(restored, self.runs.token())
                # Said once committed, before it is archived: the archive's acknowledgement
                # of GC `number` is this restore's, not that of a GC of the old epoch a
                # Redis that lost its data once held under the same number.
                log.info("task restored", task=task, to=target, to_epoch=gc.epoch, gc=number,
                         epoch=epoch)  # fmt: skip
                self._make_durable(task, number, policy)
                ran = {"status": TaskState.RUNNING, "superstep": 0, REPLAY_UNTIL: reached}
                self.runs.write(task, ran, forget=["reason"])
                self.redis.sadd(keys.ACTIVE_TASKS, task)
                wake(self.redis, task)  # its next superstep begins now, not at a look
                metrics.RESTORES.labels("fallback" if tried else "restored").inc()
                return Restored(target, number, epoch)
            failures.append(f"GC {target}: {refused}")
            self.store.abort_gc(attempt, self.runs.token())
            number += 1
        why = "; ".join(failures)
        self.runs.write(task, {"status": TaskState.UNRECOVERABLE, "reason": why})
        self.redis.srem(keys.ACTIVE_TASKS, task)
        metrics.RESTORES.labels("unrecoverable").inc()
        raise RestoreFailed(f"no checkpoint of task {task} could be restored: {why}")

    def _make_durable(self, task: str, number: int, policy: CheckpointPolicy) -> None:
        """Under `durability: sync`, put the restore's GC on disk before it is reported.

        As every GC of such a task: acknowledged means archived, so a Redis that loses its
        data afterwards cannot take the restore with it (nor hand its number out again).
        A failed archive (a full disk) is logged and leaves the GC in Redis, as for any GC.
        Under `replicated`, the GC is acknowledged if a replica holds it in time; if not,
        the next GC's acknowledgement covers it.
        """
        if policy.durability == "replicated":
            try:
                confirm(self.runs, self.store.hot, task, number, policy.replica_timeout)
            except redis.RedisError as exc:  # the restore is committed: only its ack waits
                log.warning("restore not acknowledged by a replica", task=task, error=str(exc))
        if policy.durability != "sync":
            return
        if archive(self.store, ArchiveJob(task, number, policy.hot_keep, policy.cold_keep)):
            acknowledge(self.runs, task, number)

    def _newest_epoch(self, task: str, candidates: list[int]) -> int:
        """The epoch of the newest candidate GC that can be read (0: none can)."""
        for number in candidates:
            with contextlib.suppress(CorruptCheckpoint, RecordNotFound):
                return self.store.read_gc(task, number).epoch
        return 0

    def _candidates(self, task: str, to: int | None) -> list[int]:
        """Committed GCs to try, newest first, starting at `to` (a damaged one among them)."""
        committed = [g.number for g in self.store.list_gcs(task) if g.status is GCStatus.COMMITTED]
        if to is not None and to not in committed:
            raise RestoreFailed(f"task {task} has no committed checkpoint {to}")
        return sorted((n for n in committed if to is None or n <= to), reverse=True)

    def _stop_superstep(self, task: str) -> None:
        """Abort the superstep in flight (its jobs are fenced by the new epoch already)."""
        abort_in_flight(self.runs, self.store, task)

    def _stage_all(
        self,
        task: str,
        record: TaskRecord,
        gc: GlobalCheckpoint,
        epoch: int,
        reason: str,
        wait: float,
    ) -> str | None:
        """Stage every agent of `gc`; None when all voted yes, else why the target is refused.

        A refusal (the target cannot be staged: see `staging.refusal`) makes the restore
        try an older GC. Staging that failed in passing, or no vote from every agent
        within `wait` s, raises `RestoreFailed` instead (see `_given_up`).
        """
        agents = team(gc, record)
        self.store.hot.begin_attempts(task, dict.fromkeys(agents, 1), gc.superstep, epoch=epoch)
        if not self.workers:
            for agent in agents:
                try:
                    stage(self.store, task, agent, gc.number, epoch, reason)
                except PASSING:
                    raise
                except Exception as exc:  # noqa: BLE001 - the target's; `refusal` logs it
                    return f"{agent}: {refusal(exc, task, agent)}"
            return None
        for agent in agents:
            self.control.enqueue_call(
                STAGE_JOB,
                args=(task, agent, gc.number, epoch, reason),
                job_id=f"cairn-restore-{task}-{epoch}-{gc.number}-{agent}",
                result_ttl=3_600,
                failure_ttl=86_400,
            )
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            votes = self.store.hot.get_votes(task, epoch, gc.superstep)
            if set(agents) <= votes.keys():
                return None
            outcomes = cast(
                dict[bytes, bytes], self.redis.hgetall(keys.outcomes(task, epoch, -gc.number))
            )
            said = {who.decode(): json.loads(raw) for who, raw in outcomes.items()}
            refused = [f"{who}: {out['no']}" for who, out in said.items() if "no" in out]
            if refused:  # a refusal outweighs a failure in passing: the target is bad
                return refused[0]
            if said:
                who, out = next(iter(said.items()))
                raise self._given_up(task, f"staging {who} failed: {out['failed']}")
            time.sleep(0.02)
        raise self._given_up(task, f"no vote from every agent within {wait:g} s")

    def _given_up(self, task: str, why: str) -> RestoreFailed:
        """End this restore for a reason that says nothing of its target: the error to raise.

        A staging job that failed or never ran is no sign of a damaged checkpoint, so no
        older one is tried: nothing committed changes, and the task stays `restoring`, which
        its coordinator restores again (to its latest committed GC) once this restore let
        go of the task's lock.
        """
        with contextlib.suppress(redis.RedisError):  # a failing Redis may refuse it: logged
            self.runs.write(task, {"reason": why})
        log.warning("restore given up; the task stays restoring", task=task, why=why)
        return RestoreFailed(f"task {task} not restored: {why}; its coordinator restores it again")

    def _promote_workspace(self, task: str, gc: GlobalCheckpoint) -> str | None:
        """Make the target's manifest and files hot (copying cold ones back); else why not.

        A file damaged or gone in both tiers refuses the target as a damaged LC does: the
        restore falls back to an older GC, every agent and file together.
        """
        try:
            manifest = self.store.read_manifest(task, gc.workspace)
            for sha in [gc.workspace, *manifest.files.values()]:
                self.store.put_blob(task, self.store.get_blob(task, sha))
        except (CorruptCheckpoint, RecordNotFound) as exc:
            return f"its workspace cannot be read: {exc}"
        return None

    def _lock(self, task: str, token: str, wait: float) -> None:
        deadline = time.monotonic() + wait
        while not self.redis.set(keys.restore_lock(task), token, nx=True, px=LOCK_TTL_MS):
            if time.monotonic() > deadline:
                raise CairnError(f"task {task} is being restored by someone else")
            time.sleep(0.02)

    def _unlock(self, task: str, token: str) -> None:
        if self.redis.get(keys.restore_lock(task)) == token.encode():
            self.redis.delete(keys.restore_lock(task))
