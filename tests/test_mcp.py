"""MCP servers as tools: configuration, names, effects, and calls over stdio and HTTP.

The server is real (tests/mcp_server.py, on the `mcp` SDK): the manager starts it as a
stdio subprocess from a config file, and a test starts it over streamable HTTP on a free
port of 127.0.0.1. Each test ends every process it started.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import mcp_types
import pytest

from agents.mcp import load_mcp_config, parse_ref, tool_name
from agents.mcp.manager import META_KEY, McpManager, render_result
from agents.mcp.names import MODEL_NAME
from agents.mcp.tools import agent_tools
from agents.spec import StepPolicy
from agents.toolkit import builtin_tools
from agents.tools import ToolContext
from agents.workspace import Workspace
from storage.errors import InvalidSpec, MissingTool, ToolError
from storage.records import Effects

SERVER = Path(__file__).with_name("mcp_server.py")
KEY = "task1:coder:3:0:0123456789abcdef"


@pytest.fixture
def record_file(tmp_path: Path) -> Path:
    """The file the test server's `record` tool appends keys to."""
    return tmp_path / "recorded.tsv"


@pytest.fixture
def stdio(tmp_path: Path, record_file: Path) -> Iterator[McpManager]:
    """A manager whose server `notes` is the test server over stdio, from a config file."""
    config = tmp_path / "mcp.json"
    server = {
        "command": sys.executable,
        "args": [str(SERVER)],
        "env": {"MCP_RECORD_FILE": "${RECORD}"},
        "timeout": 10,
    }
    config.write_text(json.dumps({"mcpServers": {"notes": server}}))
    servers = load_mcp_config(config, {"RECORD": str(record_file)})
    with McpManager(servers, connect_timeout=10) as manager:
        yield manager


@pytest.fixture
def http(tmp_path: Path, record_file: Path) -> Iterator[McpManager]:
    """A manager whose server `remote` is the test server over streamable HTTP."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "MCP_RECORD_FILE": str(record_file)}
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), "--http", str(port)], env=env, stderr=subprocess.DEVNULL
    )
    try:
        _wait_for_port(port, proc)
        config = tmp_path / "mcp.json"
        remote = {"url": f"http://127.0.0.1:{port}/mcp", "headers": {"X-Team": "cairn"}}
        config.write_text(json.dumps({"mcpServers": {"remote": {**remote, "timeout": 10}}}))
        with McpManager(load_mcp_config(config), connect_timeout=10) as manager:
            yield manager
    finally:
        proc.terminate()
        proc.wait(10)


def _wait_for_port(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the HTTP server exited"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        except OSError:
            time.sleep(0.05)
        else:
            return
    raise AssertionError(f"nothing listens on port {port}")


def _recorded(path: Path) -> list[str]:
    return [line.split("\t")[0] for line in path.read_text().splitlines()]


def _pid(result: str) -> int:
    match = re.search(r"pid (\d+)", result)
    assert match is not None, result
    return int(match[1])


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_listing_names_schemas_and_effects(stdio: McpManager) -> None:
    """Tools are listed with model-facing names; readOnlyHint makes `none`, else `external`."""
    listed = {info.name: info for info in stdio.list_tools("notes")}
    assert ["notes__lookup", "notes__pause", "notes__record"] == sorted(listed)
    lookup, record = listed["notes__lookup"], listed["notes__record"]
    assert (Effects.NONE, Effects.EXTERNAL) == (lookup.effects, record.effects)
    assert {"readOnlyHint": True} == lookup.annotations
    assert ("lookup", "Look a word up in a small glossary.") == (lookup.tool, lookup.description)
    assert ["word"] == lookup.input_schema["required"]


def test_stdio_call_round_trip_sends_key_in_meta(stdio: McpManager, record_file: Path) -> None:
    """A call reaches the stdio server with its idempotency key in `_meta`, and leaves none."""
    assert "Model Context Protocol" == stdio.call_tool("notes", "lookup", {"word": "mcp"}, KEY)
    result = stdio.call_tool("notes", "record", {"note": "hello"}, KEY)
    assert result.startswith("recorded hello")
    assert [KEY] == _recorded(record_file)
    stdio.close()
    assert _gone(_pid(result))


def test_http_call_round_trip_sends_key_in_meta(http: McpManager, record_file: Path) -> None:
    """The same server over streamable HTTP: listing, a call, and the key in `_meta`."""
    assert ["remote__lookup", "remote__pause", "remote__record"] == sorted(
        i.name for i in http.list_tools("remote")
    )
    assert "recorded over http" in http.call_tool("remote", "record", {"note": "over http"}, KEY)
    assert [KEY] == _recorded(record_file)


def test_error_result_is_a_tool_error(stdio: McpManager) -> None:
    """A result marked isError raises `ToolError` with the server's text; the session lives on."""
    with pytest.raises(ToolError, match="no entry for 'zzz'"):
        stdio.call_tool("notes", "lookup", {"word": "zzz"}, KEY)
    assert "a pile of stones" in stdio.call_tool("notes", "lookup", {"word": "cairn"}, KEY)


