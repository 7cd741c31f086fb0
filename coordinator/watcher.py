"""Watching a superstep: its votes as they arrive, and its steps that failed.

Each look reads the LCs behind the votes that arrived (so the barrier has little left to
read) and hands the superstep to the committer once every step voted. A few times a
second it also looks for steps that failed, timed out, or whose worker died (the job
gone, the heartbeat lapsed), and retries each after a backoff, or gives the superstep up.
"""

from __future__ import annotations

import contextlib
import time
from typing import cast

import redis
from rq.exceptions import InvalidJobOperation, NoSuchJobError
from rq.serializers import JSONSerializer

from cairn.agents.barrier import StepOutputs, read_outputs
from cairn.agents.logship import process_name
from cairn.agents.team import member_spec
from cairn.coordinator import metrics
from cairn.coordinator.context import Context, log
from cairn.coordinator.failures import FailureEvent, record_quietly
from cairn.coordinator.finisher import MAX_ROLLBACKS, SAME_WORKERS
from cairn.coordinator.jobstate import JobState, backoff, step_failure
from cairn.coordinator.numbering import restore_from_archive
from cairn.coordinator.runs import Look, StepRun
from cairn.coordinator.spec import Limits
from cairn.coordinator.worker import CairnJob
from cairn.errors import CairnError
from cairn.storage import keys
from cairn.storage.records import LCRef

# Seconds between looks for failed, timed-out or dead steps. A step that says why it
# failed (an outcome) is looked into at once; one that died silently is found a
# heartbeat grace after its last beat, and this at most later.
FAILURE_CHECK_EVERY = 1.0


