"""What the CLI shows of a task, as JSON-ready data: checkpoints, one GC, the trace, files.

Plain functions over the checkpoint store, so `cairn checkpoints --json` prints exactly
what they return and the tables, `watch` and the HTML timeline can be drawn from the same.
Every record read here is verified on the way (the store never hands out one that is not).
"""

from __future__ import annotations

import os
from pathlib import Path

import redis

from agents.approval import decide
from agents.barrier import StepOutputs, pending_calls
from agents.spec import TaskRecord
from agents.workspace import check_path
from coordinator.runs import read_run
from storage.errors import CairnError, InvalidSpec, ToolError
from storage.keys import SPEC_DOC, check_name
from storage.records import AgentStatus, GlobalCheckpoint, ToolCall
from storage.store import CheckpointStore

JSON = dict[str, object]


def require_task(client: redis.Redis, store: CheckpointStore, task: str) -> None:
    """Raise `InvalidSpec` (or `InvalidName`) unless `task` is a task Cairn knows."""
    check_name("task", task)
    if read_run(client, task) or store.hot.get_epoch(task) or store.cold.list_gcs(task):
        return
    raise InvalidSpec(f"unknown task {task!r}")


def status_without_steps(
    client: redis.Redis, store: CheckpointStore, task: str, error: str
) -> JSON:
    """The task's status as `Coordinator.status` gives it, but with no agent's step.

    For a task whose member LCs cannot be read (one that became unrecoverable because
    its checkpoints are lost): `error` says why the steps are missing.
    """
    run = read_run(client, task)
    gc = store.latest_gc(task)
    agents: list[JSON] = []
    if gc is not None:
        agents = [
            {"name": a, "status": gc.statuses.get(a, AgentStatus.ACTIVE).value, "step": None}
            for a in gc.members
        ]
    return {
        "task_id": task,
        "status": run.get("status", "unknown"),
        "superstep": 0 if gc is None else gc.superstep,
        "epoch": store.hot.get_epoch(task),
        "latest_checkpoint": None if gc is None else gc.number,
        "agents": agents,
        "reason": run.get("reason"),
        "verify_output": run.get("verify_output"),
        "error": error,
    }


def team(store: CheckpointStore, task: str) -> list[str]:
    """The task's agents, in team order."""
    return [a.name for a in store.read_doc(task, SPEC_DOC, TaskRecord).agents]


def latest(store: CheckpointStore, task: str) -> GlobalCheckpoint:
    """The task's latest committed GC; `InvalidSpec` when it has none."""
    gc = store.latest_gc(task)
    if gc is None:
        raise InvalidSpec(f"task {task} has no committed checkpoint")
    return gc


def checkpoint_at(store: CheckpointStore, task: str, number: int | None) -> GlobalCheckpoint:
    """GC `number` of the task (the latest committed when None); `InvalidSpec` if absent."""
    if number is None:
        return latest(store, task)
    if number not in {info.number for info in store.list_gcs(task)}:
        raise InvalidSpec(f"task {task} has no checkpoint {number}")
    return store.read_gc(task, number)


def checkpoints(store: CheckpointStore, task: str) -> list[JSON]:
    """Every GC of the task, hot or cold, oldest first, as `cairn checkpoints --json` prints.

    A GC whose record cannot be read whole is still listed, with `error` saying why.
    """
    listed: list[JSON] = []
    for info in store.list_gcs(task):
        entry: JSON = {
            "number": info.number,
            "status": info.status.value,
            "superstep": info.superstep,
            "members": {},
            "hot": info.hot,
            "cold": info.cold,
            "created_at": None,
            "size_bytes": info.size,
        }
        try:
            gc = store.read_gc(task, info.number)
        except CairnError as exc:
            entry["error"] = str(exc)
        else:
            entry["members"] = {agent: ref.id for agent, ref in gc.members.items()}
            entry["created_at"] = gc.created_at.isoformat()
            entry["epoch"] = gc.epoch
        listed.append(entry)
    return listed


