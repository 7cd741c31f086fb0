"""Spawning members at run time, with real workers: joining, reporting, limits, restore, fork.

A scripted lead spawns three workers with `spawn_agent`; each writes its part and
finishes; the lead, resting meanwhile, is woken by their three reports and finishes.
"""

from __future__ import annotations

from typing import Any

import yaml

from cairn.coordinator.diff import diff
from cairn.coordinator.spec import TaskSpec
from cairn.coordinator.timeline import gather
from cairn.coordinator.views import trace
from cairn.storage.records import AgentState, GlobalCheckpoint
from tests.agent_harness import files_of
from tests.cluster import Cluster, files_and_histories

WORKERS = ("w1", "w2", "w3")


def worker_call(name: str) -> dict[str, Any]:
    """The lead's `spawn_agent` call for worker `name`: it writes its part and finishes."""
    script = [{"say": f"{name} writing.", "tools": [
        {"name": "write_file", "args": {"path": f"{name}.txt", "content": f"part of {name}\n"}},
        {"name": "finish", "args": {"summary": f"{name}.txt written"}},
    ]}]  # fmt: skip
    return {"name": "spawn_agent", "args": {
        "name": name, "goal": f"Write {name}.txt.", "system": f"You write {name}.txt.",
        "tools": ["write_file", "finish"], "script": script,
    }}  # fmt: skip


def orchestrator(*, crash: bool = False, more: list[dict[str, Any]] | None = None,
                 max_agents: int = 4) -> TaskSpec:  # fmt: skip
    """A lead that spawns the three workers in superstep 1, rests, and finishes on their reports.

    `crash` kills the worker running the spawning step after two spawns (its first try);
    `more` are further calls of the spawning turn.
    """
    spawning: dict[str, Any] = {
        "say": "Spawning workers.",
        "tools": [worker_call(name) for name in WORKERS] + (more or []),
    }
    if crash:
        spawning["crash"] = {"attempts": [1], "after_tools": 2}
    lead = {
        "name": "lead",
        "model": "scripted",
        "tools": ["write_file", "finish", "spawn_agent"],
        "script": [
            spawning,
            {"say": "Waiting for the workers."},
            {"say": "All parts are in.", "tools": [
                {"name": "write_file", "args": {"path": "DONE", "content": "all parts\n"}},
                {"name": "finish", "args": {"summary": "three parts written"}},
            ]},
        ],
    }  # fmt: skip
    return TaskSpec.model_validate(
        {
            "name": "Orchestrate",
            "goal": "Write three parts.",
            "agents": [lead],
            "max_agents": max_agents,
        }
    )


def latest(cluster: Cluster, task: str) -> GlobalCheckpoint:
    gc = cluster.store.latest_gc(task)
    assert gc is not None
    return gc


def messages_of(cluster: Cluster, gc: GlobalCheckpoint, agent: str) -> list[str]:
    ref = gc.members[agent]
    state = cluster.store.read_state(gc.task, agent, ref.id, ref.checksum)
    return [m.content or "" for m in state.messages]


def test_a_lead_spawns_three_workers_and_is_woken_by_their_three_results(
    cluster: Cluster,
) -> None:
    """They join at the barrier, finish, and each result reaches the lead as a message."""
    cluster.start_worker()
    cluster.start_worker()
    task = cluster.tasks.submit(orchestrator())
    assert "succeeded" == cluster.drive(task)["status"]

    gc = latest(cluster, task)
    assert {"lead", *WORKERS} == set(gc.members)
    assert dict.fromkeys(WORKERS, "lead") == {n: s.parent for n, s in gc.spawned.items()}
    assert {1} == {s.superstep for s in gc.spawned.values()}  # joined at barrier 1
    assert all(gc.statuses[name] is AgentState.FINISHED for name in [*WORKERS, "lead"])
    files = files_of(cluster.store, gc)
    assert {f"{n}.txt": f"part of {n}\n".encode() for n in WORKERS} | {
        "DONE": b"all parts\n"
    } == files
    said = messages_of(cluster, gc, "lead")
    reports = [m for m in said if " finished: " in m]
    assert [f"Message from {n}: {n} finished: {n}.txt written" for n in WORKERS] == sorted(reports)
    # A worker's history starts with its system prompt and the lead's brief.
    assert ["You write w1.txt.", "Message from lead: Write w1.txt."] == messages_of(
        cluster, gc, "w1"
    )[:2]

    status = cluster.tasks.status(task)
    assert {"lead": None, **dict.fromkeys(WORKERS, "lead")} == {
        a.name: a.spawned_by for a in status.agents
    }
    spawns = [r for r in trace(cluster.store, task, "lead") if r.tool == "spawn_agent"]
    assert list(WORKERS) == [r.arguments["name"] for r in spawns]
    assert [None] * 3 == [r.error for r in spawns]
    assert dict.fromkeys(WORKERS, "lead") == gather(cluster.client, cluster.store, task).spawned


