"""What happened in a task, as a plain data model: steps, checkpoints, failures, restores.

`gather` reads the store (the trace records of the latest GC's agents, as `cairn trace`
does; every GC with its epoch and where it lives, as `cairn checkpoints` does; the
attempt of each member LC) into a `Timeline` of dataclasses, which the CLI draws as a
self-contained HTML page (`cairn trace TASK --html FILE`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import redis
from pydantic import ConfigDict

from coordinator import views
from storage.errors import CairnError, TaskNotFound
from storage.records import AgentStatus, GCStatus, Record
from storage.store import CheckpointStore

RANKED = 5  # rows in each analytics table


class _Attempt(Record):
    """The fields of a member LC that say which attempt of which step it is."""

    model_config = ConfigDict(extra="ignore")

    step: int = 0
    superstep: int = 0
    attempt: int = 1
    epoch: int = 0
    status: AgentStatus = AgentStatus.ACTIVE


@dataclass
class StepCell:
    """One agent's step in one superstep: how long it took, how it went, its tool calls."""

    agent: str
    superstep: int
    step: int
    duration_ms: float = 0.0
    started_at: str | None = None
    attempt: int = 1
    epoch: int | None = None
    agent_status: str | None = None
    tools: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        """`failed` when a record of the step carries an error, `retried`, else `ok`."""
        if self.errors:
            return "failed"
        return "retried" if self.attempt > 1 else "ok"


@dataclass
class CheckpointMark:
    """A global checkpoint: its superstep, epoch, outcome, where it lives, if it restores."""

    number: int
    superstep: int
    status: str
    hot: bool
    cold: bool
    epoch: int | None = None
    created_at: str | None = None
    restore: bool = False  # its epoch rose: it restates an earlier superstep after a restore
    error: str | None = None


@dataclass
class Timeline:
    """Everything the HTML timeline shows of one task."""

    task: str
    status: str
    reason: str | None
    agents: list[str]
    supersteps: list[int]
    cells: list[StepCell]
    checkpoints: list[CheckpointMark]
    slowest: list[StepCell]
    troubled: list[StepCell]
    error: str | None = None  # why the steps are missing, when the trace cannot be read

    def cell(self, agent: str, superstep: int) -> StepCell | None:
        """The agent's step in that superstep, if it ran one the trace remembers."""
        for cell in self.cells:
            if (cell.agent, cell.superstep) == (agent, superstep):
                return cell
        return None

    @property
    def restores(self) -> list[CheckpointMark]:
        """The checkpoints written by a restore."""
        return [mark for mark in self.checkpoints if mark.restore]

    @property
    def retries(self) -> int:
        """How many extra attempts the steps took."""
        return sum(cell.attempt - 1 for cell in self.cells)

    @property
    def failures(self) -> int:
        """How many steps had an error, plus the aborted checkpoints."""
        aborted = sum(1 for mark in self.checkpoints if mark.status == GCStatus.ABORTED.value)
        return sum(1 for cell in self.cells if cell.errors) + aborted


def cells_from_trace(rows: list[dict[str, Any]]) -> dict[tuple[str, int], StepCell]:
    """(agent, superstep) → its step, built from `views.trace` rows.

    The step's record (no tool) gives its duration; without one, the tool calls' sum.
    """
    cells: dict[tuple[str, int], StepCell] = {}
    stepped: set[tuple[str, int]] = set()
    tool_ms: dict[tuple[str, int], float] = {}
    for row in rows:
        key = (str(row["agent"]), int(row["superstep"]))
        cell = cells.get(key)
        if cell is None:
            cell = cells[key] = StepCell(agent=key[0], superstep=key[1], step=int(row["step"]))
            cell.started_at = row.get("started_at")
        duration = float(row.get("duration_ms") or 0.0)
        if row.get("tool") is None:
            stepped.add(key)
            cell.duration_ms = max(cell.duration_ms, duration)
        else:
            cell.tools.append(str(row["tool"]))
            tool_ms[key] = tool_ms.get(key, 0.0) + duration
        if row.get("error"):
            cell.errors.append(str(row["error"]))
    for key, cell in cells.items():
        if key not in stepped:
            cell.duration_ms = tool_ms.get(key, 0.0)
    return cells


def marks(checkpoints: list[views.CheckpointInfo]) -> list[CheckpointMark]:
    """The GCs of `views.checkpoints`, oldest first, a restore marked where epoch rises."""
    found: list[CheckpointMark] = []
    epoch: int | None = None
    for info in sorted(checkpoints, key=lambda c: c.number):
        mark = CheckpointMark(
            number=info.number,
            superstep=info.superstep,
            status=info.status.value,
            hot=info.hot,
            cold=info.cold,
            epoch=info.epoch,
            created_at=None if info.created_at is None else info.created_at.isoformat(),
            error=info.error,
        )
        if mark.epoch is not None:
            mark.restore = epoch is not None and mark.epoch > epoch
            epoch = mark.epoch if epoch is None else max(epoch, mark.epoch)
        found.append(mark)
    return found


def gather(client: redis.Redis, store: CheckpointStore, task: str) -> Timeline:
    """The task's timeline, read from the store; raises `TaskNotFound` for an unknown task."""
    views.require_task(client, store, task)
    try:
        status = views.task_status(client, store, task)
        state, reason = status.state.value, status.reason
    except TaskNotFound:  # only its archive is left
        state, reason = "unknown", None
    checkpoints = marks(views.checkpoints(store, task))
    error = None
    try:
        agents = views.team(store, task)
    except CairnError as exc:
        agents, error = [], str(exc)
    cells: dict[tuple[str, int], StepCell] = {}
    try:
        cells = cells_from_trace(views.trace(store, task))
    except CairnError as exc:
        error = str(exc)
    for mark in checkpoints:  # which attempt of each step its GC kept, and in what epoch
        if mark.status != GCStatus.COMMITTED.value or mark.error:
            continue
        try:
            gc = store.read_gc(task, mark.number)
            members = store.read_lcs_fields(task, gc.members, _Attempt)
        except CairnError:
            continue
        for agent, lc in members.items():
            cell = cells.get((agent, lc.superstep))
            if cell is not None and lc.step == cell.step:
                cell.attempt = max(cell.attempt, lc.attempt)
                cell.epoch, cell.agent_status = lc.epoch, lc.status.value
    for agent, _ in cells:
        if agent not in agents:
            agents.append(agent)
    ordered = sorted(cells.values(), key=lambda c: (c.superstep, _rank(agents, c.agent)))
    supersteps = sorted({c.superstep for c in ordered} | {m.superstep for m in checkpoints})
    slowest = sorted(ordered, key=lambda c: -c.duration_ms)[:RANKED]
    troubled = sorted(
        (c for c in ordered if c.errors or c.attempt > 1),
        key=lambda c: (-(len(c.errors) + c.attempt - 1), c.superstep),
    )[:RANKED]
    return Timeline(
        task=task,
        status=state,
        reason=reason or None,
        agents=agents,
        supersteps=supersteps,
        cells=ordered,
        checkpoints=checkpoints,
        slowest=slowest,
        troubled=troubled,
        error=error,
    )


def _rank(agents: list[str], agent: str) -> int:
    return agents.index(agent) if agent in agents else len(agents)
