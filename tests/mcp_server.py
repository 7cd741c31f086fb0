"""A small MCP server (the `mcp` SDK's `MCPServer`) for tests/test_mcp.py and test_mcp_workers.py.

`python tests/mcp_server.py` serves over stdio; `... --http PORT` serves streamable HTTP
on 127.0.0.1:PORT at /mcp. It speaks the handshake era of the protocol (`initialize`, and
over HTTP an `Mcp-Session-Id` that a restarted server no longer knows), as servers in the
wild do; `MCP_MODERN=1` lets it answer `server/discover` and speak 2026-07-28 instead.

Its tools: `lookup` (read-only) answers from a fixed table and fails for an unknown key;
`record` is an outside ledger that applies each idempotency key once: the key of a call
(from the request's `_meta`, `-` when there is none) is appended with its note to the file
`MCP_RECORD_FILE` names unless that file already holds it (a call without a key is
applied every time). It says its process id so a test can kill it. `pause` answers after
a while; `picture` returns a PNG of a given size as an image block (and, as
server-filesystem does, the same block again as structured content); `whoami` says the
client's name and version from its handshake; `forget` ends the calling HTTP session
(its id answers 404 from then on, as a restarted server's would); `chore` is task-only
(`execution.taskSupport: required`), so a client that does not run tasks can never call it.

Optional, for tests that watch the server: `MCP_CALLS_FILE` gets a line per `record` or
`pause` call that arrives, applied or not; `MCP_PID_FILE` a line with the process id at
start. A server started while the file `MCP_EXTRA_TOOL_IF` names exists has a tool
`extra` too, so a test can tell a fresh listing from a cached one after a restart.
`MCP_STUBBORN=1` makes it ignore SIGTERM: a client stopping it waits until it kills it.
"""

from __future__ import annotations

import base64
import fcntl
import os
import random
import signal
import struct
import sys
import time
import zlib
from http import HTTPStatus
from pathlib import Path
from typing import Any

import anyio
import uvicorn
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp_types import (
    METHOD_NOT_FOUND,
    CallToolResult,
    ErrorData,
    ImageContent,
    JSONRPCError,
    JSONRPCRequest,
    ToolAnnotations,
)
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

META_KEY = "cairn/idempotency_key"
TABLE = {"cairn": "a pile of stones marking a path", "mcp": "Model Context Protocol"}
TASK_ONLY = "chore"
MCP_SESSION_ID = "mcp-session-id"
# Session ids `forget` ended, and the status their requests get: 404 as the spec has it,
# or 400 as servers built on the TypeScript SDK's example answer an id they do not know.
FORGOTTEN: dict[str, int] = {}


def modern() -> bool:
    """Whether to speak 2026-07-28 (`MCP_MODERN=1`) rather than the handshake era."""
    return os.environ.get("MCP_MODERN") == "1"


