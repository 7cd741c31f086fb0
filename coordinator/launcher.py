"""Beginning a superstep: decide what follows the latest GC, and launch its steps as RQ jobs.

The superstep after a GC runs every runnable agent, unless the task is out of supersteps
or budget; with no agent runnable the task's verify is due (the committer judges it).
A superstep's GC to be is prepared and its attempts fenced in one round trip, then its
step jobs are enqueued in one pipeline.
"""

from __future__ import annotations

import time

from rq import Queue

from cairn.agents.barrier import runnable
from cairn.coordinator import tracing
from cairn.coordinator.budgets import held
from cairn.coordinator.context import Context, log
from cairn.coordinator.jobs import STEP_JOB
from cairn.coordinator.numbering import restore_from_archive
from cairn.coordinator.plan import Barrier, Plan, Then
from cairn.coordinator.runs import StepRun, TaskState
from cairn.coordinator.spec import Limits
from cairn.coordinator.spend import BUDGET_REASON, budget_of, budget_reached
from cairn.storage.records import AgentState, GCOrigin, GlobalCheckpoint


class Launcher:
    """Begins a task's supersteps and launches (or relaunches) their steps."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def begin(self, task: str, committed: GlobalCheckpoint | None = None) -> None:
        """Start the superstep after the latest GC (`committed`, when the caller holds it)."""
        ctx = self.ctx
        ctx.phase = "begin"
        limits = ctx.docs.limits(task)
        latest = ctx.store.hot.latest_gc(task) if committed is None else committed.number
        if ctx.archived.behind(task, latest):  # the next number would be an archived one
            restore_from_archive(ctx.restorer, task, latest)
            return
        gc = committed
        if gc is None and latest is not None:
            gc = ctx.store.read_gc(task, latest)
        if gc is None:
            why = "no committed checkpoint is left"
            ctx.finisher.finish(task, TaskState.UNRECOVERABLE, why, again=True)
            return
        barrier = Barrier.read(ctx.redis, task)
        if not barrier.may_begin(gc):
            return
        plan = self.plan(task, gc, barrier)
        if plan.agents:
            superstep, epoch = gc.superstep + 1, barrier.epoch
            intent = gc.written(
                GCOrigin.SUPERSTEP, number=gc.number + 1, superstep=superstep, epoch=epoch
            )
            self.launch(task, dict.fromkeys(plan.agents, 1), superstep, epoch, limits, intent,
                        replayed=superstep <= barrier.replay_until)  # fmt: skip
        elif plan.then is Then.WAIT:
            ctx.waiting[task] = (gc.number, time.monotonic())
        elif plan.then is Then.VERIFY:
            ctx.committer.verify(task, gc, ctx.docs.team(task, gc), limits, barrier.epoch)
        elif plan.then is Then.FAIL:
            ctx.finisher.finish(task, TaskState.FAILED, plan.reason, gc, again=True)
        elif plan.then is Then.PAUSE:
            reason = f"{BUDGET_REASON}: {plan.reason}" if plan.held else BUDGET_REASON
            ctx.runs.write(task, {"status": TaskState.PAUSED, "reason": reason})
            log.info("task paused: budget reached", task=task, spent=plan.reason)

    def plan(self, task: str, gc: GlobalCheckpoint, barrier: Barrier) -> Plan:
        """Decide what follows `gc` (the caller does it): the next superstep, or what else."""
        limits = self.ctx.docs.limits(task)
        order = self.ctx.docs.team(task, gc)
        agents = runnable(self.ctx.store, gc, order)
        if not agents:
            if any(gc.statuses.get(a) is AgentState.WAITING_APPROVAL for a in order):
                return Plan(then=Then.WAIT)
            return Plan(then=Then.VERIFY)
        if gc.superstep >= limits.max_supersteps:
            return Plan(then=Then.FAIL, reason=f"reached max_supersteps ({limits.max_supersteps})")
        why = budget_reached(budget_of(barrier.budget, limits), barrier.spent)
        if why is not None:
            return Plan(then=Then.PAUSE, reason=why)
        record = self.ctx.docs.record(task)
        over = held(self.ctx.store, record, gc, barrier.raised, barrier.spent)
        if over:  # a subtree over its budget rests; the rest of the team goes on
            resting = frozenset().union(*(h.members for h in over))
            agents = [agent for agent in agents if agent not in resting]
            if not agents:
                return Plan(then=Then.PAUSE, reason="; ".join(h.reason for h in over), held=True)
        return Plan(tuple(agents))

    def launch(
        self,
        task: str,
        attempts: dict[str, int],
        superstep: int,
        epoch: int,
        limits: Limits,
        intent: GlobalCheckpoint | None = None,
        *,
        fenced: bool = False,
        replayed: bool = False,
    ) -> None:
        """Launch agent → attempt as step jobs: fence them in, then enqueue all in one go.

        A new superstep's `intent` (its GC to be) is prepared in the fencing's round trip,
        unless `fenced` says the commit before it did both; its run state is then written
        with the steps, in one write. `replayed` says the superstep runs again what a
        restore discarded (its trace says so). When the process traces, each job carries
        its superstep span's trace context (`cairn.coordinator.tracing`).
        """
        ctx = self.ctx
        if intent is None:
            ctx.store.hot.begin_attempts(task, attempts, superstep, epoch=epoch)
        elif not fenced:
            ctx.store.begin_superstep(intent, attempts, ctx.lease.token)
        # Logged before the jobs exist: a history checker reads which attempt was current.
        log.info("steps launched", task=task, epoch=epoch, superstep=superstep, attempts=attempts)
        jobs = {
            agent: f"cairn-{task}-{epoch}-{superstep}-{agent}-{attempt}"
            for agent, attempt in attempts.items()
        }
        if intent is None:
            trace = tracing.steps_relaunched(task, epoch, superstep, attempts)
        else:
            trace = tracing.superstep_began(task, epoch, superstep, intent.number, list(attempts),
                                            replayed=replayed)  # fmt: skip
        pipe = ctx.redis.pipeline()
        ctx.queue.enqueue_many(
            [
                Queue.prepare_data(
                    STEP_JOB,
                    args=(task, agent, superstep, epoch, attempt),
                    kwargs=None if trace is None else {"trace": trace},
                    job_id=jobs[agent],
                    timeout=int(limits.step_timeout) + 60,
                    # A step's result is its vote and LC; RQ's copy of a finished job
                    # only costs Redis two keys a step for as long as it is kept.
                    result_ttl=60,
                    failure_ttl=86_400,
                )
                for agent, attempt in attempts.items()
            ],
            pipeline=pipe,
        )
        steps = {agent: StepRun(attempt, jobs[agent]).dump() for agent, attempt in attempts.items()}
        pipe.execute()
        if intent is None:
            ctx.runs.write(task, steps=steps)
            return
        run = {"superstep": superstep, "number": intent.number, "epoch": epoch}
        ctx.runs.write(task, run, steps, clear_steps=True)
        log.info("superstep started", task=task, superstep=superstep, agents=list(attempts))
