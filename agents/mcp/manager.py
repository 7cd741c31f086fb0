"""`McpManager`: a worker's sessions with its MCP servers, kept across steps.

The `mcp` SDK is async and steps are sync. The manager owns one event loop on one daemon
thread; every session lives there, each held open by a task of its own (the SDK's
contexts must be left by the task that entered them), and a step's thread hands the loop
a coroutine and waits for it, never longer than the server's `timeout`. Sessions open on
first use, one per server.

A server that died (a stdio process killed between steps) is noticed when its stream
ends; the next listing or call opens a new session first. A listing that fails on a
broken connection is retried once on a new one. A call is retried once only when its
request never reached the transport; once written it may have taken effect, so its
failure is the model's to read (the idempotency key in `_meta` lets the server drop a
repeat).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
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
    from mcp import Client, MCPError, StdioServerParameters, stdio_client
    from mcp.client import Transport
    from mcp.client._transport import ReadStream, WriteStream  # the types of `Transport`
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.message import SessionMessage
    from mcp_types import CONNECTION_CLOSED
except ImportError as exc:  # the optional extra is not installed
    raise ImportError(
        f"MCP servers need the mcp extra: pip install 'cairn-agents[mcp]' ({exc})"
    ) from exc

from agents.logs import get_logger
from agents.mcp.config import McpServer
from agents.mcp.names import tool_name
from storage.errors import ToolError, ToolUnreachable
from storage.records import Effects

META_KEY = "cairn/idempotency_key"  # in a tools/call request's `_meta`
CONNECT_TIMEOUT = 30.0  # seconds to start a server (or reach it) and shake hands
STOP_TIMEOUT = 5.0  # seconds for a session to close before its task is cancelled
MAX_PAGES = 100  # of one tools/list: a server paging forever cannot hang a step
GRACE = 5.0  # seconds a caller waits past a coroutine's own deadline
MAX_TEXT = 16_000  # characters of a result a model reads, unless the caller says
T = TypeVar("T")
TransportStreams = tuple[ReadStream[SessionMessage | Exception], WriteStream[SessionMessage]]

log = get_logger(__name__)


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


def render_result(result: mcp_types.CallToolResult, limit: int) -> str:
    """A tool's result as the model reads it, at most about `limit` characters.

    Text blocks as they are, embedded text resources by their text, other blocks
    (images, audio, binary resources, links) by a one-line note; the structured content as
    JSON when no block holds text. The middle of a longer text is cut, with a note.
    """
    parts = [_block_text(block) for block in result.content]
    texts = [isinstance(block, mcp_types.TextContent) for block in result.content]
    if result.structured_content is not None and not any(texts):
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    text = "\n".join(parts) or "(no output)"
    if len(text) <= limit:
        return text
    head, tail = limit // 2, limit - limit // 2
    return f"{text[:head]}\n… [{len(text) - limit} characters cut] …\n{text[-tail:]}"


def _block_text(block: mcp_types.ContentBlock) -> str:
    if isinstance(block, mcp_types.TextContent):
        return block.text
    if isinstance(block, mcp_types.ImageContent | mcp_types.AudioContent):
        return f"[{block.type}: {block.mime_type}, {len(block.data) * 3 // 4} bytes]"
    if isinstance(block, mcp_types.ResourceLink):
        return f"[resource link: {block.uri}]"
    contents = block.resource
    if isinstance(contents, mcp_types.TextResourceContents):
        return contents.text
    return f"[resource: {contents.uri}, {contents.mime_type or 'binary'}]"


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

    def call_tool(
        self, server: str, tool: str, args: Mapping[str, Any], key: str, *, limit: int = MAX_TEXT
    ) -> str:
        """Call `tool` of `server` with `args`, and `key` as `_meta["cairn/idempotency_key"]`.

        Returns what the model reads: `render_result` of the result, in at most about
        `limit` characters. Raises `ToolError` for a result marked `isError` (its text), a
        protocol error, a timeout or a lost connection; the message says which.
        """
        spec = self._spec(server)
        deadline = 2 * (self.connect_timeout + spec.timeout)  # with one reconnect
        result = self._run(
            self._call(server, tool, dict(args), key), deadline, f"MCP tool {server}/{tool}"
        )
        text = render_result(result, limit)
        if result.is_error:
            raise ToolError(text)
        return text

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
            if listed is not None and session is not None and not session.transport.closed:
                return listed
            try:
                listed = await self._list_once(server)
            except ToolUnreachable:
                await self._drop(server)
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
            raise _failure(exc, session, f"listing MCP server {server!r}", spec.timeout) from exc
        return [_info(server, tool) for tool in tools]

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
                failure = _failure(exc, session, f"MCP tool {server}/{tool}", spec.timeout)
                if not isinstance(failure, ToolUnreachable):
                    raise failure from exc
                async with self._lock(server):
                    if self._sessions.get(server) is session:
                        await self._drop(server)
                if attempt == 1 and key and key not in session.transport.sent:
                    log.info("MCP call not sent; retrying on a new session", server=server)
                    continue  # the request never left: no effect can have happened
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
        if session is not None and not session.transport.closed:
            return session
        if session is not None:
            log.info("starting a new MCP session: the last one's server hung up", server=server)
            await self._drop(server)
        session = await _Session.open(
            server, self.servers[server], self.connect_timeout, self.errlog
        )
        self._sessions[server] = session
        return session

    async def _drop(self, server: str) -> None:
        self._listings.pop(server, None)
        session = self._sessions.pop(server, None)
        if session is not None:
            await session.close()

    async def _close_all(self) -> None:
        for server in list(self._sessions):
            await self._drop(server)


def _failure(exc: BaseException, session: _Session, what: str, timeout: float) -> ToolError:
    """`exc`, raised by a listing or call on `session`, as a one-line `ToolError`."""
    if isinstance(exc, TimeoutError):
        return ToolUnreachable(f"{what} timed out after {timeout:g} s")
    if isinstance(exc, MCPError):
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
        transport = _Tracked(_transport(spec, errlog), server)
        client = Client(transport, cache=None)
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


def _transport(spec: McpServer, errlog: TextIO | None) -> Transport:
    if spec.command is not None:
        params = StdioServerParameters(
            command=spec.command, args=spec.args, env=spec.env or None, cwd=spec.cwd
        )
        return stdio_client(params, errlog=errlog or sys.stderr)
    assert spec.url is not None  # McpServer has a command or a url
    http = httpx2.AsyncClient(
        headers=spec.headers, timeout=httpx2.Timeout(spec.timeout, read=spec.timeout)
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
    """A transport that notes when the server hung up and which calls' keys it wrote."""

    def __init__(self, inner: Transport, server: str) -> None:
        self.inner, self.server = inner, server
        self.closed = False  # the server's stream ended: the session is dead
        self.leaving = False  # this side is closing the session: its end is no news
        self.sent: set[str] = set()  # idempotency keys of tools/call requests written

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


class _WatchedWrite:
    """A write stream that notes the idempotency key of each tools/call it writes."""

    def __init__(self, inner: WriteStream[SessionMessage], owner: _Tracked) -> None:
        self.inner, self.owner = inner, owner

    async def send(self, item: SessionMessage, /) -> None:
        message = item.message
        key = None
        if isinstance(message, mcp_types.JSONRPCRequest) and message.method == "tools/call":
            meta = (message.params or {}).get("_meta")
            key = meta.get(META_KEY) if isinstance(meta, dict) else None
        if isinstance(key, str):
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
