"""Agents written in Python (`cairn.agent`) on real workers, a real coordinator and Redis.

The workers load tests/code_agents.py as a user's module (`CAIRN_TOOLS`); the team is
declared in Python (`cairn.Team`). A worker killed in the middle of a Python step retries
to the same end as a run without the fault, and the replay pays for nothing twice: the
model is asked once, and the call that finished before the checkpoint runs once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import cairn
from cairn.agents.kinds.journal import Journal
from cairn.agents.spec import AgentSpec
from cairn.coordinator import approvals
from cairn.errors import Diverged, InvalidSpec
from cairn.storage.chain import WorkingState
from tests import code_agents
from tests.agent_harness import files_of
from tests.cluster import Cluster

SCRIPT = [{"say": "Write a greeting."}]


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """The world outside the workspace: the stamp ledger and the fault markers."""
    path = tmp_path / "outside"
    path.mkdir()
    return path


@pytest.fixture
def cluster(cluster: Cluster, outside: Path) -> Cluster:
    """The conftest cluster; its workers load the test's agents as a user's module."""
    cluster.env.update({"CAIRN_TOOLS": "tests.code_agents", "CODE_AGENTS_DIR": str(outside)})
    return cluster


def team(**fields: Any) -> cairn.Team:
    """The planner and the writer, in Python only, each thinking with a scripted model."""
    tools = ["read_file", "write_file", "list_files", "send_message", "stamp"]
    return cairn.Team(
        "Greet the world.",
        [
            code_agents.planner.spec(model="scripted", script=SCRIPT, tools=tools),
            code_agents.writer.spec(model="scripted", script=SCRIPT, tools=tools),
        ],
        files={"README.md": "greetings\n"},
        **fields,
    )


def ledger(outside: Path) -> list[dict[str, str]]:
    """The stamp tool's entries, in order."""
    path = outside / "ledger.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def final(cluster: Cluster, task: str, agent: str) -> WorkingState:
    """The agent's state in the task's latest GC."""
    gc = cluster.store.latest_gc(task)
    assert gc is not None
    ref = gc.members[agent]
    return cluster.store.read_state(task, agent, ref.id, ref.checksum)


def run(cluster: Cluster, spec: cairn.TaskSpec, workers: int = 1) -> str:
    """Start the workers, submit, drive the task to its end; its id."""
    for _ in range(workers):
        cluster.start_worker()
    cluster.wait_for_workers(workers)
    task = cluster.tasks.submit(spec)
    cluster.drive(task, timeout=90)
    return task


def test_a_team_in_python_runs_on_workers_that_load_it(cluster: Cluster, outside: Path) -> None:
    """Code asks its model, writes files, sends, keeps state, and finishes with a result."""
    task = run(cluster, team())
    status = cluster.status(task)
    assert "succeeded" == status["status"], (status, cluster.worker_logs())
    gc = cluster.store.latest_gc(task)
    assert gc is not None
    files = files_of(cluster.store, gc)
    assert b"Write a greeting.\n" == files["PLAN.md"] == files["hello.txt"]
    writer = final(cluster, task, "writer")
    files_seen = ["PLAN.md", "README.md", "hello.txt"]
    assert {"state": {"woken": 2, "files": files_seen}} == writer.kind_state
    assert {"wrote": "hello.txt"} == (writer.result.value if writer.result else None)
    said = [m.content for m in writer.messages]
    assert "Message from planner: Please write hello.txt; the plan: Write a greeting." in said
    assert "Say what you will write." in said
    turns = [row for row in writer.trace if row.tool is None]
    assert 1 == len(turns)
    assert turns[0].usage is not None  # its one model call, counted
    stamps = [row for row in writer.trace if row.tool == "stamp"]
    assert [True, True] == [row.side_effect and bool(row.idempotency_key) for row in stamps]
    assert ["first", "second"] == [entry["label"] for entry in ledger(outside)]


def test_a_worker_killed_mid_step_retries_to_the_same_end(cluster: Cluster, outside: Path) -> None:
    """The replay asks the model once and runs the finished call once (compared with no fault)."""
    clean = run(cluster, team())
    first = ledger(outside)
    (outside / "ledger.jsonl").unlink()
    (outside / "die-writer").touch()
    faulted = run(cluster, team(), workers=2)  # one dies; the other takes the retry
    assert not (outside / "die-writer").exists()  # the fault fired
    assert "succeeded" == cluster.status(faulted)["status"], cluster.worker_logs()
    a, b = (final(cluster, task, "writer") for task in (clean, faulted))
    assert a.kind_state == b.kind_state
    assert [m.content for m in a.messages] == [m.content for m in b.messages]
    ga, gb = cluster.store.latest_gc(clean), cluster.store.latest_gc(faulted)
    assert ga is not None
    assert gb is not None
    assert files_of(cluster.store, ga) == files_of(cluster.store, gb)
    assert 1 == len([row for row in b.trace if row.tool is None])  # not asked again
    # The first stamp finished before the checkpoint that precedes the second: not run
    # again. The second was interrupted: run again, with the same key (at most once).
    again = ledger(outside)
    assert ["first", "second", "second"] == [entry["label"] for entry in again]
    assert again[1]["key"] == again[2]["key"]
    assert [e["key"].split(":", 1)[1] for e in first] == [
        e["key"].split(":", 1)[1] for e in again[:2]
    ]


