"""Budgets per member: a member and the members it spawned may spend so much, no more.

A member's `budget` (its spec's, or as last raised with `Task.budget(agent=...)`) limits
its *subtree*: itself and every member it spawned, theirs too, as the GC's `spawned` map
says. Tokens and dollars are what their model calls spent, replays included (the spend
counters, as the task's budget counts them); steps are the steps their checkpoints hold,
on the task's current line. A subtree that reached its budget is *held*: its members take
no step, while the rest of the team goes on; when only held members have work left, the
task pauses, its reason naming them. A member removed by a restore no longer counts
toward its spawner's subtree; its spend stays in the task's total.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

import redis
from pydantic import ConfigDict

from cairn.agents.accounting import MemberBudget
from cairn.agents.spec import TaskRecord
from cairn.agents.team import member_spec, spawned_by
from cairn.coordinator.spend import read_spend, total
from cairn.storage import keys
from cairn.storage.keys import SPEC_DOC
from cairn.storage.records import GlobalCheckpoint, Record, Usage
from cairn.storage.store import CheckpointStore


class _Steps(Record):
    """The one field of an LC a steps budget reads."""

    model_config = ConfigDict(extra="ignore")

    step: int = 0


@dataclass(frozen=True, slots=True)
class Held:
    """A subtree that reached its budget: its root, its members, and what was reached."""

    root: str
    members: frozenset[str]
    reached: str

    @property
    def reason(self) -> str:
        """Why its members take no step, in one line."""
        return f"the budget of {self.root}'s subtree is reached: {self.reached}"


def subtree(gc: GlobalCheckpoint, root: str) -> set[str]:
    """`root` and every member of `gc` it spawned, directly or not."""
    parents = spawned_by(gc)
    found = {root}
    grew = True
    while grew:
        more = {child for child, parent in parents.items() if parent in found} - found
        found |= more
        grew = bool(more)
    return found


def budgets(
    record: TaskRecord, gc: GlobalCheckpoint, raised: Mapping[str, str]
) -> dict[str, MemberBudget]:
    """Each member of `gc` with a budget → it: as raised (`raised`), else its spec's."""
    found: dict[str, MemberBudget] = {}
    for member in gc.members:
        kept = raised.get(member)
        budget = (MemberBudget.model_validate_json(kept) if kept is not None
                  else member_spec(record, gc, member).budget)  # fmt: skip
        if budget is not None:
            found[member] = budget
    return found


def held(
    store: CheckpointStore,
    record: TaskRecord,
    gc: GlobalCheckpoint,
    raised: Mapping[str, str],
    spent: Mapping[str, Usage],
) -> list[Held]:
    """The subtrees of `gc` that reached their budgets (none when no member has one).

    Reads the subtree's checkpoints' step counts only for a budget of steps.
    """
    limits = budgets(record, gc, raised)
    if not limits:
        return []
    trees = {root: subtree(gc, root) for root in limits}
    counted = set().union(*(trees[r] for r, b in limits.items() if b.steps is not None))
    refs = {member: gc.members[member] for member in counted}
    steps = {m: view.step for m, view in store.read_lcs_fields(gc.task, refs, _Steps).items()}
    found = []
    for root, budget in limits.items():
        members = trees[root]
        usage = total(spent.get(member, Usage()) for member in members)
        reached = budget.over(usage, sum(steps.get(member, 0) for member in members))
        if reached is not None:
            found.append(Held(root, frozenset(members), reached))
    return found


def held_members(
    client: redis.Redis, store: CheckpointStore, task: str, gc: GlobalCheckpoint
) -> dict[str, str]:
    """Each member of `gc` a subtree's budget holds → why, as a status shows it.

    Reads nothing more for a task none of whose members can have a budget.
    """
    record = store.read_doc(task, SPEC_DOC, TaskRecord)
    kept = cast(dict[bytes, bytes], client.hgetall(keys.member_budgets(task)))
    raised = {k.decode(): v.decode() for k, v in kept.items()}
    if not raised and not gc.spawned and all(a.budget is None for a in record.agents):
        return {}
    spent = read_spend(client, task)[0]
    return {member: each.reason for each in held(store, record, gc, raised, spent)
            for member in each.members}  # fmt: skip
