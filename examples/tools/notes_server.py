"""A team notebook as an MCP server, built with the official `mcp` SDK; served over stdio.

Workers start it from examples/tools/mcp.json (`CAIRN_MCP_CONFIG`), and agents name its
tools `mcp:notes` (all of them) or `mcp:notes/<tool>`; a model calls them `notes__add_note`
and `notes__read_notes`. The notebook is the JSON-lines file `NOTES_FILE` names, which
mcp.json hands on from the worker's environment.

`read_notes` says it is read-only (`readOnlyHint`), so Cairn calls it with effects `none`.
`add_note` is `external`: Cairn checkpoints before each call and sends the call's
idempotency key in the request's `_meta`, the same on every retry and replay of it; the
notebook adds each key's note once. Run it by hand with `python3 notes_server.py`: it
speaks MCP on stdin and stdout.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations

META_KEY = "cairn/idempotency_key"  # where Cairn puts a call's key in `_meta`

server = MCPServer("notes", log_level="WARNING")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def read_notes(topic: str) -> str:
    """Read the team's notes on a topic (a ticket id, a file name), oldest first."""
    notes = [note for note in _read() if note["topic"] == topic]
    if not notes:
        return f"no notes on {topic}"
    return "\n".join(f"- {note['text']}" for note in notes)


@server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False))
def add_note(topic: str, text: str, ctx: Context) -> str:
    """Add a note on a topic to the team's notebook, for teammates to read."""
    if not text.strip():
        raise ToolError("a note needs some text")
    key = (ctx.request_context.meta or {}).get(META_KEY)
    with _notebook().open("a+", encoding="utf-8") as notebook:
        fcntl.flock(notebook, fcntl.LOCK_EX)  # released as the file closes
        notebook.seek(0)
        lines = [json.loads(line) for line in notebook.read().splitlines() if line.strip()]
        if key is not None and any(note["key"] == key for note in lines):
            return f"this note on {topic} is in the notebook already"
        notebook.write(json.dumps({"key": key, "topic": topic, "text": text}) + "\n")
    return f"note {len(lines) + 1} added, on {topic}"


def _notebook() -> Path:
    path = os.environ.get("NOTES_FILE")
    if not path:
        raise ToolError("NOTES_FILE is not set: the notes server has no notebook")
    return Path(path)


def _read() -> list[dict[str, str]]:
    path = _notebook()
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


if __name__ == "__main__":
    server.run("stdio")
