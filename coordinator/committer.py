"""The commit of a superstep and what follows it: the next superstep, archiving, the verify.

Once every step of a superstep voted, the barrier builds its GC from the votes and commits
it in one atomic write. Under `durability: async` the same write begins the next superstep
when it is due now (`Committer.then`); otherwise the superstep is closed and the next
begins after it, once the GC is on disk (`sync`) or on a replica (`replicated`). When no
agent is runnable, the task's verify command is judged, run on a worker (`Verifier`).
"""

from __future__ import annotations

import time

import redis

from cairn.agents.barrier import SYSTEM_SENDER, build_gc
from cairn.agents.joining import join
from cairn.coordinator import metrics, tracing
from cairn.coordinator.archiver import ArchiveJob, acknowledge, archive
from cairn.coordinator.context import Context, log
from cairn.coordinator.plan import Barrier
from cairn.coordinator.runs import REPLAY_UNTIL, Look, TaskState
from cairn.coordinator.spec import Limits
from cairn.coordinator.spend import RAISED_BUDGETS, budget_of, parse_spend
from cairn.coordinator.verifier import GaveUp
from cairn.coordinator.verify import FIELD as VERIFY_FIELD
from cairn.errors import CairnError, CommitRefused, CorruptCheckpoint, RecordNotFound
from cairn.storage import keys
from cairn.storage.ids import new_id
from cairn.storage.records import GlobalCheckpoint, InboxMessage, LCRef, Usage

# Seconds a look's status and budget are trusted for beginning the next superstep with a
# commit: the look and the commit of a task are milliseconds apart, unless other tasks of
# the same tick took long (an inline archive, a rollback).
FRESH_LOOK = 0.1


