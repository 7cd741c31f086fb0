"""Connections for one-shot calls: a checked Redis client (its store: `open_store`).

A call fails fast on an unreachable Redis: one ping with a short connect timeout and no
retries before anything else (`Unavailable`), then a client with short timeouts and a
short retry (every Cairn write is idempotent, so a retried call whose reply was lost is
harmless).
"""

from __future__ import annotations

import redis
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.retry import Retry

from cairn.coordinator.settings import display_url
from cairn.errors import InvalidSpec, Unavailable, one_line
from cairn.storage.backends.redis import connect

CONNECT_TIMEOUT = 3.0  # seconds: a Redis that does not answer by then is unreachable
COMMAND_TIMEOUT = 60.0  # seconds: well above any one Cairn command or script


def ping(url: str, origin: str = "") -> None:
    """Raise `Unavailable` unless the Redis at `url` answers at once.

    A Redis that answers but refuses the URL's credentials is a bad setting, not worth
    retrying: `InvalidSpec`.
    """
    probe = connect(
        url,
        socket_connect_timeout=CONNECT_TIMEOUT,
        socket_timeout=CONNECT_TIMEOUT,
        retry=Retry(NoBackoff(), 0),
    )
    where = f" (from {origin})" if origin else ""
    try:
        probe.ping()
    except redis.AuthenticationError as exc:
        raise InvalidSpec(
            f"Redis at {display_url(url)}{where} refused the credentials: {one_line(exc)}"
        ) from None
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise Unavailable(
            f"cannot reach Redis at {display_url(url)}{where}: {one_line(exc)}"
        ) from None
    finally:
        probe.close()


def client_for(url: str) -> redis.Redis:
    """A client for one-shot calls: short timeouts, a short retry."""
    return connect(
        url,
        socket_connect_timeout=CONNECT_TIMEOUT,
        socket_timeout=COMMAND_TIMEOUT,
        retry=Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), 2),
    )
