"""What `cairn checkpoints` tells of each GC: when it was written, by what, its epoch, members.

Real workers on a private Redis; every answer read through the CLI, run as a process of
its own, as a person runs it.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from cairn.coordinator.runs import read_run
from cairn.coordinator.spec import TaskSpec
from tests.cli_harness import cairn
from tests.cluster import TEAM, Cluster, team_spec
from tests.test_restore import run_until


def listed(cluster: Cluster, task: str) -> list[dict[str, Any]]:
    """`cairn checkpoints TASK --json`, parsed."""
    done = cairn("checkpoints", task, "--json", env=cluster._env("cli"))
    assert 0 == done.returncode, done.stderr
    rows: list[dict[str, Any]] = json.loads(done.stdout)
    return rows


def written(row: dict[str, Any]) -> datetime:
    """When a listed GC's record was written."""
    return datetime.fromisoformat(row["created_at"])


def test_each_checkpoint_says_when_it_was_written_and_what_wrote_it(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A restore's and a rollback's GCs carry their own time, their origin and source GC.

    The list shows every number: the superstep the rollback gave up is ABORTED, and once
    the task left Redis the archive's note still lists it, and `cairn checkpoint` says so.
    """
    cluster.start_worker()
    task = cluster.tasks.submit(team_spec(tmp_path / "ledger"))
    run_until(cluster, task, 1)
    time.sleep(1.1)  # the list shows seconds: a copied time would show as the source's
    asked = time.time()
    restored = cairn("restore", task, "--to", "0", env=cluster._env("cli"))
    assert 0 == restored.returncode, restored.stderr
    cluster.coordinator.tick()  # begins the next superstep: GC 3, PREPARING
    assert 3 == max(row["number"] for row in listed(cluster, task))
    run = read_run(cluster.client, task)
    cluster.coordinator.finisher.give_up(task, run, "a test gives the superstep up")

    rows = listed(cluster, task)
    assert [0, 1, 2, 3, 4] == [row["number"] for row in rows]
    assert ["COMMITTED", "COMMITTED", "COMMITTED", "ABORTED", "COMMITTED"] == [
        row["status"] for row in rows
    ]
    assert [("superstep", None), ("superstep", None), ("restore", 0), ("superstep", None),
            ("rollback", 2)] == [(row["origin"], row["source"]) for row in rows]  # fmt: skip
    assert written(rows[2]).timestamp() >= asked
    assert written(rows[0]) < written(rows[2]) <= written(rows[3]) <= written(rows[4])
    assert all(row["epoch"] is not None for row in rows)
    assert rows[4]["epoch"] > rows[2]["epoch"] > rows[1]["epoch"]
    assert {"planner", "coder", "reviewer"} == rows[4]["members"].keys()

    text = cairn("checkpoints", task, env={**cluster._env("cli"), "COLUMNS": "200"})
    assert 0 == text.returncode, text.stderr
    header = text.stdout.splitlines()[1]
    for column in ("epoch", "members", "origin", "written"):
        assert column in header, text.stdout
    assert "restore of 0" in text.stdout
    assert "rollback to 2" in text.stdout
    assert written(rows[2]).strftime("%H:%M:%S") in text.stdout
    assert "ABORTED: committed nothing" in text.stdout

    detail = cairn("checkpoint", task, "3", env=cluster._env("cli"))
    assert 0 == detail.returncode, detail.stderr
    assert "ABORTED" in detail.stdout

    assert "succeeded" == cluster.drive(task)["status"]
    forgot = cairn("forget", task, env=cluster._env("cli"))
    assert 0 == forgot.returncode, forgot.stderr
    after = listed(cluster, task)
    aborted = next(row for row in after if row["number"] == 3)
    assert ("ABORTED", True, "superstep") == (
        aborted["status"],
        aborted["dropped"],
        aborted["origin"],
    )
    gone = cairn("checkpoint", task, "3", env=cluster._env("cli"))
    assert 0 != gone.returncode
    assert f"checkpoint 3 of task {task} was aborted" in gone.stderr
    assert "Traceback" not in gone.stderr


def test_a_fork_says_which_checkpoint_of_which_task_it_started_from(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The fork's GC 0 is written by the fork, now, and names its source task and GC."""
    cluster.start_worker()
    source = cluster.tasks.submit(team_spec(tmp_path / "ledger"))
    run_until(cluster, source, 1)
    time.sleep(1.1)
    asked = time.time()
    done = cairn("fork", source, "--at", "1", "--json", env=cluster._env("cli"))
    assert 0 == done.returncode, done.stderr
    forked = json.loads(done.stdout)["task_id"]
    start = listed(cluster, forked)[0]
    assert ("fork", 1, source) == (start["origin"], start["source"], start["source_task"])
    assert written(start).timestamp() >= asked
    text = cairn("checkpoints", forked, env={**cluster._env("cli"), "COLUMNS": "200"})
    assert f"fork of {source}@1" in text.stdout


def diffed(cluster: Cluster, a: str, b: str) -> dict[str, Any]:
    """`cairn diff A B --json` (each side TASK@N), parsed."""
    done = cairn("diff", a, b, "--json", env=cluster._env("cli"))
    assert 0 == done.returncode, done.stderr
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def counts(found: dict[str, Any]) -> dict[str, tuple[int, list[str]]]:
    """Per agent: how many messages the diff says were added, and which tool calls."""
    return {
        name: (len(agent["messages_added"]), [c["tool"] for c in agent["tool_calls_added"]])
        for name, agent in found["agents"].items()
    }


def made(message: dict[str, Any]) -> list[str]:
    """The tools an added message calls."""
    return [call["name"] for call in message.get("tool_calls", [])]


def test_a_fork_replayed_to_the_same_end_differs_by_nothing(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Identical states compare as identical: no message, no tool call, no file added.

    The fork's GC k is its source's GC k + 1 replayed: its trace ran at other times, which
    no count of the diff may read as something done.
    """
    cluster.start_worker()
    source = cluster.tasks.submit(team_spec(tmp_path / "ledger"))
    assert "succeeded" == cluster.drive(source)["status"]
    forked = cluster.tasks.fork(source, at=1)
    assert "succeeded" == cluster.drive(forked)["status"]
    last = max(row["number"] for row in listed(cluster, forked))
    nothing: tuple[int, list[str]] = (0, [])
    for k in range(1, last + 1):
        found = diffed(cluster, f"{source}@{k + 1}", f"{forked}@{k}")
        assert dict.fromkeys(found["agents"], nothing) == counts(found), k
        assert {"added": [], "removed": [], "changed": {}} == found["files"]
    text = cairn(
        "diff", f"{source}@3", f"{forked}@2", env={**cluster._env("cli"), "COLUMNS": "200"}
    )
    assert 0 == text.returncode, text.stderr
    for tool in ("write_file", "run_command", "send_message"):
        assert tool not in text.stdout


def test_two_branches_that_differ_count_messages_and_tool_calls_alike(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A tool call is added exactly when the message that makes it is, on either side.

    Two pairs of branches of GC 1. The source restored to GC 1 runs on with a note in each
    history that its plain fork lacks: from the note on, every message and call differ.
    A fork that gives the coder another system prompt differs from the source in the
    coder's whole history, and in no other agent's, whose steps merely ran at other times.
    """
    cluster.start_worker()
    source = cluster.tasks.submit(team_spec(tmp_path / "ledger"))
    run_until(cluster, source, 1)
    forked = cluster.tasks.fork(source, at=1)
    data = yaml.safe_load(TEAM.replace("LEDGER", str(tmp_path / "ledger")).replace("SLOW", "0"))
    data["agents"][1]["system"] = "You are a careful coder."
    careful = cluster.tasks.fork(source, at=1, spec=TaskSpec.model_validate(data))
    for task in (forked, careful):
        assert "succeeded" == cluster.drive(task)["status"]
    cluster.coordinator.restorer.restore(source, to=1)
    assert "succeeded" == cluster.drive(source)["status"]
    end = {task: f"{task}@{max(row['number'] for row in listed(cluster, task))}"
           for task in (source, forked, careful)}  # fmt: skip

    prompted = counts(diffed(cluster, end[forked], end[careful]))
    assert {"planner": (0, []), "reviewer": (0, [])} == {
        name: found for name, found in prompted.items() if name != "coder"
    }
    assert prompted["coder"][0]
    assert prompted["coder"][1]
    pairs = [(end[source], end[forked]), (end[forked], end[source]), (end[forked], end[careful])]
    for a, b in pairs:
        found = diffed(cluster, a, b)
        for name, agent in found["agents"].items():
            calls = [tool for message in agent["messages_added"] for tool in made(message)]
            assert calls == [c["tool"] for c in agent["tool_calls_added"]], (a, b, name)
        assert any(agent["messages_added"] for agent in found["agents"].values())
        assert any(agent["tool_calls_added"] for agent in found["agents"].values())
        assert {"added": [], "removed": [], "changed": {}} == found["files"]
