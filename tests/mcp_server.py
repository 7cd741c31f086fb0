"""A small MCP server (the `mcp` SDK's `MCPServer`) for tests/test_mcp.py and test_mcp_workers.py.

`python tests/mcp_server.py` serves over stdio; `... --http PORT` serves streamable HTTP
on 127.0.0.1:PORT at /mcp. Its tools: `lookup` (read-only) answers from a fixed table and
fails for an unknown key; `record` is an outside ledger that applies each idempotency key
once: the key of a call (from the request's `_meta`, `-` when there is none) is appended
with its note to the file `MCP_RECORD_FILE` names unless that file already holds it (a
call without a key is applied every time). It says its process id so a test can kill it.

Optional, for tests that watch the server: `MCP_CALLS_FILE` gets a line per `record`
call that arrives, applied or not; `MCP_PID_FILE` a line with the process id at start.
"""

from __future__ import annotations

import fcntl
import os
import sys
import time
from pathlib import Path

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations

META_KEY = "cairn/idempotency_key"
TABLE = {"cairn": "a pile of stones marking a path", "mcp": "Model Context Protocol"}

server = MCPServer("cairn-test", log_level="WARNING")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def lookup(word: str) -> str:
    """Look a word up in a small glossary."""
    if word not in TABLE:
        raise ToolError(f"no entry for {word!r}")
    return TABLE[word]


@server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False))
def record(note: str, ctx: Context) -> str:
    """Record a note, once per idempotency key of the call that brought it."""
    meta = ctx.request_context.meta or {}
    key = meta.get(META_KEY, "-")
    _append(os.environ.get("MCP_CALLS_FILE"), f"{key}\t{note}\n")
    with Path(os.environ["MCP_RECORD_FILE"]).open("a+", encoding="utf-8") as ledger:
        fcntl.flock(ledger, fcntl.LOCK_EX)  # released as the file closes
        ledger.seek(0)
        if key != "-" and key in {line.split("\t")[0] for line in ledger.read().splitlines()}:
            return f"already recorded {note} (pid {os.getpid()})"
        ledger.write(f"{key}\t{note}\n")
    return f"recorded {note} (pid {os.getpid()})"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def pause(seconds: float) -> str:
    """Answer after `seconds` (a server too slow for its caller's deadline)."""
    time.sleep(seconds)
    return f"paused {seconds:g} s"


def _append(path: str | None, line: str) -> None:
    if path:
        with Path(path).open("a", encoding="utf-8") as out:
            out.write(line)


def main(argv: list[str]) -> None:
    """Serve over stdio, or over streamable HTTP with `--http PORT`."""
    _append(os.environ.get("MCP_PID_FILE"), f"{os.getpid()}\n")
    if argv[:1] == ["--http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(argv[1]))
    else:
        server.run("stdio")


if __name__ == "__main__":
    main(sys.argv[1:])
