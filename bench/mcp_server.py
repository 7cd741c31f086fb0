"""A tiny MCP server (the `mcp` SDK's `MCPServer`, over stdio) for the agents benchmark.

`python -m bench.mcp_server` serves one read-only tool, `clock`, which does nothing but
say when its body ran: `"<entered> <left>"`, two `time.monotonic_ns()` readings. On Linux
that clock is the system's CLOCK_MONOTONIC, the one the benchmark reads in its own
process.

`--times PATH` also notes, on the same clock, when the server's stdio transport read each
request line from stdin (as `readline` returned it) and when it had written each response
line to stdout (as the write to the pipe returned), and at exit writes one JSON line per
request answered to PATH: `{"id", "method", "key", "read", "written"}` (`key`: a
`tools/call`'s `_meta["cairn/idempotency_key"]`). `written - read` is the server's own
time: everything its process does for the request, the SDK included.

By default the stdio is the SDK's `stdio_server` as `MCPServer.run("stdio")` sets it up:
stdin and stdout in `anyio.wrap_file`, which hands every line read and written to a
worker thread (the timestamps are taken on that thread, at the pipe). `--direct` serves
the same tool with streams of its own that read and write the pipes on the event loop.
The benchmark compares the two to show what the threads cost.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from io import TextIOWrapper
from pathlib import Path
from typing import Any, cast

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.stdio import stdio_server
from mcp_types import ToolAnnotations

server = MCPServer("cairn-bench", log_level="WARNING")
META_KEY = "cairn/idempotency_key"  # as cairn.agents.mcp.manager sends it

# (read or written, monotonic ns, the line): appended on whichever thread touches the pipe
Stamp = tuple[bool, int, str]
stamps: list[Stamp] = []


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def clock() -> str:
    """Do nothing; say when this body was entered and left (monotonic ns)."""
    entered = time.monotonic_ns()
    return f"{entered} {time.monotonic_ns()}"


class TimedText(TextIOWrapper):
    """A text stream noting when each line was read and each write flushed to the pipe."""

    pending = ""  # written since the last flush

    def readline(self, size: int = -1, /) -> str:  # type: ignore[override]  # typeshed: bytes
        """The next line, noted as read the moment the pipe gave it."""
        line = super().readline(size)
        if line:
            stamps.append((True, time.monotonic_ns(), line))
        return line

    def write(self, text: str, /) -> int:
        """Buffer `text`; `flush` notes it written."""
        self.pending += text
        return super().write(text)

    def flush(self) -> None:
        """Write what is buffered to the pipe; note the line written."""
        super().flush()
        pending, self.pending = self.pending, ""
        if pending:
            stamps.append((False, time.monotonic_ns(), pending))


class LoopStdin:
    """Stdin's lines, read on the event loop (no thread), as `stdio_server` iterates them."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.reader = reader

    def __aiter__(self) -> AsyncIterator[str]:
        return self.lines()

    async def lines(self) -> AsyncIterator[str]:
        """Each line, decoded and noted as read, until the end of input."""
        while line := await self.reader.readline():
            stamps.append((True, time.monotonic_ns(), text := line.decode(errors="replace")))
            yield text


class DirectStdout:
    """Stdout written with os.write (a pipe takes a short line without blocking)."""

    async def write(self, text: str) -> None:
        """Write all of `text`; note it written."""
        data = memoryview(text.encode())
        while data:
            data = data[os.write(1, data) :]
        stamps.append((False, time.monotonic_ns(), text))

    async def flush(self) -> None:
        """Nothing to flush: every write went to the pipe."""


async def serve(direct: bool) -> None:
    """Serve over stdio: the SDK's threads, or (`direct`) the loop and os.write."""
    if direct:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        protocol = asyncio.StreamReaderProtocol(reader)
        await loop.connect_read_pipe(lambda: protocol, sys.stdin.buffer)
        stdin, stdout = cast("Any", LoopStdin(reader)), cast("Any", DirectStdout())
    else:  # what stdio_server() builds for itself, with the timed text layer
        stdin = anyio.wrap_file(TimedText(sys.stdin.buffer, encoding="utf-8", errors="replace"))
        stdout = anyio.wrap_file(TimedText(sys.stdout.buffer, encoding="utf-8"))
    lowlevel = server._lowlevel_server  # what MCPServer.run_stdio_async runs
    async with stdio_server(stdin, stdout) as (read, write):
        await lowlevel.run(read, write, lowlevel.create_initialization_options())


def answered(noted: list[Stamp]) -> list[dict[str, Any]]:
    """Each request answered: its id, method, idempotency key, when read and when written."""
    asked: dict[object, dict[str, Any]] = {}
    done = []
    for is_read, ns, text in noted:
        message = json.loads(text)
        if is_read and "id" in message:
            params = message.get("params") or {}
            key = (params.get("_meta") or {}).get(META_KEY)
            asked[message["id"]] = {"method": message["method"], "key": key, "read": ns}
        elif not is_read and (request := asked.pop(message.get("id"), None)) is not None:
            done.append({"id": message["id"], **request, "written": ns})
    return done


def main() -> None:
    """Serve until stdin ends; then write the times, if asked."""
    parser = argparse.ArgumentParser(prog="python -m bench.mcp_server")
    parser.add_argument("--direct", action="store_true", help="stdio on the loop, no threads")
    parser.add_argument("--times", help="write when each request was read and answered here")
    options = parser.parse_args()
    try:
        if options.direct:
            asyncio.run(serve(direct=True))
        else:
            anyio.run(serve, False)
    finally:
        if options.times:
            rows = answered(stamps)
            Path(options.times).write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
