"""`McpManager`: a worker's sessions with its MCP servers, kept across steps.

The `mcp` SDK is async and steps are sync. The manager owns one event loop on one daemon
thread; every session lives there, each held open by a task of its own (the SDK's
contexts must be left by the task that entered them), and a step's thread hands the loop
a coroutine and waits for it, never longer than the server's `timeout`. Sessions open on
first use, one per server.

A session ends when its server does: a stdio process that died, noticed when its stream
ends, or an HTTP server that answers 404 to a request carrying the session's
`Mcp-Session-Id` (a restarted server knows no session it had; the MCP spec then wants a
new `initialize`). Some servers answer such a request with 400 instead: after any other
4xx a `ping` asks, and a session whose ping is refused too has ended the same way. A
listing or call on an ended session opens a new one first, and lists the server's tools
again. A listing that fails on a broken or ended session is retried once on a new one.
A call is retried once only when it cannot have taken effect: its request never reached
the transport, or the server refused it at the HTTP level for a session that ended.
Once written otherwise it may have, so its failure is the model's to read (the
idempotency key in `_meta` lets the server drop a repeat). A session that failed (a
broken connection, a call past its deadline) is closed in the background: a call
returns at its deadline.

A result reaches the model as `agents/mcp/results.py` renders it: text with no base64 in
it, and images beside it for a provider that takes them. Tools a server marks task-only
(`execution.taskSupport: required`) are left out of the listing: Cairn does not run MCP
tasks, so a model could never call them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.metadata
import json
import sys
import threading
from collections.abc import Coroutine, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TextIO, TypeVar, cast

from pydantic import JsonValue

try:
    import anyio
    import httpx2
    import mcp_types
    from httpx2 import codes
    from mcp import Client, MCPError, StdioServerParameters, stdio_client
    from mcp.client import Transport
    from mcp.client._transport import ReadStream, WriteStream  # the types of `Transport`
    from mcp.client.streamable_http import MCP_SESSION_ID, streamable_http_client
    from mcp.shared.message import SessionMessage
    from mcp_types import CONNECTION_CLOSED
except ImportError as exc:  # the optional extra is not installed
    raise ImportError(
        f"MCP servers need the mcp extra: pip install 'cairn-agents[mcp]' ({exc})"
    ) from exc

from cairn.agents.logs import get_logger
from cairn.agents.mcp.config import McpServer
from cairn.agents.mcp.names import tool_name
from cairn.agents.mcp.results import ToolOutput, render_result
from cairn.errors import ToolError, ToolUnreachable
from cairn.storage.records import Effects

META_KEY = "cairn/idempotency_key"  # in a tools/call request's `_meta`
CONNECT_TIMEOUT = 30.0  # seconds to start a server (or reach it) and shake hands
STOP_TIMEOUT = 5.0  # seconds for a session to close before its task is cancelled
MAX_PAGES = 100  # of one tools/list: a server paging forever cannot hang a step
GRACE = 5.0  # seconds a caller waits past a coroutine's own deadline
PROBE_TIMEOUT = 5.0  # seconds for the ping that asks whether a session still stands
MAX_TEXT = 16_000  # characters of a result a model reads, unless the caller says
T = TypeVar("T")
TransportStreams = tuple[ReadStream[SessionMessage | Exception], WriteStream[SessionMessage]]

log = get_logger(__name__)


def _client_info() -> mcp_types.Implementation:
    """What Cairn calls itself to servers: its distribution's name and installed version."""
    try:
        version = importlib.metadata.version("cairn-agents")
    except importlib.metadata.PackageNotFoundError:  # run from a tree that is not installed
        version = "0+unknown"
    return mcp_types.Implementation(name="cairn-agents", version=version)


CLIENT_INFO = _client_info()


@dataclass(frozen=True, slots=True)
class McpToolInfo:
    """One tool a server lists, as a model will see it, with what it may change."""

    server: str
    tool: str  # the server's name for it
    name: str  # the model's (`tool_name`)
    description: str
    input_schema: dict[str, JsonValue]
    annotations: dict[str, JsonValue]
    effects: Effects


def effects_of(annotations: mcp_types.ToolAnnotations | None) -> Effects:
    """`none` for a tool whose annotations say `readOnlyHint: true`, else `external`."""
    read_only = annotations is not None and annotations.read_only_hint is True
    return Effects.NONE if read_only else Effects.EXTERNAL


