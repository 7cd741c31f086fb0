"""Redis with replicas and Sentinels as real processes: for tests and the chaos suite.

`ReplicaSet` starts a primary, its replicas (`--replicaof`) and three Sentinels
(`redis-server CONF --sentinel`) on free loopback ports, each in a directory of its own,
with Sentinel timings short enough that a failover takes a few seconds. Its `url` is the
`redis+sentinel://` URL every Cairn process takes; `failover()` SIGKILLs the primary and
returns once the Sentinels name the replica they promoted. Everything it started is
stopped by `stop()` (or the `with` block's end).
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from cairn.errors import RedisServerError
from cairn.testing.redis_server import (
    START_TIMEOUT,
    RedisServer,
    free_port,
    redis_server_binary,
    sigkill,
)

HOST = "127.0.0.1"
DOWN_AFTER_MS = 1_000  # a primary silent this long is down for a Sentinel
# Also how soon a failover that seems stuck is tried again (twice this), with another
# replica: on a busy machine a short one promotes a second replica over the first,
# whose writes are then lost. Sentinel's default is 180 s; 10 s keeps tests quick.
FAILOVER_TIMEOUT_MS = 10_000
FAILOVER_WAIT = 30.0  # seconds `failover` waits for a promotion at most


def _client(port: int, password: str | None = None) -> redis.Redis:
    """A plain client of one process on the loopback, with short timeouts and no retry."""
    return redis.Redis(HOST, port, password=password, socket_timeout=1, retry=Retry(NoBackoff(), 0))


def _wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    """Return once `check()` holds; `RedisServerError` naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(redis.RedisError):
            if check():
                return
        if time.monotonic() > deadline:
            raise RedisServerError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)