def checkpoint(store: CheckpointStore, task: str, number: int) -> JSON:
    """One GC in detail: its record, where it lives, each member's step and the files."""
    info = next((i for i in store.list_gcs(task) if i.number == number), None)
    if info is None:
        raise InvalidSpec(f"task {task} has no checkpoint {number}")
    gc = store.read_gc(task, number)
    try:
        steps = {a: o.step for a, o in store.read_lcs_fields(task, gc.members, StepOutputs).items()}
    except CairnError:  # an aborted GC's tentative LCs are gone: the GC is still shown
        steps = {}
    manifest = store.read_manifest(task, gc.workspace)
    return {
        "number": gc.number,
        "name": gc.name,
        "status": gc.status.value,
        "superstep": gc.superstep,
        "epoch": gc.epoch,
        "created_at": gc.created_at.isoformat(),
        "committed_at": None if gc.committed_at is None else gc.committed_at.isoformat(),
        "hot": info.hot,
        "cold": info.cold,
        "size_bytes": info.size,
        "checksum": gc.checksum,
        "members": {agent: ref.id for agent, ref in gc.members.items()},
        "agents": [
            {
                "name": agent,
                "lc_id": ref.id,
                "checksum": ref.checksum,
                "status": gc.statuses.get(agent, AgentStatus.ACTIVE).value,
                "step": steps.get(agent),
            }
            for agent, ref in gc.members.items()
        ],
        "workspace": gc.workspace,
        "files": dict(sorted(manifest.files.items())),
        "inbox": [m.model_dump(mode="json") for m in gc.inbox],
    }


def trace(store: CheckpointStore, task: str, agent: str | None = None) -> list[JSON]:
    """The trace records of the latest GC's agents (or of one), in the order they happened.

    Ordered by superstep, then start time (agents of one superstep ran in parallel), then
    team order and position in the agent's own trace.
    """
    gc = latest(store, task)
    order = team(store, task)
    if agent is not None and agent not in gc.members:
        raise InvalidSpec(f"task {task} has no agent {agent!r}")
    rows = []
    for rank, name in enumerate(order):
        ref = gc.members.get(name)
        if ref is None or agent not in (None, name):
            continue
        state = store.read_state(task, name, ref.id, ref.checksum)
        for position, record in enumerate(state.trace):
            row: JSON = {"agent": name}
            row.update(record.model_dump(mode="json", exclude={"schema_version"}))
            rows.append(((record.superstep, record.started_at, rank, position), row))
    return [row for _, row in sorted(rows, key=lambda pair: pair[0])]


def export_workspace(store: CheckpointStore, task: str, number: int | None, out: Path) -> JSON:
    """Write the files of GC `number` (else the latest) into the empty or new directory `out`.

    Raises `InvalidSpec` when `out` holds files already, so an export is exactly the
    workspace, and `OSError` when it cannot be written.
    """
    gc = checkpoint_at(store, task, number)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InvalidSpec(f"{out} is not an empty directory: choose a new or empty one")
    manifest = store.read_manifest(task, gc.workspace)
    contents = store.get_blobs(task, manifest.files.values())
    out.mkdir(parents=True, exist_ok=True)
    root = out.resolve()
    for path, sha in sorted(manifest.files.items()):
        try:
            check_path(path)
        except ToolError as exc:
            raise InvalidSpec(f"checkpoint {gc.number} names an unsafe path: {exc}") from None
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(contents[sha])
    return {
        "task_id": task,
        "checkpoint": gc.number,
        "out": os.fspath(out),
        "files": sorted(manifest.files),
    }


def pending_approval(
    store: CheckpointStore, task: str, agent: str, call_id: str | None
) -> ToolCall:
    """The tool call of `agent` waiting for a person (`call_id`, or the first one).

    Raises `InvalidSpec` when the agent is unknown, not waiting, or has no such call.
    """
    gc = latest(store, task)
    ref = gc.members.get(agent)
    if ref is None:
        raise InvalidSpec(f"task {task} has no agent {agent!r}")
    status = gc.statuses.get(agent, AgentStatus.ACTIVE)
    if status is not AgentStatus.WAITING_APPROVAL:
        raise InvalidSpec(f"{agent} of task {task} is not waiting for approval ({status.value})")
    calls = pending_calls(store.read_state(task, agent, ref.id, ref.checksum).messages)
    if not calls:
        raise InvalidSpec(f"{agent} of task {task} has no tool call waiting")
    if call_id is None:
        return calls[0]
    for call in calls:
        if call.id == call_id:
            return call
    raise InvalidSpec(f"{agent} has no pending call {call_id!r}; pending: {[c.id for c in calls]}")


def record_decision(
    store: CheckpointStore,
    task: str,
    agent: str,
    call_id: str | None,
    *,
    approved: bool,
    reason: str = "",
) -> JSON:
    """Approve or reject the agent's waiting tool call; the coordinator then runs it on."""
    call = pending_approval(store, task, agent, call_id)
    decide(store, task, agent, call.id, approved, reason)
    return {
        "task_id": task,
        "agent": agent,
        "call": call.id,
        "tool": call.name,
        "arguments": call.args,
        "approved": approved,
        "reason": reason,
    }
