"""What a person sees first from `cairn`, run as processes against a real stack.

One private stack serves the module: a redis-server, a `cairn coordinator` and a
`cairn worker` process. Every command runs as its own process at 80 columns, as a
terminal of that width shows it, and is read as a person (or a shell script) reads it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cairn import Client, TaskStatus
from tests.cli_harness import cairn, private_stack
from tests.cluster import TEAM

ROOT = Path(__file__).resolve().parents[1]
LONG_NAME = "Review every module of the payments service before the release"  # a 40-char slug
ASKS_FIRST = """
name: NAME
goal: Write b.txt, with permission.
files: {"a.txt": "a\\n"}
agents:
  - name: writer
    model: scripted
    approve: [write_file]
    script:
      - say: May I?
        tools:
          - {name: write_file, args: {path: b.txt, content: "b\\n"}}
"""


class Stack:
    """The module's private Redis, a coordinator and a worker, and a client on them."""

    def __init__(self, env: dict[str, str], tmp: Path, client: Client) -> None:
        self.env, self.tmp, self.client = env, tmp, client

    def spec(self, name: str, text: str) -> Path:
        """Write a spec file named `name` and return its path."""
        path = self.tmp / f"{name}.yaml"
        path.write_text(text)
        return path

    def team(self, name: str, slow: float) -> Path:
        """The three-agent team of tests/cluster.py, the coder's second turn `slow` s long."""
        ledger = self.tmp / f"{name}.ledger"
        return self.spec(name, TEAM.replace("LEDGER", str(ledger)).replace("SLOW", str(slow)))

    def wait_for(self, task: str, seen: Callable[[TaskStatus], bool]) -> TaskStatus:
        """Poll the task's status until `seen` holds (30 s at most)."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            status = self.client.task(task).status()
            if seen(status):
                return status
            time.sleep(0.05)
        raise AssertionError(f"{task}: never seen; last {status}")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A private redis-server, `cairn coordinator` and `cairn worker`, 80 columns wide."""
    tmp = tmp_path_factory.mktemp("view")
    with (
        private_stack(tmp, "view-test", appendonly=False, COLUMNS="80") as (url, env),
        Client(url, tmp / "archive") as client,
    ):
        yield Stack(env, tmp, client)


def submitted(stack: Stack, spec: Path) -> str:
    """Submit `spec` with `cairn submit` as a shell script would: `T=$(cairn submit SPEC)`."""
    done = cairn("submit", str(spec), env=stack.env)
    assert 0 == done.returncode, done.stderr
    return done.stdout.strip()


def cells(table: str, column: int) -> list[str]:
    """The cells of a rich table's `column`, a cell folded over lines joined back."""
    found: list[str] = []
    for line in table.splitlines():
        parts = line.split("│")
        if len(parts) < column + 2:  # a border, the header, or a line outside the table
            continue
        cell = parts[column + 1].strip()
        if parts[1].strip():
            found.append(cell)
        elif cell:
            found[-1] += cell
    return found


def test_submit_prints_the_task_id_alone(stack: Stack) -> None:
    """`cairn submit` prints nothing but the new task's id on stdout: `T=$(cairn submit ...)`."""
    task = submitted(stack, stack.team("alone", slow=0.0))
    assert task == stack.client.task(task).id
    assert "succeeded" == stack.client.task(task).wait(timeout=60).state.value


def test_list_at_80_columns_shows_every_task_id_whole(stack: Stack) -> None:
    """`cairn list` never cuts a task id, however narrow the terminal and long the id."""
    task = submitted(stack, stack.spec("long", ASKS_FIRST.replace("NAME", LONG_NAME)))
    assert len(task) > 50
    done = cairn("list", env=stack.env)
    assert 0 == done.returncode, done.stderr
    assert all(len(line) <= 80 for line in done.stdout.splitlines())
    assert task in cells(done.stdout, 0)
    assert task in done.stdout  # on one line, as a person copies it


def test_approvals_at_80_columns_show_ids_whole(stack: Stack) -> None:
    """`cairn approvals` never cuts the task id, agent or call a decision names."""
    task = submitted(stack, stack.spec("asks", ASKS_FIRST.replace("NAME", LONG_NAME)))
    status = stack.wait_for(task, lambda s: s.state.value == "waiting_approval")
    [call] = stack.client.task(task).approvals()
    done = cairn("approvals", task, env=stack.env)
    assert 0 == done.returncode, done.stderr
    assert all(len(line) <= 80 for line in done.stdout.splitlines())
    assert [task, 'write_file {"content": "b\\n", "path": "b.txt"}'] == cells(done.stdout, 0)
    assert ["writer", ""] == cells(done.stdout, 1)  # the call's own line under it
    assert [call.call, ""] == cells(done.stdout, 2)
    assert "writer" == status.agents[0].name


def test_status_names_the_superstep_running_and_the_last_checkpoint(stack: Stack) -> None:
    """`cairn status` of a task mid-superstep names the superstep running, not the last GC's."""
    # Slow enough that `cairn watch`, started after `cairn status`, still sees superstep 2
    # running on a loaded machine: each command is a Python process starting.
    task = submitted(stack, stack.team("slow", slow=8.0))
    # GC 1 closes superstep 1; superstep 2 (the coder's slow turn) starts at once.
    stack.wait_for(task, lambda s: s.latest_checkpoint == 1)
    done = cairn("status", task, env=stack.env)
    assert 0 == done.returncode, done.stderr
    head = done.stdout.splitlines()[0]
    assert "running superstep 2" in head
    assert "(last checkpoint 1 at superstep 1)" in head
    watched = cairn("watch", task, env=stack.env)  # no terminal: a JSON line per change
    lines = [json.loads(line) for line in watched.stdout.splitlines()]
    assert lines[0]["running_superstep"] is not None
    assert (None, "succeeded") == (lines[-1]["running_superstep"], lines[-1]["status"])
    ended = stack.client.task(task).wait(timeout=60)
    done = cairn("status", task, env=stack.env)
    at = f"superstep {ended.superstep}  epoch {ended.epoch}  checkpoint {ended.latest_checkpoint}"
    assert at in done.stdout.splitlines()[0]
