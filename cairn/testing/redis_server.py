"""A private `redis-server` process on a free port: for tests (yours and Cairn's) and `cairn up`.

It never touches a Redis it did not start, and it is stopped (or killed, to test crashes)
by whoever started it.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from cairn.errors import RedisServerError

START_TIMEOUT = 10.0

Launch = Callable[..., subprocess.Popen[bytes]]  # subprocess.Popen, or what wraps it


_HANDED_OUT: deque[int] = deque(maxlen=4_096)  # the latest ports free_port returned
_HANDING_OUT = threading.Lock()


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free right now, and not one handed out lately.

    A port is chosen before its server binds it, and the kernel may offer a port again
    until then: a replica set choosing six ports at once got its primary's port twice
    (the replica then failed to bind). So this process never hands out a port twice among
    its latest 4,096.
    """
    with _HANDING_OUT:
        while True:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = int(s.getsockname()[1])
            if port not in _HANDED_OUT:
                _HANDED_OUT.append(port)
                return port


def sigkill(process: subprocess.Popen[bytes] | None) -> None:
    """SIGKILL `process` if it runs, as a crash would, and reap it (up to 10 s)."""
    if process is not None and process.poll() is None:
        process.send_signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)


def redis_server_binary() -> str:
    """The `redis-server` on PATH, or `RedisServerError` saying how to install it."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RedisServerError(
            "redis-server is not on PATH: install it (apt-get install redis-server)"
        )
    return binary


@dataclass(frozen=True, slots=True)
class TLSFiles:
    """PEM files for a server that serves TLS only: its certificate, its key, the CA."""

    cert: Path
    key: Path
    ca: Path


class RedisServer:
    """One redis-server child process with its own directory, port and AOF setting.

    `fsync` is the AOF's `appendfsync` (`everysec`, `always` or `no`). With `username`,
    that ACL user (with `password`, allowed every key, channel and command) is the only
    one: the `default` user is switched off. Without it, `password` is `requirepass`.
    With `tls`, the port serves TLS only (`rediss://`, plain port off). With `replicaof`
    (host, port) it starts as a replica of that primary (`password` is the primary's too).
    `launch` starts the process (`launch(argv, stdout=..., stderr=...)`, default
    `subprocess.Popen`): `cairn up` starts it in its children's process group.
    """

    def __init__(
        self,
        directory: Path,
        *,
        appendonly: bool = False,
        port: int | None = None,
        bind: str = "127.0.0.1",
        password: str | None = None,
        username: str | None = None,
        tls: TLSFiles | None = None,
        fsync: str = "everysec",
        replicaof: tuple[str, int] | None = None,
        launch: Launch = subprocess.Popen,
    ) -> None:
        if username and not password:
            raise ValueError("an ACL user needs a password")
        self.directory = Path(directory).resolve()
        self.appendonly = appendonly
        self.fsync = fsync  # the AOF's appendfsync: `always` loses nothing to a SIGKILL
        self.bind = bind  # another address serves workers on other hosts (or namespaces)
        self.password = password  # required by Redis to serve beyond the loopback
        self.username = username
        self.tls = tls
        self.port = port or free_port()
        self.replicaof = replicaof
        self.launch = launch
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The URL of this server: redis://, or rediss:// naming the CA to trust."""
        auth = ""
        if self.password:
            auth = f"{quote(self.username or '', safe='')}:{quote(self.password, safe='')}@"
        if self.tls is None:
            return f"redis://{auth}{self.bind}:{self.port}/0"
        ca = quote(str(self.tls.ca.resolve()), safe="/")
        return f"rediss://{auth}{self.bind}:{self.port}/0?ssl_ca_certs={ca}"

    def start(self) -> RedisServer:
        """Start the server (again, on the same port and data) and wait until it answers."""
        binary = redis_server_binary()
        self.directory.mkdir(parents=True, exist_ok=True)
        args = [
            binary,
            *self._listen_args(),
            "--bind", self.bind,
            "--dir", str(self.directory),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", self.fsync,
            "--daemonize", "no",
            "--logfile", str(self.directory / "redis.log"),
        ]  # fmt: skip
        if self.username:
            args += ["--user", self.username, "on", f">{self.password}", "~*", "&*", "+@all"]
            args += ["--user", "default", "off"]
        elif self.password:
            args += ["--requirepass", self.password]
        if self.replicaof is not None:
            args += ["--replicaof", self.replicaof[0], str(self.replicaof[1])]
            if self.password:
                args += ["--masterauth", self.password]
                if self.username:
                    args += ["--masteruser", self.username]
        self.process = self.launch(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            self._wait_until_it_answers(self.process)
        except BaseException:
            self.kill()  # a server that never became usable is not left behind
            raise
        return self

    def _wait_until_it_answers(self, process: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        client = redis.Redis.from_url(self.url, socket_timeout=1, retry=Retry(NoBackoff(), 0))
        try:
            while True:
                try:
                    if client.ping():
                        return
                except redis.ConnectionError:
                    pass
                if process.poll() is not None or time.monotonic() > deadline:
                    log = self.directory / "redis.log"
                    raise RedisServerError(f"redis-server did not start on {self.port}; see {log}")
                time.sleep(0.02)
        finally:
            client.close()

    def _listen_args(self) -> list[str]:
        """The port arguments: plain TCP, or TLS only (`--port 0`) with the given files."""
        if self.tls is None:
            return ["--port", str(self.port)]
        return [
            "--port", "0",
            "--tls-port", str(self.port),
            "--tls-cert-file", str(self.tls.cert),
            "--tls-key-file", str(self.tls.key),
            "--tls-ca-cert-file", str(self.tls.ca),
            "--tls-auth-clients", "no",
        ]  # fmt: skip

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
        sigkill(self.process)
        self.process = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
