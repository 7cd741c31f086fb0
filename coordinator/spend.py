"""What a task's model calls spent, what of it was replayed, and whether its budget is reached.

Workers count each step attempt's model call as it returns (`HotStore.record_spend`:
counters per agent that only rise, kept apart from the restorable state). The restorable
state holds the usage of the history itself: every LC carries the running total of its
agent's history. So, per agent:

    replayed = spent - (history - inherited) - in flight

`history` is the total in the agent's LC of the latest committed GC, `inherited` what a
fork's history held when it was forked (spent by its source, not by it), `in flight` what
the current attempts of the superstep running have spent (not committed yet, not
discarded either). Whatever else was spent bought work that a retry, a rollback or a
restore discarded.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import cast

import redis

from cairn.agents.accounting import Budget
from cairn.coordinator.spec import Limits
from cairn.storage import keys
from cairn.storage.records import Usage

BUDGET_REASON = "budget"  # a paused task's reason when its budget was reached
RAISED_BUDGETS = "member_budgets"  # the run state's mark: some member's budget was raised
INHERITED = "inherited:"
KINDS = ("prompt_tokens", "completion_tokens", "cached_tokens", "cost_usd")


def total(usages: Iterable[Usage]) -> Usage:
    """The usages together."""
    found = Usage()
    for usage in usages:
        found = found.plus(usage)
    return found


def read_spend(client: redis.Redis, task: str) -> tuple[dict[str, Usage], dict[str, Usage]]:
    """Per agent: what it spent (this task's calls) and what its history inherited."""
    return parse_spend(cast(dict[bytes, bytes], client.hgetall(keys.spend(task))))


def parse_spend(raw: Mapping[bytes, bytes]) -> tuple[dict[str, Usage], dict[str, Usage]]:
    """`read_spend` of the task's spend hash as read."""
    own: dict[str, dict[str, float]] = {}
    inherited: dict[str, dict[str, float]] = {}
    for field, value in raw.items():
        name = field.decode()
        into = inherited if name.startswith(INHERITED) else own
        agent, _, kind = name.removeprefix(INHERITED).rpartition(":")
        if kind in KINDS:
            into.setdefault(agent, {})[kind] = float(value)
    return _usages(own), _usages(inherited)


def _usages(by_agent: Mapping[str, Mapping[str, float]]) -> dict[str, Usage]:
    return {
        agent: Usage(**{k: v if k == "cost_usd" else int(v) for k, v in kinds.items()})
        for agent, kinds in by_agent.items()
    }


def inherit(client: redis.Redis, task: str, histories: Mapping[str, Usage]) -> None:
    """Record what a fork's agents' histories hold of their source's spend."""
    items = [
        part
        for agent, usage in histories.items()
        for kind in KINDS
        for part in (f"{INHERITED}{agent}:{kind}", str(getattr(usage, kind)))
    ]
    if items:
        client.hset(keys.spend(task), items=items)


def in_flight(
    client: redis.Redis, task: str, run: Mapping[str, str], steps: Mapping[str, str]
) -> dict[str, Usage]:
    """Per agent: what its current attempt of the superstep in flight spent so far.

    `run` and `steps` are the task's run state and steps in flight (`cairn.coordinator.runs`).
    """
    superstep = int(run.get("superstep", "0"))
    if not superstep or not steps:
        return {}
    attempts: dict[str, int] = {}
    for agent, raw in steps.items():
        try:
            attempts[agent] = int(json.loads(raw)["attempt"])
        except (ValueError, KeyError, TypeError):
            continue  # a garbled entry (its task is paused for it): no attempt to count
    where = keys.attempt_spend(task, int(run["epoch"]), superstep)
    found = cast(list[bytes | None], client.hmget(where, [f"{a}:{n}" for a, n in attempts.items()]))
    spends: dict[str, Usage] = {}
    for agent, value in zip(attempts, found, strict=True):
        if value is not None:
            prompt, completion, cached, cost = value.decode().split(" ")
            spends[agent] = Usage(prompt_tokens=int(prompt), completion_tokens=int(completion),
                                  cached_tokens=int(cached), cost_usd=float(cost))  # fmt: skip
    return spends


def replayed(spent: Usage, history: Usage, inherited: Usage | None, flying: Usage | None) -> Usage:
    """What of `spent` bought work that was discarded (see the module's docstring)."""
    own = history.minus(inherited or Usage())
    return spent.minus(own).minus(flying or Usage())


def budget_of(raised: str | bytes | None, limits: Limits) -> Budget | None:
    """The task's budget: as last set (the run's `budget`, `raised`), else its spec's."""
    return limits.budget if raised is None else Budget.model_validate_json(raised)


def budget_reached(budget: Budget | None, spent: Mapping[str, Usage]) -> str | None:
    """Why the task must pause for its budget (spent against limit), or None."""
    if budget is None:
        return None
    now = total(spent.values())
    if not budget.reached(now.tokens, now.cost_usd):
        return None
    parts = []
    if budget.tokens is not None:
        parts.append(f"{now.tokens} of {budget.tokens} tokens")
    if budget.cost_usd is not None:
        parts.append(f"${now.cost_usd:.4f} of ${budget.cost_usd:.4f}")
    return "spent " + " and ".join(parts)
