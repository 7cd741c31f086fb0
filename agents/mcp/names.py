"""How MCP tools are named: in a spec (`mcp:<server>[/<tool>]`) and to a model.

A model sees an MCP tool as `<server>__<tool>`: the server's name, two underscores, the
tool's name. Providers take function names of `^[a-zA-Z0-9_-]{1,64}$`; a server name is
held to `SERVER_NAME` (no `__`, at most 32 characters) so the split is unambiguous. A tool
name that does not fit (MCP allows dots and up to 128 characters) is made to fit: each
other character becomes `_`, the name is cut to 64 characters with room for `_` and the
first 8 hex digits of the SHA-256 of `<server>/<tool>`. The mapping depends on the two
names alone, so a name in a checkpoint's history means the same tool after a restart.
"""

from __future__ import annotations

import hashlib
import re

SERVER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]*(?:_[A-Za-z0-9-]+)*")
MAX_SERVER_NAME = 32
MODEL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
SEPARATOR = "__"
PREFIX = "mcp:"
# `mcp:<server>` or `mcp:<server>/<tool>`, as a spec's `tools` names them.
MCP_REF = re.compile(r"mcp:(?P<server>[A-Za-z0-9_-]{1,32})(?:/(?P<tool>[^\s/]{1,128}))?")
_FOREIGN = re.compile(r"[^A-Za-z0-9_-]")
_DIGEST = 8


def is_server_name(name: str) -> bool:
    """Say whether `name` may name an MCP server in a worker's configuration."""
    return len(name) <= MAX_SERVER_NAME and SERVER_NAME.fullmatch(name) is not None


def parse_ref(ref: str) -> tuple[str, str | None]:
    """Split `mcp:<server>` or `mcp:<server>/<tool>` into (server, tool or None).

    Raises `ValueError` for anything else.
    """
    match = MCP_REF.fullmatch(ref)
    if match is None:
        raise ValueError(f"{ref!r} is not mcp:<server> or mcp:<server>/<tool>")
    return match["server"], match["tool"]


def tool_name(server: str, tool: str) -> str:
    """The name a model calls MCP tool `tool` of `server` by (see the module docstring)."""
    name = f"{server}{SEPARATOR}{tool}"
    if MODEL_NAME.fullmatch(name):
        return name
    digest = hashlib.sha256(f"{server}/{tool}".encode()).hexdigest()[:_DIGEST]
    return f"{_FOREIGN.sub('_', name)[: 64 - 1 - _DIGEST]}_{digest}"
