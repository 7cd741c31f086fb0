"""`cairn up` and `cairn down`: Cairn's processes for one directory, started and stopped.

`cairn up` runs Redis (a private one unless configured), a coordinator and workers in one
process group apart from its own (`cairn.cli.lifetime`), and takes them down with it on
SIGTERM, SIGINT or SIGHUP; on Linux they die with it even when it is SIGKILLed. Its run
files (`cairn.cli.runfiles`) tell other commands where its Redis is and `cairn down` which
processes to stop; its Redis keeps one port and password per directory, so a restart
serves the same URL.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import time
from pathlib import Path

from rich.console import Console

from cairn.cli.exits import Exit
from cairn.cli.lifetime import ChildGroup, group_alive, group_members, is_alive, kill_strays
from cairn.cli.processes import STOP_GRACE, Child, Supervisor, stop_on_signals, worker_children
from cairn.cli.render import say
from cairn.cli.runfiles import RunFiles, UpRecord
from cairn.connection import ping
from cairn.coordinator.settings import Settings, display_url
from cairn.testing.redis_server import RedisServer

DOWN_GRACE = STOP_GRACE + 5.0  # seconds `cairn down` waits for `cairn up` to stop it all
KILL_WAIT = 5.0  # seconds `cairn down` waits for what it SIGKILLed to be gone


def run_up(settings: Settings, workers: int, console: Console) -> int:
    """`cairn up`: Redis (a private one unless configured), a coordinator and workers.

    A private redis-server (with a password kept for this directory) keeps its data (AOF)
    under the state directory, and while it runs its URL is in `<state>/redis.url` (mode
    0600), so other `cairn` commands in this directory find it without configuration.
    """
    state = settings.state_dir
    files = RunFiles(state)
    stale = files.read()
    files.claim()
    if stale is not None and stale.pgid is not None:
        kill_strays(stale.pgid)
    # Set before any child starts: a signal during the start still stops all of it.
    stop = stop_on_signals()
    group = ChildGroup(on_new_group=files.record_group)
    # Redis is asked to stop (it writes its AOF); coordinator and workers are killed, as
    # a crash would: their writes are fenced, and one waiting for a Redis gone with
    # `cairn up` could outlive it.
    redis_launch = functools.partial(group.popen, death_signal=signal.SIGTERM)
    launch = functools.partial(group.popen, death_signal=signal.SIGKILL)
    server: RedisServer | None = None
    supervisor = Supervisor([])
    try:
        if settings.redis_url:
            url = settings.redis_url
            ping(url, settings.origin("redis_url"))
        else:
            server = RedisServer(
                state / "redis",
                appendonly=True,
                password=files.password(),
                port=files.port(console.print),
                launch=redis_launch,
            ).start()
            url = server.url
            files.write_url(url)
        logs = state / "logs"
        coordinator = Child(
            "coordinator",
            [sys.executable, "-m", "cairn.coordinator", "--name", "up"],
            settings.child_env(url),
            logs / "coordinator.log",
            launch,
        )
        supervisor.children = [
            coordinator,
            *worker_children(settings, url, workers, logs, launch=launch),
        ]
        supervisor.start()
        _say_up(console, settings, url, workers, server)
        supervisor.watch(stop)
    finally:
        try:
            supervisor.stop()
            if server is not None:
                server.stop()
            group.kill_rest()
        finally:
            files.remove()
    return Exit.OK


def _say_up(
    console: Console, settings: Settings, url: str, workers: int, server: RedisServer | None
) -> None:
    state = settings.state_dir
    where = "private redis-server, AOF in " + str(state / "redis") if server else "configured"
    console.print(f"Cairn is up. Redis: [bold]{display_url(url)}[/] ({where})")
    console.print(
        f"a coordinator and {workers} worker(s) ({settings.worker_concurrency} step(s) at"
        f" once each); logs in {state / 'logs'}; archive in {settings.archive}"
    )
    console.print("Ctrl-C (or `cairn down`) stops everything.")


def run_down(state: Path, console: Console) -> int:
    """`cairn down`: stop the `cairn up` of `state` and wait until all it ran is gone.

    Exit 0 once it stopped; exit 1, in one line, when none runs there (stale run files
    are removed, and what is left of their children killed).
    """
    files = RunFiles(state)
    record = files.running()
    if record is None:
        stale = files.read()
        if stale is not None and stale.pgid is not None:
            kill_strays(stale.pgid)
        files.remove()
        say(f"no cairn up is running in {state}")
        return Exit.FAILED
    count = len(group_members(record.pgid)) if record.pgid is not None else 0
    with contextlib.suppress(ProcessLookupError):
        os.kill(record.pid, signal.SIGTERM)
    if not _wait_gone(record, DOWN_GRACE):
        _kill_group(record.pgid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(record.pid, signal.SIGKILL)
        _wait_gone(record, KILL_WAIT)
        files.remove()
        console.print(
            f"killed cairn up (pid {record.pid}) in {state} and its {count} process(es):"
            f" they did not stop within {DOWN_GRACE:g} s"
        )
        return Exit.OK
    files.remove()  # gone already, unless it was stopped before it could remove them
    console.print(f"stopped cairn up (pid {record.pid}) in {state} and its {count} process(es)")
    return Exit.OK


def _wait_gone(record: UpRecord, timeout: float) -> bool:
    """Wait until `cairn up` and its whole process group are gone; False if `timeout` ran out."""
    deadline = time.monotonic() + timeout
    while is_alive(record.pid) or (record.pgid is not None and group_alive(record.pgid)):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _kill_group(pgid: int | None) -> None:
    if pgid is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
