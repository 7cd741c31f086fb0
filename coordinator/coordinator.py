"""The coordinator: drives every running task superstep by superstep, on RQ workers.

Per superstep: write the GC as PREPARING, launch one step job per runnable agent, watch
their votes, retry a step whose attempt failed, timed out or whose worker died (the
heartbeat lapsed), and commit the GC in one atomic write once every vote is in; then
archive per policy. When no agent is runnable, have a worker run `verify` and judge its
verdict (`cairn.coordinator.verify`): the coordinator runs nothing a spec names. All of it
lives in Redis (the task's `run` and `steps` hashes): a coordinator that dies is replaced
by one that reads the same state and carries on, and only the holder of the lease acts.
Whatever advancing one task raises stays with that task (`cairn.coordinator.isolation`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import TypeVar, cast

import redis
from rq import Queue
from rq.exceptions import InvalidJobOperation, NoSuchJobError
from rq.serializers import JSONSerializer

from cairn.agents.barrier import SYSTEM_SENDER, StepOutputs, build_gc, read_outputs, runnable
from cairn.agents.logs import get_logger
from cairn.agents.spec import TaskRecord
from cairn.coordinator import metrics
from cairn.coordinator.archiver import ArchiveJob, Archiver, acknowledge, archive
from cairn.coordinator.isolation import PAUSE_AFTER, TaskFaults
from cairn.coordinator.jobs import STEP_JOB, STEPS_QUEUE
from cairn.coordinator.jobstate import JobState, TakenJobs, backoff, step_failure
from cairn.coordinator.lease import Lease
from cairn.coordinator.numbering import ArchiveFloor, restore_from_archive
from cairn.coordinator.plan import Barrier, Plan, Then
from cairn.coordinator.replication import Replication
from cairn.coordinator.restore import Restorer
from cairn.coordinator.runs import (
    RESTORING,
    TERMINAL,
    Look,
    RunState,
    StepRun,
    TaskState,
    abort_in_flight,
)
from cairn.coordinator.spec import LIMITS_DOC, Limits
from cairn.coordinator.spend import BUDGET_REASON, budget_of, budget_reached, parse_spend
from cairn.coordinator.verifier import GaveUp, Verifier
from cairn.coordinator.verify import FIELD as VERIFY_FIELD
from cairn.coordinator.worker import CairnJob
from cairn.errors import (
    CairnError,
    CommitRefused,
    CorruptCheckpoint,
    FencedWrite,
    RecordNotFound,
    RestoreFailed,
)
from cairn.storage import keys
from cairn.storage.ids import new_id
from cairn.storage.keys import SPEC_DOC
from cairn.storage.records import AgentState, GlobalCheckpoint, InboxMessage, LCRef, Record, Usage
from cairn.storage.store import CheckpointStore

log = get_logger(__name__)
R = TypeVar("R", bound=Record)
HEARTBEAT_GRACE = 3.0  # seconds a started step may go without a heartbeat
MAX_ROLLBACKS = 3
FAILURE_CHECK_EVERY = 0.2  # seconds between looks for failed, timed-out or dead steps
# Seconds a look's status and budget are trusted for beginning the next superstep with a
# commit: the look and the commit of a task are milliseconds apart, unless other tasks of
# the same tick took long (an inline archive, a rollback).
FRESH_LOOK = 0.1
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
        self._checked: dict[str, float] = {}  # when each task was last checked for failures
        self.taken = TakenJobs(heartbeat_grace)  # jobs taken from their queue, not started
        # task → (epoch, superstep) whose commit was refused once: a second refusal rolls back
        self._refused: dict[str, tuple[int, int]] = {}
        # task → (restores of it that failed in a row, when the next may begin: monotonic)
        self._restore_due: dict[str, tuple[int, float]] = {}
        # A task's spec and limits never change once submitted: read each once.
        self._docs: dict[tuple[str, str], Record] = {}
        # (task, epoch, superstep) → agent → (its vote, the outputs read from that LC)
        self._outputs: dict[tuple[str, int, int], dict[str, tuple[LCRef, StepOutputs]]] = {}
        self.runs = RunState(client, store.hot, lambda: self.lease.token)
        self.restorer = Restorer(client, store, workers=restore_on_workers, runs=self.runs)
        self.archiver = Archiver(store, self._archived)
        self.archived = ArchiveFloor(store)  # a GC number is never reused: see numbering.py
        self.replication = Replication(self.runs)
        self.verifier = Verifier(client, self.queue, self.runs, heartbeat_grace)
        self.faults = TaskFaults(self._pause, pause_after)
        self.phase = ""  # what `tick` is doing for the task at hand, named in its faults

    # the loop -----------------------------------------------------------------------------
    def run(self, stop: threading.Event, poll: float = 0.05) -> None:
        """Drive tasks until `stop` is set, acting only while holding the leader lease."""
        try:
            while not stop.is_set():
                try:
                    if self.lease.acquire():
                        self.tick()
                except (redis.ConnectionError, redis.TimeoutError) as exc:
                    # Redis restarting or failing over: every write is fenced by the lease
                    # token, so this coordinator waits and asks again instead of exiting.
                    log.warning("Redis unreachable; trying again", error=str(exc))
                    stop.wait(UNREACHABLE_PAUSE)
                stop.wait(poll)
        finally:
            self.archiver.drain()
            self.lease.release()

    def tick(self) -> None:
        """Advance every active task by what is due now.

        One look (two round trips) reads every active task; each is then advanced from it.
        """
        active = sorted(
            t.decode() for t in cast(set[bytes], self.redis.smembers(keys.ACTIVE_TASKS))
        )
        above = 0  # the highest task owner token above this lease's
        for task, seen in self.runs.look(active).items():
            if not self.faults.due(task):
                continue  # its advance failed a moment ago: it waits out a backoff
            self.phase = "look"
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
            self.faults.failed(task, failure, self.phase)
            if isinstance(failure, FencedWrite):  # a coordinator with a newer lease owns it
                above = max(above, self._owner_above(task))
        if above:
            self.lease.outrank(above)

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
            self._forget(task)  # ended by a person (`Tasks.cancel`), not by this loop
            return
        if status == RESTORING:
            self._restore_again(task, seen.latest)
            return
        if status == TaskState.PAUSED and self.replication.resume_if_replicated(
            task, seen.run, seen.latest
        ):
            status = TaskState.RUNNING
        if int(seen.run.get("superstep", "0")):
            self._watch(task, seen)
        elif status == TaskState.RUNNING:
            self._begin(task)

    def _restore_again(self, task: str, latest: int | None) -> None:
        """Restore a task that a restore left `restoring` when it stopped half-way.

        A restore holds the task's restore lock while it runs; a task `restoring` without
        it lost its restorer (a process killed, a coordinator fenced mid-way), and nothing
        else would move it again. Its superstep was aborted and its epoch raised already, so
        it goes back to its latest committed GC, every agent and file together.
        """
        self.phase = "restore"
        if self.redis.exists(keys.restore_lock(task)):
            return  # the restore runs still
        failed, due = self._restore_due.get(task, (0, 0.0))
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
            self._restore_due[task] = (failed + 1, time.monotonic() + pause)
            log.info("restore tried again later", task=task, failed=failed + 1, after_s=pause)
            raise
        self._restore_due.pop(task, None)

    # one superstep ------------------------------------------------------------------------
    def _begin(self, task: str, committed: GlobalCheckpoint | None = None) -> None:
        """Start the superstep after the latest GC (`committed`, when the caller holds it)."""
        self.phase = "begin"
        limits = self._limits(task)
        latest = self.store.hot.latest_gc(task) if committed is None else committed.number
        if self.archived.behind(task, latest):  # the next number would be an archived one
            restore_from_archive(self.restorer, task, latest)
            return
        gc = committed
        if gc is None and latest is not None:
            gc = self.store.read_gc(task, latest)
        if gc is None:
            self._finish(task, TaskState.UNRECOVERABLE, "no committed checkpoint is left")
            return
        barrier = Barrier.read(self.redis, task)
        if not barrier.may_begin(gc):
            return
        plan = self._plan(task, gc, barrier)
        if plan.agents:
            superstep, epoch = gc.superstep + 1, barrier.epoch
            intent = gc.model_copy(
                update={"number": gc.number + 1, "superstep": superstep, "epoch": epoch}
            )
            self._launch(task, dict.fromkeys(plan.agents, 1), superstep, epoch, limits, intent)
        elif plan.then is Then.VERIFY:
            self._verify(task, gc, [a.name for a in self._record(task).agents], limits,
                         barrier.epoch)  # fmt: skip
        elif plan.then is Then.FAIL:
            self._finish(task, TaskState.FAILED, plan.reason, gc)
        elif plan.then is Then.PAUSE:
            self.runs.write(task, {"status": TaskState.PAUSED, "reason": BUDGET_REASON})
            log.info("task paused: budget reached", task=task, spent=plan.reason)

    def _plan(self, task: str, gc: GlobalCheckpoint, barrier: Barrier) -> Plan:
        """Decide what follows `gc` (the caller does it): the next superstep, or what else."""
        limits = self._limits(task)
        order = [a.name for a in self._record(task).agents]
        agents = runnable(self.store, gc, order)
        if not agents:
            if any(gc.statuses.get(a) is AgentState.WAITING_APPROVAL for a in order):
                return Plan(then=Then.WAIT)
            return Plan(then=Then.VERIFY)
        if gc.superstep >= limits.max_supersteps:
            return Plan(then=Then.FAIL, reason=f"reached max_supersteps ({limits.max_supersteps})")
        why = budget_reached(budget_of(barrier.budget, limits), barrier.spent)
        if why is not None:
            return Plan(then=Then.PAUSE, reason=why)
        return Plan(tuple(agents))

    def _launch(
        self,
        task: str,
        attempts: dict[str, int],
        superstep: int,
        epoch: int,
        limits: Limits,
        intent: GlobalCheckpoint | None = None,
        *,
        fenced: bool = False,
    ) -> None:
        """Launch agent → attempt as step jobs: fence them in, then enqueue all in one go.

        A new superstep's `intent` (its GC to be) is prepared in the fencing's round trip,
        unless `fenced` says the commit before it did both; its run state is then written
        with the steps, in one write.
        """
        if intent is None:
            self.store.hot.begin_attempts(task, attempts, superstep, epoch=epoch)
        elif not fenced:
            self.store.begin_superstep(intent, attempts, self.lease.token)
        # Logged before the jobs exist: a history checker reads which attempt was current.
        log.info("steps launched", task=task, epoch=epoch, superstep=superstep, attempts=attempts)
        jobs = {
            agent: f"cairn-{task}-{epoch}-{superstep}-{agent}-{attempt}"
            for agent, attempt in attempts.items()
        }
        pipe = self.redis.pipeline()
        self.queue.enqueue_many(
            [
                Queue.prepare_data(
                    STEP_JOB,
                    args=(task, agent, superstep, epoch, attempt),
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
            self.runs.write(task, steps=steps)
            return
        run = {"superstep": superstep, "number": intent.number, "epoch": epoch}
        self.runs.write(task, run, steps, clear_steps=True)
        log.info("superstep started", task=task, superstep=superstep, agents=list(attempts))

    def _watch(self, task: str, seen: Look) -> None:
        self.phase = "watch"
        run, latest = seen.run, seen.latest
        superstep, number = int(run["superstep"]), int(run["number"])
        if self.archived.behind(task, latest):  # `number` may be an archived GC's
            restore_from_archive(self.restorer, task, latest)
            return
        if (latest or -1) >= number:
            # Committed already, by a coordinator that died before saying so: move on.
            self._after_commit(task, self.store.read_gc(task, number))
            return
        epoch, votes = int(run["epoch"]), seen.votes
        self._ingest(task, epoch, superstep, votes)
        steps = {agent: StepRun.load(raw) for agent, raw in seen.steps.items()}
        if steps and steps.keys() <= votes.keys():
            self._commit(task, superstep, seen, {a: votes[a] for a in steps})
            return
        limits = self._limits(task)
        now = time.time()
        pending = {agent: step for agent, step in steps.items() if agent not in votes}
        due = {
            a: step.attempt for a, step in pending.items() if step.retry_at and now >= step.retry_at
        }
        if due:
            self._launch(task, due, superstep, epoch, limits)
        # Looking for failures costs a few reads per step: a few times a second is enough.
        if now - self._checked.get(task, 0.0) < FAILURE_CHECK_EVERY:
            return
        self._checked[task] = now
        watched = {a: step for a, step in pending.items() if not step.retry_at}
        if not watched:
            return
        outcomes = cast(
            dict[bytes, bytes], self.redis.hgetall(keys.outcomes(task, epoch, superstep))
        )
        ids = [s.job for s in watched.values()]
        jobs = JobState.read_many(self.redis, ids, self.queue.key, self.heartbeat_grace, now)
        jobs = self.taken.judge(task, ids, jobs, now)
        beats = cast(
            list[bytes | None], self.redis.mget([keys.heartbeat(task, a) for a in watched])
        )
        for (agent, step), job, raw in zip(watched.items(), jobs, beats, strict=True):
            beat = None if raw is None else raw.decode()
            failure = step_failure(step, epoch, superstep, outcomes.get(agent.encode()), job, beat,
                               limits, self.heartbeat_grace, now)  # fmt: skip
            if failure is not None and not self._retry(
                task, run, agent, step, superstep, failure, now
            ):
                return

    def _ingest(self, task: str, epoch: int, superstep: int, votes: dict[str, LCRef]) -> None:
        """Read the barrier's inputs from LCs as their votes arrive, not all at the last one.

        So the last vote to the commit costs one LC read, whatever the team's size. Only a
        cache: a successor coordinator, or a failed read here, reads them at the barrier.
        """
        key = (task, epoch, superstep)
        self._outputs = {k: v for k, v in self._outputs.items() if k[0] != task or k == key}
        seen = self._outputs.setdefault(key, {})
        fresh = {agent: ref for agent, ref in votes.items() if agent not in seen
                 or seen[agent][0] != ref}  # fmt: skip
        if not fresh:
            return
        try:
            read = read_outputs(self.store, task, fresh)
        except CairnError as exc:
            log.info("votes not read ahead; the barrier reads them", task=task, error=str(exc))
            return
        seen.update({agent: (fresh[agent], outputs) for agent, outputs in read.items()})

    def _read_ahead(
        self, task: str, epoch: int, superstep: int, votes: dict[str, LCRef]
    ) -> dict[str, StepOutputs]:
        """The outputs `_ingest` read for exactly these votes."""
        seen = self._outputs.get((task, epoch, superstep), {})
        return {a: out for a, (ref, out) in seen.items() if votes.get(a) == ref}

    def _retry(
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
        kind, message = failure
        if kind == "fatal" or step.attempt > self._record(task).agent(agent).max_retries:
            self._give_up(task, run, f"step of {agent} in superstep {superstep}: {message}")
            return False
        # Fence the failed attempt first: whatever it does from now on is refused.
        self.store.hot.begin_attempt(
            task, agent, superstep, step.attempt + 1, epoch=int(run["epoch"])
        )
        # Gone, or canceled already (by a coordinator that died before it recorded the
        # retry): nothing left to cancel.
        with contextlib.suppress(NoSuchJobError, InvalidJobOperation, redis.RedisError):
            CairnJob.fetch(step.job, connection=self.redis, serializer=JSONSerializer).cancel()
        retry = StepRun(step.attempt + 1, retry_at=now + backoff(step.attempt))
        self.runs.write(task, steps={agent: retry.dump()})
        metrics.STEP_RETRIES.inc()
        log.info("step retried", task=task, agent=agent, attempt=retry.attempt, why=message)
        return True

    def _commit(self, task: str, superstep: int, seen: Look, votes: dict[str, LCRef]) -> None:
        """Build the superstep's GC and commit it; begin the next superstep.

        In the commit's own write when it is due now and nothing must come between (see
        `_then`), else after it, as a superstep begins after a restore. A refused commit
        is tried once more at the next tick (what the barrier stored itself, the merged
        manifest, may have gone to a primary replaced since); refused again, the
        superstep rolls back.
        """
        self.phase = "commit"
        run = seen.run
        record = self._record(task)
        gc = self.store.latest_gc(task)
        assert gc is not None
        order = [a.name for a in record.agents]
        epoch = int(run["epoch"])
        try:
            barrier = build_gc(
                self.store,
                gc,
                votes,
                order,
                number=int(run["number"]),
                superstep=superstep,
                epoch=epoch,
                outputs=self._read_ahead(task, epoch, superstep, votes),
            )
        except (RecordNotFound, CorruptCheckpoint) as exc:  # a vote whose LC Redis lost
            self._give_up(task, run, f"superstep {superstep} cannot be committed: {exc}")
            return
        agents = self._then(task, barrier.gc, seen)
        prepared = None
        try:
            if agents:
                committed, prepared = self.store.commit_and_begin(
                    barrier.gc, dict.fromkeys(agents, 1), self.lease.token
                )
            else:
                committed = self.store.commit_gc(barrier.gc, self.lease.token)
        except CommitRefused as exc:
            if (self.store.hot.latest_gc(task) or -1) < barrier.gc.number:
                # What it names is gone or not what was voted (Redis lost it: a failover,
                # a FLUSHALL): as a step that failed, the superstep rolls back.
                if self._refused.get(task) != (epoch, superstep):
                    self._refused[task] = (epoch, superstep)
                    log.info("commit refused; tried again", task=task, superstep=superstep,
                             why=str(exc))  # fmt: skip
                    return
                self._give_up(task, run, f"superstep {superstep} cannot be committed: {exc}")
                return
            committed = self.store.read_gc(task, barrier.gc.number)  # another did it first
        self._refused.pop(task, None)
        metrics.GC_COMMITS.inc()
        log.info("superstep committed", task=task, superstep=superstep, gc=committed.number,
                 epoch=committed.epoch, conflicts=len(barrier.conflicts))  # fmt: skip
        if prepared is None:
            self._after_commit(task, committed)
            return
        self._launch(task, dict.fromkeys(agents, 1), prepared.superstep, epoch,
                     self._limits(task), prepared, fenced=True)  # fmt: skip
        self._archive(task, committed)

    def _then(self, task: str, gc: GlobalCheckpoint, seen: Look) -> list[str]:
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
        limits = self._limits(task)
        if limits.checkpoints.durability != "async":
            return []
        run, spent = seen.run, dict[str, Usage]()
        try:
            if time.monotonic() - seen.taken > FRESH_LOOK:  # other tasks of the tick first
                run = self.runs.read(task)
            if run.get("status") != TaskState.RUNNING.value:
                return []
            budget = run["budget"].encode() if "budget" in run else None
            if budget_of(budget, limits) is not None:
                spend = cast(dict[bytes, bytes], self.redis.hgetall(keys.spend(task)))
                spent = parse_spend(spend)[0]
            return list(self._plan(task, gc, Barrier(True, gc.epoch, False, budget, spent)).agents)
        except (CairnError, redis.RedisError) as exc:  # a state unread: the commit goes alone
            log.info("next superstep not begun with the commit", task=task, why=str(exc))
            return []

    def _after_commit(self, task: str, committed: GlobalCheckpoint) -> None:
        """Close the superstep whose GC is committed and start the next one at once.

        Forget its steps, archive per policy, and, if the task is still running (a person
        may have paused or cancelled it meanwhile) and, under `durability: replicated`, a
        replica holds `committed`, begin the next superstep from it rather than a tick later.
        """
        self.phase = "after commit"
        self.runs.write(task, {"superstep": 0}, clear_steps=True)
        self._archive(task, committed)
        policy = self._limits(task).checkpoints
        if self.replication.after_commit(task, committed.number, policy):
            self._begin(task, committed)  # which does nothing unless the task is still running

    def _archive(self, task: str, gc: GlobalCheckpoint) -> None:
        """Archive per policy: inline under `durability: sync`, else on the archiver's thread.

        Under `sync` a GC counts as committed for the user only once it is on disk, so the
        next superstep waits for it; under `async` (every `archive_every` GCs) it does not.
        """
        self.phase = "archive"
        policy = self._limits(task).checkpoints
        job = ArchiveJob(task, gc.number, policy.hot_keep, policy.cold_keep)
        if policy.durability == "sync":
            if archive(self.store, job):
                self._archived(task, gc.number)
        elif gc.number % policy.archive_every == 0:
            self.archiver.submit(job)

    def _archived(self, task: str, number: int) -> None:
        self.archived.note(task, number)
        acknowledge(self.runs, task, number)

    def _verify(
        self, task: str, gc: GlobalCheckpoint, order: list[str], limits: Limits, epoch: int
    ) -> None:
        """Judge `gc`'s files by the task's verify command, run on a worker (`Verifier`).

        Until its verdict is in, nothing: the next look asks again. Passed, the task
        succeeds; failed, every agent is told why and the team goes on, unless that
        would pass `max_supersteps`; no verdict after every try, the task fails.
        """
        self.phase = "verify"
        if not limits.verify:
            self._finish(task, TaskState.SUCCEEDED, "every agent rested", gc)
            return
        verdict = self.verifier.poll(task, gc.number, epoch, limits)
        if verdict is None:
            return
        if isinstance(verdict, GaveUp):
            self._finish(task, TaskState.FAILED, f"verify could not run: {verdict.reason}", gc)
            return
        # The verify in flight stays noted until what its verdict decides is done: a try
        # that fails after this write reads the verdict again, and does not run it again.
        self.runs.write(task, {"verify_output": verdict.output})
        if verdict.passed:
            self._finish(task, TaskState.SUCCEEDED, "verify passed", gc)
            return
        if gc.superstep + 1 > limits.max_supersteps:
            self._finish(
                task,
                TaskState.FAILED,
                f"verify failed at max_supersteps ({limits.max_supersteps})",
                gc,
            )
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
            self.store,
            gc,
            {},
            order,
            number=gc.number + 1,
            superstep=gc.superstep + 1,
            epoch=epoch,
            notices=notices,
        )
        self.store.prepare_gc(barrier.gc, self.lease.token)
        self.store.commit_gc(barrier.gc, self.lease.token)
        self.runs.write(task, forget=[VERIFY_FIELD])
        metrics.GC_COMMITS.inc()
        log.info("verify failed; the team goes on", task=task, gc=barrier.gc.number,
                 epoch=barrier.gc.epoch)  # fmt: skip

    def _give_up(self, task: str, run: dict[str, str], reason: str) -> None:
        """Abort the superstep and roll the task back to its latest committed GC.

        After `MAX_ROLLBACKS` rollbacks the task fails instead: a step that fails the same
        way from the same state would fail again.
        """
        self.phase = "rollback"
        rollbacks = int(run.get("rollbacks", "0"))
        metrics.GC_ABORTS.inc()
        if rollbacks >= MAX_ROLLBACKS:
            self.store.raise_epoch(task, int(run["epoch"]) + 1, self.lease.token)
            abort_in_flight(self.runs, self.store, task)
            self._finish(task, TaskState.FAILED, f"{reason}; {rollbacks} rollbacks did not help")
            return
        self.runs.write(task, {"rollbacks": rollbacks + 1})
        log.info("superstep aborted; rolling back", task=task, reason=reason)
        try:
            self.restorer.restore(task, reason=f"superstep aborted: {reason}")
        except RestoreFailed as exc:
            log.warning("rollback failed", task=task, error=str(exc))

    # run state ----------------------------------------------------------------------------
    def _record(self, task: str) -> TaskRecord:
        return self._doc(task, SPEC_DOC, TaskRecord)

    def _limits(self, task: str) -> Limits:
        return self._doc(task, LIMITS_DOC, Limits)

    def _doc(self, task: str, name: str, model: type[R]) -> R:
        found = self._docs.get((task, name))
        if found is None:
            found = self.store.read_doc(task, name, model)
            self._docs[(task, name)] = found
        assert isinstance(found, model)
        return found

    def _pause(self, task: str, reason: str) -> bool:
        """Pause `task` with `reason` (`TaskFaults`'s way); False if it was not running.

        Never one that is `restoring`: paused, then resumed, it would run on from a
        restore that stopped half-way, which only that status says must be done again.
        """
        status = cast(bytes | None, self.redis.hget(keys.run(task), "status"))
        if status is None or status.decode() in (TaskState.PAUSED, RESTORING, *TERMINAL):
            return False
        self.runs.write(task, {"status": TaskState.PAUSED, "reason": reason})
        return True

    def _forget(self, task: str) -> None:
        """Drop what this coordinator cached of a task that ended."""
        self._docs = {key: doc for key, doc in self._docs.items() if key[0] != task}
        self._outputs = {key: out for key, out in self._outputs.items() if key[0] != task}
        self._checked.pop(task, None)
        self._refused.pop(task, None)
        self._restore_due.pop(task, None)
        self.taken.forget(task)
        self.verifier.forget(task)
        self.faults.forget(task)
        self.archived.forget(task)
        self.replication.forget(task)

    def _finish(
        self, task: str, status: TaskState, reason: str, gc: GlobalCheckpoint | None = None
    ) -> None:
        """End the task; when the end stands on `gc`, only where `gc` is the latest GC.

        A coordinator may commit `gc` on a primary the Sentinels replaced and move to the
        new one before it ends the task (a split): there `gc` was never committed, and an
        end written would leave the task `succeeded` short of its last superstep. The end
        is refused instead, and the task goes on from what the new primary holds.
        """
        self.phase = "finish"
        # A task that ended has every GC it committed on disk, whatever `archive_every` says.
        latest = self.store.hot.latest_gc(task) if gc is None else gc.number
        if latest is not None:
            policy = self._limits(task).checkpoints
            self.archiver.submit(ArchiveJob(task, latest, policy.hot_keep, policy.cold_keep))
        if not self.archiver.drain():
            log.warning("archiving still running at the task's end", task=task)
        self._forget(task)
        try:
            self.runs.write(task, {"status": status, "reason": reason},
                            standing_on=None if gc is None else gc.number)  # fmt: skip
        except CommitRefused as exc:
            log.warning("task not ended: its last GC is not the latest here", task=task,
                        gc=latest, why=str(exc))  # fmt: skip
            return
        self.redis.srem(keys.ACTIVE_TASKS, task)
        log.info("task ended", task=task, status=status.value, reason=reason)
