"""The files `cairn up` keeps in its state directory, and what they say about it.

While it runs: `redis.url` (its Redis, password included; mode 0600) and `up.pid` (its
pid, then the process group of its children, one a line). Both go when it stops; a
`cairn up` killed before it could remove them left them *stale* (its pid is dead), and the
next `cairn up` or `cairn down` removes them.

Across runs: `redis.port` and `redis.password` (mode 0600), so a restarted `cairn up`
serves the same URL and a `Client()` or `cairn console` left open reconnects to it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cairn.cli.lifetime import runs_cairn_up
from cairn.coordinator.settings import URL_FILE
from cairn.errors import InvalidSpec
from cairn.testing.redis_server import free_port

PID_FILE = "up.pid"
PORT_FILE = "redis.port"
PASSWORD_FILE = "redis.password"  # noqa: S105 - a file name
PORT_WAIT = 3.0  # seconds: how long the Redis of a `cairn up` just killed may hold its port


@dataclass(frozen=True, slots=True)
class UpRecord:
    """What `up.pid` says: the `cairn up` process, and its children's process group."""

    pid: int
    pgid: int | None


@dataclass(frozen=True, slots=True)
class RunFiles:
    """The run files of `cairn up` in one state directory."""

    state: Path

    @property
    def pid_file(self) -> Path:
        """`up.pid`: the `cairn up` that runs here."""
        return self.state / PID_FILE

    @property
    def url_file(self) -> Path:
        """`redis.url`: its Redis."""
        return self.state / URL_FILE

    def read(self) -> UpRecord | None:
        """What `up.pid` says, or None when there is none (or it is not one)."""
        try:
            lines = self.pid_file.read_text().split()
            return UpRecord(int(lines[0]), int(lines[1]) if len(lines) > 1 else None)
        except (OSError, ValueError, IndexError):
            return None

    def running(self) -> UpRecord | None:
        """The `cairn up` of this directory, if one runs."""
        record = self.read()
        return record if record is not None and runs_cairn_up(record.pid) else None

    def claim(self) -> None:
        """Record this process as the directory's `cairn up`, or raise `InvalidSpec`.

        Stale run files are removed first; of two `cairn up` starting at once, one wins.
        """
        stale = self.read()
        if stale is not None and runs_cairn_up(stale.pid):
            raise InvalidSpec(f"cairn up is running already in {self.state} (pid {stale.pid})")
        self.url_file.unlink(missing_ok=True)
        if stale is not None and self.read() == stale:  # not one another `cairn up` just wrote
            self.pid_file.unlink(missing_ok=True)
        self.state.mkdir(parents=True, exist_ok=True)
        try:
            descriptor = os.open(self.pid_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            raise InvalidSpec(f"cairn up is starting already in {self.state}") from None
        with os.fdopen(descriptor, "w") as out:
            out.write(f"{os.getpid()}\n")

    def record_group(self, pgid: int) -> None:
        """Add the children's process group to `up.pid` (for `cairn down`)."""
        self.pid_file.write_text(f"{os.getpid()}\n{pgid}\n")

    def write_url(self, url: str) -> None:
        """Say which Redis runs: `redis.url`, readable by this user alone (it holds a password)."""
        _write_private(self.url_file, url)

    def remove(self) -> None:
        """Remove the files that say a `cairn up` runs (what survives it stays)."""
        self.url_file.unlink(missing_ok=True)
        self.pid_file.unlink(missing_ok=True)

    def password(self) -> str:
        """The Redis password of this directory: the one kept, else a new one, kept."""
        with contextlib.suppress(OSError):
            if kept := (self.state / PASSWORD_FILE).read_text().strip():
                return kept
        # A password of its own, though it listens on the loopback only: an agent's command
        # allowed the network (`network: true`) shares this host's loopback.
        made = secrets.token_hex(16)
        _write_private(self.state / PASSWORD_FILE, made)
        return made

    def port(self, say: Callable[[str], None]) -> int:
        """The Redis port of this directory: the one kept while it is free, else a new one.

        A port held by someone else is waited for a moment (the Redis of a `cairn up` killed
        just before may still be exiting), then given up, in one line through `say`.
        """
        path = self.state / PORT_FILE
        try:
            kept: int | None = int(path.read_text().strip())
        except (OSError, ValueError):
            kept = None
        if kept is not None:
            deadline = time.monotonic() + PORT_WAIT
            while not port_is_free(kept):
                if time.monotonic() > deadline:
                    chosen = free_port()
                    say(f"port {kept} of this directory's Redis is taken: it listens on {chosen}")
                    path.write_text(f"{chosen}\n")
                    return chosen
                time.sleep(0.1)
            return kept
        chosen = free_port()
        path.write_text(f"{chosen}\n")
        return chosen


def port_is_free(port: int) -> bool:
    """Whether nothing listens on `port` of 127.0.0.1 (a closed connection's TIME_WAIT aside)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as redis-server binds
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _write_private(path: Path, text: str) -> None:
    """Write `text` to `path`, readable by this user alone from before it holds anything."""
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text(text + "\n")