def test_a_spawn_past_the_limit_or_under_a_taken_or_bad_name_is_refused_to_the_lead(
    cluster: Cluster,
) -> None:
    """Each refusal is the call's error, read by the lead; the team is as the limit allows."""
    cluster.start_worker()
    more = [
        {"name": "spawn_agent", "args": {"name": "w4", "goal": "One too many."}},
        {"name": "spawn_agent", "args": {"name": "lead", "goal": "A taken name."}},
        {"name": "spawn_agent", "args": {"name": "w 5", "goal": "Not a name."}},
        {"name": "spawn_agent", "args": {"name": "w6", "goal": "x", "tools": ["run_command"]}},
        {"name": "spawn_agent", "args": {"name": "w7", "goal": "x", "model": "openai:gpt-4o"}},
    ]
    task = cluster.tasks.submit(orchestrator(more=more, max_agents=4))
    assert "succeeded" == cluster.drive(task)["status"]
    gc = latest(cluster, task)
    assert {"lead", *WORKERS} == set(gc.members)
    errors = [r.error for r in trace(cluster.store, task, "lead") if r.tool == "spawn_agent"]
    assert [None, None, None] == errors[:3]
    refused = errors[3:]
    assert all(e is not None for e in refused)
    assert "at most 4 members" in str(refused[0])
    assert "taken" in str(refused[1])
    assert "agent" in str(refused[2])
    assert "run_command" in str(refused[3])
    assert "spawner's provider" in str(refused[4])


RACE = """
name: Race
goal: Each wants a helper.
max_agents: 4
agents:
  - name: a
    model: scripted
    tools: [finish, spawn_agent]
    script:
      - tools: [{name: spawn_agent, args: {name: helper, goal: "Help a.", script: []}}]
  - name: b
    model: scripted
    tools: [finish, spawn_agent]
    script:
      - tools: [{name: spawn_agent, args: {name: helper, goal: "Help b.", script: []}}]
  - name: c
    model: scripted
    tools: [finish, spawn_agent]
    script:
      - tools: [{name: spawn_agent, args: {name: other, goal: "Help c.", script: []}}]
"""


def test_the_barrier_refuses_a_name_taken_in_the_same_superstep_and_a_full_team(
    cluster: Cluster,
) -> None:
    """Spawns their steps allowed clash at the barrier: the first in team order wins; told why."""
    cluster.start_worker()
    task = cluster.tasks.submit(TaskSpec.model_validate(yaml.safe_load(RACE)))
    assert "succeeded" == cluster.drive(task)["status"]
    gc = latest(cluster, task)
    assert {"a", "b", "c", "helper"} == set(gc.members)
    assert "a" == gc.spawned["helper"].parent
    told = {
        agent: [m for m in messages_of(cluster, gc, agent) if m.startswith("Message from cairn")]
        for agent in ("a", "b", "c")
    }
    assert [] == told["a"]
    assert ["Spawn of helper refused", "taken"] == [
        part for part in ("Spawn of helper refused", "taken") if part in " ".join(told["b"])
    ]
    assert ["Spawn of other refused", "at most 4 members"] == [
        part
        for part in ("Spawn of other refused", "at most 4 members")
        if part in " ".join(told["c"])
    ]
    assert ["Message from a: Help a."] == messages_of(cluster, gc, "helper")[1:2]