class McpManager:
    """A worker's MCP servers: their tools, and calls to them, from sync code.

    Thread-safe: concurrent steps share the sessions. `close` ends every session (a
    stdio server's process with it) and the loop's thread; a closed manager reopens on
    next use. `errlog` receives stdio servers' stderr (default: the worker's).
    """

    def __init__(
        self,
        servers: Mapping[str, McpServer],
        *,
        connect_timeout: float = CONNECT_TIMEOUT,
        errlog: TextIO | None = None,
    ) -> None:
        self.servers = dict(servers)
        self.connect_timeout = connect_timeout
        self.errlog = errlog
        self._guard = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        # Touched on the loop's thread only:
        self._sessions: dict[str, _Session] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._listings: dict[str, list[McpToolInfo]] = {}
        self._closing: set[asyncio.Task[None]] = set()  # sessions closing in the background
        self._left_out: set[tuple[str, str]] = set()  # task-only tools, logged once each

    def __enter__(self) -> McpManager:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def list_tools(self, server: str) -> list[McpToolInfo]:
        """The tools `server` offers, listed once per session.

        Raises `ToolError` (one line) when the server cannot be started, reached or listed.
        """
        spec = self._spec(server)
        deadline = 2 * (self.connect_timeout + spec.timeout)  # with one reconnect
        return self._run(self._list(server), deadline, f"listing MCP server {server!r}")

    def call_tool_output(
        self, server: str, tool: str, args: Mapping[str, Any], key: str, *, limit: int = MAX_TEXT
    ) -> ToolOutput:
        """Call `tool` of `server` with `args`, and `key` as `_meta["cairn/idempotency_key"]`.

        Returns what the model reads: `render_result` of the result, its text in at most
        about `limit` characters. Raises `ToolError` for a result marked `isError` (its
        text), a protocol error, a timeout or a lost connection; the message says which.
        """
        spec = self._spec(server)
        deadline = 2 * (self.connect_timeout + spec.timeout)  # with one reconnect
        result = self._run(
            self._call(server, tool, dict(args), key), deadline, f"MCP tool {server}/{tool}"
        )
        output = render_result(result, limit)
        if result.is_error:
            raise ToolError(output.text)
        return output

    def call_tool(
        self, server: str, tool: str, args: Mapping[str, Any], key: str, *, limit: int = MAX_TEXT
    ) -> str:
        """`call_tool_output`'s text alone: what a model shown no images reads."""
        return self.call_tool_output(server, tool, args, key, limit=limit).text

    def close(self) -> None:
        """End every session and stop the loop's thread; wait for both."""
        with self._guard:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        future = asyncio.run_coroutine_threadsafe(self._close_all(), loop)
        try:
            future.result(STOP_TIMEOUT * 2 + GRACE)
        except Exception:  # closing: log, never raise
            log.warning("MCP sessions did not close cleanly", exc_info=True)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(GRACE)
        if not thread.is_alive():
            loop.close()

    # The sync side: one loop, started on first use.

    def _spec(self, server: str) -> McpServer:
        spec = self.servers.get(server)
        if spec is None:
            raise ToolError(
                f"no MCP server {server!r} on this worker; it has {sorted(self.servers)}"
            )
        return spec

    def _run(self, coro: Coroutine[Any, Any, T], deadline: float, what: str) -> T:
        """Run `coro` on the loop and return its result; `ToolError` after `deadline` s."""
        future = asyncio.run_coroutine_threadsafe(coro, self._started())
        try:
            return future.result(deadline + GRACE)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise ToolError(f"{what} timed out after {deadline:g} s") from None

    def _started(self) -> asyncio.AbstractEventLoop:
        with self._guard:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="cairn-mcp", daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    # The loop's side.

    async def _list(self, server: str) -> list[McpToolInfo]:
        async with self._lock(server):
            listed = self._listings.get(server)
            session = self._sessions.get(server)
            if listed is not None and session is not None and session.transport.usable:
                return listed
            try:
                listed = await self._list_once(server)
            except ToolUnreachable:
                self._drop(server)
                listed = await self._list_once(server)  # a listing is safe to repeat
            self._listings[server] = listed
            return listed

    async def _list_once(self, server: str) -> list[McpToolInfo]:
        session = await self._session(server)
        spec = self.servers[server]
        tools: list[mcp_types.Tool] = []
        cursor: str | None = None
        try:
            with anyio.fail_after(spec.timeout):
                for _ in range(MAX_PAGES):
                    page = await session.client.list_tools(cursor=cursor)
                    tools.extend(page.tools)
                    cursor = page.next_cursor
                    if cursor is None:
                        break
        except BaseException as exc:
            if isinstance(exc, MCPError):
                await _check_session(session, spec.timeout)
            raise _failure(exc, session, f"listing MCP server {server!r}", spec.timeout) from exc
        return [_info(server, tool) for tool in tools if self._callable(server, tool)]

    def _callable(self, server: str, tool: mcp_types.Tool) -> bool:
        """False for a task-only tool, which Cairn cannot call (logged once per tool)."""
        if tool.execution is None or tool.execution.task_support != "required":
            return True
        if (server, tool.name) not in self._left_out:
            self._left_out.add((server, tool.name))
            log.info(
                "MCP tool left out: it runs only as a task, and Cairn does not run MCP tasks",
                server=server,
                tool=tool.name,
            )
        return False

    async def _call(
        self, server: str, tool: str, args: dict[str, Any], key: str
    ) -> mcp_types.CallToolResult:
        spec = self.servers[server]
        meta = cast("mcp_types.RequestParamsMeta", {META_KEY: key}) if key else None
        for attempt in (1, 2):
            async with self._lock(server):
                session = await self._session(server)
            try:
                # asyncio's own deadline: half the cost of an anyio cancel scope a call
                async with asyncio.timeout(spec.timeout):
                    return await session.client.call_tool(tool, args, meta=meta)
            except BaseException as exc:
                if isinstance(exc, MCPError):
                    await _check_session(session, spec.timeout)
                failure = _failure(exc, session, f"MCP tool {server}/{tool}", spec.timeout)
                if not isinstance(failure, ToolUnreachable):
                    raise failure from exc
                if self._sessions.get(server) is session:
                    self._drop(server)
                if attempt == 1 and key and key not in session.transport.sent:
                    log.info("MCP call not sent; retrying on a new session", server=server)
                    continue  # the request never left: no effect can have happened
                if attempt == 1 and key in session.transport.refused:
                    log.info("MCP session ended; retrying the call it refused", server=server)
                    continue  # refused unread, for a session the server no longer has
                raise ToolError(f"{failure}; it may or may not have taken effect") from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def _lock(self, server: str) -> asyncio.Lock:
        lock = self._locks.get(server)
        if lock is None:
            lock = self._locks[server] = asyncio.Lock()
        return lock

    async def _session(self, server: str) -> _Session:
        """The server's open session: the one held, unless its server hung up, else a new one.

        Called with the server's lock held.
        """
        session = self._sessions.get(server)
        if session is not None and session.transport.usable:
            return session
        if session is not None:
            why = "ended the session" if session.transport.expired else "hung up"
            log.info(f"starting a new MCP session: the last one's server {why}", server=server)
            self._drop(server)
        session = await _Session.open(
            server, self.servers[server], self.connect_timeout, self.errlog
        )
        self._sessions[server] = session
        return session

    def _drop(self, server: str) -> None:
        """Forget the server's session and listing; close the session in the background."""
        self._listings.pop(server, None)
        session = self._sessions.pop(server, None)
        if session is not None:
            # Not awaited: a stdio server's exit can take seconds, past a call's deadline.
            closing = asyncio.get_running_loop().create_task(session.close())
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)

    async def _close_all(self) -> None:
        for server in list(self._sessions):
            self._drop(server)
        if self._closing:
            await asyncio.wait(set(self._closing))


