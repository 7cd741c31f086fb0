"""What a user sees of a task: its status, its result, its trace, its calls awaiting a person.

Every answer is typed: pydantic models (`TaskStatus`, `TaskResult`, `TraceEntry`,
`PendingCall`, ...) whose JSON is what `cairn status --json` and its siblings print. Plain
functions over Redis and the checkpoint store, so the Python API, the CLI, `watch` and the
HTML timeline all read a task the same way (its checkpoints: `gcviews`). Every record read
here is verified on the way (the store never hands out one that is not).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import cast

import redis
from pydantic import ConfigDict, Field, JsonValue

from cairn.agents.accounting import Budget
from cairn.agents.results import latest_result
from cairn.agents.spec import TaskRecord
from cairn.agents.team import spawned_by
from cairn.agents.team import team as team_at
from cairn.coordinator.budgets import held_members
from cairn.coordinator.failures import StepFailure, read_failures, troubles
from cairn.coordinator.gcviews import checkpoint_at, latest
from cairn.coordinator.runs import RESTORING, TaskState, read_run
from cairn.coordinator.spend import in_flight, read_spend, replayed, total
from cairn.coordinator.viewbase import IsoTime, View
from cairn.errors import CairnError, CheckpointNotFound, InvalidSpec, NoResult, TaskNotFound
from cairn.storage import keys
from cairn.storage.keys import SPEC_DOC, check_name
from cairn.storage.public import public
from cairn.storage.records import (
    AgentResult,
    AgentState,
    Effects,
    GCStatus,
    GlobalCheckpoint,
    Record,
    Usage,
)
from cairn.storage.store import CheckpointStore


class Tokens(View):
    """Tokens and what they cost (US dollars, at the task's prices)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: float = 0.0

    @property
    def tokens(self) -> int:
        """Prompt plus completion tokens (what a budget counts)."""
        return self.prompt_tokens + self.completion_tokens

    @classmethod
    def of(cls, usage: Usage) -> Tokens:
        """The view of a usage."""
        return cls(**usage.model_dump())


class Spending(Tokens):
    """What model calls spent (only rises), and the part of it whose work was discarded."""

    replayed: Tokens = Field(default_factory=Tokens)


@public
class AgentStatus(View):
    """One agent of a task: its status at the latest checkpoint, its step count, its spend."""

    name: str
    status: AgentState
    step: int | None  # None when its checkpoint cannot be read (see `TaskStatus.error`)
    usage: Spending = Field(default_factory=Spending)
    # The member that spawned it; None (and left out of the JSON): the task's spec lists it.
    spawned_by: str | None = Field(default=None, exclude_if=lambda parent: parent is None)
    # Why it takes no step: its subtree's budget is reached (coordinator/budgets.py).
    held: str | None = Field(default=None, exclude_if=lambda why: why is None)
    # Its steps' retries and latest failure, as recorded while they happen (failures.py);
    # left out of the JSON while it has none, as `held` is.
    retries: int = Field(default=0, exclude_if=lambda retries: retries == 0)
    last_error: StepFailure | None = Field(default=None, exclude_if=lambda last: last is None)


@public
class Lineage(View):
    """Where a forked task started: the source task and its global checkpoint."""

    task_id: str
    checkpoint: int


@public
class TaskResult(View):
    """A task's result: the value, the agent whose `finish` gave it, when, and where it is read."""

    value: JsonValue
    agent: str
    superstep: int  # the superstep whose `finish` gave it
    checkpoint: int  # the global checkpoint it is read at


@public
class TaskStatus(View):
    """A task's status: its state, where it is, its agents, and why it ended."""

    task_id: str
    state: TaskState = Field(alias="status")
    superstep: int  # the latest committed GC's
    epoch: int
    latest_checkpoint: int | None
    agents: list[AgentStatus]
    running_superstep: int | None = None  # the superstep in flight; None between supersteps
    restoring: bool = False  # a restore is running (the task is `running` meanwhile)
    reason: str | None = None
    verify_output: str | None = None
    error: str | None = None  # why the agents' steps are unknown, when they are
    forked_from: Lineage | None = None
    usage: Spending = Field(default_factory=Spending)  # the agents' together
    budget: Budget | None = None
    submitted_at: IsoTime | None = None  # None for a task whose submit is still under way
    # The result at the latest checkpoint, once an agent gave one (left out until then).
    result: TaskResult | None = Field(default=None, exclude_if=lambda result: result is None)

    @property
    def ended(self) -> bool:
        """True once the task succeeded, failed, was cancelled or is unrecoverable."""
        return self.state.ended


@public
class RestoreResult(View):
    """A restore's outcome: the checkpoint restored, the new one recording it, the epoch."""

    restored_to: int
    epoch: int
    checkpoint: int


@public
class Export(View):
    """Where a checkpoint's files were written, which, and which were left out (git's)."""

    task_id: str
    checkpoint: int
    out: str
    files: list[str]
    left_out: list[str] = Field(default_factory=list)


@public
class TraceEntry(View):
    """One model turn (`tool` is None) or tool call of an agent, as `cairn trace` lists it."""

    agent: str
    step: int
    superstep: int
    tool: str | None
    arguments: dict[str, JsonValue]
    result: JsonValue
    side_effect: bool  # the call's effects are external
    effects: Effects | None  # a tool call's; None for the model's turn
    idempotency_key: str | None  # an external call's, the same on every retry and replay
    error: str | None
    started_at: datetime
    finished_at: datetime
    duration_ms: float
    usage: Usage | None
    compacted: int | None = None  # a compaction's: the messages it left out of what is sent


def require_task(client: redis.Redis, store: CheckpointStore, task: str) -> None:
    """Raise `TaskNotFound` (or `InvalidName`) unless `task` is a task Cairn knows."""
    check_name("task", task)
    if read_run(client, task) or store.hot.get_epoch(task) or store.cold.list_gcs(task):
        return
    raise TaskNotFound(f"unknown task {task!r}")


def task_status(client: redis.Redis, store: CheckpointStore, task: str) -> TaskStatus:
    """The task's status; its agents' steps are None (and `error` says why) when unreadable.

    A task that became unrecoverable may have lost its checkpoints: its status still shows.
    Raises `TaskNotFound` for a task Redis has no run state of.
    """
    run = read_run(client, task)
    if not run:
        require_task(client, store, task)
        raise TaskNotFound(f"task {task!r} is not in Redis (only its archive is left)")
    error: str | None = None
    gc: GlobalCheckpoint | None = None
    try:
        gc = store.latest_gc(task)
    except CairnError as exc:
        error = str(exc)
    agents: list[AgentStatus] = []
    result: TaskResult | None = None
    usage: dict[str, Spending] = {}
    if gc is not None:
        members: dict[str, _Member] = {}
        try:
            members = store.read_lcs_fields(task, gc.members, _Member)
            if any(member.result is not None for member in members.values()):
                result = _result_of(store, gc, members)
        except CairnError as exc:
            error = str(exc)
        usage = _spending(client, store, task, run, gc, members)
        parents = spawned_by(gc)
        holding = held_members(client, store, task, gc)
        trouble = troubles(read_failures(client, task))
        agents = [
            AgentStatus(
                name=agent,
                status=gc.statuses.get(agent, AgentState.ACTIVE),
                step=members[agent].step if agent in members else None,
                usage=usage[agent],
                spawned_by=parents.get(agent),
                held=holding.get(agent),
                retries=trouble[agent][0] if agent in trouble else 0,
                last_error=trouble[agent][1] if agent in trouble else None,
            )
            for agent in gc.members
        ]
    raw = run.get("status") or TaskState.RUNNING.value  # none yet: a submit in progress
    restoring = raw == RESTORING
    state = TaskState.RUNNING if restoring else TaskState(raw)
    if state is TaskState.RUNNING and any(a.status is AgentState.WAITING_APPROVAL for a in agents):
        state = TaskState.WAITING_APPROVAL
    return TaskStatus(
        task_id=task,
        state=state,
        superstep=0 if gc is None else gc.superstep,
        epoch=store.hot.get_epoch(task),
        latest_checkpoint=None if gc is None else gc.number,
        agents=agents,
        running_superstep=None if state.ended else int(run.get("superstep") or 0) or None,
        restoring=restoring,
        reason=run.get("reason"),
        verify_output=run.get("verify_output"),
        error=error,
        forked_from=Lineage.model_validate_json(run["forked_from"])
        if "forked_from" in run
        else None,
        usage=_together(list(usage.values())),  # members a restore removed too
        budget=Budget.model_validate_json(run["budget"]) if "budget" in run else None,
        submitted_at=_instant(run.get("submitted_at")),
        result=result,
    )


def _instant(seconds: str | None) -> datetime | None:
    """A Unix time as Redis keeps it, as an aware datetime."""
    return None if not seconds else datetime.fromtimestamp(float(seconds), tz=UTC)


class _Member(Record):
    """The fields of a member LC a status shows: its step, its history's model usage."""

    model_config = ConfigDict(extra="ignore")

    step: int = 0
    usage: Usage | None = None  # None in a record of schema 1 (see storage/upcast.py)
    result: AgentResult | None = None


def task_result(store: CheckpointStore, task: str, number: int | None = None) -> TaskResult:
    """The task's result at GC `number` (default: the latest committed).

    Raises `NoResult` when the task declares none or no agent has given one by then, and
    `CheckpointNotFound` for a checkpoint the task has not committed.
    """
    if store.read_doc(task, SPEC_DOC, TaskRecord).result is None:
        raise NoResult(f"task {task} declares no result")
    gc = checkpoint_at(store, task, number)
    if gc.status is not GCStatus.COMMITTED:
        raise CheckpointNotFound(f"task {task} has no committed checkpoint {number}")
    found = _result_of(store, gc, store.read_lcs_fields(task, gc.members, _Member))
    if found is None:
        at = "" if number is None else f" at checkpoint {number}"
        raise NoResult(f"task {task} has no result yet: no agent has finished with one{at}")
    return found


def _result_of(
    store: CheckpointStore, gc: GlobalCheckpoint, members: dict[str, _Member]
) -> TaskResult | None:
    """The task's result at `gc`, whose members' LCs are `members` (`latest_result`).

    None when no member gave one, or the task (a fork given another spec) declares none.
    """
    record = store.read_doc(gc.task, SPEC_DOC, TaskRecord)
    given = {agent: member.result for agent, member in members.items()}
    found = latest_result(given, team_at(gc, record)) if record.result is not None else None
    if found is None:
        return None
    agent, result = found
    return TaskResult(value=result.value, agent=agent, superstep=result.superstep,
                      checkpoint=gc.number)  # fmt: skip


def _spending(
    client: redis.Redis,
    store: CheckpointStore,
    task: str,
    run: dict[str, str],
    gc: GlobalCheckpoint,
    members: dict[str, _Member],
) -> dict[str, Spending]:
    """Each agent's spend and the replayed part of it (coordinator/spend.py)."""
    spent, inherited = read_spend(client, task)
    steps = cast(dict[bytes, bytes], client.hgetall(keys.steps(task)))
    flying = in_flight(client, task, run, {k.decode(): v.decode() for k, v in steps.items()})
    found: dict[str, Spending] = {}
    for agent, ref in gc.members.items():
        member = members.get(agent)
        history = member.usage if member is not None else None
        if history is None and member is not None:  # schema 1: add up the trace
            history = store.read_state(task, agent, ref.id, ref.checksum).usage
        mine = spent.get(agent, Usage())
        lost = replayed(mine, history or Usage(), inherited.get(agent), flying.get(agent))
        found[agent] = Spending(**mine.model_dump(), replayed=Tokens.of(lost))
    # A member a restore removed (spawned after the GC it went back to) spent what it
    # spent: all of it replayed, and the task's spend never falls.
    for agent, mine in spent.items():
        if agent not in gc.members:
            found[agent] = Spending(**mine.model_dump(), replayed=Tokens.of(mine))
    return found


def _together(usages: list[Spending]) -> Spending:
    """The agents' spending added up."""
    spent = total(Usage(**u.model_dump(exclude={"replayed"})) for u in usages)
    lost = total(Usage(**u.replayed.model_dump()) for u in usages)
    return Spending(**spent.model_dump(), replayed=Tokens.of(lost))


def list_tasks(client: redis.Redis, store: CheckpointStore) -> list[TaskStatus]:
    """The status of every task Redis knows, the most recently submitted first."""
    found: list[tuple[float, str]] = []
    for key in client.scan_iter(match=keys.RUNS, count=1_000):
        task = keys.task_of_run(cast(bytes, key).decode())
        submitted = cast(bytes | None, client.hget(key, "submitted_at"))
        found.append((float(submitted or 0), task))
    listed = []
    for _, task in sorted(found, reverse=True):
        try:
            listed.append(task_status(client, store, task))
        except TaskNotFound:  # deleted since the scan
            continue
    return listed


def team(store: CheckpointStore, task: str) -> list[str]:
    """The task's agents at its latest GC, in team order (`cairn.agents.team`)."""
    return team_at(latest(store, task), store.read_doc(task, SPEC_DOC, TaskRecord))


def trace(store: CheckpointStore, task: str, agent: str | None = None) -> list[TraceEntry]:
    """The trace records of the latest GC's agents (or of one), in the order they happened.

    Ordered by superstep, then start time (agents of one superstep ran in parallel), then
    team order and position in the agent's own trace.
    """
    gc = latest(store, task)
    order = team_at(gc, store.read_doc(task, SPEC_DOC, TaskRecord))
    if agent is not None and agent not in gc.members:
        raise InvalidSpec(f"task {task} has no agent {agent!r}")
    rows = []
    for rank, name in enumerate(order):
        ref = gc.members.get(name)
        if ref is None or agent not in (None, name):
            continue
        state = store.read_state(task, name, ref.id, ref.checksum)
        for position, record in enumerate(state.trace):
            row = TraceEntry(agent=name, **record.model_dump(exclude={"schema_version"}))
            rows.append(((record.superstep, record.started_at, rank, position), row))
    return [row for _, row in sorted(rows, key=lambda pair: pair[0])]
