"""Calling `cairn` as tests do: `main(argv)` in this process, or as processes of its own.

In-process: `main(argv)` → (exit code, stdout, stderr). As processes: `cairn(...)` runs one
to its end, `spawn(...)` starts one in the background, `children(...)` finds what it
started (and the command lines they run with).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
import structlog

from cairn.cli import main
from cairn.testing.redis_server import RedisServer

Run = Callable[..., tuple[int, str, str]]
ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def cli_runner(
    env: Mapping[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Iterator[Run]:
    """Yield a caller of `main` with `env` set; structlog's set-up is given back after."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    saved = structlog.get_config()

    def call(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    try:
        yield call
    finally:
        structlog.configure(**saved)  # each command configures logging its own way


def cairn(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run `python -m cairn.cli ARGS` as a process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "cairn.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """Start `python -m cairn.cli ARGS` in the background, its stderr in `log`."""
    with log.open("wb") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "cairn.cli", *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=sink,
        )


@contextlib.contextmanager
def private_stack(
    tmp: Path, name: str, *, appendonly: bool = True, **extra: str
) -> Iterator[tuple[str, dict[str, str]]]:
    """A redis-server of its own, a `cairn coordinator` and a `cairn worker` process on it.

    Yields the Redis URL and the environment `cairn` processes run with (every setting
    under `tmp`, JSON logs, `extra` on top); stops them all after.
    """
    server = RedisServer(tmp / "redis", appendonly=appendonly).start()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "CAIRN_REDIS_URL": server.url,
        "CAIRN_STATE_DIR": str(tmp / "state"),
        "CAIRN_ARCHIVE_DIR": str(tmp / "archive"),
        "CAIRN_CACHE_DIR": str(tmp / "cache"),
        "CAIRN_LOG_FORMAT": "json",
        **extra,
    }
    processes = [
        spawn(["coordinator", "--name", name, "--lease-ms", "1000"], env, tmp / "coordinator.log"),
        spawn(["worker", "--count", "1"], env, tmp / "worker.log"),
    ]
    try:
        yield server.url, env
    finally:
        for process in processes:
            stop(process)
        server.stop()


def stop(process: subprocess.Popen[bytes], timeout: float = 20) -> int:
    """SIGTERM a process and return its exit code (SIGKILL it if it will not stop)."""
    if process.poll() is None:
        process.terminate()
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise


def children(parent: int, marker: str) -> set[int]:
    """The live child processes of `parent` whose command line holds `marker`."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == parent and fields[0] != "Z" and marker in command:
            found.add(int(entry.name))
    return found


def wait_until(check: Callable[[], bool], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.05)


def cmdline(pid: int) -> str:
    """The command line process `pid` runs with, as `ps` shows it to every user."""
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
