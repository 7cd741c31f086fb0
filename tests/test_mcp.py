"""MCP servers as tools: configuration, names, effects, and calls over stdio and HTTP.

The server is real (tests/mcp_server.py, on the `mcp` SDK): the manager starts it as a
stdio subprocess from a config file, and a test starts it over streamable HTTP on a free
port of 127.0.0.1, and may kill it and start it again on that port. It speaks the
handshake era of the protocol, with sessions, as servers in the wild do. Each test ends
every process it started.
"""

from __future__ import annotations

import base64
import importlib.metadata
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mcp_types
import pytest
from structlog.testing import capture_logs

from cairn.agents.mcp import load_mcp_config, parse_ref, tool_name
from cairn.agents.mcp.manager import META_KEY, McpManager
from cairn.agents.mcp.names import MODEL_NAME
from cairn.agents.mcp.results import MAX_IMAGE_BYTES, render_result
from cairn.agents.mcp.tools import agent_tools
from cairn.agents.spec import StepPolicy
from cairn.agents.task import start_task
from cairn.agents.toolkit import builtin_tools
from cairn.agents.tools import ToolContext
from cairn.agents.workspace import Workspace
from cairn.errors import InvalidSpec, MissingTool, ToolError
from cairn.storage.records import Effects, ImagePart, Role
from cairn.storage.store import CheckpointStore
from tests.agent_harness import drive, record, scripted
from tests.mcp_server import png_of

# What base64 looks like in text: no word, path or key of these tests is this long.
BASE64_RUN = re.compile(r"[A-Za-z0-9+/]{64,}")

SERVER = Path(__file__).with_name("mcp_server.py")
KEY = "task1:coder:3:0:0123456789abcdef"
# The test server's tools a model is offered (not `chore`: it is task-only).
NOTES_TOOLS = [
    f"notes__{name}" for name in ("forget", "lookup", "pause", "picture", "record", "whoami")
]


@pytest.fixture
def record_file(tmp_path: Path) -> Path:
    """The file the test server's `record` tool appends keys to."""
    return tmp_path / "recorded.tsv"


@pytest.fixture
def pid_file(tmp_path: Path) -> Path:
    """The file each test server started writes its process id to."""
    return tmp_path / "pids"


@pytest.fixture
def stdio(
    tmp_path: Path, record_file: Path, calls_file: Path, pid_file: Path
) -> Iterator[McpManager]:
    """A manager whose server `notes` is the test server over stdio, from a config file."""
    config = tmp_path / "mcp.json"
    server = {
        "command": sys.executable,
        "args": [str(SERVER)],
        "env": {
            "MCP_RECORD_FILE": "${RECORD}",
            "MCP_CALLS_FILE": str(calls_file),
            "MCP_PID_FILE": str(pid_file),
            "MCP_EXTRA_TOOL_IF": str(tmp_path / "extra"),
        },
        "timeout": 10,
    }
    config.write_text(json.dumps({"mcpServers": {"notes": server}}))
    servers = load_mcp_config(config, {"RECORD": str(record_file)})
    with McpManager(servers, connect_timeout=10) as manager:
        yield manager


@pytest.fixture
def calls_file(tmp_path: Path) -> Path:
    """The file the test server notes each `record` and `pause` call in, as it arrives."""
    return tmp_path / "calls.tsv"


@dataclass
class HttpServer:
    """The test server over streamable HTTP on one port, which a test may kill and restart."""

    port: int
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    started: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def url(self) -> str:
        """The server's MCP endpoint."""
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self) -> None:
        """Start the server and wait until it listens."""
        proc = subprocess.Popen(
            [sys.executable, str(SERVER), "--http", str(self.port)],
            env=self.env,
            stderr=subprocess.DEVNULL,
        )
        self.proc = proc
        self.started.append(proc)
        _wait_until(lambda: _listens(self.port, proc), f"the server to listen on {self.port}")

    def kill(self) -> None:
        """SIGKILL the server and wait for it to be gone."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def stop_all(self) -> None:
        """End every process this server ran."""
        for proc in self.started:
            proc.kill()
            proc.wait(10)


@pytest.fixture
def http_server(tmp_path: Path, record_file: Path, calls_file: Path) -> Iterator[HttpServer]:
    """The test server over streamable HTTP on a free port (a tool `extra` once `extra` exists)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {
        **os.environ,
        "MCP_RECORD_FILE": str(record_file),
        "MCP_CALLS_FILE": str(calls_file),
        "MCP_EXTRA_TOOL_IF": str(tmp_path / "extra"),
    }
    server = HttpServer(port, env)
    try:
        server.start()
        yield server
    finally:
        server.stop_all()