def test_code_that_raises_is_a_step_error_with_its_traceback_and_is_retried(
    cluster: Cluster, outside: Path
) -> None:
    """The traceback is in the trace; the retry replays the write and goes on."""
    (outside / "raise-flaky").touch()
    task = run(cluster, cairn.Team("Be flaky.", [code_agents.flaky]))
    assert "succeeded" == cluster.status(task)["status"], cluster.worker_logs()
    state = final(cluster, task, "flaky")
    [failure] = [row for row in state.trace if row.tool == "flaky (code)"]
    assert failure.error is not None
    assert "Traceback" in failure.error
    assert "ZeroDivisionError" in failure.error
    writes = [row for row in state.trace if row.tool == "write_file"]
    assert ["before.txt", "after.txt"] == [row.arguments["path"] for row in writes]


def test_a_call_a_person_approves_stops_the_code_until_one_decides(cluster: Cluster) -> None:
    """The run goes on after the decision, replayed: its model was asked once."""
    write = {"name": "write_file", "args": {"path": "NOTE.md", "content": "approved\n"}}
    member = code_agents.careful.spec(
        model="scripted", script=[{"say": "Writing.", "tools": [write]}], approve=["write_file"]
    )
    cluster.start_worker()
    cluster.wait_for_workers(1)
    task = cluster.tasks.submit(cairn.Team("Write with care.", [member]))
    cluster.tick_until(lambda: bool(approvals.pending_approvals(cluster.store, task)))
    [pending] = approvals.pending_approvals(cluster.store, task)
    assert ("careful", "write_file") == (pending.agent, pending.tool)
    approvals.record_decision(cluster.store, task, "careful", None, approved=True)
    assert "succeeded" == cluster.drive(task)["status"], cluster.worker_logs()
    state = final(cluster, task, "careful")
    assert {"state": {"done": True}} == state.kind_state
    assert {"calls": ["write_file"]} == (state.result.value if state.result else None)
    assert 1 == len([row for row in state.trace if row.tool is None])
    gc = cluster.store.latest_gc(task)
    assert gc is not None
    assert b"approved\n" == files_of(cluster.store, gc)["NOTE.md"]


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("wrong", "agent wrong (kind wrong) returned 42, not an outcome"),
        ("hoarder", "agent hoarder's state holds a value that is not JSON at state.seen.plan[1]"),
        ("nowhere", "agent nowhere is of kind 'nowhere', which worker"),
    ],
)
def test_code_that_cannot_run_fails_the_task_naming_the_agent(
    cluster: Cluster, kind: str, reason: str
) -> None:
    """A wrong return, a state that is not JSON, a kind no worker has: fatal, and said.

    The kind no worker has is submitted before any worker is live (accepted: one may come);
    once the worker is live, it is refused at submit.
    """
    member = AgentSpec(name=kind, kind=kind, model="none", max_retries=0)
    spec = cairn.Team("Fail clearly.", [member], max_supersteps=3)
    if kind == "nowhere":
        task = cluster.tasks.submit(spec)
        cluster.start_worker()
        cluster.drive(task, timeout=90)
        cluster.wait_for_offers()
        with pytest.raises(InvalidSpec, match="agent nowhere is of kind 'nowhere', which no "
                           "live worker has"):  # fmt: skip
            cluster.tasks.submit(spec)
    else:
        task = run(cluster, spec)
    status = cluster.status(task)
    assert "failed" == status["status"]
    assert reason in str(status["reason"]), status


def test_a_kind_needs_a_name_and_an_llm_agent_a_model() -> None:
    """`kind:` is checked at submit; only code may say `model: none`."""
    assert "none" == AgentSpec.model_validate({"name": "a", "kind": "researcher"}).model
    with pytest.raises(InvalidSpec, match=r"agents\[a\]\.kind: String should match pattern"):
        cairn.Team("x", [{"name": "a", "kind": "no spaces", "model": "scripted"}])
    with pytest.raises(InvalidSpec, match="is an llm agent: it needs a model, not none"):
        cairn.Team("x", [{"name": "a", "model": "none"}])
    with pytest.raises(ValueError, match="must match"):
        cairn.agent(name="llm")(code_agents.wrong.func)


def test_a_replay_that_does_something_else_is_refused() -> None:
    """Code that decides differently on its replay cannot be replayed: `Diverged` says so."""
    entries: list[Any] = []
    Journal(entries, "writer").record("ask", {"prompt": "a", "tools": False}, upto=3)
    replay = Journal(entries, "writer")
    with pytest.raises(Diverged, match="agent writer's code did something else on its replay"):
        replay.replay("ask", {"prompt": "b", "tools": False})
    assert {"did": entries[0]["did"], "upto": 3} == Journal(entries, "w").replay(
        "ask", {"prompt": "a", "tools": False}
    )
