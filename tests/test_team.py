"""Team membership: the GC's members, in the task record's order (`cairn.agents.team`)."""

from __future__ import annotations

from cairn.agents.spec import AgentSpec, TaskRecord
from cairn.agents.team import team
from cairn.storage.records import GlobalCheckpoint, LCRef


def gc_of(*names: str) -> GlobalCheckpoint:
    """A GC naming an LC for each of `names` (stored members come back sorted by name)."""
    members = {name: LCRef(id=f"lc-{name}", checksum="0" * 64) for name in sorted(names)}
    return GlobalCheckpoint(task="t", number=1, superstep=1, epoch=1, members=members,
                            workspace="w")  # fmt: skip


RECORD = TaskRecord(
    task="t", goal="g",
    agents=[AgentSpec(name=n, model="scripted") for n in ("planner", "coder", "reviewer")],
)  # fmt: skip


def test_the_team_is_the_gc_members_in_the_record_order() -> None:
    """Sorted members read back in spec order: the order write conflicts are decided by."""
    assert ["planner", "coder", "reviewer"] == team(gc_of("coder", "planner", "reviewer"), RECORD)


def test_a_member_the_record_does_not_list_follows_by_name() -> None:
    """One who joined at run time is on the team, after the record's members."""
    gc = gc_of("zed", "coder", "helper", "planner", "reviewer")
    assert ["planner", "coder", "reviewer", "helper", "zed"] == team(gc, RECORD)


def test_an_agent_the_gc_does_not_name_is_not_on_the_team() -> None:
    """The spec lists it; the GC holds no LC of it: not a member at that GC."""
    assert ["planner", "reviewer"] == team(gc_of("reviewer", "planner"), RECORD)
