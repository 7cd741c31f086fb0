"""`cairn up` and `cairn down` as a user runs them: real processes, signals, restarts.

Each test starts `cairn up` as a process in a session of its own, in a fresh directory,
and finds what it started through /proc (by parent and by process group) before it stops
it, so a child left behind fails the test. Whatever a test leaves running is killed, by
process group, when it ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cairn import Client
from cairn.errors import Unavailable
from cairn.testing.redis_server import free_port
from tests.cli_harness import wait_until

ROOT = Path(__file__).resolve().parents[1]
GONE_WITHIN = 15.0  # seconds: SIGTERM, 10 s of grace at most, SIGKILL, reaping


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def living() -> dict[int, tuple[int, int]]:
    """Every live process (zombies aside): pid → (parent pid, process group)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) and fields[0] != "Z":
            found[int(entry.name)] = (int(fields[1]), int(fields[2]))
    return found


def in_groups(groups: set[int]) -> set[int]:
    """The live processes of these process groups."""
    return {pid for pid, (_, pgid) in living().items() if pgid in groups}


@dataclass
class Directory:
    """A fresh directory to run `cairn` in, and every process group started there."""

    path: Path
    env: dict[str, str]
    groups: set[int] = field(default_factory=set)
    started: list[subprocess.Popen[bytes]] = field(default_factory=list)  # reaped after

    @property
    def state(self) -> Path:
        """Its state directory, `.cairn`."""
        return self.path / ".cairn"

    def cairn(self, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """Run `cairn ARGS` to its end, here (or in `cwd`)."""
        return subprocess.run(
            [sys.executable, "-m", "cairn.cli", *args],
            cwd=cwd or self.path,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def spawn(self, *args: str, log: str) -> subprocess.Popen[bytes]:
        """Start `cairn ARGS` here in a session of its own, its output in `log`."""
        with (self.path / log).open("ab") as sink:
            process = subprocess.Popen(
                [sys.executable, "-m", "cairn.cli", *args],
                cwd=self.path,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.groups.add(process.pid)
        self.started.append(process)
        return process

    def up(self) -> Up:
        """Start `cairn up --workers 1` and wait until it runs all it starts."""
        process = self.spawn("up", "--workers", "1", log="up.log")

        def settled() -> bool:  # three children, each past its fork into the children's group
            family = children_of(process.pid)
            groups = {pgid for pid, (_, pgid) in living().items() if pid in family}
            return len(family) == 3 and len(groups) == 1 and process.pid not in groups

        # redis-server, coordinator, worker: one group, apart from `cairn up`'s own
        wait_until(lambda: settled() or process.poll() is not None)
        assert process.poll() is None, (self.path / "up.log").read_text()
        wait_until((self.state / "redis.url").exists)
        family = children_of(process.pid)
        groups = {living()[pid][1] for pid in family}
        self.groups |= groups
        return Up(process, family | in_groups(groups), groups)


@dataclass
class Up:
    """A running `cairn up`: its process, and what it started (by pid and by group)."""

    process: subprocess.Popen[bytes]
    family: set[int]
    groups: set[int]

    def gone(self) -> bool:
        """Whether `cairn up` ended and nothing it started is left."""
        alive = living()
        return (
            self.process.poll() is not None
            and not self.family & alive.keys()
            and not {pid for pid, (_, pgid) in alive.items() if pgid in self.groups}
        )


def put_down(groups: set[int], started: list[subprocess.Popen[bytes]]) -> None:
    """SIGKILL every process of `groups`, then reap the processes a test `started`."""
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
    for process in started:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(10)


def children_of(parent: int) -> set[int]:
    return {pid for pid, (ppid, _) in living().items() if ppid == parent}


@pytest.fixture
def here(tmp_path: Path) -> Iterator[Directory]:
    """A fresh directory with no Cairn setting but its own; what ran there is killed after."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAIRN_")}
    env |= {"PYTHONPATH": str(ROOT), "CAIRN_LOG_FORMAT": "json"}
    directory = Directory(tmp_path, env)
    try:
        yield directory
    finally:
        put_down(directory.groups, directory.started)


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_up_takes_everything_it_started_down(
    here: Directory, signum: signal.Signals
) -> None:
    """SIGHUP (its terminal closed), SIGTERM or SIGINT: no child left, no run file left."""
    up = here.up()
    os.kill(up.process.pid, signum)
    wait_until(up.gone, GONE_WITHIN)
    assert 0 == up.process.returncode
    assert not (here.state / "redis.url").exists()
    assert not (here.state / "up.pid").exists()


def test_a_sigkilled_up_leaves_no_child_and_never_blocks_the_next(here: Directory) -> None:
    """Its children die with it (parent death signal); the next `up` cleans up after it."""
    first = here.up()
    url = (here.state / "redis.url").read_text()
    first.process.kill()
    wait_until(first.gone, 5)
    assert (here.state / "up.pid").exists()  # stale: nothing could remove it
    second = here.up()
    assert url == (here.state / "redis.url").read_text()  # same port, same password
    assert [f"{second.process.pid}", *map(str, second.groups)] == (
        (here.state / "up.pid").read_text().split()
    )
    second.process.terminate()
    wait_until(second.gone, GONE_WITHIN)


def test_a_second_up_while_one_runs_is_refused(here: Directory) -> None:
    """One line, exit 2, and the running one is untouched."""
    up = here.up()
    done = here.cairn("up")
    assert 2 == done.returncode
    assert [f"cairn: cairn up is running already in .cairn (pid {up.process.pid})"] == (
        done.stderr.splitlines()
    )
    assert not up.gone()
    up.process.terminate()
    wait_until(up.gone, GONE_WITHIN)


def test_down_stops_up_from_another_terminal(here: Directory) -> None:
    """`cairn down` waits until all of it is gone (exit 0); with none running, exit 1."""
    up = here.up()
    count = len(up.family)
    done = here.cairn("down")
    assert (0, "") == (done.returncode, done.stderr)
    assert [f"stopped cairn up (pid {up.process.pid}) in .cairn and its {count} process(es)"] == (
        done.stdout.splitlines()
    )
    assert up.gone()  # when `down` returns, not later
    assert 0 == up.process.returncode
    assert not (here.state / "redis.url").exists()
    done = here.cairn("down")
    assert (1, "") == (done.returncode, done.stdout)
    assert ["cairn: no cairn up is running in .cairn"] == done.stderr.splitlines()


def test_down_after_a_killed_up_cleans_its_run_files(here: Directory) -> None:
    """No `cairn up` runs: exit 1, one line, and the run files it left are gone."""
    up = here.up()
    up.process.kill()
    wait_until(up.gone, 5)
    done = here.cairn("down")
    assert (1, ["cairn: no cairn up is running in .cairn"]) == (
        done.returncode,
        done.stderr.splitlines(),
    )
    assert not (here.state / "up.pid").exists()
    assert not (here.state / "redis.url").exists()
    assert (here.state / "redis.port").exists()  # kept for the next `cairn up`


def test_down_with_dir_from_elsewhere(here: Directory, tmp_path: Path) -> None:
    """`cairn down --dir DIR` stops the `cairn up` that runs in DIR."""
    up = here.up()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = here.cairn("down", "--dir", str(here.path), cwd=elsewhere)
    assert 0 == done.returncode, done.stderr
    assert up.gone()


def test_a_client_and_a_console_left_open_survive_a_restart(
    here: Directory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restart serves the same URL and data: an open `Client()` and console go on."""
    first = here.up()
    port = (here.state / "redis.port").read_text()
    console_port = free_port()
    console = here.spawn("console", "--port", str(console_port), log="console.log")
    api = f"http://127.0.0.1:{console_port}/api/tasks"

    def answers() -> bool:
        try:
            with urllib.request.urlopen(api, timeout=5) as reply:
                return bool(reply.status == 200)
        except OSError:
            return False

    wait_until(answers, 30)
    spec = here.path / "idle.yaml"
    spec.write_text(IDLE)
    for name in [name for name in os.environ if name.startswith("CAIRN_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(here.path)  # a REPL opened where `cairn up` runs
    with Client() as client:
        task = client.submit(spec)
        first.process.send_signal(signal.SIGHUP)
        wait_until(first.gone, GONE_WITHIN)
        with pytest.raises(Unavailable):
            client.tasks()  # no Redis meanwhile: the call fails, the client stays usable
        second = here.up()
        assert port == (here.state / "redis.port").read_text()
        assert task.id in [status.task_id for status in client.tasks()]  # the data kept too
    with urllib.request.urlopen(api, timeout=10) as reply:
        assert task.id in [status["task_id"] for status in json.loads(reply.read())]
    console.terminate()
    console.wait(20)
    second.process.terminate()
    wait_until(second.gone, GONE_WITHIN)


def test_a_taken_port_moves_redis_and_says_so(here: Directory) -> None:
    """The port kept is taken by someone else: a new one, in one line, kept from then on."""
    (here.state).mkdir()
    taken = free_port()
    (here.state / "redis.port").write_text(f"{taken}\n")
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", taken))
        holder.listen()
        started = time.monotonic()
        up = here.up()
        assert time.monotonic() - started < 20
        kept = int((here.state / "redis.port").read_text())
        assert taken != kept
        assert (
            f"port {taken} of this directory's Redis is taken: it listens on {kept}"
            in (here.path / "up.log").read_text()
        )
    up.process.terminate()
    wait_until(up.gone, GONE_WITHIN)


IDLE = """
name: Idle
goal: Wait.
agents:
  - name: waiter
    model: scripted
    script:
      - say: Done.
        tools:
          - {name: finish, args: {summary: done}}
"""