async def _check_session(session: _Session, timeout: float) -> None:
    """After an HTTP 4xx other than 404 to the session's requests, ask if it still stands.

    Some servers answer a session id they do not know with 400, not the spec's 404. A
    `ping` the server refuses too says the session is gone there: it ends here as after a
    404, and the calls refused with that 4xx count as refused unread.
    """
    transport = session.transport
    if transport.expired or not transport.doubted:
        return
    transport.doubted = False
    try:
        async with asyncio.timeout(min(timeout, PROBE_TIMEOUT)):
            await session.client.send_ping()
    except Exception:  # noqa: BLE001 - any failure: the session does not answer
        log.info("MCP server refused a ping on the session: it ended", server=transport.server)
        transport.expired = True
        transport.refused |= transport.rejected


def _failure(exc: BaseException, session: _Session, what: str, timeout: float) -> ToolError:
    """`exc`, raised by a listing or call on `session`, as a one-line `ToolError`."""
    if isinstance(exc, TimeoutError):
        return ToolUnreachable(f"{what} timed out after {timeout:g} s")
    if isinstance(exc, MCPError):
        if session.transport.expired:
            return ToolUnreachable(f"{what}: the server ended the session ({exc.error.message})")
        if exc.code == CONNECTION_CLOSED or session.transport.closed:
            return ToolUnreachable(f"{what}: connection closed")
        return ToolError(f"{what}: {exc.error.message}")
    if isinstance(exc, Exception):
        return ToolUnreachable(f"{what}: {_describe(exc)}")
    raise exc  # cancellation and exits go on as they are