@pytest.fixture
def http(tmp_path: Path, http_server: HttpServer) -> Iterator[McpManager]:
    """A manager whose server `remote` is the test server over streamable HTTP."""
    config = tmp_path / "mcp.json"
    remote = {"url": http_server.url, "headers": {"X-Team": "cairn"}, "timeout": 10}
    config.write_text(json.dumps({"mcpServers": {"remote": remote}}))
    with McpManager(load_mcp_config(config), connect_timeout=10) as manager:
        yield manager


def _listens(port: int, proc: subprocess.Popen[bytes]) -> bool:
    assert proc.poll() is None, "the HTTP server exited"
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
    except OSError:
        return False
    return True


def _wait_until(done: Callable[[], bool], what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"waited {timeout:g} s for {what}"
        time.sleep(0.02)


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
    assert NOTES_TOOLS == sorted(listed)
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
    assert [n.replace("notes__", "remote__") for n in NOTES_TOOLS] == sorted(
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
    with capture_logs() as logs:  # between calls: once the manager saw it hang up
        os.kill(first, signal.SIGKILL)
        hung_up = {"event": "MCP server hung up", "server": "notes"}
        _wait_until(lambda: any(hung_up.items() <= e.items() for e in logs), "the hang-up")
    second = _pid(stdio.call_tool("notes", "record", {"note": "two"}, "k2"))
    assert first != second
    assert ["k1", "k2"] == _recorded(record_file)


def test_agent_tools_expand_mcp_names(stdio: McpManager, tmp_path: Path, record_file: Path) -> None:
    """`mcp:<server>` and `mcp:<server>/<tool>` become registry tools a step can run."""
    registry = builtin_tools()
    tools = agent_tools(["read_file", "mcp:notes/record"], registry, stdio)
    assert ["read_file", "notes__record"] == list(tools)
    assert NOTES_TOOLS == sorted(agent_tools(["mcp:notes"], registry, stdio))
    workspace = Workspace(tmp_path / "cache", "t", "coder")
    ctx = ToolContext(workspace, "coder", ["coder"], 3, StepPolicy(output_limit=300), key=KEY)
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
    mixed = render_result(
        mcp_types.CallToolResult(content=[mcp_types.TextContent(text="hi"), image]), 1000
    )
    assert ("hi\n[image/png, 3 bytes]", [ImagePart(media_type="image/png", data="QUJD")]) == (
        mixed.text,
        mixed.images,
    )
    structured = mcp_types.CallToolResult(content=[], structured_content={"n": 1})
    assert '{"n": 1}' == render_result(structured, 1000).text
    long = mcp_types.CallToolResult(content=[mcp_types.TextContent(text="a" * 50 + "b" * 50)])
    cut = render_result(long, 20).text
    assert cut.startswith("a" * 10)
    assert cut.endswith("b" * 10)
    assert "80 characters cut" in cut
    assert "(no output)" == render_result(mcp_types.CallToolResult(content=[]), 1000).text


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


# Sessions that end: a server that forgets one, servers killed between calls or mid-call.


def _log_events(logs: list[MutableMapping[str, Any]]) -> list[object]:
    return [entry["event"] for entry in logs]


@pytest.mark.parametrize("status", [404, 400])
def test_a_call_the_server_refuses_for_an_ended_session_runs_once_on_a_new_one(
    status: int, http: McpManager, record_file: Path
) -> None:
    """404 for the session's id: the session is over (the spec); the call refused runs anew.

    The server did not handle the refused call, so it is sent again on a new session (a new
    `initialize`), and applied once. A server that answers 400 instead (server-everything,
    built on the TypeScript SDK's example) is asked with a ping, which it refuses too.
    """
    http.list_tools("remote")
    assert "forgotten" == http.call_tool("remote", "forget", {"status": status}, "k0")
    with capture_logs() as logs:
        assert http.call_tool("remote", "record", {"note": "x"}, "k1").startswith("recorded x")
    assert "MCP session ended; retrying the call it refused" in _log_events(logs)
    assert http.call_tool("remote", "record", {"note": "y"}, "k2").startswith("recorded y")
    assert ["k1", "k2"] == _recorded(record_file)


def test_http_server_restarted_between_calls_gets_a_new_session_and_listing(
    http: McpManager, http_server: HttpServer, record_file: Path, tmp_path: Path
) -> None:
    """A server killed and started again between calls: the next call and listing work.

    The listing is the restarted server's (it has a tool the first one lacked), not the
    one cached for the old session.
    """
    assert "extra" not in {info.tool for info in http.list_tools("remote")}
    assert http.call_tool("remote", "record", {"note": "one"}, "k1").startswith("recorded one")
    http_server.kill()
    (tmp_path / "extra").touch()
    http_server.start()
    assert http.call_tool("remote", "record", {"note": "two"}, "k2").startswith("recorded two")
    assert "extra" in {info.tool for info in http.list_tools("remote")}
    assert "Model Context Protocol" == http.call_tool("remote", "lookup", {"word": "mcp"}, "k3")
    assert ["k1", "k2"] == _recorded(record_file)


def test_stdio_server_killed_between_calls_is_listed_again(
    stdio: McpManager, pid_file: Path, tmp_path: Path
) -> None:
    """A stdio server killed between calls: the next listing is the new process's.

    Between calls: once the manager saw the server hang up (its log says so). A listing
    made before that races the manager's notice of the closed pipe, and is the cached one.
    """
    assert "extra" not in {info.tool for info in stdio.list_tools("notes")}
    first = _pid(stdio.call_tool("notes", "record", {"note": "one"}, "k1"))
    (tmp_path / "extra").touch()
    with capture_logs() as logs:
        os.kill(first, signal.SIGKILL)
        hung_up = {"event": "MCP server hung up", "server": "notes"}
        _wait_until(lambda: any(hung_up.items() <= e.items() for e in logs), "the hang-up")
    assert "extra" in {info.tool for info in stdio.list_tools("notes")}
    assert 2 == len(pid_file.read_text().split())


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_a_server_killed_mid_call_fails_that_call_and_the_next_one_works(
    transport: str,
    request: pytest.FixtureRequest,
    calls_file: Path,
    pid_file: Path,
    record_file: Path,
) -> None:
    """The call in flight is a `ToolError` (it may have taken effect: the model decides).

    The next call works, on a new session: a new stdio process, or the HTTP server started
    again.
    """
    manager: McpManager = request.getfixturevalue(transport)
    server = "notes" if transport == "stdio" else "remote"
    manager.list_tools(server)
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(manager.call_tool, server, "pause", {"seconds": 60}, "k-slow")
        _wait_until(lambda: calls_file.exists() and "pause" in calls_file.read_text(), "the call")
        if transport == "stdio":
            os.kill(int(pid_file.read_text().split()[0]), signal.SIGKILL)
        else:
            http_server: HttpServer = request.getfixturevalue("http_server")
            http_server.kill()
            http_server.start()
        with pytest.raises(ToolError, match="may or may not have taken effect"):
            pending.result(30)
    assert manager.call_tool(server, "record", {"note": "after"}, "k2").startswith("recorded")
    assert ["k2"] == _recorded(record_file)


def test_a_call_past_its_deadline_returns_at_it(tmp_path: Path, pid_file: Path) -> None:
    """A timed-out call returns at its deadline; its session closes in the background.

    The server ignores SIGTERM, so stopping it takes the SDK seconds (stdin closed, then
    SIGTERM, then SIGKILL): the call has returned while that server still runs.
    """
    config = tmp_path / "mcp.json"
    server = {"command": sys.executable, "args": [str(SERVER)], "timeout": 1,
              "env": {"MCP_PID_FILE": str(pid_file), "MCP_STUBBORN": "1"}}  # fmt: skip
    config.write_text(json.dumps({"mcpServers": {"slow": server}}))
    with McpManager(load_mcp_config(config), connect_timeout=10) as manager:
        manager.list_tools("slow")
        pid = int(pid_file.read_text().split()[0])
        started = time.monotonic()
        with pytest.raises(ToolError, match=r"timed out after 1 s"):
            manager.call_tool("slow", "pause", {"seconds": 60}, "key-1")
        took = time.monotonic() - started
        assert not _gone(pid), "the call waited for its session to close"
        assert took < 1 + 3, f"a call with a 1 s timeout took {took:.1f} s"
        _wait_until(lambda: _gone(pid), "the timed-out session's server to be stopped")
        assert "paused 0 s" == manager.call_tool("slow", "pause", {"seconds": 0}, "key-2")


# What a server is told, and what it is not asked.


def test_the_client_names_itself_cairn_agents_at_its_version(stdio: McpManager) -> None:
    """`clientInfo` is `cairn-agents` and the installed distribution's version."""
    expected = f"cairn-agents {importlib.metadata.version('cairn-agents')}"
    assert expected == stdio.call_tool("notes", "whoami", {}, KEY)


def test_a_task_only_tool_is_left_out_and_logged_once(stdio: McpManager) -> None:
    """`execution.taskSupport: required` cannot be called without tasks: not offered."""
    with capture_logs() as logs:
        for _ in range(2):
            assert "chore" not in {info.tool for info in stdio.list_tools("notes")}
            stdio.close()  # a new session lists again
    left_out = [e for e in logs if str(e["event"]).startswith("MCP tool left out")]
    assert [("notes", "chore")] == [(e["server"], e["tool"]) for e in left_out]


# Images: as images where the model takes them, never as base64 text.


def test_an_image_result_is_an_image_beside_a_note_of_its_size(http: McpManager) -> None:
    """A 27 KB PNG: a note of its exact size in the text, the PNG's bytes as an `ImagePart`.

    The server repeats the image block as structured content (as server-filesystem does);
    that is no reason for base64 in the text.
    """
    png = png_of(27_310)
    text = http.call_tool("remote", "picture", {"size": 27_310}, KEY)
    assert BASE64_RUN.search(text) is None, text[:200]
    output = http.call_tool_output("remote", "picture", {"size": 27_310}, KEY)
    assert text == output.text
    assert f"[image/png, {len(png):,} bytes]" == output.text
    assert [png] == [base64.b64decode(image.data) for image in output.images]
    assert ["image/png"] == [image.media_type for image in output.images]


def test_images_past_the_bound_are_notes_only() -> None:
    """Images beyond `MAX_IMAGE_BYTES` a result are noted, not kept; base64 never in text."""
    big = base64.b64encode(b"\0" * (MAX_IMAGE_BYTES - 10)).decode()
    small = base64.b64encode(b"\1" * 20).decode()
    svg = base64.b64encode(b"<svg/>").decode()
    blocks: list[mcp_types.ContentBlock] = [
        mcp_types.ImageContent(data=big, mime_type="image/png"),
        mcp_types.ImageContent(data=small, mime_type="image/jpeg"),
        mcp_types.ImageContent(data=svg, mime_type="image/svg+xml"),
        mcp_types.ImageContent(data="not base64!", mime_type="image/png"),
    ]
    structured = {"thumbnail": base64.b64encode(b"\2" * 400).decode(), "name": "x"}
    output = render_result(
        mcp_types.CallToolResult(content=blocks, structured_content=structured), 10_000
    )
    assert [MAX_IMAGE_BYTES - 10] == [image.size for image in output.images]
    assert [
        f"[image/png, {MAX_IMAGE_BYTES - 10:,} bytes]",
        f"[image/jpeg, 20 bytes: not shown, past {MAX_IMAGE_BYTES:,} bytes]",
        "[image/svg+xml, 6 bytes: not shown]",
        "[image/png: not valid base64]",
        '{"thumbnail": "[base64, 400 bytes]", "name": "x"}',
    ] == output.text.split("\n")
    assert BASE64_RUN.search(output.text) is None


def test_a_steps_tool_result_keeps_its_image_in_the_checkpoint(
    http: McpManager, real_store: CheckpointStore, tmp_path: Path
) -> None:
    """A step's MCP call that returned an image: the tool message holds it, read back typed."""
    look = {"name": "remote__picture", "args": {"size": 2000}}
    finish = {"name": "finish", "args": {"summary": "seen"}}
    agent = scripted("looker", [{"tools": [look]}, {"tools": [finish]}],
                     tools=["mcp:remote/picture", "finish"])  # fmt: skip
    start_task(real_store, record("img", agent), {})
    gc = drive(real_store, "img", tmp_path / "cache", mcp=http)
    state = real_store.read_state("img", "looker", gc.members["looker"].id)
    [result] = [m for m in state.messages if m.role is Role.TOOL and m.name == "remote__picture"]
    png = png_of(2000)
    assert f"[image/png, {len(png):,} bytes]" == result.content
    assert [png] == [base64.b64decode(image.data) for image in result.images]
