"""MCP tools as Cairn `Tool`s, and an agent's tools with its `mcp:` names expanded.

`server_tools` gives the `Tool`s of one server, in the registry's shape (`agents/tools.py`):
the model-facing name (`agents/mcp/names.py`), the server's description and input schema,
the effects its annotations imply, and a `run` that calls the server through the worker's
`McpManager` with the call's idempotency key, and hands the step the images it returned.
`agent_tools` resolves a spec's tool names, built-in, registered or `mcp:`, to the tools an
agent is offered. Importing this module does not import the `mcp` SDK: a worker without
MCP servers passes no manager.
"""

from __future__ import annotations

import difflib
import os
import socket
from collections.abc import Iterable
from typing import TYPE_CHECKING

from cairn.agents.mcp.names import PREFIX, parse_ref, tool_name
from cairn.agents.toolkit import ToolRegistry
from cairn.agents.tools import Args, Tool, ToolContext
from cairn.errors import MissingTool, ToolError, ToolUnreachable

if TYPE_CHECKING:  # the SDK is imported by whoever builds a manager, not by this module
    from cairn.agents.mcp.manager import McpManager, McpToolInfo


def server_tools(manager: McpManager, server: str) -> list[Tool]:
    """The tools MCP server `server` offers, as registry entries.

    Starts or reaches the server if no session is open. Raises `MissingTool` when the
    worker has no such server or it refuses the listing, `ToolUnreachable` when it cannot
    be reached (the reason in one line).
    """
    if server not in manager.servers:
        raise MissingTool(
            f"MCP server {server!r} is not configured on worker {_worker()} "
            f"(it has {sorted(manager.servers) or 'none'})"
        )
    try:
        listed = manager.list_tools(server)
    except ToolUnreachable as exc:  # worth retrying: the next attempt connects anew
        raise ToolUnreachable(
            f"worker {_worker()} cannot reach MCP server {server}: {exc}"
        ) from exc
    except ToolError as exc:
        raise MissingTool(f"worker {_worker()} cannot list MCP tools: {exc}") from exc
    return [_tool(manager, info) for info in listed]


def agent_tools(
    names: Iterable[str], registry: ToolRegistry, manager: McpManager | None, agent: str = "agent"
) -> dict[str, Tool]:
    """The tools `names` give an agent, by model-facing name, in the order named.

    A name is a registered tool's, `mcp:<server>` (all the server's tools) or
    `mcp:<server>/<tool>` (one of them, by the server's name for it). Raises
    `MissingTool`, naming every tool the worker lacks, when any is missing.
    """
    tools: dict[str, Tool] = {}
    missing: list[str] = []
    listed: dict[str, list[Tool]] = {}
    for name in names:
        if not name.startswith(PREFIX):
            found = registry.get(name)
            if found is None:
                missing.append(repr(name))
            else:
                tools[found.name] = found
            continue
        server, only = parse_ref(name)
        if manager is None:
            raise MissingTool(f"{name} names an MCP server; worker {_worker()} has none")
        if server not in listed:
            listed[server] = server_tools(manager, server)
        chosen = [t for t in listed[server] if only is None or t.name == tool_name(server, only)]
        if not chosen:
            missing.append(repr(name))
        tools.update((t.name, t) for t in chosen)
    if missing:
        raise MissingTool(
            f"{agent} names tool{'s' * (len(missing) > 1)} {', '.join(missing)}, which worker "
            f"{_worker()} does not have{_guesses(missing, registry)}"
        )
    return tools


def _guesses(missing: list[str], registry: ToolRegistry) -> str:
    """What the missing names were likely meant to be: " (did you mean 'write_file'?)", or ""."""
    meant = [
        repr(close[0])
        for shown in missing
        if (close := difflib.get_close_matches(shown.strip("'"), list(registry), n=1, cutoff=0.6))
    ]
    return f" (did you mean {', '.join(meant)}?)" if meant else ""


def _tool(manager: McpManager, info: McpToolInfo) -> Tool:
    def run(ctx: ToolContext, args: Args) -> str:
        output = manager.call_tool_output(
            info.server, info.tool, args, ctx.idempotency_key, limit=ctx.policy.output_limit
        )
        ctx.images.extend(output.images)  # the result's message takes them to the model
        return output.text

    return Tool(info.name, info.description, info.input_schema, info.effects, run)


def _worker() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"
