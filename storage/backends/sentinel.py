"""Redis behind Sentinel: `redis+sentinel://` URLs, and a pool that follows the primary.

The URL names the Sentinels and the service they watch, not a Redis server:

    redis+sentinel://[USER:PASSWORD@]HOST[:PORT][,HOST[:PORT]...]/SERVICE[/DB][?OPTIONS]

- `HOST:PORT`, comma-separated: the Sentinels (port 26379 when left out); any one that
  answers is enough.
- `SERVICE`: the name the Sentinels monitor (`sentinel monitor SERVICE ...`); `DB` the
  database number (0 when left out).
- `USER:PASSWORD`: the credentials of the Redis servers (the primary and its replicas).
- `sentinel_password` (and `sentinel_username`): the Sentinels' own credentials, when
  they have any (`requirepass` in a Sentinel's configuration).
- Any other option is one of redis-py's URL options (`socket_timeout`, ...) and applies
  to the connections to the primary, as in a `redis://` URL.

This is the spelling of Prefect's and the `Redis-Sentinel-Url` package's `redis+sentinel`
scheme (kombu and celery spell a list of `sentinel://` URLs and take the service name
apart); redis-py has Sentinel support but no URL for it.

Every connection of the pool asks the Sentinels for the primary's address when it
connects. After a failover a connection to the old primary fails (it is gone, or it is a
replica now: redis-py turns its READONLY reply into a connection error), and the next
command on it connects again, to the primary the Sentinels name then.

An old primary can also live on as a primary: the Sentinels promoted another while they
could not reach it (a slow or cut-off server), and demote it only once they reach it
again. Its connections neither break nor get READONLY, so each pool also asks the
Sentinels once a second, on a thread of its own (`PRIMARY_LOOK_EVERY`), and a connection
about to send a command to a primary they no longer name closes and connects again, to
the one they name. A Sentinel that does not answer delays no command: the look is off
the commands' path, and a connection keeps its primary until a look names another.

The answer is one per process and service, whichever pool's look (or connection) got
it last: a process with several clients on one URL (a worker's RQ queues and its store)
leaves an old primary with all of them at once. With an answer per pool, a job taken from
the new primary's queue could run its writes on the old primary for up to a second.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode, urlsplit, urlunsplit

from redis.backoff import NoBackoff
from redis.connection import parse_url
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool, SentinelManagedConnection

SCHEME = "redis+sentinel"
DEFAULT_PORT = 26379
# A Sentinel answers at once or is down (then the next one is asked): a short timeout
# keeps a dead one from holding every new connection up.
SENTINEL_TIMEOUT = 1.0  # seconds
SENTINEL_OPTIONS = ("sentinel_username", "sentinel_password")
SERVICE_AND_DB = 2  # path segments at most: /SERVICE/DB
MAX_PORT = 65_535
# How often a pool asks the Sentinels which primary they name: how long a process may go
# on writing to a primary they replaced while it still answers as one (the docs advise
# `min-replicas-to-write` on the servers to bound that from their side too).
PRIMARY_LOOK_EVERY = 1.0  # seconds


@dataclass(frozen=True, slots=True)
class SentinelURL:
    """A `redis+sentinel://` URL taken apart.

    `redis` holds the keyword arguments of a connection to the primary (credentials,
    `db`, options); `sentinel` those of a connection to a Sentinel (its credentials).
    """

    sentinels: tuple[tuple[str, int], ...]
    service: str
    redis: Mapping[str, Any] = field(default_factory=dict)
    sentinel: Mapping[str, Any] = field(default_factory=dict)


def is_sentinel_url(url: str) -> bool:
    """True when `url` names Redis through Sentinels (`redis+sentinel://`)."""
    return url.split("://", 1)[0].lower() == SCHEME


def parse(url: str) -> SentinelURL:
    """Take a `redis+sentinel://` URL apart; `ValueError` saying what is wrong with it."""
    parts = urlsplit(url)
    if parts.scheme.lower() != SCHEME:
        raise ValueError(f"must start with {SCHEME}://")
    userinfo, _, hosts = parts.netloc.rpartition("@")
    if not hosts:
        raise ValueError("names no Sentinel (HOST:PORT[,HOST:PORT...])")
    sentinels = tuple(_address(host) for host in hosts.split(","))
    path = [unquote(p) for p in parts.path.split("/") if p]
    if not path or len(path) > SERVICE_AND_DB:
        raise ValueError("must name the service the Sentinels watch: .../SERVICE[/DB]")
    if len(path) == SERVICE_AND_DB and not path[1].isdigit():
        raise ValueError(f"the database must be a number, not {path[1]!r}")
    query = parse_qs(parts.query, keep_blank_values=True)
    sentinel = {name.removeprefix("sentinel_"): query.pop(name)[-1]
                for name in SENTINEL_OPTIONS if name in query}  # fmt: skip
    # The primary's options are read by redis-py's own parser, as for a redis:// URL.
    netloc = f"{userinfo}@sentinel" if userinfo else "sentinel"
    db = path[1] if len(path) == SERVICE_AND_DB else "0"
    plain = urlunsplit(("redis", netloc, f"/{db}", urlencode(query, doseq=True), ""))
    parsed: dict[str, Any] = parse_url(plain)  # type: ignore[no-untyped-call]
    options = {k: v for k, v in parsed.items() if k not in ("host", "port")}
    return SentinelURL(sentinels, path[0], options, sentinel)


def _address(text: str) -> tuple[str, int]:
    """A Sentinel's `HOST[:PORT]` (an IPv6 host in brackets) as (host, port)."""
    host, port = text, str(DEFAULT_PORT)
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest:
            port = rest.removeprefix(":")
    elif ":" in text:
        host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) <= MAX_PORT:
        raise ValueError(f"{text!r} is not a Sentinel's HOST:PORT")
    return unquote(host), int(port)


