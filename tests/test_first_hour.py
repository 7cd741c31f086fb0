"""A newcomer's first hour, scripted: the README's CLI tour around `cairn up` and `cairn down`.

In a fresh directory: `cairn up` in the background, the example team submitted, watched
to its end, its status and checkpoints read; the terminal running `cairn up` closed
(SIGHUP), `cairn up` again, the task still there; `cairn down`. Nothing the test started
may be left running, by process group or by descent.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from tests.cli_harness import wait_until
from tests.test_up import GONE_WITHIN, living

ROOT = Path(__file__).resolve().parents[1]


def descendants(root: int) -> set[int]:
    """The live processes `root` started, and those they started, and so on."""
    alive = living()
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, (ppid, _) in alive.items() if ppid in frontier} - found
        found |= frontier
    return found


def test_the_first_hour_leaves_nothing_behind(tmp_path: Path) -> None:
    """up, submit, watch, status, checkpoints, SIGHUP, up again, status, down: all clean."""
    (tmp_path / "examples").mkdir()
    shutil.copy(ROOT / "examples" / "team.yaml", tmp_path / "examples" / "team.yaml")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAIRN_")}
    env["PYTHONPATH"] = str(ROOT)
    state = tmp_path / ".cairn"
    groups: set[int] = set()  # every process group the test saw, to check (and clean) at the end
    seen: set[int] = set()  # every process `cairn up` started, however deep

    def cairn(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "cairn.cli", *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def up() -> subprocess.Popen[bytes]:
        with (tmp_path / "up.log").open("ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "cairn.cli", "up", "--workers", "2"],
                cwd=tmp_path,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # as a terminal's shell starts a job
            )
        groups.add(process.pid)
        wait_until(lambda: (state / "redis.url").exists() or process.poll() is not None)
        assert process.poll() is None, (tmp_path / "up.log").read_text()
        return process

    def note_family(process: subprocess.Popen[bytes]) -> None:
        family = descendants(process.pid)
        seen.update(family)
        groups.update(pgid for pid, (_, pgid) in living().items() if pid in family)

    def left() -> set[int]:
        return {pid for pid, (_, pgid) in living().items() if pgid in groups} | (
            seen & living().keys()
        )

    try:
        first = up()
        url = (state / "redis.url").read_text()
        done = cairn("submit", "examples/team.yaml")
        assert 0 == done.returncode, done.stderr
        task = done.stdout.split()[-1]
        note_family(first)
        done = cairn("watch", task)
        assert 0 == done.returncode, done.stdout + done.stderr
        note_family(first)
        done = cairn("status", task)
        assert (0, True) == (done.returncode, "succeeded" in done.stdout), done.stderr
        done = cairn("checkpoints", task, "--json")
        assert 0 == done.returncode, done.stderr
        assert len(json.loads(done.stdout)) >= 2  # GC 0, and one per superstep after it
        note_family(first)

        first.send_signal(signal.SIGHUP)  # its terminal closed
        wait_until(lambda: first.poll() is not None and not left(), GONE_WITHIN)
        assert not (state / "redis.url").exists()

        second = up()
        assert url == (state / "redis.url").read_text()
        note_family(second)
        done = cairn("status", task, "--json")
        assert (0, "succeeded") == (done.returncode, json.loads(done.stdout)["status"])
        done = cairn("down")
        assert 0 == done.returncode, done.stderr
        assert done.stdout.startswith(f"stopped cairn up (pid {second.pid})")
        assert set() == left()  # `down` returned once all of it was gone
        assert 0 == second.wait(5)
        assert not (state / "redis.url").exists()
    finally:
        for group in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