def _info(server: str, tool: mcp_types.Tool) -> McpToolInfo:
    annotations = tool.annotations
    dumped = annotations.model_dump(by_alias=True, exclude_none=True) if annotations else {}
    return McpToolInfo(
        server=server,
        tool=tool.name,
        name=tool_name(server, tool.name),
        description=tool.description or tool.title or tool.name,
        input_schema=tool.input_schema,
        annotations=dumped,
        effects=effects_of(annotations),
    )


def _describe(exc: BaseException) -> str:
    """An exception, or the first leaf of an exception group, as one line."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _Session:
    """One open session with one server, held by a task of its own on the loop."""

    def __init__(
        self, client: Client, transport: _Tracked, stop: asyncio.Event, task: asyncio.Task[None]
    ) -> None:
        self.client, self.transport, self.stop, self.task = client, transport, stop, task

    @classmethod
    async def open(
        cls, server: str, spec: McpServer, timeout: float, errlog: TextIO | None
    ) -> _Session:
        """Start (or reach) `server` and shake hands; `ToolError` if it fails or takes too long."""
        transport = _Tracked(spec, server, errlog)
        client = Client(transport, cache=None, client_info=CLIENT_INFO)
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        stop = asyncio.Event()
        task = asyncio.create_task(_hold(client, ready, stop), name=f"mcp:{server}")
        session = cls(client, transport, stop, task)
        try:
            await asyncio.wait_for(asyncio.shield(ready), timeout)
        except TimeoutError:
            await session.close(now=True)
            raise ToolError(f"MCP server {server!r} did not start within {timeout:g} s") from None
        except Exception as exc:  # noqa: BLE001 - a spawn, transport or handshake failure
            await session.close()
            raise ToolError(f"MCP server {server!r} did not start: {_describe(exc)}") from None
        log.info("MCP session open", server=server, transport=spec.transport)
        return session

    async def close(self, *, now: bool = False) -> None:
        """Leave the session (stopping a stdio server); cancel it `now` or if that is slow."""
        self.transport.leaving = True
        self.stop.set()
        if not now:
            await asyncio.wait({self.task}, timeout=STOP_TIMEOUT)
        if not self.task.done():
            self.task.cancel()
            await asyncio.wait({self.task}, timeout=STOP_TIMEOUT)


async def _hold(client: Client, ready: asyncio.Future[None], stop: asyncio.Event) -> None:
    """Enter `client`, say so through `ready`, and leave it when `stop` is set."""
    try:
        async with client:
            ready.set_result(None)
            await stop.wait()
    except Exception as exc:  # noqa: BLE001 - handed to the opener, or logged once in use
        if not ready.done():
            ready.set_exception(exc)
        else:  # the session was in use: its calls report what went wrong
            log.debug("MCP session ended with an error", error=_describe(exc))
    finally:
        if not ready.done():
            ready.cancel()


def _transport(spec: McpServer, errlog: TextIO | None, tracked: _Tracked) -> Transport:
    if spec.command is not None:
        params = StdioServerParameters(
            command=spec.command, args=spec.args, env=spec.env or None, cwd=spec.cwd
        )
        return stdio_client(params, errlog=errlog or sys.stderr)
    assert spec.url is not None  # McpServer has a command or a url
    http = httpx2.AsyncClient(
        headers=spec.headers,
        timeout=httpx2.Timeout(spec.timeout, read=spec.timeout),
        event_hooks={"response": [tracked.see_response]},
    )
    return _Owning(streamable_http_client(spec.url, http_client=http), http)


class _Owning(AbstractAsyncContextManager[TransportStreams]):
    """A transport that closes the HTTP client it was given when it closes."""

    def __init__(self, inner: Transport, http: httpx2.AsyncClient) -> None:
        self.inner, self.http = inner, http

    async def __aenter__(self) -> TransportStreams:
        await self.http.__aenter__()
        try:
            return await self.inner.__aenter__()
        except BaseException:
            await self.http.aclose()
            raise

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        try:
            return await self.inner.__aexit__(exc_type, exc, tb)
        finally:
            await self.http.aclose()


class _Tracked(AbstractAsyncContextManager[TransportStreams]):
    """A transport that notes how its session ended, and what became of calls' requests.

    The server hung up (`closed`) or answered 404 for the session (`expired`); the keys of
    the calls written (`sent`), and of those the server refused with that 404 (`refused`),
    or with another 4xx (`rejected`, refused too once the session proves gone).
    """

    def __init__(self, spec: McpServer, server: str, errlog: TextIO | None) -> None:
        self.server = server
        self.closed = False  # the server's stream ended: the session is dead
        self.expired = False  # the server answered 404 for the session: it is gone there
        self.leaving = False  # this side is closing the session: its end is no news
        self.sent: set[str] = set()  # idempotency keys of tools/call requests written
        self.refused: set[str] = set()  # ... and of those the server refused with that 404
        self.doubted = False  # a request got another 4xx: the session may be gone
        self.rejected: set[str] = set()  # keys of calls refused with another 4xx
        self.inner = _transport(spec, errlog, self)

    @property
    def usable(self) -> bool:
        """Whether the session may take another request (its server has not left it)."""
        return not (self.closed or self.expired)

    async def see_response(self, response: httpx2.Response) -> None:
        """Note a 4xx to a request carrying the session's id.

        A 404 is the spec's word for a session the server no longer has (restarted, or
        expired there): the session is over, and the server did not handle the request, so
        a call it answered so had no effect. Another 4xx (a refusal at the HTTP level, the
        request not handled either) leaves the session in doubt (`_check_session`).
        """
        status = response.status_code
        if MCP_SESSION_ID not in response.request.headers or not codes.is_client_error(status):
            return
        key = _call_key(response.request.content)
        if status != codes.NOT_FOUND:
            self.doubted = True
            if key is not None:
                self.rejected.add(key)
            return
        if not (self.expired or self.leaving):
            log.info("MCP server ended the session (HTTP 404)", server=self.server)
        self.expired = True
        if key is not None:
            self.refused.add(key)

    async def __aenter__(self) -> TransportStreams:
        read, write = await self.inner.__aenter__()
        return _WatchedRead(read, self), _WatchedWrite(write, self)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        self.closed = True
        return await self.inner.__aexit__(exc_type, exc, tb)


class _WatchedRead:
    """A read stream that marks its transport closed when the server's stream ends."""

    def __init__(self, inner: ReadStream[SessionMessage | Exception], owner: _Tracked) -> None:
        self.inner, self.owner = inner, owner

    @property
    def last_context(self) -> object:
        """The sender's context of the last message, when the inner stream keeps one."""
        return getattr(self.inner, "last_context", None)

    async def receive(self) -> SessionMessage | Exception:
        try:
            return await self.inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            if not (self.owner.closed or self.owner.leaving):
                log.info("MCP server hung up", server=self.owner.server)
            self.owner.closed = True
            raise

    async def aclose(self) -> None:
        await self.inner.aclose()

    def __aiter__(self) -> _WatchedRead:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> _WatchedRead:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        await self.aclose()
        return None


def _call_key(body: bytes) -> str | None:
    """The idempotency key of the tools/call request that is HTTP `body`, if it is one."""
    try:
        message = json.loads(body)
    except ValueError:
        return None
    if not isinstance(message, dict) or message.get("method") != "tools/call":
        return None
    return _key_of(message.get("params"))


def _key_of(params: object) -> str | None:
    """The idempotency key in a tools/call request's params, if any."""
    meta = params.get("_meta") if isinstance(params, dict) else None
    key = meta.get(META_KEY) if isinstance(meta, dict) else None
    return key if isinstance(key, str) else None


class _WatchedWrite:
    """A write stream that notes the idempotency key of each tools/call it writes."""

    def __init__(self, inner: WriteStream[SessionMessage], owner: _Tracked) -> None:
        self.inner, self.owner = inner, owner

    async def send(self, item: SessionMessage, /) -> None:
        message = item.message
        if isinstance(message, mcp_types.JSONRPCRequest) and message.method == "tools/call":
            key = _key_of(message.params)
            if key is not None:
                self.owner.sent.add(key)  # before: a send that raises may still have delivered
        await self.inner.send(item)

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def __aenter__(self) -> _WatchedWrite:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        await self.aclose()
        return None
