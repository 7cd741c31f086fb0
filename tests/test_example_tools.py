"""examples/tools/: a team with Python tools and an MCP server, end to end on real workers.

The workers are set up as examples/tools/README.md says: `CAIRN_TOOLS=ticket_tools` with
examples/tools on their `PYTHONPATH`, `CAIRN_MCP_CONFIG` naming examples/tools/mcp.json
(which starts notes_server.py with `python3` from `PATH`, relative to the worker's
directory: the repository's root), `TICKET_LEDGER` and `NOTES_FILE` naming the files the
tracker and the notebook keep, outside the workspace. The team on Claude is only loaded.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from cairn import Client
from cairn.agents.mcp.config import load_mcp_config
from cairn.coordinator.spec import TaskSpec, load_spec
from cairn.storage.records import GCStatus, TraceRecord
from tests.agent_harness import files_of
from tests.cluster import ROOT, Cluster

EXAMPLE = ROOT / "examples" / "tools"
TEAM = EXAMPLE / "team.yaml"
EXTERNAL = ("comment_on_ticket", "notes__add_note")


@dataclass(frozen=True)
class Outside:
    """The files the example's tools keep outside the workspace."""

    ledger: Path  # the ticket tracker's (ticket_tools.py)
    notebook: Path  # the notes server's (notes_server.py)


@pytest.fixture
def outside(tmp_path: Path) -> Outside:
    """The tracker's ledger and the notebook, in the test's directory."""
    return Outside(tmp_path / "tickets.jsonl", tmp_path / "notes.jsonl")


@pytest.fixture
def cluster(cluster: Cluster, outside: Outside, monkeypatch: pytest.MonkeyPatch) -> Cluster:
    """The conftest cluster, its workers started at the root as the example's README says."""
    monkeypatch.chdir(ROOT)  # mcp.json names the server's script relative to it
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    cluster.env.update(
        {
            "PATH": path,  # as in an activated virtualenv: its python3 has the mcp SDK
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(EXAMPLE)]),
            "CAIRN_TOOLS": "ticket_tools",
            "CAIRN_MCP_CONFIG": str(EXAMPLE / "mcp.json"),
            "TICKET_LEDGER": str(outside.ledger),
            "NOTES_FILE": str(outside.notebook),
        }
    )
    return cluster


def lines(path: Path) -> list[dict[str, object]]:
    """A JSON-lines file's entries."""
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def trace(cluster: Cluster, task: str) -> list[TraceRecord]:
    """Every agent's tool calls as the latest GC holds them (its committed calls), by time."""
    gc = cluster.store.latest_gc(task)
    assert gc is not None
    rows = [
        row
        for agent, ref in gc.members.items()
        for row in cluster.store.read_state(task, agent, ref.id, ref.checksum).trace
        if row.tool is not None
    ]
    return sorted(rows, key=lambda row: row.started_at)


def calls(rows: list[TraceRecord], tool: str) -> list[TraceRecord]:
    """The calls of `tool`."""
    return [row for row in rows if row.tool == tool]


def run(cluster: Cluster, spec: TaskSpec) -> str:
    """Submit the team, drive it to its end; it must succeed with temps.py fixed."""
    task = cluster.tasks.submit(spec, base=TEAM.parent)
    status = cluster.drive(task, timeout=100)
    errors = [(row.tool, row.error) for row in trace(cluster, task) if row.error]
    assert "succeeded" == status["status"], (status, errors)
    gc = cluster.store.latest_gc(task)
    assert gc is not None
    assert b"return celsius * 9 / 5 + 32" in files_of(cluster.store, gc)["temps.py"]
    return task


def check_applied_once(cluster: Cluster, task: str, outside: Outside) -> list[TraceRecord]:
    """The ledger and the notebook hold each committed external call's key, once."""
    rows = trace(cluster, task)
    for tool in EXTERNAL:
        for row in calls(rows, tool):
            assert ("external", True) == (row.effects, row.side_effect), row
            assert row.idempotency_key is not None
            assert row.idempotency_key.startswith(f"{task}:")
    [comment] = calls(rows, "comment_on_ticket")
    assert [comment.idempotency_key] == [entry["key"] for entry in lines(outside.ledger)]
    noted = [row.idempotency_key for row in calls(rows, "notes__add_note")]
    assert 2 == len(noted) == len(set(noted))
    assert noted == [entry["key"] for entry in lines(outside.notebook)]
    return rows


