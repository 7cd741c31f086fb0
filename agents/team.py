"""Who is on a task's team at a global checkpoint, and in which order.

The team at a GC is its members: the agents the GC names an LC of. That is what every
part of Cairn reads (the coordinator's plan, the barrier's conflict order, a restore, a
fork, the views), never the spec as it was submitted; so a member that joins between two
GCs is what the protocol already commits, restores, forks and diffs, an LC in a GC.
The order is the task record's (the spec's `agents`, which decides write conflicts),
then any member the record does not list, by name.
"""

from __future__ import annotations

from cairn.agents.spec import TaskRecord
from cairn.storage.records import GlobalCheckpoint


def team(gc: GlobalCheckpoint, record: TaskRecord) -> list[str]:
    """The members of `gc`, in team order (see the module's docstring)."""
    order = {spec.name: place for place, spec in enumerate(record.agents)}
    last = len(order)
    return sorted(gc.members, key=lambda name: (order.get(name, last), name))
