"""The user's side of the coordinator: submit tasks, read them, pause, resume, cancel.

`Tasks` never leads and holds no lease: it writes a task's records and run state, and the
coordinator's loop (`Coordinator.run`, in whichever process holds the lease) drives what
it finds there. A person's writes are not fenced by a lease token (`RunState` without a
token), so they land whichever coordinator leads.
"""

from __future__ import annotations

import builtins
import re
import time
from pathlib import Path
from typing import cast

import redis

from cairn.agents.accounting import Budget, MemberBudget
from cairn.agents.logs import get_logger
from cairn.agents.spec import TaskRecord, parse_model
from cairn.agents.task import start_task
from cairn.agents.team import member_spec
from cairn.coordinator import metrics
from cairn.coordinator.archiver import ArchiveJob, acknowledge, archive
from cairn.coordinator.fork import fork_task
from cairn.coordinator.offers import check_offers, live_offers
from cairn.coordinator.replication import require
from cairn.coordinator.restore import LOCK_TTL_MS
from cairn.coordinator.runs import TERMINAL, RunState, TaskState, abort_in_flight
from cairn.coordinator.spec import LIMITS_DOC, TaskSpec, read_limits, read_policy
from cairn.coordinator.spend import RAISED_BUDGETS, budget_of
from cairn.coordinator.views import TaskStatus, list_tasks, require_task, task_status
from cairn.coordinator.wakes import wake
from cairn.errors import InvalidSpec, TaskNotFound
from cairn.storage import keys
from cairn.storage.aborted import note_aborted
from cairn.storage.archive import ArchiveReport, archive_gc
from cairn.storage.ids import new_id
from cairn.storage.keys import SPEC_DOC
from cairn.storage.records import GCStatus
from cairn.storage.store import CheckpointStore

log = get_logger(__name__)
CANCELLED_REASON = "cancelled by a person"