def test_the_tools_team_closes_the_ticket_on_two_workers(
    cluster: Cluster, outside: Outside
) -> None:
    """The team as shipped: the ticket is resolved once, the notebook holds both notes.

    The read-only tools (`get_ticket`, the server's `read_notes`) run with effects `none`
    and no key; the coder reads the triager's note back from the server; the reviewer
    sees the ticket resolved by its own comment.
    """
    cluster.start_worker()
    cluster.start_worker()
    task = run(cluster, load_spec(TEAM))
    rows = check_applied_once(cluster, task, outside)

    for tool in ("get_ticket", "notes__read_notes"):
        for row in calls(rows, tool):
            assert ("none", False, None) == (row.effects, row.side_effect, row.idempotency_key)
    [read] = calls(rows, "notes__read_notes")
    assert "- to_fahrenheit() forgets to add 32" in str(read.result)
    before, after = (json.loads(str(row.result)) for row in calls(rows, "get_ticket"))
    assert ("open", []) == (before["status"], before["comments"])
    assert "resolved" == after["status"]
    assert ["reviewer"] == [comment["by"] for comment in after["comments"]]
    [comment] = lines(outside.ledger)
    assert (task, "reviewer", "TCK-101", True) == (
        comment["task"],
        comment["agent"],
        comment["ticket"],
        comment["resolve"],
    )
    assert ["TCK-101", "TCK-101"] == [note["topic"] for note in lines(outside.notebook)]
    assert all(worker.poll() is None for worker in cluster.workers)


def test_a_worker_killed_after_the_ticket_comment_does_not_comment_twice(
    cluster: Cluster, outside: Outside
) -> None:
    """SIGKILL as the reviewer's note starts, after its comment: the retry resumes past it."""
    cluster.start_worker()
    cluster.start_worker()  # takes the retry
    data = load_spec(TEAM).model_dump(mode="json", exclude_none=True)
    [reviewer] = [agent for agent in data["agents"] if agent["name"] == "reviewer"]
    reviewer["script"][1]["crash"] = {"attempts": [1], "after_tools": 3}  # 3: the comment
    task = run(cluster, TaskSpec.model_validate(data))
    assert [-signal.SIGKILL] == [w.returncode for w in cluster.workers if w.poll() is not None]
    rows = check_applied_once(cluster, task, outside)
    [comment] = calls(rows, "comment_on_ticket")  # made once: the retry resumed past it
    assert "TCK-101: commented and resolved" == comment.result


def test_a_replay_after_a_restore_hands_the_same_keys_and_applies_nothing_twice(
    cluster: Cluster, outside: Outside, tmp_path: Path
) -> None:
    """Restored to superstep 2's GC, the reviewer comments and notes again, with the same keys.

    The tracker and the notebook, applying a key once, answer that they have it already.
    """
    cluster.start_worker()
    task = run(cluster, load_spec(TEAM))
    first = check_applied_once(cluster, task, outside)
    [gc2] = [
        gc
        for gc in cluster.store.list_gcs(task)
        if gc.superstep == 2 and gc.status is GCStatus.COMMITTED
    ]
    with Client(cluster.server.url, tmp_path / "archive") as client:
        assert gc2.number == client.task(task).restore(to=gc2.number).restored_to
    status = cluster.drive(task, timeout=100)
    assert "succeeded" == status["status"], status

    again = check_applied_once(cluster, task, outside)
    for tool in EXTERNAL:
        assert [r.idempotency_key for r in calls(first, tool)] == [
            r.idempotency_key for r in calls(again, tool)
        ]
    [comment] = calls(again, "comment_on_ticket")
    assert "TCK-101: this comment is on the ticket already" == comment.result
    assert str(calls(again, "notes__add_note")[1].result).endswith("in the notebook already")


def test_the_example_loads_as_its_workers_would() -> None:
    """mcp.json names one stdio server; the team on Claude is the scripted team."""
    [(name, server)] = load_mcp_config(EXAMPLE / "mcp.json", {"NOTES_FILE": "/n"}).items()
    assert ("notes", "stdio", {"NOTES_FILE": "/n"}) == (name, server.transport, server.env)
    assert (EXAMPLE / "notes_server.py") == ROOT / server.args[0]

    scripted, real = load_spec(TEAM), load_spec(EXAMPLE / "team-anthropic.yaml")
    assert (scripted.goal, scripted.files, scripted.verify) == (real.goal, real.files, real.verify)
    assert [(a.name, a.tools) for a in scripted.agents] == [(a.name, a.tools) for a in real.agents]
    for agent in real.agents:
        assert agent.model.startswith("anthropic:")
        assert not agent.script
        assert len(agent.system) > 100
    for agent in scripted.agents:  # a script calls only tools its agent has
        for turn in agent.script:
            for call in turn.tools:
                assert offers(agent.tools, call.name), (agent.name, call.name)


def offers(tools: list[str], called: str) -> bool:
    """Whether an agent with `tools` has the tool a model calls `called`."""
    server, _, name = called.partition("__")
    mcp = {f"mcp:{server}", f"mcp:{server}/{name}"} if name else set()
    return called in tools or bool(mcp & set(tools))