class Committer:
    """Commits each task's supersteps; begins, archives or verifies what follows."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        # task → (epoch, superstep) whose commit was refused once: a second refusal rolls back
        self._refused: dict[str, tuple[int, int]] = {}

    def commit(self, task: str, superstep: int, seen: Look, votes: dict[str, LCRef]) -> None:
        """Build the superstep's GC and commit it; begin the next superstep.

        In the commit's own write when it is due now and nothing must come between (see
        `then`), else after it, as a superstep begins after a restore. A refused commit
        is tried once more at the next tick (what the barrier stored itself, the merged
        manifest, may have gone to a primary replaced since); refused again, the
        superstep rolls back.
        """
        ctx = self.ctx
        ctx.phase = "commit"
        run = seen.run
        # The look's latest GC (read moments ago under this coordinator's claim), not a
        # round trip to read the number again: either is a snapshot, and the commit is
        # fenced by the epoch, which whatever moves the latest in flight (a restore) raises.
        gc = (
            ctx.store.latest_gc(task)
            if seen.latest is None
            else ctx.store.read_gc(task, seen.latest)
        )
        assert gc is not None
        order = ctx.docs.team(task, gc)
        epoch = int(run["epoch"])
        try:
            barrier = build_gc(
                ctx.store,
                gc,
                votes,
                order,
                number=int(run["number"]),
                superstep=superstep,
                epoch=epoch,
                outputs=ctx.watcher.read_ahead(task, epoch, superstep, votes),
            )
        except (RecordNotFound, CorruptCheckpoint) as exc:  # a vote whose LC Redis lost
            ctx.finisher.give_up(task, run, f"superstep {superstep} cannot be committed: {exc}")
            return
        # Members the steps spawned: their first LCs are written, and the GC names them.
        barrier = join(ctx.store, barrier, ctx.docs.record(task))
        agents = self.then(task, barrier.gc, seen)
        prepared = None
        try:
            if agents:
                committed, prepared = ctx.store.commit_and_begin(
                    barrier.gc, dict.fromkeys(agents, 1), ctx.lease.token
                )
            else:
                committed = ctx.store.commit_gc(barrier.gc, ctx.lease.token)
        except CommitRefused as exc:
            if (ctx.store.hot.latest_gc(task) or -1) < barrier.gc.number:
                # What it names is gone or not what was voted (Redis lost it: a failover,
                # a FLUSHALL): as a step that failed, the superstep rolls back.
                if self._refused.get(task) != (epoch, superstep):
                    self._refused[task] = (epoch, superstep)
                    log.info(
                        "commit refused; tried again", task=task, superstep=superstep, why=str(exc)
                    )
                    return
                why = f"superstep {superstep} cannot be committed: {exc}"
                ctx.finisher.give_up(task, run, why)
                return
            committed = ctx.store.read_gc(task, barrier.gc.number)  # another did it first
        self._refused.pop(task, None)
        metrics.GC_COMMITS.inc()
        tracing.superstep_committed(task, committed.epoch, superstep, committed.number)
        log.info(
            "superstep committed",
            task=task,
            superstep=superstep,
            gc=committed.number,
            epoch=committed.epoch,
            conflicts=len(barrier.conflicts),
            spawns=len(barrier.spawns),
        )
        if prepared is None:
            self.after_commit(task, committed)
            return
        limits = ctx.docs.limits(task)
        attempts = dict.fromkeys(agents, 1)
        replayed = prepared.superstep <= int(run.get(REPLAY_UNTIL, 0))
        ctx.launcher.launch(task, attempts, prepared.superstep, epoch, limits, prepared,
                            fenced=True, replayed=replayed)  # fmt: skip
        self.archive(task, committed)

    def then(self, task: str, gc: GlobalCheckpoint, seen: Look) -> list[str]:
        """The agents of the superstep after `gc` if its commit may begin it; else [].

        Only under `durability: async`, where nothing waits between a commit and the next
        superstep (`sync` waits for the disk, `replicated` for a replica), and only while
        the run is `running`. Its status and budget are the look's when the look is at
        most `FRESH_LOOK` old, else read again: a pause or budget set before that is
        obeyed by this superstep's commit, one set later by the next barrier, as one set
        between a barrier's read and its begin. A budget is judged on the spend read now:
        every step of the superstep counted its spend before it voted. The epoch needs no
        look: the commit is refused unless it is still `gc`'s, and the next superstep
        begins in it.
        """
        ctx = self.ctx
        limits = ctx.docs.limits(task)
        if limits.checkpoints.durability != "async":
            return []
        run, spent = seen.run, dict[str, Usage]()
        try:
            if time.monotonic() - seen.taken > FRESH_LOOK:  # other tasks of the tick first
                run = ctx.runs.read(task)
            if run.get("status") != TaskState.RUNNING.value:
                return []
            budget = run["budget"].encode() if "budget" in run else None
            raised: dict[str, str] = {}
            if budget_of(budget, limits) is not None or self._budgeted(task, gc, run):
                pipe = ctx.redis.pipeline(transaction=False)
                pipe.hgetall(keys.spend(task))
                pipe.hgetall(keys.member_budgets(task))
                spend, kept = pipe.execute()
                spent = parse_spend(spend)[0]
                raised = {k.decode(): v.decode() for k, v in kept.items()}
            barrier = Barrier(True, gc.epoch, False, budget, spent, raised)
            return list(ctx.launcher.plan(task, gc, barrier).agents)
        except (CairnError, redis.RedisError) as exc:  # a state unread: the commit goes alone
            log.info("next superstep not begun with the commit", task=task, why=str(exc))
            return []

    def _budgeted(self, task: str, gc: GlobalCheckpoint, run: dict[str, str]) -> bool:
        """Whether a member of `gc` may have a budget: its spec gives one, or one was raised.

        A raised one is marked in the run state the caller holds: no round trip to learn it.
        """
        if RAISED_BUDGETS in run or gc.spawned:
            return True
        return any(spec.budget is not None for spec in self.ctx.docs.record(task).agents)

    def after_commit(self, task: str, committed: GlobalCheckpoint) -> None:
        """Close the superstep whose GC is committed and start the next one at once.

        Forget its steps, archive per policy, and, if the task is still running (a person
        may have paused or cancelled it meanwhile) and, under `durability: replicated`, a
        replica holds `committed`, begin the next superstep from it rather than a tick later.
        """
        ctx = self.ctx
        ctx.phase = "after commit"
        ctx.runs.write(task, {"superstep": 0}, clear_steps=True)
        self.archive(task, committed)
        policy = ctx.docs.limits(task).checkpoints
        if ctx.replication.after_commit(task, committed.number, policy):
            ctx.launcher.begin(task, committed)  # which does nothing unless still running

    def archive(self, task: str, gc: GlobalCheckpoint) -> None:
        """Archive per policy: inline under `durability: sync`, else on the archiver's thread.

        Under `sync` a GC counts as committed for the user only once it is on disk, so the
        next superstep waits for it; under `async` (every `archive_every` GCs) it does not.
        """
        ctx = self.ctx
        ctx.phase = "archive"
        policy = ctx.docs.limits(task).checkpoints
        job = ArchiveJob(task, gc.number, policy.hot_keep, policy.cold_keep)
        if policy.durability == "sync":
            if archive(ctx.store, job):
                self.archived(task, gc.number)
        elif gc.number % policy.archive_every == 0:
            ctx.archiver.submit(job)

    def archived(self, task: str, number: int) -> None:
        """Note that GC `number` of `task` is on disk (the archiver's thread calls it too)."""
        self.ctx.archived.note(task, number)
        acknowledge(self.ctx.runs, task, number)

    def verify(
        self, task: str, gc: GlobalCheckpoint, order: list[str], limits: Limits, epoch: int
    ) -> None:
        """Judge `gc`'s files by the task's verify command, run on a worker (`Verifier`).

        Until its verdict is in, nothing: the next look asks again. Passed, the task
        succeeds; failed, every agent is told why and the team goes on, unless that
        would pass `max_supersteps`; no verdict after every try, the task fails.
        """
        ctx = self.ctx
        ctx.phase = "verify"
        finish = ctx.finisher.finish
        if not limits.verify:
            finish(task, TaskState.SUCCEEDED, "every agent rested", gc, again=True)
            return
        verdict = ctx.verifier.poll(task, gc.number, epoch, limits)
        if verdict is None:
            return
        if isinstance(verdict, GaveUp):
            finish(task, TaskState.FAILED, f"verify could not run: {verdict.reason}", gc)
            return
        # The verify in flight stays noted until what its verdict decides is done: a try
        # that fails after this write reads the verdict again, and does not run it again.
        ctx.runs.write(task, {"verify_output": verdict.output})
        if verdict.passed:
            finish(task, TaskState.SUCCEEDED, "verify passed", gc, again=True)
            return
        if gc.superstep + 1 > limits.max_supersteps:
            why = f"verify failed at max_supersteps ({limits.max_supersteps})"
            finish(task, TaskState.FAILED, why, gc, again=True)
            return
        # Tell every agent, as the barrier of an empty superstep: they wake and go on.
        text = f"`{limits.verify}` failed:\n{verdict.output[-2_000:]}"
        notices = [
            InboxMessage(
                id=new_id(),
                seq=0,
                sender=SYSTEM_SENDER,
                recipient=agent,
                superstep=gc.superstep + 1,
                content=text,
            )
            for agent in order
        ]
        barrier = build_gc(
            ctx.store,
            gc,
            {},
            order,
            number=gc.number + 1,
            superstep=gc.superstep + 1,
            epoch=epoch,
            notices=notices,
        )
        ctx.store.prepare_gc(barrier.gc, ctx.lease.token)
        ctx.store.commit_gc(barrier.gc, ctx.lease.token)
        ctx.runs.write(task, forget=[VERIFY_FIELD])
        metrics.GC_COMMITS.inc()
        log.info(
            "verify failed; the team goes on",
            task=task,
            gc=barrier.gc.number,
            epoch=barrier.gc.epoch,
        )

    def forget(self, task: str) -> None:
        """Drop what was kept of a task that ended."""
        self._refused.pop(task, None)
