"""Who is on a task's team at a global checkpoint, and in which order.

The team at a GC is its members: the agents the GC names an LC of. That is what every
part of Cairn reads (the coordinator's plan, the barrier's conflict order, a restore, a
fork, the views), never the spec as it was submitted; so a member that joins between two
GCs is what the protocol already commits, restores, forks and diffs, an LC in a GC.
The order is the task record's (the spec's `agents`, which decides write conflicts),
then any member the record does not list, by name.

A member spawned at run time (`cairn.agents.spawn`) has its spec in the GC it joined at
(`GlobalCheckpoint.spawned`), carried by every GC after: `member_spec` finds a member's
spec there or in the record, so a restore to a GC before the spawn forgets it with the
member, and a fork carries it.
"""

from __future__ import annotations

from cairn.agents.spec import AgentSpec, TaskRecord
from cairn.errors import InvalidSpec
from cairn.storage.records import GlobalCheckpoint


def team(gc: GlobalCheckpoint, record: TaskRecord) -> list[str]:
    """The members of `gc`, in team order (see the module's docstring)."""
    order = {spec.name: place for place, spec in enumerate(record.agents)}
    last = len(order)
    return sorted(gc.members, key=lambda name: (order.get(name, last), name))


def member_spec(record: TaskRecord, gc: GlobalCheckpoint, name: str) -> AgentSpec:
    """The spec of member `name` at `gc`: the one it was spawned with, else the record's.

    Raises `InvalidSpec` when neither has one.
    """
    joined = gc.spawned.get(name)
    if joined is None:
        return record.agent(name)
    try:
        return AgentSpec.model_validate(joined.spec)
    except ValueError as exc:  # checked when spawned: only a record of other code fails here
        raise InvalidSpec(f"member {name}'s spawned spec does not parse: {exc}") from None


def spawned_by(gc: GlobalCheckpoint) -> dict[str, str]:
    """Each member of `gc` that was spawned at run time → the member that spawned it."""
    return {name: joined.parent for name, joined in gc.spawned.items() if name in gc.members}