def test_killed_stdio_server_is_restarted(stdio: McpManager, record_file: Path) -> None:
    """A stdio server killed between calls is started again by the next call, which succeeds."""
    first = _pid(stdio.call_tool("notes", "record", {"note": "one"}, "k1"))
    os.kill(first, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while not _gone(first) and time.monotonic() < deadline:
        time.sleep(0.02)  # the SDK reaps it once it sees the pipe close
    second = _pid(stdio.call_tool("notes", "record", {"note": "two"}, "k2"))
    assert first != second
    assert ["k1", "k2"] == _recorded(record_file)


def test_agent_tools_expand_mcp_names(stdio: McpManager, tmp_path: Path, record_file: Path) -> None:
    """`mcp:<server>` and `mcp:<server>/<tool>` become registry tools a step can run."""
    registry = builtin_tools()
    tools = agent_tools(["read_file", "mcp:notes/record"], registry, stdio)
    assert ["read_file", "notes__record"] == list(tools)
    assert ["notes__lookup", "notes__pause", "notes__record"] == sorted(
        agent_tools(["mcp:notes"], registry, stdio)
    )
    workspace = Workspace(tmp_path / "cache", "t", "coder")
    ctx = ToolContext(workspace, "coder", ["coder"], 3, StepPolicy(output_limit=300))
    ctx.idempotency_key = KEY
    assert tools["notes__record"].run(ctx, {"note": "via a step"}).startswith("recorded")
    assert [KEY] == _recorded(record_file)
    with pytest.raises(MissingTool, match="'mcp:notes/nope'"):
        agent_tools(["mcp:notes/nope"], registry, stdio)
    with pytest.raises(MissingTool, match="MCP server 'other' is not configured"):
        agent_tools(["mcp:other"], registry, stdio)


def test_unstartable_server_is_one_line(tmp_path: Path) -> None:
    """A command that cannot start fails the listing with one line naming the server."""
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"broken": {"command": "/nonexistent/x"}}}))
    manager = McpManager(load_mcp_config(config), connect_timeout=5)
    with manager, pytest.raises(ToolError, match="MCP server 'broken' did not start") as caught:
        manager.list_tools("broken")
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "cannot read"),
        ("{not json", "not JSON"),
        ('{"servers": {}}', 'expected an object {"mcpServers"'),
        ('{"mcpServers": {"a__b": {"command": "x"}}}', "mcpServers.a__b: a server name"),
        ('{"mcpServers": {"a": {}}}', "mcpServers.a: give either command"),
        ('{"mcpServers": {"a": {"command": "x", "url": "http://h"}}}', "give either command"),
        ('{"mcpServers": {"a": {"url": "ftp://h"}}}', "url must be an http"),
        ('{"mcpServers": {"a": {"command": "x", "timeout": -1}}}', "mcpServers.a.timeout"),
        ('{"mcpServers": {"a": {"command": "x", "argz": []}}}', "mcpServers.a.argz"),
        ('{"mcpServers": {"a": {"url": "http://h", "headers": {"K": "${NOPE}"}}}}', "${NOPE}"),
    ],
)
def test_bad_config_is_one_line(tmp_path: Path, content: str | None, expected: str) -> None:
    """A bad config file raises `InvalidSpec`: one line naming the file and what is wrong."""
    path = tmp_path / "mcp.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(InvalidSpec) as caught:
        load_mcp_config(path, {})
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"MCP config {path}: ")
    assert expected in message


