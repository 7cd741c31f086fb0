"""What happens at a barrier, as data: merge the steps' files, deliver their messages.

`build_gc` reads the LCs voted in a superstep and returns the global checkpoint that
commits them; it writes at most the merged manifest (a content-addressed blob), and not
even that when a step's LC write stored it already. Committing it is the coordinator's
single atomic write.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import ConfigDict, Field

from cairn.agents.approval import decision_for
from cairn.agents.cache import WORKER, WorkerCache
from cairn.agents.workspace import Conflict, manifest_blob, merge
from cairn.storage.ids import new_id
from cairn.storage.records import (
    AgentState,
    GCOrigin,
    GlobalCheckpoint,
    InboxMessage,
    LCRef,
    Message,
    Record,
    Role,
    SpawnRequest,
    ToolCall,
)
from cairn.storage.store import CheckpointStore

SYSTEM_SENDER = "cairn"


class StepOutputs(Record):
    """The part of a step's LC a barrier needs: what it changed, sent, read, and became."""

    model_config = ConfigDict(extra="ignore")

    status: AgentState
    step: int = 0
    inbox_cursor: int = 0
    changes: dict[str, str | None] = Field(default_factory=dict)
    outbox: list[InboxMessage] = Field(default_factory=list)
    spawns: list[SpawnRequest] = Field(default_factory=list)
    workspace_after: str | None = None


@dataclass(frozen=True, slots=True)
class Barrier:
    """A barrier's outcome: the GC to commit and the write conflicts it resolved.

    `spawns` are the members the superstep's steps spawned, (spawner, request) in team
    order: they join when `cairn.agents.joining.join` takes them into `gc`.
    """

    gc: GlobalCheckpoint
    conflicts: list[Conflict]
    spawns: list[tuple[str, SpawnRequest]] = field(default_factory=list)


def build_gc(
    store: CheckpointStore,
    previous: GlobalCheckpoint,
    votes: dict[str, LCRef],
    order: list[str],
    *,
    number: int,
    superstep: int,
    epoch: int,
    notices: list[InboxMessage] | None = None,
    outputs: dict[str, StepOutputs] | None = None,
    warm: WorkerCache = WORKER,
) -> Barrier:
    """Return the GC after `previous` that takes in the voted LCs of `superstep`.

    Change sets merge in `order` (the team's agent order): the later agent wins a path two
    agents wrote, or a file of one that is a directory of the other's, and the earlier one
    gets a message naming the conflict. Messages sent in
    the superstep join the inbox, numbered per recipient; messages each voter has read
    leave it. Agents that did not vote keep their LC from `previous`. `notices` are more
    messages to deliver (a failed verification's output, say). `outputs` holds what the
    caller already read from the voted LCs (see `read_outputs`); the rest are read here.
    `warm` keeps manifests between barriers (this one's is the next one's base).
    """
    task = previous.task
    known = outputs or {}
    missing = {a: ref for a, ref in votes.items() if a not in known}
    fetched = read_outputs(store, task, missing) if missing else {}
    stored = {agent: known.get(agent) or fetched[agent] for agent in order if agent in votes}
    base = warm.manifest(store, task, previous.workspace)
    files, conflicts = merge(base, [(agent, lc.changes) for agent, lc in stored.items()])
    workspace, manifest = manifest_blob(files)
    # A step's LC write stored its manifest with it: with one writer (or none) in the
    # superstep, that (or the previous GC's) is the merged one, and is stored already.
    if workspace not in {previous.workspace, *(lc.workspace_after for lc in stored.values())}:
        store.put_blob(task, manifest)
    warm.keep_manifest(task, workspace, files)

    read = {agent: lc.inbox_cursor for agent, lc in stored.items()}
    inbox = [m for m in previous.inbox if m.seq > read.get(m.recipient, -1)]
    delivered = dict(previous.delivered)
    sent = [m for lc in stored.values() for m in lc.outbox]
    sent += [
        InboxMessage(
            id=new_id(),
            seq=0,
            sender=SYSTEM_SENDER,
            recipient=c.loser,
            superstep=superstep,
            content=conflict_message(c, superstep),
        )
        for c in conflicts
    ]
    sent += notices or []
    for message in sent:
        seq = delivered.get(message.recipient, 0) + 1
        delivered[message.recipient] = seq
        inbox.append(message.model_copy(update={"seq": seq}))
    gc = GlobalCheckpoint(
        task=task,
        number=number,
        superstep=superstep,
        epoch=epoch,
        members={**previous.members, **votes},
        statuses={**previous.statuses, **{agent: lc.status for agent, lc in stored.items()}},
        workspace=workspace,
        inbox=inbox,
        delivered=delivered,
        spawned=previous.spawned,
        origin=GCOrigin.SUPERSTEP,
    )
    spawns = [(agent, request) for agent, lc in stored.items() for request in lc.spawns]
    return Barrier(gc, conflicts, spawns)


def conflict_message(conflict: Conflict, superstep: int) -> str:
    """What the agent whose write did not stay (`conflict.loser`) is told."""
    c = conflict
    if not c.clash:
        return (
            f"Write conflict in superstep {superstep}: you and {c.winner} both wrote "
            f"{c.path}; {c.winner}'s version was kept. Check it before going on."
        )
    by = f"{c.winner} wrote" if c.winner else "the workspace has"
    return (
        f"Write conflict in superstep {superstep}: you wrote {c.path}, but {by} {c.clash}, "
        f"and one path cannot be both a file and a directory: your {c.path} was dropped. "
        "Check the workspace before going on."
    )


def read_outputs(
    store: CheckpointStore, task: str, votes: dict[str, LCRef]
) -> dict[str, StepOutputs]:
    """Read what a barrier needs from each voted LC, every LC verified, in one round trip."""
    return store.read_lcs_fields(task, votes, StepOutputs)


def pending_calls(messages: list[Message]) -> list[ToolCall]:
    """Return the last assistant turn's tool calls that have no result yet."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].role is Role.ASSISTANT:
            done = {m.tool_call_id for m in messages[i + 1 :] if m.role is Role.TOOL}
            return [call for call in messages[i].tool_calls if call.id not in done]
    return []


def runnable(store: CheckpointStore, gc: GlobalCheckpoint, order: list[str]) -> list[str]:
    """Return the agents that take a step in the superstep after `gc`, in team order.

    Active agents run; halted and finished ones run when a message waits for them; one
    waiting for approval runs once a person decided on the pending tool call it stopped at,
    as it waits in its LC of `gc`.
    """
    waiting = {m.recipient for m in gc.inbox}
    chosen = []
    for agent in order:
        status = gc.statuses.get(agent, AgentState.ACTIVE)
        if status is AgentState.WAITING_APPROVAL:
            ref = gc.members[agent]
            state = store.read_state(gc.task, agent, ref.id, ref.checksum)
            calls = pending_calls(state.messages)
            if calls and decision_for(store, gc.task, agent, ref.id, calls[0]) is not None:
                chosen.append(agent)
        elif status is AgentState.ACTIVE or agent in waiting:
            chosen.append(agent)
    return chosen