class _Answer:
    """The primary the Sentinels of one service last named, shared by a process's pools.

    Answers are ordered by when they were asked for: a slow look that began before a
    newer answer arrived does not bring back the primary it found.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.primary: tuple[str, int] | None = None
        self._asked_at = 0.0

    def take(self, primary: tuple[str, int], asked_at: float) -> None:
        """Keep `primary` unless an answer asked for later is kept already."""
        with self._lock:
            if asked_at >= self._asked_at:
                self.primary, self._asked_at = primary, asked_at


_ANSWERS: dict[tuple[int, str, tuple[tuple[str, int], ...]], _Answer] = {}
_ANSWERS_LOCK = threading.Lock()


def _answer(service: str, sentinels: tuple[tuple[str, int], ...]) -> _Answer:
    """The answer for `service` as `sentinels` name it, in this process (made on first use)."""
    key = (os.getpid(), service, sentinels)
    with _ANSWERS_LOCK:
        found = _ANSWERS.get(key)
        if found is None:
            found = _ANSWERS[key] = _Answer()
        return found


class _Pool(SentinelConnectionPool):
    """A Sentinel-managed pool that knows when the Sentinels name another primary.

    It also closes its connections to the Sentinels with its own.
    """

    def __init__(
        self,
        *args: Any,  # noqa: ANN401 - redis-py's own
        sentinels: tuple[tuple[str, int], ...] = (),
        **kwargs: Any,  # noqa: ANN401 - redis-py's own
    ) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        self._sentinels = sentinels  # with the service, what names this process's answer
        self._watching = threading.Lock()
        self._watcher: tuple[int, threading.Event] | None = None  # (pid, its stop)

    def names_another(self, address: tuple[str, int]) -> bool:
        """True when the Sentinels' last answer names a primary other than `address`.

        The first call (in each process) starts the looks; until one answers, False.
        """
        watcher = self._watcher
        if watcher is None or watcher[0] != os.getpid():
            self._watch()
        named = _answer(self.service_name, self._sentinels).primary
        return named is not None and named != address

    def _watch(self) -> None:
        with self._watching:
            if self._watcher is not None and self._watcher[0] == os.getpid():
                return
            stop = threading.Event()
            self._watcher = (os.getpid(), stop)
            thread = threading.Thread(
                target=_look_while, args=(weakref.ref(self), stop), daemon=True,
                name=f"cairn-sentinel-{self.service_name}",
            )  # fmt: skip
            thread.start()

    def named(self, host: str, port: int, asked_at: float) -> None:
        """Note the primary the Sentinels named when asked at `asked_at` (monotonic)."""
        _answer(self.service_name, self._sentinels).take((str(host), int(port)), asked_at)

    def look(self) -> None:
        """Ask the Sentinels for the primary now (idle connections to an old one close).

        No Sentinel answered: connections keep their primary until one does. That holds
        for any error: besides its own, redis-py raises TypeError or AttributeError when
        the pool closes a Sentinel connection under a look, and a look that raised must
        not end the looks.
        """
        asked_at = time.monotonic()
        with contextlib.suppress(Exception):
            host, port = self.get_master_address()  # type: ignore[no-untyped-call]
            self.named(host, port, asked_at)

    def disconnect(self, inuse_connections: bool = True) -> None:
        """Close the pool's connections; closing them all closes the Sentinels' too."""
        if inuse_connections:  # not when a new primary only retires idle connections
            # The looks stop first; one under way closes the Sentinels' connections again.
            with getattr(self, "_watching", contextlib.nullcontext()):  # a pool half made
                watcher = getattr(self, "_watcher", None)
                self._watcher = None
            if watcher is not None:
                watcher[1].set()
        super().disconnect(inuse_connections)
        if inuse_connections:
            self.sentinel_manager.close()


def _look_while(pool: weakref.ref[_Pool], stop: threading.Event) -> None:
    """Let the pool look every `PRIMARY_LOOK_EVERY` s until it is closed or collected."""
    while not stop.wait(PRIMARY_LOOK_EVERY):
        found = pool()
        if found is None:
            return
        found.look()
        if stop.is_set():  # closed during the look: close what the look opened again
            found.sentinel_manager.close()
        del found  # no reference held while waiting: the pool may be collected


def sentinel_pool(
    url: str, connection_class: type[SentinelManagedConnection], **kwargs: object
) -> SentinelConnectionPool:
    """A pool of `connection_class` connections to the primary the URL's Sentinels name.

    `kwargs` (timeouts, retries) apply to the connections to the primary, over the URL's
    options; the Sentinels are asked with `SENTINEL_TIMEOUT` and no retry (the next one
    is asked instead).
    """
    found = parse(url)
    manager = Sentinel(  # type: ignore[no-untyped-call]
        found.sentinels,
        sentinel_kwargs={
            "socket_connect_timeout": SENTINEL_TIMEOUT,
            "socket_timeout": SENTINEL_TIMEOUT,
            "retry": Retry(NoBackoff(), 0),
            **found.sentinel,
        },
    )
    options = {**found.redis, **kwargs, "connection_class": connection_class}
    return _Pool(found.service, manager, sentinels=found.sentinels, **options)
