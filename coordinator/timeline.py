"""What happened in a task, as a plain data model: steps, checkpoints, failures, restores.

`gather` reads the store (the trace records of the latest GC's agents, as `cairn trace`
does; every GC with its epoch and where it lives, as `cairn checkpoints` does; the
attempt of each member LC) into a `Timeline` of dataclasses. `coordinator.timeline_page`
draws it as a self-contained HTML page (`cairn trace TASK --html FILE`); `live_view`
draws a task's status for `cairn watch`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import redis
from pydantic import ConfigDict
from rich.console import Group
from rich.table import Table
from rich.text import Text

from coordinator import cli_views as views
from coordinator.runs import read_run
from storage.errors import CairnError
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
    """(agent, superstep) → its step, built from `cli_views.trace` rows.

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


def marks(checkpoints: list[dict[str, Any]]) -> list[CheckpointMark]:
    """The GCs of `cli_views.checkpoints`, oldest first, a restore marked where epoch rises."""
    found: list[CheckpointMark] = []
    epoch: int | None = None
    for row in sorted(checkpoints, key=lambda r: int(r["number"])):
        mark = CheckpointMark(
            number=int(row["number"]),
            superstep=int(row["superstep"]),
            status=str(row["status"]),
            hot=bool(row["hot"]),
            cold=bool(row["cold"]),
            epoch=row.get("epoch"),
            created_at=row.get("created_at"),
            error=row.get("error"),
        )
        if mark.epoch is not None:
            mark.restore = epoch is not None and mark.epoch > epoch
            epoch = mark.epoch if epoch is None else max(epoch, mark.epoch)
        found.append(mark)
    return found


def gather(client: redis.Redis, store: CheckpointStore, task: str) -> Timeline:
    """The task's timeline, read from the store; raises `InvalidSpec` for an unknown task."""
    views.require_task(client, store, task)
    run = read_run(client, task)
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
        status=str(run.get("status", "unknown")),
        reason=run.get("reason") or None,
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


# `cairn watch` ---------------------------------------------------------------------------
STYLE = {"succeeded": "green", "running": "cyan", "failed": "red", "unrecoverable": "bold red"}


def watch_line(status: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a status `cairn watch --json` prints (one line each time it changes)."""
    return {
        "task_id": status.get("task_id"),
        "status": status.get("status"),
        "superstep": status.get("superstep"),
        "epoch": status.get("epoch"),
        "latest_checkpoint": status.get("latest_checkpoint"),
        "agents": [
            {"name": a.get("name"), "status": _word(a.get("status")), "step": a.get("step")}
            for a in status.get("agents") or []
        ],
        "reason": status.get("reason"),
    }


def _word(value: object) -> str:
    """A status as its JSON word (`halted`, not `AgentStatus.HALTED`)."""
    return str(value.value) if isinstance(value, Enum) else str(value)


def live_view(status: Mapping[str, Any]) -> Group:
    """A rich view of a task's status: one line, then a table of its agents."""
    line = watch_line(status)
    head = Text.assemble(
        (str(line["task_id"]), "bold"),
        "  ",
        (str(line["status"]), STYLE.get(str(line["status"]), "yellow")),
        f"  superstep {line['superstep']}  epoch {line['epoch']}"
        f"  checkpoint {line['latest_checkpoint']}",
    )
    table = Table("agent", "status", "step", box=None)
    for agent in line["agents"]:
        table.add_row(agent["name"], agent["status"], str(agent["step"]))
    return Group(head, table)
