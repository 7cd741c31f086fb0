"""The hot store on Redis: fenced LC writes and atomic GC commits as Lua scripts.

Every key comes from `cairn.storage.keys` and carries the task's `{task}` hash tag. Every write
is idempotent, because redis-py 8 retries a command whose reply it lost (10 tries).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib import resources
from typing import Any, cast

import redis
from redis.commands.core import Script
from redis.connection import (
    Connection,
    ConnectionPool,
    HiredisRespSerializer,
    PythonRespSerializer,
    SSLConnection,
    UnixDomainSocketConnection,
)
from redis.exceptions import NoScriptError
from redis.sentinel import SentinelManagedConnection

from cairn.errors import CommitRefused, FencedWrite
from cairn.storage import keys
from cairn.storage.backends.sentinel import is_sentinel_url, sentinel_pool
from cairn.storage.base import GCEntry, GCInfo, LCEntry, LCLink, NextSuperstep, StepStart
from cairn.storage.keys import SPEC_DOC
from cairn.storage.records import GCStatus, LCRef, Usage

HIREDIS = importlib.util.find_spec("hiredis") is not None
if HIREDIS:
    import hiredis
# Above this size, hiredis's packer (which copies every argument into one buffer) loses to
# redis-py's Python packer (which sends large values as chunks of their own).
LARGE_VALUE = 16 * 1024
# A tuple, not `bytes | bytearray | memoryview`: that union is built anew at each use, and
# packing checks every argument of every command against it.
BINARY = (bytes, bytearray, memoryview)
# How long an attempt's spend entry is kept: past any step's life (step_timeout ≤ 24 h).
ATTEMPT_SPEND_TTL_S = 2 * 24 * 3600


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


def script(r: redis.Redis, name: str) -> Script:
    """Register `lua/<name>.lua` of this package on `r`."""
    return r.register_script(_source(name))


def _source(name: str) -> str:
    """The text of `lua/<name>.lua` of this package."""
    return resources.files("cairn.storage.backends").joinpath(f"lua/{name}.lua").read_text()


class _Lua:
    """A script of `lua/` sent as a plain EVALSHA on the client `held()` gives.

    redis-py's `Script` goes through its deprecation checks on each call; the hot store's
    calls, several back to back in a step, skip them. A Redis that lost the script (a
    restart, SCRIPT FLUSH) is sent it again.
    """

    def __init__(self, held: Callable[[], redis.Redis], name: str) -> None:
        self._held = held
        self._source = _source(name)
        self._sha = hashlib.sha1(self._source.encode(), usedforsecurity=False).hexdigest()

    def __call__(self, *, keys: Sequence[str], args: Sequence[object]) -> object:
        return self.run(self._held(), self.command(keys, args))

    def run(self, client: redis.Redis, command: tuple[object, ...]) -> object:
        """Send `command` (this script's, from `command`) on `client`; return the reply."""
        try:
            return self._send(client, command)
        except redis.ConnectionError:
            # A held connection is not checked before each use as a pooled one is: one
            # Redis closed (it restarted, or dropped an idle client) fails once, and is
            # replaced. Every script is idempotent, so sending it again is harmless.
            return self._send(client, command)

    def command(self, keys: Sequence[str], args: Sequence[object]) -> tuple[object, ...]:
        """The EVALSHA that runs this script on `keys` and `args`."""
        return ("EVALSHA", self._sha, len(keys), *keys, *args)

    def load(self, client: redis.Redis) -> None:
        """Send the script's source to a Redis that lost it."""
        client.script_load(self._source)

    def send(self, *, keys: Sequence[str], args: Sequence[object]) -> _Pending:
        """Send the script now; its reply is read when the caller (or the next script) asks.

        The command is in Redis's hands once this returns, so the caller overlaps the
        round trip with its own work instead of waiting for it.
        """
        client = self._held()
        try:
            connection = cast(Connection, client.connection)
            connection.send_command(*self.command(keys, args))  # type: ignore[no-untyped-call]
        except redis.ConnectionError:
            return _Pending.settled(self(keys=keys, args=args))  # sent again, and waited for
        return _Pending(self, client, keys, args)

    def _send(self, client: redis.Redis, command: tuple[object, ...]) -> object:
        try:
            return _batch(client, [command])[0]
        except NoScriptError:
            self.load(client)
            return _batch(client, [command])[0]


def _pipelined(
    client: redis.Redis, scripts: Sequence[tuple[_Lua, tuple[object, ...]]]
) -> list[object]:
    """Run each (script, its command) in order in one round trip; return their replies.

    A refusal is returned as its `ResponseError`, for the caller to judge. A connection
    lost on the way (a held one is not checked before use), or a Redis that lost a script,
    gets the whole batch again: every script is idempotent.
    """
    commands = [command for _, command in scripts]
    try:
        replies = _batch(client, commands, errors=True)
    except redis.ConnectionError:
        replies = _batch(client, commands, errors=True)
    lost = {id(lua): lua for (lua, _), reply in zip(scripts, replies, strict=True)
            if isinstance(reply, NoScriptError)}  # fmt: skip
    if not lost:
        return replies
    for lua in lost.values():
        lua.load(client)
    return _batch(client, commands, errors=True)


def _batch(
    client: redis.Redis, commands: Sequence[tuple[object, ...]], *, errors: bool = False
) -> list[object]:
    """Send `commands` in one write on the held connection of `client`; return their replies.

    The first error reply is raised, or with `errors` every one is returned as its
    `ResponseError`, in its place. A connection error sends them all again, as often as
    the connection's retry policy says (redis-py's own, for a held connection too): every
    command sent here is idempotent. On a held connection, redis-py's `execute_command`
    and pipelines add a retry closure, a lock and option handling per call, which a
    step's few commands in a row feel; this sends the same bytes and reads the same
    replies without them.
    """
    connection = cast(Connection, client.connection)
    packed = (
        connection.pack_command(*commands[0])  # type: ignore[no-untyped-call]
        if len(commands) == 1
        else connection.pack_commands(commands)  # type: ignore[no-untyped-call]
    )

    def exchange() -> list[object]:
        connection.send_packed_command(packed)  # type: ignore[no-untyped-call]
        replies: list[object] = []
        for _ in commands:
            try:
                replies.append(connection.read_response())
            except redis.ResponseError as exc:  # the next replies are on the wire still
                replies.append(exc)
        return replies

    replies = connection.retry.call_with_retry(
        exchange,
        lambda _error: connection.disconnect(),  # type: ignore[no-untyped-call]
    )
    if not errors:
        for reply in replies:
            if isinstance(reply, redis.ResponseError):
                raise reply
    return replies


class _Pending:
    """A script sent on a thread's held connection whose reply is not read yet.

    The reply is read by `result()`, or before the thread's next script (`settle`): a
    held connection has one reply in flight at most, so no script reads another's.
    """

    def __init__(
        self,
        lua: _Lua | None,
        client: redis.Redis | None,
        keys: Sequence[str] = (),
        args: Sequence[object] = (),
    ) -> None:
        self._lua, self._client, self._keys, self._args = lua, client, keys, args
        self._value: object = None
        self._error: Exception | None = None
        self._done = lua is None

    @classmethod
    def settled(cls, value: object) -> _Pending:
        """A reply already read."""
        pending = cls(None, None)
        pending._value = value
        return pending

    def settle(self) -> None:
        """Read the reply off the connection (once); keep it, or the error, for `result`."""
        if self._done:
            return
        self._done = True
        lua, client = cast(_Lua, self._lua), cast(redis.Redis, self._client)
        connection = cast(Connection, client.connection)
        try:
            try:
                self._value = connection.read_response()
            except (redis.ConnectionError, redis.TimeoutError):
                # The reply was lost with the connection: the script is idempotent, so it
                # is sent again (on a new connection) and waited for.
                connection.disconnect()  # type: ignore[no-untyped-call]
                self._value = lua(keys=self._keys, args=self._args)
            except NoScriptError:  # a Redis that lost the script ran nothing
                self._value = lua(keys=self._keys, args=self._args)
        except Exception as exc:  # noqa: BLE001 - kept for `result` to raise
            self._error = exc

    def result(self) -> object:
        """The script's reply, waiting for it if need be; its error raised."""
        self.settle()
        if self._error is not None:
            raise self._error
        return self._value


def translating(call: Callable[[], object]) -> object:
    """Run a script call, turning its FENCED/REFUSED replies into Cairn's errors.

    Every script in `lua/` replies with one of two words when it writes nothing: FENCED
    when the writer lost the right to write (a newer coordinator owns the task, the epoch
    or attempt moved on, a write-once record holds other bytes): `FencedWrite`, the caller
    must stop; REFUSED when the write itself is refused (a GC already decided, a member
    missing or mismatched): `CommitRefused`.
    """
    try:
        return call()
    except redis.ResponseError as exc:
        error = translated(exc)
        if error is exc:
            raise
        raise error from None


def translated(exc: redis.ResponseError) -> Exception:
    """The Cairn error a script's FENCED or REFUSED reply stands for; else `exc` itself."""
    message = str(exc)
    if message.startswith("FENCED "):
        return FencedWrite(message.removeprefix("FENCED "))
    if message.startswith("REFUSED "):
        return CommitRefused(message.removeprefix("REFUSED "))
    return exc


def _token(owner: int | None) -> str:
    """A coordinator's lease token as the scripts take it ("" when the caller is no coordinator)."""
    return "" if owner is None else str(owner)


def parse_ref(value: bytes | None) -> LCRef | None:
    """Parse an "lc_id checksum" pair as stored for votes and progress."""
    if value is None:
        return None
    lc_id, checksum = value.decode().split(" ")
    return LCRef(id=lc_id, checksum=checksum)


def _pack_members(members: dict[str, LCRef]) -> str:
    """Pack a GC's members into the one argument commit_gc.lua reads.

    A line per member: LC id, checksum and agent, tab-separated. The command then grows by
    one short line an agent rather than by a key and two arguments, each of which Redis
    and the script handle on their own. Raises `CommitRefused` when a field holds a tab or
    a newline, which would shift the fields the script reads.
    """
    packed = "".join([f"{ref.id}\t{ref.checksum}\t{agent}\n" for agent, ref in members.items()])
    if packed.count("\t") != 2 * len(members) or packed.count("\n") != len(members):
        raise CommitRefused("a member's agent, LC id or checksum holds a tab or a newline")
    return packed


class RedisHotStore:
    """A `HotStore` on one Redis (or a cluster: each script touches one slot)."""

    def __init__(self, client: redis.Redis, *, audit: bool = False) -> None:
        self.redis = client
        self._threads = threading.local()  # see `_held`
        # With auditing (the `audit` setting, CAIRN_AUDIT=1), the scripts append every
        # epoch raise, fence and accepted LC write to the task's `audit` stream, in the
        # order Redis ran them: the history the chaos suite's checker replays. Off, it
        # costs nothing.
        self.audit = audit
        self._audit_flag = "1" if self.audit else "0"
        self._write_lc = _Lua(self._held, "write_lc")
        self._read_chain = _Lua(self._held, "read_chain")
        self._walk_chains = _Lua(self._held, "walk_chains")
        self._prepare_gc = _Lua(self._held, "prepare_gc")
        self._commit_gc = _Lua(self._held, "commit_gc")
        self._abort_gc = _Lua(self._held, "abort_gc")
        self._raise_epoch = _Lua(self._held, "raise_epoch")
        self._step_start = _Lua(self._held, "step_start")
        self._beat = _Lua(self._held, "beat")
        self._begin_attempt = _Lua(self._held, "begin_attempt")
        self._claim = _Lua(self._held, "claim")
        self._spend = _Lua(self._held, "spend")

    def _held(self) -> redis.Redis:
        """Return the calling thread's client, which holds one connection while the thread lives.

        The scripts run on it: a command then takes no connection from the pool and gives
        none back, which a step's few calls in a row feel. The connection returns to the
        pool when the thread ends (its client is collected); a forked child makes its own.
        """
        held = self._threads
        if getattr(held, "pid", None) != os.getpid():
            pool = self.redis.connection_pool
            held.client = redis.Redis(connection_pool=pool, single_connection_client=True)
            held.pid = os.getpid()
            held.pending = None
        pending: _Pending | None = held.pending
        if pending is not None:  # a reply still on the connection is read first
            held.pending = None
            pending.settle()
        return cast(redis.Redis, held.client)

    def read_audit(self, task: str) -> list[dict[str, str]]:
        """The task's audit stream, oldest first (empty unless some writer audited).

        Each entry has `kind` (epoch, fence or lc) and `at`, and `agent` and `lc` where
        they apply.
        """
        entries = cast(list[tuple[bytes, dict[bytes, bytes]]], self.redis.xrange(keys.audit(task)))
        return [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in entries]

    def init_task(self, task: str) -> int:
        self.redis.set(keys.epoch(task), 1, nx=True)
        return self.get_epoch(task)

    def get_epoch(self, task: str) -> int:
        value = self.redis.get(keys.epoch(task))
        return 0 if value is None else int(cast(bytes, value))

    def raise_epoch(self, task: str, to: int, owner: int | None = None) -> int:
        return int(
            cast(
                int,
                translating(
                    lambda: self._raise_epoch(
                        keys=[keys.epoch(task), keys.owner(task), keys.audit(task)],
                        args=[to, _token(owner), self._audit_flag],
                    )
                ),
            )
        )

    def begin_attempt(
        self, task: str, agent: str, superstep: int, attempt: int, *, epoch: int | None = None
    ) -> None:
        translating(
            lambda: self._begin_attempt(
                keys=[keys.attempts(task), keys.epoch(task), keys.audit(task)],
                args=[agent, superstep, attempt, self._audit_flag, "" if epoch is None else epoch],
            )
        )

    def begin_attempts(
        self,
        task: str,
        attempts: Mapping[str, int],
        superstep: int,
        *,
        epoch: int,
        prepare: GCEntry | None = None,
        owner: int | None = None,
    ) -> None:
        # A pipeline, not a transaction: Redis runs every script even after one refused.
        # That is harmless: an attempt only moves forward and a stale epoch is refused, so
        # a fence that runs after a refused prepare hands no step back to an older attempt,
        # and the caller enqueues no step job unless every reply is good.
        scripts: list[tuple[_Lua, tuple[object, ...]]] = []
        if prepare is not None:
            scripts.append((self._prepare_gc, self._prepare_command(prepare, owner)))
        fence = (keys.attempts(task), keys.epoch(task), keys.audit(task))
        flag = self._audit_flag
        scripts += [
            (self._begin_attempt,
             self._begin_attempt.command(fence, [agent, superstep, attempt, flag, epoch]))
            for agent, attempt in attempts.items()
        ]  # fmt: skip
        for reply in _pipelined(self._held(), scripts):
            if isinstance(reply, redis.ResponseError):
                raise translated(reply)

    def write_lc(self, entry: LCEntry, *, vote: bool = False) -> None:
        lc = entry.record
        t = lc.task
        translating(
            lambda: self._write_lc(
                keys=[
                    keys.epoch(t),
                    keys.attempts(t),
                    keys.lc(t, lc.id),
                    keys.superstep_lcs(t, lc.epoch, lc.superstep),
                    keys.votes(t, lc.epoch, lc.superstep),
                    keys.progress(t, lc.epoch, lc.superstep),
                    keys.audit(t),
                    keys.blobs(t),
                    *(keys.blob(t, sha) for sha in entry.blobs),
                ],
                args=[
                    lc.epoch,
                    lc.agent,
                    f"{lc.epoch}:{lc.superstep}:{lc.attempt}",
                    lc.id,
                    entry.sealed.checksum,
                    entry.sealed.data,
                    lc.parent_id or "",
                    "1" if lc.full else "0",
                    lc.level.value,
                    "1" if vote else "0",
                    self._audit_flag,
                    time.time(),
                    *(part for blob in entry.blobs.items() for part in blob),
                ],
            )
        )

    def read_chain(self, task: str, lc_id: str, max_links: int) -> list[bytes]:
        found = self._read_chain(keys=[keys.lc(task, lc_id)], args=[keys.lc(task, ""), max_links])
        return cast(list[bytes], found)

    def read_lcs(self, task: str, lc_ids: Iterable[str]) -> dict[str, bytes]:
        wanted = list(dict.fromkeys(lc_ids))
        if not wanted:
            return {}
        prefix = keys.lc(task, "")
        commands = [("HGET", prefix + lc_id, "data") for lc_id in wanted]
        found = cast(list[bytes | None], _batch(self._held(), commands))
        return {i: data for i, data in zip(wanted, found, strict=True) if data is not None}

    def lc_link(self, task: str, lc_id: str) -> LCLink | None:
        fields = cast(
            list[bytes | None], self.redis.hmget(keys.lc(task, lc_id), ["agent", "parent", "full"])
        )
        agent, parent, full = fields
        if agent is None:
            return None
        return LCLink(lc_id, agent.decode(), (parent or b"").decode() or None, full == b"1")

    def walk_chains(self, task: str, heads: Iterable[str], known: Iterable[str] = ()) -> set[str]:
        prefix = keys.lc(task, "")
        starts = [prefix + lc_id for lc_id in dict.fromkeys(heads)]
        if not starts:
            return set()
        found = cast(list[bytes], self._walk_chains(keys=starts, args=[prefix, *known]))
        return {lc_id.decode() for lc_id in found}

    def delete_lcs(self, task: str, lc_ids: Iterable[str]) -> None:
        names = [keys.lc(task, i) for i in lc_ids]
        if names:
            self.redis.delete(*names)

    def get_votes(self, task: str, epoch: int, superstep: int) -> dict[str, LCRef]:
        raw = cast(dict[bytes, bytes], self.redis.hgetall(keys.votes(task, epoch, superstep)))
        return {agent.decode(): cast(LCRef, parse_ref(value)) for agent, value in raw.items()}

    def step_start(
        self, task: str, agent: str, epoch: int, superstep: int, token: str, ttl_ms: int
    ) -> StepStart:
        reply = cast(
            list[bytes | None],
            self._step_start(
                keys=[
                    keys.heartbeat(task, agent),
                    keys.epoch(task),
                    keys.latest(task),
                    keys.progress(task, epoch, superstep),
                    keys.doc(task, SPEC_DOC),
                    keys.attempts(task),
                ],
                args=[token, ttl_ms, agent, keys.gc(task, 0).removesuffix("0")],
            ),
        )
        epoch_, latest, gc, progress, spec, current = reply
        return StepStart(
            epoch=int(epoch_ or 0),
            latest=None if latest is None else int(latest),
            gc=gc,
            progress=parse_ref(progress),
            spec=spec,
            current=None if current is None else current.decode(),
        )

    def get_progress(self, task: str, epoch: int, superstep: int, agent: str) -> LCRef | None:
        return parse_ref(
            cast(bytes | None, self.redis.hget(keys.progress(task, epoch, superstep), agent))
        )

    def beat(self, task: str, agent: str, token: str, ttl_ms: int) -> bool:
        kept = self._beat(
            keys=[keys.heartbeat(task, agent), keys.attempts(task)], args=[token, ttl_ms, agent]
        )
        return bool(kept)

    def beating(self, task: str, agent: str) -> str | None:
        value = cast(bytes | None, self.redis.get(keys.heartbeat(task, agent)))
        return None if value is None else value.decode()

    def record_spend(
        self, task: str, agent: str, epoch: int, superstep: int, attempt: int, usage: Usage
    ) -> bool:
        return self.send_spend(task, agent, epoch, superstep, attempt, usage)()

    def send_spend(
        self, task: str, agent: str, epoch: int, superstep: int, attempt: int, usage: Usage
    ) -> Callable[[], bool]:
        pending = self._spend.send(
            keys=[keys.spend(task), keys.attempt_spend(task, epoch, superstep)],
            args=[agent, attempt, usage.prompt_tokens, usage.completion_tokens,
                  usage.cached_tokens, repr(usage.cost_usd), ATTEMPT_SPEND_TTL_S],
        )  # fmt: skip
        self._threads.pending = pending  # read before this thread's next script
        return lambda: bool(pending.result())

    def put_doc(self, task: str, name: str, data: bytes) -> None:
        self.redis.set(keys.doc(task, name), data)

    def get_doc(self, task: str, name: str) -> bytes | None:
        return cast(bytes | None, self.redis.get(keys.doc(task, name)))

    def delete_doc(self, task: str, name: str) -> None:
        self.redis.delete(keys.doc(task, name))

    def claim(self, task: str, token: int) -> None:
        translating(lambda: self._claim(keys=[keys.owner(task)], args=[token]))

    def prepare_gc(self, entry: GCEntry, owner: int | None = None) -> None:
        command = self._prepare_command(entry, owner)
        client = self._held()
        translating(lambda: self._prepare_gc.run(client, command))

    def _prepare_command(self, entry: GCEntry, owner: int | None) -> tuple[object, ...]:
        gc = entry.record
        t = gc.task
        return self._prepare_gc.command(
            [keys.epoch(t), keys.gc(t, gc.number), keys.gcs(t), keys.owner(t)],
            [gc.number, gc.epoch, entry.sealed.data, entry.sealed.checksum, gc.superstep,
             _token(owner)],
        )  # fmt: skip

    def commit_gc(
        self, entry: GCEntry, owner: int | None = None, then: NextSuperstep | None = None
    ) -> bool:
        gc = entry.record
        t = gc.task
        begin_keys: list[str] = []
        begin_args: list[object] = []
        if then is not None:
            nxt = then.prepare.record
            begin_keys = [keys.gc(t, nxt.number), keys.attempts(t), keys.audit(t)]
            lines = "".join(f"{agent}\t{attempt}\n" for agent, attempt in then.attempts.items())
            begin_args = [nxt.number, then.prepare.sealed.data, then.prepare.sealed.checksum,
                          nxt.superstep, lines, self._audit_flag]  # fmt: skip
        reply = translating(
            lambda: self._commit_gc(
                keys=[
                    keys.epoch(t),
                    keys.gc(t, gc.number),
                    keys.gcs(t),
                    keys.latest(t),
                    keys.blob(t, gc.workspace),
                    keys.superstep_lcs(t, gc.epoch, gc.superstep),
                    keys.votes(t, gc.epoch, gc.superstep),
                    keys.progress(t, gc.epoch, gc.superstep),
                    keys.owner(t),
                    keys.attempt_spend(t, gc.epoch, gc.superstep),
                    *begin_keys,
                ],
                args=[
                    gc.number,
                    gc.epoch,
                    entry.sealed.data,
                    entry.sealed.checksum,
                    gc.superstep,
                    keys.lc(t, ""),
                    _token(owner),
                    _pack_members(gc.members),
                    len(gc.members),
                    *begin_args,
                ],
            )
        )
        return reply == b"BEGUN"

    def confirm_replicas(self, task: str, number: int, replicas: int, timeout_ms: int) -> int:
        # WAIT counts the replicas holding its connection's last write. The probe makes that
        # a write after GC `number`, on the Redis found holding the GC, whichever connection
        # committed it: the three go out together on one connection, so a failover between
        # them fails the call instead of asking a new primary about an old one's write.
        connection = cast(Connection, self._held().connection)
        commands = [
            ("HGET", keys.gc(task, number), "status"),
            ("SET", keys.replica_probe(task), number),
            ("WAIT", replicas, timeout_ms),
        ]
        packed = connection.pack_commands(commands)  # type: ignore[no-untyped-call]
        try:
            connection.send_packed_command(packed)  # type: ignore[no-untyped-call]
            status, _, count = [connection.read_response() for _ in commands]
        except Exception:
            connection.disconnect()  # type: ignore[no-untyped-call]  # no reply left behind
            raise
        return int(count) if status == GCStatus.COMMITTED.value.encode() else 0

    def abort_gc(self, entry: GCEntry, owner: int | None = None) -> None:
        gc = entry.record
        t = gc.task
        translating(
            lambda: self._abort_gc(
                keys=[
                    keys.gc(t, gc.number),
                    keys.gcs(t),
                    keys.superstep_lcs(t, gc.epoch, gc.superstep),
                    keys.votes(t, gc.epoch, gc.superstep),
                    keys.progress(t, gc.epoch, gc.superstep),
                    keys.owner(t),
                ],
                args=[
                    gc.number,
                    entry.sealed.data,
                    entry.sealed.checksum,
                    gc.superstep,
                    keys.lc(t, ""),
                    _token(owner),
                ],
            )
        )

    def read_gc(self, task: str, number: int) -> bytes | None:
        return cast(bytes | None, self.redis.hget(keys.gc(task, number), "data"))

    def list_gcs(self, task: str) -> list[GCInfo]:
        numbers = [int(n) for n in cast(list[bytes], self.redis.zrange(keys.gcs(task), 0, -1))]
        pipe = self.redis.pipeline(transaction=False)
        for n in numbers:
            pipe.hmget(keys.gc(task, n), ["status", "superstep"])
            pipe.hstrlen(keys.gc(task, n), "data")
        replies = pipe.execute()
        infos = []
        for i, n in enumerate(numbers):
            status, superstep = replies[2 * i]
            if status is None:  # deleted by retention between the two reads
                continue
            infos.append(GCInfo(n, GCStatus(status.decode()), int(superstep), replies[2 * i + 1]))
        return infos

    def latest_gc(self, task: str) -> int | None:
        value = self.redis.get(keys.latest(task))
        return None if value is None else int(cast(bytes, value))

    def delete_gc(self, task: str, number: int) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(keys.gc(task, number))
        pipe.zrem(keys.gcs(task), number)
        pipe.execute()

    def put_blob(self, task: str, sha: str, data: bytes) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.set(keys.blob(task, sha), data, nx=True)
        pipe.zadd(keys.blobs(task), {sha: time.time()})
        pipe.execute()

    def get_blob(self, task: str, sha: str) -> bytes | None:
        return cast(bytes | None, self.redis.get(keys.blob(task, sha)))

    def get_blobs(self, task: str, shas: Iterable[str]) -> dict[str, bytes]:
        wanted = list(dict.fromkeys(shas))
        if not wanted:
            return {}
        # One MGET: every blob key carries the task's hash tag, so it is one cluster slot.
        prefix = keys.blob(task, "")
        found = cast(list[bytes | None], self.redis.mget([prefix + sha for sha in wanted]))
        return {sha: data for sha, data in zip(wanted, found, strict=True) if data is not None}

    def blob_times(self, task: str) -> dict[str, float]:
        pairs = cast(
            list[tuple[bytes, float]], self.redis.zrange(keys.blobs(task), 0, -1, withscores=True)
        )
        return {sha.decode(): score for sha, score in pairs}

    def delete_blobs(self, task: str, shas: Iterable[str]) -> None:
        wanted = list(shas)
        if not wanted:
            return
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(*[keys.blob(task, s) for s in wanted])
        pipe.zrem(keys.blobs(task), *wanted)
        pipe.execute()
