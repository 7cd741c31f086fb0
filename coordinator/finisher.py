"""A task's end, and the ways short of one: a superstep given up, a task paused.

A superstep that cannot go on rolls the task back to its latest committed GC, a few
times at most; a task ends with its last GC on disk and what the coordinator kept of it
dropped; a task whose advance keeps failing is paused (`TaskFaults` decides when).
"""

from __future__ import annotations

import time
from typing import cast

from cairn.coordinator import metrics, tracing
from cairn.coordinator.archiver import ArchiveJob
from cairn.coordinator.context import Context, log
from cairn.coordinator.runs import RESTORING, TERMINAL, TaskState, abort_in_flight
from cairn.errors import CommitRefused, RestoreFailed
from cairn.storage import keys
from cairn.storage.records import GCOrigin, GlobalCheckpoint

MAX_ROLLBACKS = 3
# Why a task failed without a rollback, for each reason a rollback cannot help.
SAME_REQUEST = "not rolled back: the same request would be sent again"
SAME_WORKERS = "not rolled back: a configuration the workers cannot run fails the same way again"
ARCHIVE_POLL = 0.01  # seconds between looks at whether an ending task's archive is done


class Finisher:
    """Rolls supersteps back, pauses and ends tasks, and forgets the tasks that ended."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def give_up(
        self,
        task: str,
        run: dict[str, str],
        reason: str,
        *,
        rollback: bool = True,
        unhelped: str = SAME_REQUEST,
    ) -> None:
        """Abort the superstep and roll the task back to its latest committed GC.

        After `MAX_ROLLBACKS` rollbacks the task fails instead: a step that fails the same
        way from the same state would fail again. Without `rollback` it fails at once,
        `unhelped` saying why a rollback would not help: a model call whose request was
        refused would, from that GC, send it again unchanged (`SAME_REQUEST`); a worker
        that lacks what the agent names would lack it again (`SAME_WORKERS`).
        """
        ctx = self.ctx
        ctx.phase = "rollback"
        rollbacks = int(run.get("rollbacks", "0"))
        metrics.GC_ABORTS.inc()
        if rollbacks >= MAX_ROLLBACKS or not rollback:
            ctx.store.raise_epoch(task, int(run["epoch"]) + 1, ctx.lease.token)
            abort_in_flight(ctx.runs, ctx.store, task)
            why = f"{rollbacks} rollbacks did not help" if rollback else unhelped
            self.finish(task, TaskState.FAILED, f"{reason}; {why}")
            return
        ctx.runs.write(task, {"rollbacks": rollbacks + 1})
        log.info("superstep aborted; rolling back", task=task, reason=reason)
        try:
            ctx.restorer.restore(
                task, reason=f"superstep aborted: {reason}", origin=GCOrigin.ROLLBACK
            )
        except RestoreFailed as exc:
            log.warning("rollback failed", task=task, error=str(exc))

    def finish(
        self,
        task: str,
        status: TaskState,
        reason: str,
        gc: GlobalCheckpoint | None = None,
        *,
        again: bool = False,
    ) -> None:
        """End the task; when the end stands on `gc`, only where `gc` is the latest GC.

        A coordinator may commit `gc` on a primary the Sentinels replaced and move to the
        new one before it ends the task (a split): there `gc` was never committed, and an
        end written would leave the task `succeeded` short of its last superstep. The end
        is refused instead, and the task goes on from what the new primary holds.

        The end waits for the task's last GC to be archived. With `again` (an end that the
        next look at the task decides again, from what Redis holds) the task is left as it
        is until then, and the loop goes on with the other tasks; without it (an end
        decided from what happened now: a step given up), the loop waits here.
        """
        ctx = self.ctx
        ctx.phase = "finish"
        # A task that ended has every GC it committed on disk, whatever `archive_every` says.
        # Its archive runs on the archiver's thread; until it is done the task is left as
        # it is, and the look after the archiver's wake decides the same end again.
        latest = ctx.store.hot.latest_gc(task) if gc is None else gc.number
        if latest is not None:
            policy = ctx.docs.limits(task).checkpoints
            job = ArchiveJob(task, latest, policy.hot_keep, policy.cold_keep)
            while not ctx.archiver.last(job):
                if again:
                    return
                time.sleep(ARCHIVE_POLL)
        self.forget(task)
        standing_on = None if gc is None else gc.number
        try:
            ctx.runs.write(task, {"status": status, "reason": reason}, standing_on=standing_on)
        except CommitRefused as exc:
            log.warning(
                "task not ended: its last GC is not the latest here",
                task=task,
                gc=latest,
                why=str(exc),
            )
            return
        ctx.redis.srem(keys.ACTIVE_TASKS, task)
        log.info("task ended", task=task, status=status.value, reason=reason)
        tracing.task_ended(ctx.redis, task, status.value, ok=status is TaskState.SUCCEEDED)

    def pause(self, task: str, reason: str) -> bool:
        """Pause `task` with `reason` (`TaskFaults`'s way); False if it was not running.

        Never one that is `restoring`: paused, then resumed, it would run on from a
        restore that stopped half-way, which only that status says must be done again.
        """
        ctx = self.ctx
        status = cast(bytes | None, ctx.redis.hget(keys.run(task), "status"))
        if status is None or status.decode() in (TaskState.PAUSED, RESTORING, *TERMINAL):
            return False
        ctx.runs.write(task, {"status": TaskState.PAUSED, "reason": reason})
        return True

    def forget(self, task: str) -> None:
        """Drop what this coordinator kept of a task that ended, in every part."""
        ctx = self.ctx
        ctx.docs.forget(task)
        ctx.watcher.forget(task)
        ctx.committer.forget(task)
        ctx.restore_due.pop(task, None)
        ctx.waiting.pop(task, None)
        ctx.timers.forget(task)
        ctx.taken.forget(task)
        ctx.verifier.forget(task)
        ctx.faults.forget(task)
        ctx.archived.forget(task)
        ctx.archiver.forget(task)
        ctx.replication.forget(task)
