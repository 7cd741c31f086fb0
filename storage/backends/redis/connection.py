"""Connections to Redis: the client `connect` returns, and the packer its connections use.

Small commands are packed with hiredis and those carrying a large value in Python
(`_HybridPacker`); a client for redis+sentinel:// asks the Sentinels for the primary
whenever it connects, and leaves a primary they replaced (see `cairn.storage.backends.
sentinel`).
"""

from __future__ import annotations

import importlib.util
import time
from typing import Any, cast

import redis
from redis.connection import (
    Connection,
    ConnectionPool,
    HiredisRespSerializer,
    PythonRespSerializer,
    SSLConnection,
    UnixDomainSocketConnection,
)
from redis.sentinel import SentinelManagedConnection

from cairn.storage.backends.sentinel import is_sentinel_url, sentinel_pool

HIREDIS = importlib.util.find_spec("hiredis") is not None
if HIREDIS:
    import hiredis
# Above this size, hiredis's packer (which copies every argument into one buffer) loses to
# redis-py's Python packer (which sends large values as chunks of their own).
LARGE_VALUE = 16 * 1024
# A tuple, not `bytes | bytearray | memoryview`: that union is built anew at each use, and
# packing checks every argument of every command against it.
BINARY = (bytes, bytearray, memoryview)


class _HybridPacker:
    """Pack small commands with hiredis and those carrying a large value in Python.

    Measured here: a 512 KiB SET packs in ~5 us in Python against ~925 us with hiredis,
    while a checkpoint write (15 small arguments) packs in ~10 us with hiredis against
    ~27 us in Python; the crossover is about 16 KiB. `make bench` (storage, part 5) shows
    the effect on a whole SET.
    """

    def __init__(self, cutoff: int, encode: Any) -> None:  # noqa: ANN401 - redis-py's encoder
        self._python = PythonRespSerializer(cutoff, encode)
        self._hiredis = HiredisRespSerializer() if HIREDIS else None

    def pack(self, *args: Any) -> list[bytes]:  # noqa: ANN401 - redis-py's argument types
        if self._hiredis is None:
            return cast(list[bytes], self._python.pack(*args))  # type: ignore[no-untyped-call]
        plain = isinstance(args[0], str) and " " not in args[0]
        for arg in args:
            kind = arg.__class__
            if kind is bytes or isinstance(arg, BINARY):
                if len(arg) > LARGE_VALUE:
                    return cast(list[bytes], self._python.pack(*args))  # type: ignore[no-untyped-call]
                plain = plain and kind is bytes
            elif kind is not str and kind is not int and kind is not float:
                plain = False  # redis-py's own packer says what it makes of it (a bool: refused)
        if plain:
            # What redis-py's hiredis packer does for these arguments, without its copies:
            # it splits a command name holding a space ("SCRIPT LOAD") and copies every
            # bytearray or memoryview into bytes, and these have neither.
            return [hiredis.pack_command(args)]
        return cast(list[bytes], self._hiredis.pack(*args))


class _PythonPackerMixin:
    """A connection that packs with `_HybridPacker`; replies are still parsed by hiredis."""

    _buffer_cutoff: int
    encoder: Any

    def _construct_command_packer(self, packer: Any) -> Any:  # noqa: ANN401 - redis-py's hook is untyped
        return packer or _HybridPacker(self._buffer_cutoff, self.encoder.encode)


class _TCP(_PythonPackerMixin, Connection):
    pass


class _TLS(_PythonPackerMixin, SSLConnection):
    pass


class _Unix(_PythonPackerMixin, UnixDomainSocketConnection):
    pass


class _Sentinel(_PythonPackerMixin, SentinelManagedConnection):
    """A connection to the primary the Sentinels name, asked each time it connects.

    It connects again whenever they name another (see `cairn.storage.backends.sentinel`).
    """

    connection_pool: Any
    _connecting = False  # its handshake's commands go to the primary it is connecting to

    def connect_check_health(
        self, check_health: bool = True, retry_socket_connect: bool = True
    ) -> None:
        # redis-py 8's send path reconnects a dropped connection here, to the address it
        # had, not through `connect`, which asks the Sentinels: after a failover that is
        # the dead primary. So a connection asks them here, whichever way it connects.
        if not self._sock and self.connection_pool.is_master:
            asked_at = time.monotonic()
            self.host, self.port = self.connection_pool.get_master_address()
            pool = self.connection_pool.connection_pool_ref()
            if pool is not None:
                pool.named(self.host, self.port, asked_at)  # the freshest answer
        self._connecting = True
        try:
            super().connect_check_health(check_health, retry_socket_connect)
        finally:
            self._connecting = False

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:  # noqa: ANN401 - redis-py's own
        # Before a command, not after: nothing of an earlier command waits on the wire.
        # redis-py hands a connection a proxy of its pool, which holds the pool weakly.
        if self._sock and not self._connecting and self.connection_pool.is_master:
            pool = self.connection_pool.connection_pool_ref()
            if pool is not None and pool.names_another((self.host, self.port)):
                self.disconnect()
        super().send_packed_command(command, check_health)  # type: ignore[no-untyped-call]


def connect(url: str, **kwargs: object) -> redis.Redis:
    """Return a client for `url` with the hybrid packer.

    `url` is redis://, rediss://, unix://, or redis+sentinel:// (see `cairn.storage.backends.
    sentinel`), whose connections follow the primary the Sentinels name across failovers.
    """
    if is_sentinel_url(url):
        return redis.Redis.from_pool(sentinel_pool(url, _Sentinel, **kwargs))
    scheme = url.split("://", 1)[0]
    connection_class = {"rediss": _TLS, "unix": _Unix}.get(scheme, _TCP)
    pool = ConnectionPool.from_url(url, connection_class=connection_class, **kwargs)
    return redis.Redis.from_pool(pool)  # closing the client closes its connections
