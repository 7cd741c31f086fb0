"""Budgets per member and per subtree, on real workers, a real coordinator and Redis.

A runaway member (an agent in code that never stops asking its model) is held when its
subtree's budget is reached: it takes no more steps while the rest of the team goes on,
and the task pauses only once nothing else has work. Raising the member's budget and
resuming lets it go on to its end.
"""

from __future__ import annotations

from typing import Any

import pytest

import cairn
from cairn.coordinator.runs import TaskState
from cairn.errors import InvalidSpec
from tests import code_agents
from tests.cluster import Cluster


@pytest.fixture
def cluster(cluster: Cluster) -> Cluster:
    """The conftest cluster with one worker that loads the test's agents."""
    cluster.env.update({"CAIRN_TOOLS": "tests.code_agents", "CODE_AGENTS_DIR": "/nonexistent"})
    cluster.start_worker()
    cluster.wait_for_workers(1)
    return cluster


def team(**spawner: Any) -> cairn.Team:
    """A spawner (which spawns the runaway) and a steady member beside it."""
    lead = code_agents.spawner.spec(model="scripted", tools=["spawn_agent"], **spawner)
    return cairn.Team("Keep going.", [lead, code_agents.steady.spec()], max_supersteps=30)


def paused(cluster: Cluster, task: str) -> dict[str, Any]:
    """Tick until the task is paused; its status (as JSON)."""
    cluster.tick_until(lambda: cluster.tasks.status(task).state is TaskState.PAUSED)
    return cluster.status(task)


def agents(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The status's agents by name."""
    return {agent["name"]: agent for agent in status["agents"]}


def test_a_member_at_its_budget_is_held_while_the_team_goes_on(cluster: Cluster) -> None:
    """The runaway stops at 2 steps; steady finishes its 5; then the task pauses, saying why."""
    task = cluster.tasks.submit(team())
    status = paused(cluster, task)
    members = agents(status)
    assert 2 == members["runaway"]["step"]
    assert "2 of 2 steps" in members["runaway"]["held"]
    assert ("finished", 5) == (members["steady"]["status"], members["steady"]["step"])
    assert "held" not in members["steady"]
    assert status["reason"] == ("budget: the budget of runaway's subtree is reached: 2 of 2 steps")
    # Raised, then resumed: the runaway takes its third step, finishes, and its spawner too.
    raised = cluster.tasks.member_budget(task, "runaway", steps=5)
    assert (5, None) == (raised.steps, raised.tokens)
    cluster.tasks.resume(task)
    final = cluster.drive(task)
    assert "succeeded" == final["status"], final
    assert 3 == agents(final)["runaway"]["step"]


def test_a_subtree_counts_what_its_spawned_members_spent(cluster: Cluster) -> None:
    """The spawner's token budget holds it and its runaway child; steady goes on."""
    task = cluster.tasks.submit(team(budget={"tokens": 40}))
    status = paused(cluster, task)
    members = agents(status)
    assert members["runaway"]["held"] == members["spawner"]["held"]
    assert "the budget of spawner's subtree is reached" in members["runaway"]["held"]
    spawner_tokens = members["spawner"]["usage"]["prompt_tokens"]  # it asks no model itself
    runaway_tokens = (
        members["runaway"]["usage"]["prompt_tokens"]
        + members["runaway"]["usage"]["completion_tokens"]
    )
    assert 0 == spawner_tokens
    assert runaway_tokens >= 40  # its child's spend reached the spawner's budget
    assert "finished" == members["steady"]["status"]


def test_a_member_budget_is_checked(cluster: Cluster) -> None:
    """No limit, a member that is not there, or a bad value: one-line `InvalidSpec`."""
    task = cluster.tasks.submit(team())
    with pytest.raises(InvalidSpec, match="give tokens, cost_usd, steps"):
        cluster.tasks.member_budget(task, "runaway")
    with pytest.raises(InvalidSpec, match="has no member 'nobody'"):
        cluster.tasks.member_budget(task, "nobody", steps=3)
    with pytest.raises(InvalidSpec, match="budget: steps"):
        cluster.tasks.member_budget(task, "steady", steps=0)
    with pytest.raises(InvalidSpec, match="give tokens, cost_usd, steps"):
        code_agents.steady.spec(budget={})
