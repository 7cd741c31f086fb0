"""The Lua scripts of `lua/`: loading them, sending them, and what their replies mean.

`script` registers one on a client the redis-py way. The hot store sends its own as plain
EVALSHAs on a thread's held connection (`Lua`), one at a time, several in one round trip
(`pipelined`), or sent now and read later (`Pending`); a Redis that lost a script is sent
it again. `translating` turns a script's FENCED and REFUSED replies into Cairn's errors.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from importlib import resources
from typing import cast

import redis
from redis.commands.core import Script
from redis.connection import Connection
from redis.exceptions import NoScriptError

from cairn.errors import CommitRefused, FencedWrite


def script(r: redis.Redis, name: str) -> Script:
    """Register `lua/<name>.lua` of `cairn.storage.backends` on `r`."""
    return r.register_script(source(name))


def source(name: str) -> str:
    """The text of `lua/<name>.lua` of `cairn.storage.backends`."""
    return resources.files("cairn.storage.backends").joinpath(f"lua/{name}.lua").read_text()


class Lua:
    """A script of `lua/` sent as a plain EVALSHA on the client `held()` gives.

    redis-py's `Script` goes through its deprecation checks on each call; the hot store's
    calls, several back to back in a step, skip them. A Redis that lost the script (a
    restart, SCRIPT FLUSH) is sent it again.
    """

    def __init__(self, held: Callable[[], redis.Redis], name: str) -> None:
        self._held = held
        self._source = source(name)
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

    def send(self, *, keys: Sequence[str], args: Sequence[object]) -> Pending:
        """Send the script now; its reply is read when the caller (or the next script) asks.

        The command is in Redis's hands once this returns, so the caller overlaps the
        round trip with its own work instead of waiting for it.
        """
        client = self._held()
        try:
            connection = cast(Connection, client.connection)
            connection.send_command(*self.command(keys, args))  # type: ignore[no-untyped-call]
        except redis.ConnectionError:
            return Pending.settled(self(keys=keys, args=args))  # sent again, and waited for
        return Pending(self, client, keys, args)

    def _send(self, client: redis.Redis, command: tuple[object, ...]) -> object:
        try:
            return batch(client, [command])[0]
        except NoScriptError:
            self.load(client)
            return batch(client, [command])[0]


def pipelined(
    client: redis.Redis, scripts: Sequence[tuple[Lua, tuple[object, ...]]]
) -> list[object]:
    """Run each (script, its command) in order in one round trip; return their replies.

    A refusal is returned as its `ResponseError`, for the caller to judge. A connection
    lost on the way (a held one is not checked before use), or a Redis that lost a script,
    gets the whole batch again: every script is idempotent.
    """
    commands = [command for _, command in scripts]
    try:
        replies = batch(client, commands, errors=True)
    except redis.ConnectionError:
        replies = batch(client, commands, errors=True)
    lost = {
        id(lua): lua
        for (lua, _), reply in zip(scripts, replies, strict=True)
        if isinstance(reply, NoScriptError)
    }
    if not lost:
        return replies
    for lua in lost.values():
        lua.load(client)
    return batch(client, commands, errors=True)


def batch(
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


class Pending:
    """A script sent on a thread's held connection whose reply is not read yet.

    The reply is read by `result()`, or before the thread's next script (`settle`): a
    held connection has one reply in flight at most, so no script reads another's.
    """

    def __init__(
        self,
        lua: Lua | None,
        client: redis.Redis | None,
        keys: Sequence[str] = (),
        args: Sequence[object] = (),
    ) -> None:
        self._lua, self._client, self._keys, self._args = lua, client, keys, args
        self._value: object = None
        self._error: Exception | None = None
        self._done = lua is None

    @classmethod
    def settled(cls, value: object) -> Pending:
        """A reply already read."""
        pending = cls(None, None)
        pending._value = value
        return pending

    def settle(self) -> None:
        """Read the reply off the connection (once); keep it, or the error, for `result`."""
        if self._done:
            return
        self._done = True
        lua, client = cast(Lua, self._lua), cast(redis.Redis, self._client)
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


def owner_token(owner: int | None) -> str:
    """A coordinator's lease token as the scripts take it ("" when the caller is no coordinator)."""
    return "" if owner is None else str(owner)