class Watcher:
    """Watches each task's superstep in flight; keeps the outputs its votes name."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        # task → when it was last checked for failures, and the outcomes its look saw then
        self._checked: dict[str, tuple[float, int]] = {}
        # (task, epoch, superstep) → agent → (its vote, the outputs read from that LC)
        self._outputs: dict[tuple[str, int, int], dict[str, tuple[LCRef, StepOutputs]]] = {}

    def watch(self, task: str, seen: Look) -> None:
        """Commit the superstep once every step voted; else retry the steps that failed."""
        ctx = self.ctx
        ctx.phase = "watch"
        run, latest = seen.run, seen.latest
        superstep, number = int(run["superstep"]), int(run["number"])
        if ctx.archived.behind(task, latest):  # `number` may be an archived GC's
            restore_from_archive(ctx.restorer, task, latest)
            return
        if (latest or -1) >= number:
            # Committed already, by a coordinator that died before saying so: move on.
            ctx.committer.after_commit(task, ctx.store.read_gc(task, number))
            return
        epoch, votes = int(run["epoch"]), seen.votes
        self.ingest(task, epoch, superstep, votes)
        steps = {agent: StepRun.load(raw) for agent, raw in seen.steps.items()}
        if steps and steps.keys() <= votes.keys():
            ctx.committer.commit(task, superstep, seen, {a: votes[a] for a in steps})
            return
        limits = ctx.docs.limits(task)
        now = time.time()
        pending = {agent: step for agent, step in steps.items() if agent not in votes}
        due = {
            a: step.attempt for a, step in pending.items() if step.retry_at and now >= step.retry_at
        }
        if due:
            ctx.launcher.launch(task, due, superstep, epoch, limits)
        for step in pending.values():  # a backoff ending sends no wake: a timer looks then
            if step.retry_at > now:
                ctx.timers.at(task, step.retry_at)
        # Looking for failures costs a few reads per step: at once when an attempt said it
        # failed, else once a `FAILURE_CHECK_EVERY`.
        checked, said = self._checked.get(task, (0.0, 0))
        if now - checked < FAILURE_CHECK_EVERY and seen.outcomes <= said:
            return
        self._checked[task] = (now, seen.outcomes)
        try:
            self._failures(task, run, pending, limits, now)
        except Exception:
            self._checked[task] = (checked, said)  # one that raised is made again next look
            raise

    def _failures(
        self,
        task: str,
        run: dict[str, str],
        pending: dict[str, StepRun],
        limits: Limits,
        now: float,
    ) -> None:
        """Retry (or give up) each pending step whose attempt failed, timed out or died."""
        ctx = self.ctx
        superstep, epoch = int(run["superstep"]), int(run["epoch"])
        watched = {a: step for a, step in pending.items() if not step.retry_at}
        if not watched:
            return
        outcomes = cast(
            dict[bytes, bytes], ctx.redis.hgetall(keys.outcomes(task, epoch, superstep))
        )
        ids = [s.job for s in watched.values()]
        jobs = JobState.read_many(ctx.redis, ids, ctx.queue.key, ctx.heartbeat_grace, now)
        jobs = ctx.taken.judge(task, ids, jobs, now)
        # Read after the jobs: a step votes before its job ends, so a job seen ended whose
        # vote came after this look's read of the votes has it here, and is no failure.
        pipe = ctx.redis.pipeline(transaction=False)
        pipe.mget([keys.heartbeat(task, a) for a in watched])
        pipe.hkeys(keys.votes(task, epoch, superstep))
        beats, voted = cast(tuple[list[bytes | None], list[bytes]], tuple(pipe.execute()))
        late = {raw.decode() for raw in voted}
        for (agent, step), job, raw in zip(watched.items(), jobs, beats, strict=True):
            if agent in late:
                continue  # voted since the look: the next look commits it
            beat = None if raw is None else raw.decode()
            failure = step_failure(
                step,
                epoch,
                superstep,
                outcomes.get(agent.encode()),
                job,
                beat,
                limits,
                ctx.heartbeat_grace,
                now,
            )
            if failure is not None and not self.retry(
                task, run, agent, step, superstep, failure, now
            ):
                return

    def ingest(self, task: str, epoch: int, superstep: int, votes: dict[str, LCRef]) -> None:
        """Read the barrier's inputs from LCs as their votes arrive, not all at the last one.

        So the last vote to the commit costs one LC read, whatever the team's size. Only a
        cache: a successor coordinator, or a failed read here, reads them at the barrier.
        """
        key = (task, epoch, superstep)
        self._outputs = {k: v for k, v in self._outputs.items() if k[0] != task or k == key}
        seen = self._outputs.setdefault(key, {})
        fresh = {
            agent: ref for agent, ref in votes.items() if agent not in seen or seen[agent][0] != ref
        }
        if not fresh:
            return
        try:
            read = read_outputs(self.ctx.store, task, fresh)
        except CairnError as exc:
            log.info("votes not read ahead; the barrier reads them", task=task, error=str(exc))
            return
        seen.update({agent: (fresh[agent], outputs) for agent, outputs in read.items()})

    def read_ahead(
        self, task: str, epoch: int, superstep: int, votes: dict[str, LCRef]
    ) -> dict[str, StepOutputs]:
        """The outputs `ingest` read for exactly these votes."""
        seen = self._outputs.get((task, epoch, superstep), {})
        return {a: out for a, (ref, out) in seen.items() if votes.get(a) == ref}

    def retry(
        self,
        task: str,
        run: dict[str, str],
        agent: str,
        step: StepRun,
        superstep: int,
        failure: tuple[str, str],
        now: float,
    ) -> bool:
        """Retry a failed step after a backoff; False when the superstep was given up."""
        ctx = self.ctx
        kind, message = failure
        why = f"step of {agent} in superstep {superstep}: {message}"
        epoch = int(run["epoch"])

        def note(event: FailureEvent) -> None:  # what `status` and the timeline show now
            record_quietly(ctx.redis, task, agent, superstep, epoch, step.attempt, event,
                           message, process=process_name("coordinator"))  # fmt: skip

        if kind == "refused":  # a rollback would send the same request, unchanged
            note(FailureEvent.GAVE_UP)
            ctx.finisher.give_up(task, run, why, rollback=False)
            return False
        if kind == "missing":  # the agent names what a worker lacks: no retry, no rollback
            note(FailureEvent.GAVE_UP)
            ctx.finisher.give_up(task, run, why, rollback=False, unhelped=SAME_WORKERS)
            return False
        if kind == "fatal" or step.attempt > self._max_retries(task, agent):
            last = int(run.get("rollbacks", "0")) >= MAX_ROLLBACKS
            note(FailureEvent.GAVE_UP if last else FailureEvent.ROLLED_BACK)
            ctx.finisher.give_up(task, run, why)
            return False
        note(FailureEvent.RETRIED)
        # Fence the failed attempt first: whatever it does from now on is refused.
        ctx.store.hot.begin_attempt(
            task, agent, superstep, step.attempt + 1, epoch=int(run["epoch"])
        )
        # Gone, or canceled already (by a coordinator that died before it recorded the
        # retry): nothing left to cancel.
        with contextlib.suppress(NoSuchJobError, InvalidJobOperation, redis.RedisError):
            CairnJob.fetch(step.job, connection=ctx.redis, serializer=JSONSerializer).cancel()
        retry = StepRun(step.attempt + 1, retry_at=now + backoff(step.attempt))
        ctx.runs.write(task, steps={agent: retry.dump()})
        metrics.STEP_RETRIES.inc()
        log.info("step retried", task=task, agent=agent, attempt=retry.attempt, why=message)
        return True

    def _max_retries(self, task: str, agent: str) -> int:
        """The retries `agent`'s spec allows: the record's, or the one it was spawned with."""
        record = self.ctx.docs.record(task)
        if any(spec.name == agent for spec in record.agents):
            return record.agent(agent).max_retries
        gc = self.ctx.store.latest_gc(task)  # a member spawned at run time: its GC says
        if gc is None:
            return record.agent(agent).max_retries  # raises InvalidSpec, naming the agent
        return member_spec(record, gc, agent).max_retries

    def forget(self, task: str) -> None:
        """Drop what was kept of a task that ended."""
        self._outputs = {key: out for key, out in self._outputs.items() if key[0] != task}
        self._checked.pop(task, None)
