"""A newcomer's first hour, scripted: the README's tours around `cairn up` and `cairn down`.

In a fresh directory: `cairn up` in the background; the README's Python tour and CLI tour
run as written, read out of README.md (a tour that no longer runs fails here); the example
team submitted, watched to its end, its status and checkpoints read; a model that cannot
be reached seen failing in `status` and `logs`, a misspelt tool refused at submit; the
terminal running `cairn up` closed (SIGHUP), `cairn up` again, the task still there; `cairn down`.
Nothing the test started may be left running, by process group or by descent.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cairn.testing.redis_server import free_port
from tests.cli_harness import wait_until
from tests.test_up import GONE_WITHIN, living, put_down

ROOT = Path(__file__).resolve().parents[1]
# A model nobody answers (a closed port), and a tool no worker has.
UNREACHABLE = """
name: Unreachable
goal: Say hello.
agents:
  - {name: writer, model: openai:gpt-test, base_url: "http://127.0.0.1:PORT/v1", timeout: 1}
"""
MISSPELT = """
name: Misspelt
goal: Say hello.
agents:
  - {name: writer, model: scripted, tools: [write_fle], script: [{say: hi}]}
"""


def readme_block(section: str, language: str) -> str:
    """The first `language` code block under the README's `## section` heading."""
    text = (ROOT / "README.md").read_text()
    after = text[text.index(f"## {section}\n") :]
    start = after.index(f"```{language}\n") + len(f"```{language}\n")
    return after[start : after.index("```", start)]


def descendants(root: int) -> set[int]:
    """The live processes `root` started, and those they started, and so on."""
    alive = living()
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, (ppid, _) in alive.items() if ppid in frontier} - found
        found |= frontier
    return found