def task_id(name: str) -> str:
    """A task id people can read: the spec's name, made safe, plus a unique suffix."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:40] or "task"
    return f"{slug}-{new_id().replace('-', '')[-12:]}"


class Tasks:
    """Submits tasks to the coordinators of one Redis and reads and steers them."""

    def __init__(self, client: redis.Redis, store: CheckpointStore) -> None:
        self.redis = client
        self.store = store
        self.runs = RunState(client, store.hot)

    def submit(self, spec: TaskSpec, base: Path = Path()) -> str:
        """Store a task, commit its GC 0 and queue it to run; return its id.

        `base` is the directory a spec's `workspace` is relative to. Raises `InvalidSpec`
        when an agent names a tool, MCP server, agent kind or model provider that every
        live worker lacks (`cairn.coordinator.offers`); with no worker live, none is.
        """
        check_offers(spec.agents, live_offers(self.redis))
        task = task_id(spec.name)
        files = spec.workspace_files(base)
        start_task(self.store, spec.record(task), files)
        metrics.GC_COMMITS.inc()  # GC 0
        self.store.put_doc(task, LIMITS_DOC, spec.limits())
        if spec.checkpoints.durability == "sync":
            # Its GC 0 is acknowledged by the task id we return: under `sync`, only once
            # on disk (a full or read-only archive fails the submit, with the reason).
            archive_gc(self.store, task, 0)
            acknowledge(self.runs, task, 0)
        elif spec.checkpoints.durability == "replicated":  # only once a replica holds it
            require(self.runs, self.store.hot, task, 0, spec.checkpoints.replica_timeout)
        run: dict[str, object] = {"status": TaskState.RUNNING, "superstep": 0,
                                  "submitted_at": time.time()}  # fmt: skip
        if spec.budget is not None:  # where `status` and each barrier read it
            run["budget"] = spec.budget.model_dump_json()
        self.runs.write(task, run)
        self.redis.sadd(keys.ACTIVE_TASKS, task)
        wake(self.redis, task)  # its first superstep begins now, not at a look
        log.info("task submitted", task=task, agents=len(spec.agents))
        return task

    def fork(self, source: str, at: int | None = None, spec: TaskSpec | None = None) -> str:
        """Start a new task from GC `at` of `source` (default: its latest); return its id.

        See `cairn.coordinator.fork`. Raises `TaskNotFound` for an unknown source, `InvalidSpec`
        for an absent checkpoint or a spec naming other agents, or naming what no live
        worker has (as `submit`).
        """
        self.require(source)
        if spec is not None:
            check_offers(spec.agents, live_offers(self.redis))
        new = task_id(spec.name if spec is not None else source.rsplit("-", 1)[0])
        fork_task(self.store, self.runs, source, new, at, spec)
        wake(self.redis, new)
        return new

    def current_budget(self, task: str) -> Budget | None:
        """The task's budget: as last set (`budget`), else its spec's (None: unbounded)."""
        raised = cast(bytes | None, self.redis.hget(keys.run(task), "budget"))
        return budget_of(raised, read_limits(self.store, task))

    def require(self, task: str) -> None:
        """Raise `TaskNotFound` (or `InvalidName`) unless `task` is a task Cairn knows."""
        require_task(self.redis, self.store, task)

    def status(self, task: str) -> TaskStatus:
        """The task's status (`TaskNotFound` when Redis has no run state of it)."""
        return task_status(self.redis, self.store, task)

    def list(self) -> list[TaskStatus]:
        """Every task Redis knows, the most recently submitted first."""
        return list_tasks(self.redis, self.store)

    def pause(self, task: str) -> None:
        """Stop starting supersteps; the one in flight finishes and commits."""
        self._move(task, TaskState.PAUSED, only_from=TaskState.RUNNING)

    def resume(self, task: str) -> None:
        """Start supersteps again (a task paused for its budget pauses again unless raised)."""
        self._move(task, TaskState.RUNNING, only_from=TaskState.PAUSED)

    def budget(self, task: str, tokens: int | None = None, cost_usd: float | None = None) -> Budget:
        """Set the task's budget: the limits given, the others kept; return the new budget.

        Read at each barrier; a task paused for its budget goes on once resumed. Raises
        `InvalidSpec` when neither limit is given or one is not positive, `TaskNotFound`
        for an unknown task.
        """
        if tokens is None and cost_usd is None:
            raise InvalidSpec("budget: give tokens, cost_usd or both")
        self.require(task)
        old = self.current_budget(task)
        given = {k: v for k, v in (("tokens", tokens), ("cost_usd", cost_usd)) if v is not None}
        kept = {} if old is None else old.model_dump()
        new = parse_model(Budget, {**kept, **given}, "budget")
        self.runs.write(task, {"budget": new.model_dump_json()})
        log.info("budget set", task=task, tokens=new.tokens, cost_usd=new.cost_usd)
        return new

    def member_budget(
        self,
        task: str,
        agent: str,
        tokens: int | None = None,
        cost_usd: float | None = None,
        steps: int | None = None,
    ) -> MemberBudget:
        """Set the budget of member `agent`'s subtree: the limits given, the others kept.

        Over the spec's (or the last one set); read at each barrier (coordinator/budgets.py).
        Raises `InvalidSpec` when no limit is given or one is not positive, or the latest
        GC has no such member; `TaskNotFound` for an unknown task.
        """
        given = {k: v for k, v in (("tokens", tokens), ("cost_usd", cost_usd), ("steps", steps))
                 if v is not None}  # fmt: skip
        if not given:
            raise InvalidSpec("budget: give tokens, cost_usd, steps or some of them")
        self.require(task)
        gc = self.store.latest_gc(task)
        if gc is None or agent not in gc.members:
            raise InvalidSpec(f"task {task} has no member {agent!r}")
        kept = self.redis.hget(keys.member_budgets(task), agent)
        old: MemberBudget | None
        if kept is not None:
            old = MemberBudget.model_validate_json(cast(bytes, kept))
        else:
            record = self.store.read_doc(task, SPEC_DOC, TaskRecord)
            old = member_spec(record, gc, agent).budget
        base = {} if old is None else old.model_dump()
        new = parse_model(MemberBudget, {**base, **given}, "budget")
        self.redis.hset(keys.member_budgets(task), agent, new.model_dump_json())
        self.runs.write(task, {RAISED_BUDGETS: "1"})  # what a commit reads: no extra look
        log.info("member budget set", task=task, agent=agent, **new.model_dump())
        return new

    def cancel(self, task: str) -> None:
        """End the task now: fence its running steps and abort the superstep in flight.

        Every GC it committed goes to disk, as for any task that ended. Raises
        `TaskNotFound` for an unknown task, `InvalidSpec` for one that has ended already.
        """
        run = self._run(task)
        if run.get("status", "") in TERMINAL:
            raise InvalidSpec(f"task {task} is {run['status']} already: nothing to cancel")
        self.store.raise_epoch(task, self.store.hot.get_epoch(task) + 1)
        if int(run.get("superstep", "0")):
            abort_in_flight(self.runs, self.store, task)
        latest = self.store.hot.latest_gc(task)
        if latest is not None:
            policy = read_policy(self.store, task)
            archive(self.store, ArchiveJob(task, latest, policy.hot_keep, policy.cold_keep))
        self.runs.write(task, {"status": TaskState.CANCELLED, "reason": CANCELLED_REASON})
        self.redis.srem(keys.ACTIVE_TASKS, task)
        log.info("task ended", task=task, status=TaskState.CANCELLED.value, reason=CANCELLED_REASON)

    def archive(self, task: str) -> builtins.list[ArchiveReport]:  # `list` is a method here
        """Archive every committed GC of `task` still only in Redis, oldest first.

        Raises `ArchiveError` (a full or read-only disk) at the first that cannot be
        written; those before it stay archived.
        """
        self.require(task)
        on_disk = set(self.store.cold.list_gcs(task))
        due = [
            info.number
            for info in self.store.hot.list_gcs(task)
            if info.status is GCStatus.COMMITTED and info.number not in on_disk
        ]
        return [archive_gc(self.store, task, number) for number in due]

    def forget(self, task: str) -> int:
        """Remove an ended task from Redis, archived first; return how many keys went.

        What it committed stays in the archive (`cairn workspace` and `fork` read it there;
        `restore` brings the task back from it, as after a lost Redis, its spend counted
        from zero); its run state, hot checkpoints, spend and trace leave Redis, so `status`
        finds only the archive. A step still running (cancelled, it stops at its next write)
        may leave a key or two behind it: forgetting the task again removes them. Raises
        `InvalidSpec` for a task that has not ended or is being restored, `ArchiveError` or
        `CorruptCheckpoint` when a GC could not be archived (then nothing is removed), and
        `TaskNotFound` for a task of which Redis holds nothing.
        """
        pattern = keys.task_prefix(task) + "*"  # no glob character in a name (`check_name`)
        stray = next(iter(self.redis.scan_iter(match=pattern, count=1_000)), None)
        if stray is None:
            self.require(task)
            raise TaskNotFound(f"task {task!r} is not in Redis (only its archive is left)")
        self._ended(task)
        # The restore lock keeps a restore out until the keys are gone (it then finds only
        # the archive); one that holds it already makes this refuse.
        lock = new_id()
        if not self.redis.set(keys.restore_lock(task), lock, nx=True, px=LOCK_TTL_MS):
            raise InvalidSpec(f"task {task} is being restored: forget it once that is done")
        try:
            self.archive(task)
            self._ended(task)  # a restore that ended as the lock was taken may have run it
            aborted = [i.number for i in self.store.hot.list_gcs(task)
                       if i.status is GCStatus.ABORTED]  # fmt: skip
            note_aborted(self.store, task, (self.store.read_gc(task, n) for n in aborted))
        except BaseException:
            if self.redis.get(keys.restore_lock(task)) == lock.encode():
                self.redis.delete(keys.restore_lock(task))
            raise
        self.redis.srem(keys.ACTIVE_TASKS, task)  # first, so no tick claims it back
        found = [cast(bytes, k) for k in self.redis.scan_iter(match=pattern, count=1_000)]
        for start in range(0, len(found), 500):
            self.redis.unlink(*found[start : start + 500])
        removed = len(found) - 1  # the lock taken here is not one of the task's keys
        log.info("task forgotten", task=task, keys=removed)
        return removed

    def _ended(self, task: str) -> None:
        """Raise `InvalidSpec` unless the task has ended (or left only stray keys)."""
        status = self.runs.read(task).get("status", "")
        if status and status not in TERMINAL:
            raise InvalidSpec(
                f"task {task} is {status}: only an ended task can be forgotten (cancel it first)"
            )

    def _run(self, task: str) -> dict[str, str]:
        run = self.runs.read(task)
        if not run:
            self.require(task)
            raise TaskNotFound(f"task {task!r} is not in Redis (only its archive is left)")
        return run

    def _move(self, task: str, state: TaskState, only_from: TaskState) -> None:
        current = self._run(task).get("status")
        if current != only_from:
            raise InvalidSpec(f"task {task} is {current or 'unknown'}, not {only_from.value}")
        self.runs.write(
            task, {"status": state}, forget=["reason"] if state is TaskState.RUNNING else ()
        )
        wake(self.redis, task)