def test_a_restore_before_the_spawn_removes_the_members_and_their_work(cluster: Cluster) -> None:
    """Their LCs, files and messages leave with them; run again, the task ends as before."""
    cluster.start_worker()
    cluster.start_worker()
    task = cluster.tasks.submit(orchestrator())
    assert "succeeded" == cluster.drive(task)["status"]
    end = latest(cluster, task)
    files_end, histories_end = files_and_histories(cluster, task)

    restored = cluster.coordinator.restorer.restore(task, to=0)
    gc = cluster.store.read_gc(task, restored.number)
    assert ["lead"] == list(gc.members)
    assert {} == gc.spawned
    assert files_of(cluster.store, cluster.store.read_gc(task, 0)) == files_of(cluster.store, gc)
    assert [] == gc.inbox
    assert ["lead"] == [a.name for a in cluster.tasks.status(task).agents]
    gone = diff(cluster.store, task, end.number, task, gc.number).members
    assert (list(WORKERS), {}) == (gone.left, gone.joined)

    # The lead spawns them again, under the new epoch, to the same end.
    assert "succeeded" == cluster.drive(task)["status"]
    files_again, histories_again = files_and_histories(cluster, task)
    assert files_end == files_again
    assert set(histories_end) == set(histories_again)
    for name in WORKERS:
        assert histories_end[name] == histories_again[name]


def test_a_fork_after_the_spawn_carries_the_members_and_a_diff_shows_them_joining(
    cluster: Cluster,
) -> None:
    """The fork's GC 0 names the workers with their specs and spawner; it ends as its source."""
    cluster.start_worker()
    cluster.start_worker()
    source = cluster.tasks.submit(orchestrator())
    assert "succeeded" == cluster.drive(source)["status"]
    joined = diff(cluster.store, source, 0, source, 1).members
    assert (dict.fromkeys(WORKERS, "lead"), []) == (joined.joined, joined.left)

    gc1 = cluster.store.read_gc(source, 1)
    forked = cluster.tasks.fork(source, at=1)
    start = cluster.store.read_gc(forked, 0)
    assert set(gc1.members) == set(start.members)
    assert gc1.spawned == start.spawned
    assert "succeeded" == cluster.drive(forked)["status"]
    assert files_of(cluster.store, latest(cluster, source)) == files_of(
        cluster.store, latest(cluster, forked)
    )
    assert {"lead": None, **dict.fromkeys(WORKERS, "lead")} == {
        a.name: a.spawned_by for a in cluster.tasks.status(forked).agents
    }
    across = diff(cluster.store, source, 0, forked, 0).members
    assert dict.fromkeys(WORKERS, "lead") == across.joined


def test_a_worker_killed_in_the_spawning_step_retries_it_to_the_same_end(
    cluster: Cluster,
) -> None:
    """The spawns of the killed try are discarded with it; the retry's join, once each."""
    cluster.start_worker()
    cluster.start_worker()
    clean = cluster.tasks.submit(orchestrator())
    assert "succeeded" == cluster.drive(clean)["status"]
    faulted = cluster.tasks.submit(orchestrator(crash=True))
    cluster.start_worker()  # the one the crash kills is replaced
    assert "succeeded" == cluster.drive(faulted)["status"]

    assert files_and_histories(cluster, clean) == files_and_histories(cluster, faulted)
    a, b = latest(cluster, clean), latest(cluster, faulted)
    assert (a.statuses, {n: s.parent for n, s in a.spawned.items()}) == (
        b.statuses,
        {n: s.parent for n, s in b.spawned.items()},
    )
    retried = [c for c in gather(cluster.client, cluster.store, faulted).steps if c.attempt > 1]
    assert ["lead"] == [c.agent for c in retried]


def test_a_restore_after_the_spawn_keeps_the_members_and_the_task_ends_as_before(
    cluster: Cluster,
) -> None:
    """Spawned members are staged with the rest of the team and go on with their own specs."""
    cluster.start_worker()
    cluster.start_worker()
    task = cluster.tasks.submit(orchestrator())
    assert "succeeded" == cluster.drive(task)["status"]
    files_end = files_of(cluster.store, latest(cluster, task))

    restored = cluster.coordinator.restorer.restore(task, to=1)
    gc = cluster.store.read_gc(task, restored.number)
    assert {"lead", *WORKERS} == set(gc.members)
    assert cluster.store.read_gc(task, 1).spawned == gc.spawned
    assert "succeeded" == cluster.drive(task)["status"]
    assert files_end == files_of(cluster.store, latest(cluster, task))