async def handshake_era(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
    """Over HTTP, refuse `server/discover`: clients fall back to `initialize` (and sessions)."""
    if ctx.method == "server/discover" and not modern():
        raise MCPError(METHOD_NOT_FOUND, "Method not found")
    return await call_next(ctx)


async def serve_stdio() -> None:
    """Serve over stdio, answering `server/discover` as unknown unless modern.

    Over stdio the SDK settles the era on the first request before middleware runs, so the
    probe is answered here, ahead of the server, as a server that never heard of it would.
    """
    lowlevel = server._lowlevel_server  # what MCPServer.run_stdio_async serves, too
    options = lowlevel.create_initialization_options()
    async with stdio_server() as (read, write):
        if modern():
            await lowlevel.run(read, write, options)
            return
        relay, relayed = anyio.create_memory_object_stream[SessionMessage | Exception](0)

        async def answer_discover() -> None:
            async with relay:
                async for item in read:
                    probe = isinstance(item, SessionMessage) and _is_discover(item.message)
                    if not probe:
                        await relay.send(item)
                        continue
                    assert isinstance(item, SessionMessage)  # for the type checker
                    assert isinstance(item.message, JSONRPCRequest)
                    error = ErrorData(code=METHOD_NOT_FOUND, message="Method not found")
                    reply = JSONRPCError(jsonrpc="2.0", id=item.message.id, error=error)
                    await write.send(SessionMessage(reply))

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(answer_discover)
            await lowlevel.run(relayed, write, options)


def _is_discover(message: object) -> bool:
    return isinstance(message, JSONRPCRequest) and message.method == "server/discover"


async def task_only(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
    """List `chore` as task-only: MCPServer's decorator has no `execution` field."""
    result = await call_next(ctx)
    if ctx.method == "tools/list" and isinstance(result, dict):
        for tool in result.get("tools", []):
            if tool.get("name") == TASK_ONLY:
                tool["execution"] = {"taskSupport": "required"}
    return result


server = MCPServer("cairn-test", log_level="WARNING", middleware=[handshake_era, task_only])


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def lookup(word: str) -> str:
    """Look a word up in a small glossary."""
    if word not in TABLE:
        raise ToolError(f"no entry for {word!r}")
    return TABLE[word]


@server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False))
def record(note: str, ctx: Context) -> str:
    """Record a note, once per idempotency key of the call that brought it."""
    key = _key(ctx)
    _append(os.environ.get("MCP_CALLS_FILE"), f"{key}\t{note}\n")
    with Path(os.environ["MCP_RECORD_FILE"]).open("a+", encoding="utf-8") as ledger:
        fcntl.flock(ledger, fcntl.LOCK_EX)  # released as the file closes
        ledger.seek(0)
        if key != "-" and key in {line.split("\t")[0] for line in ledger.read().splitlines()}:
            return f"already recorded {note} (pid {os.getpid()})"
        ledger.write(f"{key}\t{note}\n")
    return f"recorded {note} (pid {os.getpid()})"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def pause(seconds: float, ctx: Context) -> str:
    """Answer after `seconds` (a server too slow for its caller's deadline)."""
    _append(os.environ.get("MCP_CALLS_FILE"), f"{_key(ctx)}\tpause\n")
    time.sleep(seconds)
    return f"paused {seconds:g} s"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def picture(size: int) -> CallToolResult:
    """A PNG of about `size` bytes (noise, so it does not compress)."""
    block = ImageContent(data=base64.b64encode(png_of(size)).decode(), mime_type="image/png")
    dumped = block.model_dump(by_alias=True, exclude_none=True)
    return CallToolResult(content=[block], structured_content={"content": [dumped]})


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def whoami(ctx: Context) -> str:
    """The client's name and version, as its handshake gave them."""
    params = ctx.request_context.session.client_params
    info = params.client_info if params is not None else None
    return f"{info.name} {info.version}" if info is not None else "unknown"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def forget(ctx: Context, status: int = 404) -> str:
    """End the calling session (HTTP): its id gets `status` from now on, as after a restart."""
    request = ctx.request_context.request
    session = getattr(request, "headers", {}).get(MCP_SESSION_ID)
    if session is None:
        raise ToolError("no HTTP session to forget")
    FORGOTTEN[session] = status
    return "forgotten"


@server.tool(name=TASK_ONLY)
def chore() -> str:
    """A long job that only runs as a task."""
    return "done"


if Path(os.environ.get("MCP_EXTRA_TOOL_IF") or "/nonexistent").exists():

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def extra() -> str:
        """A tool only a server started with MCP_EXTRA_TOOL=1 has."""
        return "extra"


def _key(ctx: Context) -> str:
    meta = ctx.request_context.meta or {}
    return str(meta.get(META_KEY, "-"))


def png_of(size: int) -> bytes:
    """A valid RGB PNG of random pixels whose file is about `size` bytes."""
    side = max(1, int((max(size - 100, 3) / 3) ** 0.5))
    noise = random.Random(size)
    rows = b"".join(b"\0" + noise.randbytes(side * 3) for _ in range(side))

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    idat = zlib.compress(rows, 0)  # stored: the file's size follows the pixels'
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")
    )


def forgetting(app: ASGIApp) -> ASGIApp:
    """`app`, refusing a request that carries a session id `forget` ended (`FORGOTTEN`)."""

    async def serve(scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope.get("headers") or [])
        session = headers.get(MCP_SESSION_ID.encode(), b"").decode()
        status = FORGOTTEN.get(session) if scope["type"] == "http" else None
        if status == HTTPStatus.NOT_FOUND:
            error = {"code": -32600, "message": "Session not found"}
            await JSONResponse({"jsonrpc": "2.0", "id": None, "error": error}, status)(
                scope, receive, send
            )
            return
        if status is not None:  # server-everything's answer: no id, so no JSON-RPC error
            error = {"code": -32000, "message": "Bad Request: No valid session ID provided"}
            await JSONResponse({"jsonrpc": "2.0", "error": error}, status)(scope, receive, send)
            return
        await app(scope, receive, send)

    return serve


def _append(path: str | None, line: str) -> None:
    if path:
        with Path(path).open("a", encoding="utf-8") as out:
            out.write(line)


def main(argv: list[str]) -> None:
    """Serve over stdio, or over streamable HTTP with `--http PORT`."""
    _append(os.environ.get("MCP_PID_FILE"), f"{os.getpid()}\n")
    if os.environ.get("MCP_STUBBORN") == "1":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if argv[:1] == ["--http"]:
        app = forgetting(server.streamable_http_app(host="127.0.0.1"))
        uvicorn.run(app, host="127.0.0.1", port=int(argv[1]), log_level="warning")
    else:
        anyio.run(serve_stdio)


if __name__ == "__main__":
    main(sys.argv[1:])
