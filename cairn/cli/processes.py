"""Long-running commands: `cairn worker` and `cairn coordinator` (`cairn up`: `cairn.cli.up`).

`Supervisor` keeps a set of child processes alive (a worker that dies is started again,
after a backoff when it keeps dying young) and stops them all on SIGTERM, SIGINT or SIGHUP:
SIGTERM first, SIGKILL after a grace period. Workers are stateless and every write they
make is fenced, so killing one mid-step costs a retry of that step, nothing more.

Children learn their Redis from `CAIRN_REDIS_URL` in their environment, never from their
command line, which any user of the machine can read (`ps`, `/proc/PID/cmdline`).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO

from rich.console import Console

from cairn.agents.logs import get_logger
from cairn.agents.logship import ship_logs
from cairn.agents.tracing import start_tracing, stop_tracing
from cairn.client import Client
from cairn.connection import client_for, ping
from cairn.coordinator import metrics
from cairn.coordinator.coordinator import Coordinator
from cairn.coordinator.settings import Settings, display_url, open_store
from cairn.testing.redis_server import Launch

log = get_logger("cairn.cli")
YOUNG = 5.0  # seconds: a child dying sooner than this is restarted after a backoff
MAX_BACKOFF = 10.0
STOP_GRACE = 10.0  # seconds between SIGTERM and SIGKILL at shutdown


@dataclass(slots=True)
class Child:
    """One supervised process: how to start it, and its current incarnation."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path | None = None  # None: inherit stderr
    launch: Launch = subprocess.Popen  # `cairn up`: in its children's process group
    process: subprocess.Popen[bytes] | None = None
    log_file: IO[bytes] | None = None
    started: float = 0.0
    young_deaths: int = 0
    restart_at: float | None = None
    restarts: int = field(default=0)

    def spawn(self) -> None:
        """Start (or start again) the process."""
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self.log_file = self.log_path.open("ab")
        # Without a log file a child's output goes to our stderr: stdout is for results.
        out = self.log_file if self.log_file is not None else _stderr_fd()
        self.process = self.launch(self.argv, env=self.env, stdout=out, stderr=out)
        self.started, self.restart_at = time.monotonic(), None
        log.info("process started", process=self.name, pid=self.process.pid)

    def reap(self) -> int | None:
        """Return the exit code if the process ended (closing its log), else None."""
        if self.process is None:
            return None
        code = self.process.poll()
        if code is not None and self.log_file is not None:
            self.log_file.close()
            self.log_file = None
        return code


def _stderr_fd() -> int | None:
    """Our stderr's descriptor, or None (inherit) when it has none (a test's capture)."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return None


class Supervisor:
    """Keeps its children running until stopped."""

    def __init__(self, children: list[Child]) -> None:
        self.children = children

    def start(self) -> None:
        """Start every child."""
        for child in self.children:
            child.spawn()

    def watch(self, stop: threading.Event, poll: float = 0.1) -> None:
        """Restart children that die, until `stop` is set."""
        while not stop.wait(poll):
            now = time.monotonic()
            for child in self.children:
                if child.restart_at is not None:
                    if now >= child.restart_at:
                        child.restarts += 1
                        child.spawn()
                    continue
                code = child.reap()
                if code is None:
                    continue
                young = now - child.started < YOUNG
                child.young_deaths = child.young_deaths + 1 if young else 0
                delay = min(MAX_BACKOFF, 0.25 * 2**child.young_deaths) if young else 0.0
                child.restart_at = now + delay
                log.warning(
                    "process exited; restarting", process=child.name, code=code, after_s=delay
                )

    def stop(self, grace: float = STOP_GRACE) -> None:
        """SIGTERM every child, SIGKILL those still alive after `grace` seconds, reap all."""
        alive = [c.process for c in self.children if c.process and c.process.poll() is None]
        for process in alive:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
        deadline = time.monotonic() + grace
        for process in alive:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for child in self.children:
            child.reap()


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM, SIGINT or SIGHUP (Ctrl-C, or its terminal closing).

    Without the SIGHUP handler, a closed terminal would kill the command before it could
    stop what it started.
    """
    stop = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGHUP, request_stop)
    return stop


def worker_children(
    settings: Settings,
    url: str,
    count: int,
    logs: Path | None,
    module: str = "cairn.coordinator.worker",
    launch: Launch = subprocess.Popen,
) -> list[Child]:
    """`count` worker processes on the Redis at `url`, each `python -m module`."""
    env = settings.child_env(url)
    return [
        Child(
            f"worker-{n}",
            [sys.executable, "-m", module],
            env,
            None if logs is None else logs / f"worker-{n}.log",
            launch,
        )
        for n in range(count)
    ]


def run_workers(
    client: Client, count: int, console: Console, settings: Settings | None = None
) -> int:
    """`cairn worker --count N`: run N workers in the foreground until stopped."""
    stop = stop_on_signals()
    children = worker_children(settings or client.settings, client.url, count, None)
    supervisor = Supervisor(children)
    supervisor.start()
    each = (settings or client.settings).worker_concurrency
    steps = f", {each} step(s) at once each" if each > 1 else ""
    console.print(f"{count} worker(s){steps} on {display_url(client.url)}; Ctrl-C stops them")
    try:
        supervisor.watch(stop)
    finally:
        supervisor.stop()
    return 0


def run_coordinator(settings: Settings, name: str, lease_ms: int) -> int:
    """`cairn coordinator`: lead (or stand by, while another leads) until stopped."""
    url, origin = settings.redis()
    ping(url, origin)
    connection = client_for(url)
    ship_logs(connection, "coordinator")  # `cairn logs TASK` reads a task's lines from Redis
    stop = stop_on_signals()
    metrics.serve_coordinator(connection, settings.metrics_port)
    start_tracing(settings.traces("coordinator"))
    coordinator = Coordinator(
        connection,
        open_store(settings, connection),
        name=name,
        lease_ttl_ms=lease_ms,
    )
    log.info("coordinator running", name=name, redis=display_url(url))
    coordinator.run(stop)
    stop_tracing()
    return 0
