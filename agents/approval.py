"""Approvals: a person's yes or no to a tool call an agent may not make alone.

A decision holds for one call waiting in one place and for nothing else. It names the
call by its id, its tool and the digest of its arguments (`call_digest`), and the place by
the LC the agent waits in (its member in the GC that shows the call pending). Each
decision is a document of its own, named from all four, so no other call can find it:
not a later call whose id repeats (an id-less server's), not another call of the same
turn, not the same call after a restore (which stages the agent as a new LC, so a person
is asked again). The step that starts from that LC uses it, as do the step's retries
(they start from there too); once the step's vote is in, the step consumes it.
"""

from __future__ import annotations

import hashlib
import json

from cairn.agents.tools import call_digest
from cairn.errors import RecordNotFound
from cairn.storage.records import Record, ToolCall
from cairn.storage.store import CheckpointStore


class Approval(Record):
    """A decision on one tool call; a rejection's reason is what the model reads."""

    agent: str
    at: str  # the id of the LC the call waits in
    tool_call_id: str
    tool: str
    digest: str  # call_digest(tool, args)
    approved: bool
    reason: str = ""


def doc_name(agent: str, at: str, call: ToolCall) -> str:
    """The task document holding the decision on `agent`'s `call`, waiting in LC `at`."""
    identity = json.dumps([agent, at, call.id, call_digest(call.name, call.args)])
    return "approval-" + hashlib.sha256(identity.encode()).hexdigest()[:40]


def decide(
    store: CheckpointStore,
    task: str,
    agent: str,
    at: str,
    call: ToolCall,
    approved: bool,
    reason: str = "",
) -> Approval:
    """Record a person's decision on `agent`'s `call`, pending in LC `at`; return it."""
    decision = Approval(
        agent=agent,
        at=at,
        tool_call_id=call.id,
        tool=call.name,
        digest=call_digest(call.name, call.args),
        approved=approved,
        reason=reason,
    )
    store.put_doc(task, doc_name(agent, at, call), decision)
    return decision


def decision_for(
    store: CheckpointStore, task: str, agent: str, at: str, call: ToolCall
) -> Approval | None:
    """Return the decision on `call` waiting in LC `at`, or None while nobody has decided."""
    try:
        decision = store.read_doc(task, doc_name(agent, at, call), Approval)
    except RecordNotFound:
        return None
    about = (decision.agent, decision.at, decision.tool_call_id, decision.tool, decision.digest)
    wanted = (agent, at, call.id, call.name, call_digest(call.name, call.args))
    return decision if about == wanted else None


def consume(store: CheckpointStore, task: str, agent: str, at: str, call: ToolCall) -> None:
    """Delete the decision on `call` waiting in LC `at`: it was used and holds no more."""
    store.delete_doc(task, doc_name(agent, at, call))
