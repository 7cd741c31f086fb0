"""Members who join at a barrier: the spawns a superstep's steps recorded, made real.

`join` takes a barrier's GC and the spawns its steps recorded (`cairn.agents.spawn`),
in team order, and for each one it admits names the new member's first LC in the GC,
with its spec and its spawner (`GlobalCheckpoint.spawned`); it is runnable in the next
superstep. The spawning step wrote that LC before it voted, as every step writes its
own; for a request without one (recorded by code that wrote none) the barrier writes
it, fenced under its epoch, all of them in one round trip. A spawn
whose name another member took first (in this superstep too), or past the task's
`member_limit`, is refused: its spawner gets a message saying why. The commit of the GC
is what makes a member a member: a GC that is not committed leaves its first LC an
orphan, swept as any tentative LC.
"""

from __future__ import annotations

from cairn.agents.barrier import SYSTEM_SENDER, Barrier
from cairn.agents.logs import get_logger
from cairn.agents.spawn import first_state
from cairn.agents.spec import AgentSpec, TaskRecord
from cairn.storage.ids import new_id
from cairn.storage.records import (
    AgentState,
    InboxMessage,
    Spawned,
    SpawnRequest,
)
from cairn.storage.store import CheckpointStore

log = get_logger(__name__)


def join(store: CheckpointStore, barrier: Barrier, record: TaskRecord) -> Barrier:
    """`barrier` with the members its steps spawned admitted into its GC (see the module)."""
    if not barrier.spawns:
        return barrier
    gc = barrier.gc
    members, statuses = dict(gc.members), dict(gc.statuses)
    spawned, refusals, first = dict(gc.spawned), [], []
    taken = set(members)
    for parent, request in barrier.spawns:
        why = _refusal(request, taken, record.member_limit)
        if why is not None:
            refusals.append(
                _message(parent, gc.superstep, f"Spawn of {request.name} refused: {why}")
            )
            log.info("spawn refused", task=gc.task, parent=parent, member=request.name, why=why)
            continue
        if request.lc is not None:  # the spawning step wrote it: named, not written
            members[request.name] = request.lc
        else:
            spec = AgentSpec.model_validate(request.spec)  # checked when the step recorded it
            first.append(first_state(gc.task, gc.epoch, gc.superstep, gc.workspace, spec,
                                     parent, request.brief))  # fmt: skip
        taken.add(request.name)
        statuses[request.name] = AgentState.ACTIVE
        spawned[request.name] = Spawned(parent=parent, superstep=gc.superstep, spec=request.spec)
    if first:  # every first LC left to write in one round trip
        refs = store.write_first_lcs(first)
        members.update((state.agent, ref) for state, ref in zip(first, refs, strict=True))
    parents = {name: joined.parent for name, joined in spawned.items() if name not in gc.spawned}
    if parents:  # one log line, however many join
        log.info("members joined", task=gc.task, superstep=gc.superstep, spawned_by=parents)
    inbox, delivered = list(gc.inbox), dict(gc.delivered)
    for message in refusals:
        seq = delivered.get(message.recipient, 0) + 1
        delivered[message.recipient] = seq
        inbox.append(message.model_copy(update={"seq": seq}))
    joined = gc.model_copy(update={"members": members, "statuses": statuses,
                                   "spawned": spawned, "inbox": inbox,
                                   "delivered": delivered})  # fmt: skip
    return Barrier(joined, barrier.conflicts, barrier.spawns)


def _refusal(request: SpawnRequest, taken: set[str], limit: int) -> str | None:
    """Why the barrier refuses `request` when `taken` are the members so far, or None."""
    if request.name in taken:
        return f"the name {request.name!r} was taken first (in this superstep)"
    if len(taken) >= limit:
        return f"the task holds at most {limit} members (max_agents), and holds {len(taken)}"
    return None


def _message(recipient: str, superstep: int, content: str) -> InboxMessage:
    return InboxMessage(id=new_id(), seq=0, sender=SYSTEM_SENDER, recipient=recipient,
                        superstep=superstep, content=content)  # fmt: skip
