"""What a CLI command works with: a checked Redis connection and the checkpoint store.

The CLI fails fast on an unreachable Redis: one ping with a short connect timeout and no
retries before anything else, then a client with short timeouts and a short retry (every
Cairn write is idempotent, so a retried command whose reply was lost is harmless).
"""

from __future__ import annotations

from dataclasses import dataclass

import redis
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.retry import Retry
from rich.console import Console

from coordinator.settings import Settings, display_url
from storage.backends.disk import DiskArchive
from storage.backends.redis import RedisHotStore, connect
from storage.codec import Codec
from storage.store import CheckpointStore

CONNECT_TIMEOUT = 3.0  # seconds: a Redis that does not answer by then is unreachable
COMMAND_TIMEOUT = 60.0  # seconds: well above any one Cairn command or script


class RedisUnreachable(redis.ConnectionError):
    """Raised when the configured Redis does not answer a ping; the message says which."""


def ping(url: str, origin: str = "") -> None:
    """Raise `RedisUnreachable` unless the Redis at `url` answers at once."""
    probe = connect(
        url,
        socket_connect_timeout=CONNECT_TIMEOUT,
        socket_timeout=CONNECT_TIMEOUT,
        retry=Retry(NoBackoff(), 0),
    )
    try:
        probe.ping()
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        where = f" (from {origin})" if origin else ""
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise RedisUnreachable(
            f"cannot reach Redis at {display_url(url)}{where}: {reason}"
        ) from None
    finally:
        probe.close()


def client_for(url: str) -> redis.Redis:
    """A client for one-shot commands: short timeouts, a short retry."""
    return connect(
        url,
        socket_connect_timeout=CONNECT_TIMEOUT,
        socket_timeout=COMMAND_TIMEOUT,
        retry=Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), 2),
    )


def open_store(settings: Settings, client: redis.Redis) -> CheckpointStore:
    """The checkpoint store over `client` and the configured archive and signing key."""
    return CheckpointStore(
        RedisHotStore(client), DiskArchive(settings.archive), Codec(signing_key=settings.key())
    )


@dataclass(slots=True)
class Context:
    """A command's settings, Redis URL, client and store."""

    settings: Settings
    url: str
    client: redis.Redis
    store: CheckpointStore

    @classmethod
    def open(cls, settings: Settings) -> Context:
        """Resolve the Redis URL, check it answers, and build the store."""
        url, origin = settings.redis()
        ping(url, origin)
        client = client_for(url)
        return cls(settings, url, client, open_store(settings, client))

    def close(self) -> None:
        """Close the client's connections."""
        self.client.close()


@dataclass(slots=True)
class Session:
    """One run of a command: its settings, its console, and a Redis context opened on use."""

    settings: Settings
    console: Console
    _ctx: Context | None = None

    @property
    def ctx(self) -> Context:
        """The checked Redis connection and the store (opened, and Redis pinged, once)."""
        if self._ctx is None:
            self._ctx = Context.open(self.settings)
        return self._ctx

    def close(self) -> None:
        """Close the Redis connections, if any were opened."""
        if self._ctx is not None:
            self._ctx.close()