def test_config_reads_both_transports_and_skips_disabled(tmp_path: Path) -> None:
    """Stdio and HTTP entries load with their fields; `disabled` ones are left out."""
    path = tmp_path / "mcp.json"
    servers = {
        "files": {"command": "uvx", "args": ["files"], "env": {"ROOT": "/srv"}},
        "search": {"type": "http", "url": "https://s.example/mcp", "headers": {"A": "${T}"}},
        "old": {"command": "x", "disabled": True},
    }
    path.write_text(json.dumps({"mcpServers": servers}))
    loaded = load_mcp_config(path, {"T": "secret"})
    assert ["files", "search"] == list(loaded)
    assert ("stdio", ["files"], 60.0) == (
        loaded["files"].transport,
        loaded["files"].args,
        loaded["files"].timeout,
    )
    assert ("http", {"A": "secret"}) == (loaded["search"].transport, loaded["search"].headers)


def test_tool_names_fit_every_provider() -> None:
    """`<server>__<tool>` when it fits; else a stable, hashed name of at most 64 characters."""
    assert "files__read" == tool_name("files", "read")
    dotted, long = tool_name("files", "read.text"), tool_name("s", "x" * 128)
    assert re.fullmatch(r"files__read_text_[0-9a-f]{8}", dotted)
    assert len(long) == 64
    for name in (dotted, long):
        assert MODEL_NAME.fullmatch(name)
    assert dotted == tool_name("files", "read.text")
    assert tool_name("files", "read_text") != dotted
    assert ("files", None) == parse_ref("mcp:files")
    assert ("files", "read.text") == parse_ref("mcp:files/read.text")
    with pytest.raises(ValueError, match="not mcp:<server>"):
        parse_ref("files")


def test_results_render_bounded() -> None:
    """Text is kept, other blocks noted, structured content shown when no text, long text cut."""
    image = mcp_types.ImageContent(data="QUJD", mime_type="image/png")
    mixed = mcp_types.CallToolResult(content=[mcp_types.TextContent(text="hi"), image])
    assert "hi\n[image: image/png, 3 bytes]" == render_result(mixed, 1000)
    structured = mcp_types.CallToolResult(content=[], structured_content={"n": 1})
    assert '{"n": 1}' == render_result(structured, 1000)
    long = mcp_types.CallToolResult(content=[mcp_types.TextContent(text="a" * 50 + "b" * 50)])
    cut = render_result(long, 20)
    assert cut.startswith("a" * 10)
    assert cut.endswith("b" * 10)
    assert "80 characters cut" in cut
    assert "(no output)" == render_result(mcp_types.CallToolResult(content=[]), 1000)


def test_meta_key_name() -> None:
    """The key travels as `_meta["cairn/idempotency_key"]` (docs/mcp.md)."""
    assert "cairn/idempotency_key" == META_KEY


def test_a_call_past_its_deadline_is_a_tool_error_and_the_next_call_works(
    tmp_path: Path, record_file: Path
) -> None:
    """A server slower than the call's timeout: the model reads why; a new session follows."""
    config = tmp_path / "mcp.json"
    server = {"command": sys.executable, "args": [str(SERVER)], "timeout": 0.5,
              "env": {"MCP_RECORD_FILE": str(record_file)}}  # fmt: skip
    config.write_text(json.dumps({"mcpServers": {"slow": server}}))
    with McpManager(load_mcp_config(config), connect_timeout=10) as manager:
        manager.list_tools("slow")
        with pytest.raises(ToolError, match=r"timed out after 0.5 s"):
            manager.call_tool("slow", "pause", {"seconds": 1.2}, "key-1")
        assert "paused 0 s" == manager.call_tool("slow", "pause", {"seconds": 0}, "key-2")