class SentinelServer:
    """One Sentinel process watching `service`, whose primary is first at `primary`."""

    def __init__(
        self,
        directory: Path,
        service: str,
        primary: tuple[str, int],
        *,
        password: str | None = None,
        quorum: int = 2,
        down_after_ms: int = DOWN_AFTER_MS,
        failover_timeout_ms: int = FAILOVER_TIMEOUT_MS,
    ) -> None:
        self.directory = Path(directory).resolve()
        self.service, self.primary, self.password = service, primary, password
        self.quorum, self.down_after_ms = quorum, down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def _config(self) -> str:
        """The configuration file's text (Sentinel rewrites the file as it learns)."""
        s = self.service
        lines = [
            f"port {self.port}", f"bind {HOST}", "daemonize no",
            f"dir {self.directory}", f"logfile {self.directory / 'sentinel.log'}",
            f"sentinel monitor {s} {self.primary[0]} {self.primary[1]} {self.quorum}",
            f"sentinel down-after-milliseconds {s} {self.down_after_ms}",
            f"sentinel failover-timeout {s} {self.failover_timeout_ms}",
            f"sentinel parallel-syncs {s} 1",
        ]  # fmt: skip
        if self.password:
            quoted = self.password.replace("\\", "\\\\").replace('"', '\\"')
            lines.append(f'sentinel auth-pass {s} "{quoted}"')
        return "\n".join(lines) + "\n"

    def start(self) -> SentinelServer:
        """Start the Sentinel and wait until it answers."""
        binary = redis_server_binary()
        self.directory.mkdir(parents=True, exist_ok=True)
        config = self.directory / "sentinel.conf"
        config.write_text(self._config())
        self.process = subprocess.Popen(  # noqa: S603 - fixed arguments, binary from PATH
            [binary, str(config), "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = self.client()
        try:
            _wait_for(lambda: bool(client.ping()), START_TIMEOUT, f"Sentinel on {self.port}")
        except BaseException:
            self.kill()
            raise
        finally:
            client.close()
        return self

    def client(self) -> redis.Redis:
        """A client of this Sentinel (close it when done)."""
        return _client(self.port)

    def master(self) -> tuple[str, int] | None:
        """The primary's address as this Sentinel names it now."""
        client = self.client()
        try:
            found = cast(
                tuple[bytes | str, int] | None,
                client.sentinel_get_master_addr_by_name(self.service),
            )
        finally:
            client.close()
        if not found:
            return None
        host = found[0].decode() if isinstance(found[0], bytes) else str(found[0])
        return host, int(found[1])

    def watch(self, primary: tuple[str, int]) -> None:
        """Forget the service's primary and watch `primary` as it, with this set's timings."""
        client = self.client()
        try:
            client.sentinel_remove(self.service)
            client.sentinel_monitor(self.service, primary[0], primary[1], self.quorum)
            client.sentinel_set(self.service, "down-after-milliseconds", self.down_after_ms)
            client.sentinel_set(self.service, "failover-timeout", self.failover_timeout_ms)
            if self.password:
                client.sentinel_set(self.service, "auth-pass", self.password)
        finally:
            client.close()
        self.primary = primary

    def kill(self) -> None:
        """Kill the Sentinel with SIGKILL."""
        sigkill(self.process)
        self.process = None


class ReplicaSet:
    """A primary, `replicas` replicas and `sentinels` Sentinels watching them.

    With `password`, every Redis requires it (replicas authenticate with it) and the
    URL carries it; the Sentinels themselves take no password.
    """

    def __init__(
        self,
        directory: Path,
        *,
        replicas: int = 2,
        sentinels: int = 3,
        service: str = "cairn",
        password: str | None = None,
        down_after_ms: int = DOWN_AFTER_MS,
        failover_timeout_ms: int = FAILOVER_TIMEOUT_MS,
    ) -> None:
        self.directory = Path(directory).resolve()
        self.service, self.password = service, password
        first = RedisServer(self.directory / "redis-0", password=password)
        self.servers = [first] + [
            RedisServer(
                self.directory / f"redis-{n}", password=password, replicaof=(HOST, first.port)
            )
            for n in range(1, replicas + 1)
        ]
        self.sentinels = [
            SentinelServer(
                self.directory / f"sentinel-{n}",
                service,
                (HOST, first.port),
                password=password,
                quorum=min(2, sentinels),
                down_after_ms=down_after_ms,
                failover_timeout_ms=failover_timeout_ms,
            )
            for n in range(sentinels)
        ]

    @property
    def url(self) -> str:
        """The `redis+sentinel://` URL of this set (database 0)."""
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        hosts = ",".join(f"{HOST}:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{auth}{hosts}/{self.service}/0"

    def start(self) -> ReplicaSet:
        """Start every process; return once a failover can happen.

        That is once the replicas are in sync and the Sentinels see them and each other.
        """
        try:
            for server in self.servers:
                server.start()
            for server in self.servers[1:]:
                self.wait_in_sync(server)
            for sentinel in self.sentinels:
                sentinel.start()
            for sentinel in self.sentinels:
                _wait_for(lambda s=sentinel: self._sees_all(s), 30, "the Sentinels to agree")  # type: ignore[misc]
        except BaseException:
            self.stop()
            raise
        return self

    def _sees_all(self, sentinel: SentinelServer) -> bool:
        client = sentinel.client()
        try:
            state = cast(dict[str, Any], client.sentinel_master(self.service))
        finally:
            client.close()
        return bool(
            state["num-slaves"] >= len(self.servers) - 1
            and state["num-other-sentinels"] >= len(self.sentinels) - 1
        )

    def client(self, server: RedisServer) -> redis.Redis:
        """A plain client of one server of the set (close it when done)."""
        return _client(server.port, self.password)

    def primary(self) -> RedisServer:
        """The server the Sentinels name as the primary now."""
        named = self.sentinels[0].master()
        found = [s for s in self.servers if named == (HOST, s.port)]
        if not found:
            raise RedisServerError(f"the Sentinels name {named}, no server of this set")
        return found[0]

    def wait_in_sync(self, server: RedisServer, timeout: float = 30.0) -> None:
        """Return once the replica `server` is connected to its primary and in sync."""
        client = self.client(server)
        try:
            _wait_for(
                lambda: client.info("replication").get("master_link_status") == "up",
                timeout,
                f"replica {server.port} to sync",
            )
        finally:
            client.close()

    def failover(self, timeout: float = FAILOVER_WAIT) -> RedisServer:
        """SIGKILL the primary; return the replica the Sentinels promoted, once it leads.

        Returns when every Sentinel names the new primary and it answers as a primary.
        """
        old = self.primary()
        old.kill()

        def promoted() -> bool:
            named = {s.master() for s in self.sentinels if s.process is not None}
            if len(named) != 1 or (HOST, old.port) in named:
                return False
            client = self.client(self.primary())
            try:
                return client.info("replication").get("role") == "master"
            finally:
                client.close()

        _wait_for(promoted, timeout, "Sentinel to promote a replica")
        return self.primary()

    def split(self, timeout: float = FAILOVER_WAIT) -> tuple[RedisServer, RedisServer]:
        """Promote a replica while the old primary lives on as a primary; return (old, new).

        What a failover leaves when the Sentinels could not reach the primary to demote it
        (a slow or cut-off server): they name the new one, the other replicas follow it,
        and the old one, watched by none of them, still answers writes with no replica of
        its own. Returns once every Sentinel names the new primary.
        """
        old = self.primary()
        new = next(s for s in self.servers if s is not old and s.process is not None)
        self._lead(new, old, timeout)
        return old, new

    def promote(self, old: RedisServer, timeout: float = FAILOVER_WAIT) -> RedisServer:
        """Make a live server other than `old` lead by hand; return it once the Sentinels name it.

        What an operator does when the primary `old` is dead and the Sentinels will not
        promote a replica: after a stall of the whole machine (every Sentinel in TILT) a
        replica cut off from its primary for longer than ten times `down_after_ms` is one
        they never choose. A server that already answers as a primary (the Sentinels
        promoted it after all) is kept; else the replica furthest along is promoted. Every
        other live server follows it.
        """
        live = [s for s in self.servers if s is not old and s.process is not None]
        if not live:
            raise RedisServerError("no live replica to promote")
        new = max(live, key=self._standing)
        self._lead(new, old, timeout)
        return new

    def _standing(self, server: RedisServer) -> tuple[int, int]:
        """(1 if `server` is a primary now, how far it got in the replication stream)."""
        client = self.client(server)
        try:
            info = client.info("replication")
        except redis.RedisError:
            return 0, -1
        finally:
            client.close()
        if info.get("role") == "master":
            return 1, int(info.get("master_repl_offset", -1))
        return 0, int(info.get("slave_repl_offset", -1))

    def _lead(self, new: RedisServer, old: RedisServer, timeout: float) -> None:
        """Make `new` the primary of every live server but `old`, and of every Sentinel."""
        for server in self.servers:
            if server is old or server.process is None:
                continue
            client = self.client(server)
            try:
                if server is new:
                    client.replicaof("NO", "ONE")
                else:
                    client.replicaof(HOST, new.port)
            finally:
                client.close()
        for sentinel in self.sentinels:
            if sentinel.process is not None:
                sentinel.watch((HOST, new.port))
        named = (HOST, new.port)
        _wait_for(
            lambda: all(s.master() == named for s in self.sentinels if s.process is not None),
            timeout,
            "the Sentinels to name the new primary",
        )

    def stop(self) -> None:
        """Kill every process of the set (their data is only for the test)."""
        for sentinel in self.sentinels:
            sentinel.kill()
        for server in self.servers:
            server.kill()

    def __enter__(self) -> ReplicaSet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
