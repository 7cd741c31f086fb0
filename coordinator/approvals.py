"""The tool calls waiting for a person, and a person's decision on one.

An agent whose step asked for a tool its spec gates (`approve:`) waits, at the latest
committed GC, in `WAITING_APPROVAL`; `pending_approvals` lists its calls, and
`record_decision` approves or rejects one where it waits (`cairn.agents.approval`), after
which the coordinator runs the agent on.
"""

from __future__ import annotations

from typing import Any

from cairn.agents.approval import decide
from cairn.agents.barrier import pending_calls
from cairn.coordinator.gcviews import latest
from cairn.coordinator.viewbase import View
from cairn.errors import InvalidSpec
from cairn.storage.public import public
from cairn.storage.records import AgentState, ToolCall
from cairn.storage.store import CheckpointStore


@public
class Decision(View):
    """A person's decision on an agent's tool call that waited for approval."""

    task_id: str
    agent: str
    call: str
    tool: str
    arguments: dict[str, Any]
    approved: bool
    reason: str


@public
class PendingCall(View):
    """A tool call an agent waits on a person for (`cairn approvals --json`)."""

    task_id: str
    agent: str
    call: str
    tool: str
    arguments: dict[str, Any]


def pending_approval(
    store: CheckpointStore, task: str, agent: str, call_id: str | None
) -> tuple[str, ToolCall]:
    """The LC `agent` waits in and its tool call waiting for a person (`call_id`, or the first).

    Raises `InvalidSpec` when the agent is unknown, not waiting, or has no such call.
    """
    gc = latest(store, task)
    ref = gc.members.get(agent)
    if ref is None:
        raise InvalidSpec(f"task {task} has no agent {agent!r}")
    status = gc.statuses.get(agent, AgentState.ACTIVE)
    if status is not AgentState.WAITING_APPROVAL:
        raise InvalidSpec(f"{agent} of task {task} is not waiting for approval ({status.value})")
    calls = pending_calls(store.read_state(task, agent, ref.id, ref.checksum).messages)
    if not calls:
        raise InvalidSpec(f"{agent} of task {task} has no tool call waiting")
    if call_id is None:
        return ref.id, calls[0]
    for call in calls:
        if call.id == call_id:
            return ref.id, call
    raise InvalidSpec(f"{agent} has no pending call {call_id!r}; pending: {[c.id for c in calls]}")


def pending_approvals(store: CheckpointStore, task: str) -> list[PendingCall]:
    """Every tool call of the task's agents that waits for a person, in team order.

    Read at the latest committed GC, where a waiting agent waits; none before the first.
    """
    gc = store.latest_gc(task)
    if gc is None:
        return []
    found: list[PendingCall] = []
    for agent, ref in gc.members.items():
        if gc.statuses.get(agent, AgentState.ACTIVE) is not AgentState.WAITING_APPROVAL:
            continue
        messages = store.read_state(task, agent, ref.id, ref.checksum).messages
        found.extend(
            PendingCall(task_id=task, agent=agent, call=c.id, tool=c.name, arguments=c.args)
            for c in pending_calls(messages)
        )
    return found


def record_decision(
    store: CheckpointStore,
    task: str,
    agent: str,
    call_id: str | None,
    *,
    approved: bool,
    reason: str = "",
) -> Decision:
    """Approve or reject the agent's waiting tool call; the coordinator then runs it on.

    The decision holds for that call where it waits now, and for no other (`cairn.agents.approval`).
    """
    at, call = pending_approval(store, task, agent, call_id)
    decide(store, task, agent, at, call, approved, reason)
    return Decision(
        task_id=task,
        agent=agent,
        call=call.id,
        tool=call.name,
        arguments=call.args,
        approved=approved,
        reason=reason,
    )
