"""A private `redis-server` process on a free port: for tests and the embedded default.

It never touches a Redis it did not start, and it is stopped (or killed, to test crashes)
by whoever started it.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from storage.errors import CairnError

START_TIMEOUT = 10.0


class RedisServerError(CairnError):
    """Raised when a private redis-server cannot be found or started."""


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """One redis-server child process with its own directory, port and AOF setting."""

    def __init__(
        self,
        directory: Path,
        *,
        appendonly: bool = False,
        port: int | None = None,
        bind: str = "127.0.0.1",
        password: str | None = None,
    ) -> None:
        self.directory = Path(directory).resolve()
        self.appendonly = appendonly
        self.bind = bind  # another address serves workers on other hosts (or namespaces)
        self.password = password  # required by Redis to serve beyond the loopback
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The redis:// URL of this server."""
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{self.bind}:{self.port}/0"

    def start(self) -> RedisServer:
        """Start the server (again, on the same port and data) and wait until it answers."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise RedisServerError(
                "redis-server is not on PATH: install it (apt-get install redis-server)"
            )
        self.directory.mkdir(parents=True, exist_ok=True)
        args = [
            binary,
            "--port", str(self.port),
            "--bind", self.bind,
            "--dir", str(self.directory),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "everysec",
            "--daemonize", "no",
            "--logfile", str(self.directory / "redis.log"),
        ]  # fmt: skip
        if self.password:
            args += ["--requirepass", self.password]
        self.process = subprocess.Popen(  # noqa: S603 - fixed arguments, binary from PATH
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + START_TIMEOUT
        client = redis.Redis(
            host=self.bind,
            port=self.port,
            password=self.password,
            socket_timeout=1,
            retry=Retry(NoBackoff(), 0),
        )
        try:
            while True:
                try:
                    if client.ping():
                        return self
                except redis.ConnectionError:
                    pass
                if self.process.poll() is not None or time.monotonic() > deadline:
                    log = self.directory / "redis.log"
                    raise RedisServerError(f"redis-server did not start on {self.port}; see {log}")
                time.sleep(0.02)
        finally:
            client.close()

    def stop(self) -> None:
        """Stop the server gracefully (it writes its AOF)."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def kill(self) -> None:
        """Kill the server with SIGKILL, as a crash would."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=10)
        self.process = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
