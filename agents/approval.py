"""Approvals: a person's yes or no to a tool call an agent may not make alone."""

from __future__ import annotations

from storage.errors import RecordNotFound
from storage.records import Record
from storage.store import CheckpointStore


class Approval(Record):
    """A decision on one tool call; a rejection's reason is what the model reads."""

    agent: str
    tool_call_id: str
    approved: bool
    reason: str = ""


def doc_name(agent: str) -> str:
    """The task document holding `agent`'s latest decision."""
    return f"approval-{agent}"


def decide(
    store: CheckpointStore,
    task: str,
    agent: str,
    tool_call_id: str,
    approved: bool,
    reason: str = "",
) -> None:
    """Record a person's decision on `agent`'s pending tool call."""
    decision = Approval(agent=agent, tool_call_id=tool_call_id, approved=approved, reason=reason)
    store.put_doc(task, doc_name(agent), decision)


def decision_for(
    store: CheckpointStore, task: str, agent: str, tool_call_id: str
) -> Approval | None:
    """Return the decision on this tool call, or None while nobody has decided."""
    try:
        decision = store.read_doc(task, doc_name(agent), Approval)
    except RecordNotFound:
        return None
    return decision if decision.tool_call_id == tool_call_id else None