@dataclass
class Newcomer:
    """A fresh directory with the examples, and every process `cairn up` started there."""

    path: Path
    env: dict[str, str]
    groups: set[int] = field(default_factory=set)  # every process group seen
    started: list[subprocess.Popen[bytes]] = field(default_factory=list)  # reaped after
    seen: set[int] = field(default_factory=set)  # every process `cairn up` started, however deep

    @property
    def state(self) -> Path:
        """The state directory, `.cairn`."""
        return self.path / ".cairn"

    def cairn(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run `cairn ARGS` here, to its end."""
        return subprocess.run(
            [sys.executable, "-m", "cairn.cli", *args],
            cwd=self.path,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def tour(self, argv: list[str], script: str) -> subprocess.CompletedProcess[str]:
        """Run one of the README's tours, as a user pastes it, with `cairn` on the PATH."""
        env = {**self.env, "PATH": f"{Path(sys.executable).parent}:{self.env['PATH']}"}
        return subprocess.run(
            [*argv, script],
            cwd=self.path,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )

    def up(self) -> subprocess.Popen[bytes]:
        """Start `cairn up --workers 2` as a terminal's shell starts a job; wait for its Redis."""
        with (self.path / "up.log").open("ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "cairn.cli", "up", "--workers", "2"],
                cwd=self.path,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.groups.add(process.pid)
        self.started.append(process)
        wait_until(lambda: (self.state / "redis.url").exists() or process.poll() is not None)
        assert process.poll() is None, (self.path / "up.log").read_text()
        return process

    def note_family(self, process: subprocess.Popen[bytes]) -> None:
        """Remember what `process` runs now, and their process groups."""
        family = descendants(process.pid)
        self.seen |= family
        self.groups |= {pgid for pid, (_, pgid) in living().items() if pid in family}

    def left(self) -> set[int]:
        """What still runs of all that was noted."""
        alive = living()
        return {pid for pid, (_, pgid) in alive.items() if pgid in self.groups} | (
            self.seen & alive.keys()
        )


@pytest.fixture
def newcomer(tmp_path: Path) -> Iterator[Newcomer]:
    """A fresh directory holding `examples/team.yaml`; what ran there is killed after."""
    (tmp_path / "examples").mkdir()
    shutil.copy(ROOT / "examples" / "team.yaml", tmp_path / "examples" / "team.yaml")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAIRN_")}
    env["PYTHONPATH"] = str(ROOT)
    here = Newcomer(tmp_path, env)
    try:
        yield here
    finally:
        put_down(here.groups, here.started)


def test_the_first_hour_leaves_nothing_behind(newcomer: Newcomer) -> None:
    """up, submit, watch, status, checkpoints, SIGHUP, up again, status, down: all clean."""
    first = newcomer.up()
    url = (newcomer.state / "redis.url").read_text()
    done = newcomer.cairn("submit", "examples/team.yaml")
    assert 0 == done.returncode, done.stderr
    task = done.stdout.split()[-1]
    newcomer.note_family(first)
    done = newcomer.cairn("watch", task)
    assert 0 == done.returncode, done.stdout + done.stderr
    newcomer.note_family(first)
    done = newcomer.cairn("status", task)
    assert (0, True) == (done.returncode, "succeeded" in done.stdout), done.stderr
    done = newcomer.cairn("checkpoints", task, "--json")
    assert 0 == done.returncode, done.stderr
    assert len(json.loads(done.stdout)) >= 2  # GC 0, and one per superstep after it
    newcomer.note_family(first)

    python_tour = newcomer.tour([sys.executable, "-c"], readme_block("A Python tour", "python"))
    assert 0 == python_tour.returncode, python_tour.stdout + python_tour.stderr
    assert "TaskState.SUCCEEDED" in python_tour.stdout
    assert (newcomer.path / "out" / "words.py").read_text().count("text.split()") == 1
    cli_tour = newcomer.tour(["bash", "-euo", "pipefail", "-c"], readme_block("A CLI tour", "sh"))
    assert 0 == cli_tour.returncode, cli_tour.stdout + cli_tour.stderr
    assert (newcomer.path / "timeline.html").exists()
    assert "text.split(" in (newcomer.path / "at-gc-1" / "words.py").read_text()
    newcomer.note_family(first)
    trip_over_a_failing_model_and_a_misspelt_tool(newcomer)
    newcomer.note_family(first)

    first.send_signal(signal.SIGHUP)  # its terminal closed
    wait_until(lambda: first.poll() is not None and not newcomer.left(), GONE_WITHIN)
    assert not (newcomer.state / "redis.url").exists()

    second = newcomer.up()
    assert url == (newcomer.state / "redis.url").read_text()
    newcomer.note_family(second)
    done = newcomer.cairn("status", task, "--json")
    assert (0, "succeeded") == (done.returncode, json.loads(done.stdout)["status"])
    done = newcomer.cairn("down")
    assert 0 == done.returncode, done.stderr
    assert done.stdout.startswith(f"stopped cairn up (pid {second.pid})")
    assert set() == newcomer.left()  # `down` returned once all of it was gone
    assert 0 == second.wait(5)
    assert not (newcomer.state / "redis.url").exists()


def trip_over_a_failing_model_and_a_misspelt_tool(newcomer: Newcomer) -> None:
    """A model nobody answers shows in status and logs; a tool no worker has is refused."""
    (newcomer.path / "unreachable.yaml").write_text(UNREACHABLE.replace("PORT", str(free_port())))
    done = newcomer.cairn("submit", "unreachable.yaml")
    assert 0 == done.returncode, done.stderr
    task = done.stdout.strip()

    def writer() -> dict[str, object]:
        status = json.loads(newcomer.cairn("status", task, "--json").stdout)
        return dict(status["agents"][0])

    wait_until(lambda: "last_error" in writer(), 60)
    assert "ConnectionRefusedError" in str(writer()["last_error"])
    logs = newcomer.cairn("logs", task, "--agent", "writer")
    assert (0, True) == (logs.returncode, " step failed " in logs.stdout), logs.stderr
    assert "Traceback" not in logs.stdout
    assert 0 == newcomer.cairn("cancel", task).returncode

    (newcomer.path / "misspelt.yaml").write_text(MISSPELT)
    refused = newcomer.cairn("submit", "misspelt.yaml")
    assert 2 == refused.returncode
    assert 1 == len(refused.stderr.splitlines()), refused.stderr
    assert "did you mean write_file?" in refused.stderr
