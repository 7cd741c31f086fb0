"""Cairn's MCP client against MCP servers nobody here wrote, over stdio and streamable HTTP.

The servers: `mcp-server-time` and `mcp-server-git` from PyPI (the `test` extra), and
`@modelcontextprotocol/server-filesystem` and `@modelcontextprotocol/server-everything`
from npm, which `make test` installs into .venv/npm-mcp at pinned versions. Without npm
the npm servers' tests skip; in CI (`CI=true`) a missing server fails instead.

A manager starts each stdio server from a config file, as a worker does, behind `tee`:
what the server reads (the client's JSON-RPC lines) is appended to a file, after a line
with the process group's id, so a test sees the `clientInfo` and `_meta` a server received
though none of these servers reports them, and knows which process group to kill.
server-everything over HTTP is a process the test starts on a free port. Servers are
started once per module and shared; a test that kills a server has one of its own. Calls
go through `McpManager` and through `agent_tools`, the way a step runs them; images are
followed to the request a model gets.
"""

from __future__ import annotations

import base64
import importlib.metadata
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from random import Random
from typing import Any, cast

import pytest
from pydantic import JsonValue
from structlog.testing import capture_logs

from cairn.agents.mcp import load_mcp_config
from cairn.agents.mcp.manager import META_KEY, McpManager, McpToolInfo
from cairn.agents.mcp.tools import agent_tools
from cairn.agents.spec import AgentSpec, StepPolicy, TaskRecord
from cairn.agents.task import start_task
from cairn.agents.toolkit import builtin_tools
from cairn.agents.tools import Args, Tool, ToolContext
from cairn.agents.workspace import Workspace
from cairn.errors import ToolError
from cairn.storage.records import Effects
from cairn.storage.store import CheckpointStore
from tests.agent_harness import drive
from tests.test_anthropic_model import message, tool_use
from tests.test_anthropic_model import text as text_block
from tests.test_openai_model import ScriptedServer, reply, serve_scripted

BIN = Path(sys.executable).parent  # the venv's console scripts: the PyPI servers
NPM_BIN = Path(sys.prefix) / "npm-mcp" / "node_modules" / ".bin"  # make npm-mcp installs here
# `sh -c WIRE LOG COMMAND...`: COMMAND, its input appended to LOG on the way in, after a
# line {"started": PID} (the shell's pid: the SDK makes it a process group's leader).
WIRE = 'printf \'{"started": %d}\\n\' $$ >> "$0" && tee -a "$0" | exec "$@"'
TIMEOUT = 30  # seconds for a listing, a call or a start: generous, for a slow 2-core machine
KEY = "mcp-servers:clerk:1:0:0123456789abcdef"
CLIENT_INFO_META = "io.modelcontextprotocol/clientInfo"  # where the stateless protocol sends it
AGENT = "clerk"
# What base64 of an image looks like in text: no word, path or key of this test is as long.
BASE64_RUN = re.compile(r"[A-Za-z0-9+/]{120,}={0,2}")


@dataclass(frozen=True)
class Served:
    """One third-party server behind a manager: its name there, its input's log, its home."""

    manager: McpManager
    server: str
    wire: Path
    home: Path  # the directory it serves (the filesystem root, the git repository)

    def call(self, tool: str, args: dict[str, Any], key: str = KEY) -> str:
        """Call `tool` through the manager."""
        return self.manager.call_tool(self.server, tool, args, key)

    def tools(self) -> dict[str, Tool]:
        """The server's tools as a step is offered them (`mcp:<server>`)."""
        return agent_tools([f"mcp:{self.server}"], builtin_tools(), self.manager, AGENT)

    def received(self) -> list[dict[str, Any]]:
        """The JSON-RPC messages the server has read so far, by every process it ran as."""
        return [line for line in self._lines() if "started" not in line]

    def starts(self) -> list[int]:
        """The process group of each time the server was started, in order."""
        return [line["started"] for line in self._lines() if "started" in line]

    def _lines(self) -> list[dict[str, Any]]:
        data = self.wire.read_text() if self.wire.exists() else ""
        return [json.loads(line) for line in data[: data.rfind("\n") + 1].splitlines()]

    def calls_of(self, tool: str) -> list[dict[str, Any]]:
        """The params of each tools/call for `tool` the server read."""
        return [
            m["params"]
            for m in self.received()
            if m.get("method") == "tools/call" and m["params"]["name"] == tool
        ]

    def kill(self) -> int:
        """SIGKILL the server's process group; return its leader's pid once it is dead."""
        pid = self.starts()[-1]
        assert _alive(pid), f"server {self.server} (pid {pid}) is not running"
        os.killpg(pid, signal.SIGKILL)
        _wait_for(lambda: not _alive(pid), f"server {self.server} (pid {pid}) to die")
        return pid


def _alive(pid: int) -> bool:
    """True while `pid` runs (a zombie, waiting to be reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # gone, or going as it is read
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait_for(condition: Callable[[], bool], what: str, within: float = TIMEOUT) -> None:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {within} s for {what}")
        time.sleep(0.02)


def _npm_server(name: str) -> Path:
    """The npm server `name`'s command; skip (npm absent, not in CI) or fail without it."""
    path = NPM_BIN / name
    if path.exists():
        return path
    in_ci = os.environ.get("CI", "").lower() in {"true", "1"}
    if shutil.which("npm") is None:
        if not in_ci:
            pytest.skip("npm is not installed: scripts/system-deps test installs it")
        pytest.fail("npm is missing in CI: scripts/system-deps ci installs it")
    pytest.fail(f"{path} is missing: make npm-mcp (part of make test) installs it")


def _serve(
    tmp: Path, server: str, command: list[str], home: Path, env: dict[str, str] | None = None
) -> Iterator[Served]:
    """A manager with `server`: `command` behind the `tee` wrapper, from a config file."""
    wire = tmp / f"{server}.wire.jsonl"
    entry = {"command": "sh", "args": ["-c", WIRE, str(wire), *command], "timeout": TIMEOUT}
    config = tmp / f"{server}.mcp.json"
    config.write_text(json.dumps({"mcpServers": {server: {**entry, "env": env or {}}}}))
    with (tmp / f"{server}.stderr").open("w") as errlog:
        manager = McpManager(load_mcp_config(config), connect_timeout=TIMEOUT, errlog=errlog)
        with manager:
            yield Served(manager, server, wire, home)


# Neither the user's nor the system's git configuration: the repository's own only.
GIT_ENV = {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), *args],
        env={**os.environ, **GIT_ENV},
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def _repository(path: Path) -> Path:
    path.mkdir()
    _git(path, "init", "-q", "-b", "main")
    _git(path, "config", "user.name", "Cairn Test")
    _git(path, "config", "user.email", "cairn@example.invalid")
    (path / "README").write_text("a repository for mcp-server-git\n")
    _git(path, "add", "README")
    _git(path, "commit", "-q", "-m", "first")
    return path


def _required(info: McpToolInfo) -> list[str]:
    """The names of a tool's required arguments, sorted."""
    return sorted(cast("list[str]", info.input_schema["required"]))


def _commits(repo: Path) -> int:
    return int(_git(repo, "rev-list", "--count", "HEAD"))


@pytest.fixture(scope="module")
def time_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """mcp-server-time over stdio, shared by the module."""
    tmp = tmp_path_factory.mktemp("time")
    command = [str(BIN / "mcp-server-time"), "--local-timezone", "UTC"]
    yield from _serve(tmp, "time", command, tmp)


def _git_server(tmp: Path) -> Iterator[Served]:
    repo = _repository(tmp / "repo")
    command = [str(BIN / "mcp-server-git"), "--repository", str(repo)]
    yield from _serve(tmp, "git", command, repo, GIT_ENV)


@pytest.fixture(scope="module")
def git_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """mcp-server-git over stdio, confined to a repository of one commit; shared."""
    yield from _git_server(tmp_path_factory.mktemp("git"))


@pytest.fixture
def own_git(tmp_path: Path) -> Iterator[Served]:
    """mcp-server-git for one test, which may kill it."""
    yield from _git_server(tmp_path)


@pytest.fixture(scope="module")
def files_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """server-filesystem over stdio, allowed one directory; shared by the module."""
    command = _npm_server("mcp-server-filesystem")
    tmp = tmp_path_factory.mktemp("files")
    root = (tmp / "root").resolve()
    root.mkdir()
    yield from _serve(tmp, "files", [str(command), str(root)], root)


def _everything_stdio(tmp: Path) -> Iterator[Served]:
    command = _npm_server("mcp-server-everything")
    yield from _serve(tmp, "everything", [str(command), "stdio"], tmp)


@pytest.fixture(scope="module")
def everything(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """server-everything over stdio, shared by the module."""
    yield from _everything_stdio(tmp_path_factory.mktemp("everything"))


@pytest.fixture
def own_everything(tmp_path: Path) -> Iterator[Served]:
    """server-everything over stdio for one test, which may kill it."""
    yield from _everything_stdio(tmp_path)


@pytest.fixture
def step_context(tmp_path: Path) -> ToolContext:
    """What a step hands a tool: the workspace, the team, the policy, the call's key."""
    workspace = Workspace(tmp_path / "cache", "mcp-servers", AGENT)
    return ToolContext(workspace, AGENT, [AGENT], 1, StepPolicy(), key=KEY)


# Images: never base64 in what a model reads.


def _png(size_mod_3: int = 1, seed: int = 7) -> bytes:
    """A real 96x94 RGB PNG of noise (it does not compress), ~27 KB, its size ≡ `size_mod_3`.

    A size that is not a multiple of 3 has base64 padding, so a byte count worked out from
    the base64 length alone comes out wrong.
    """
    width, height = 96, 94
    noise = Random(seed)
    rows = b"".join(b"\0" + noise.randbytes(width * 3) for _ in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
    image = chunk(b"IDAT", zlib.compress(rows, 9)) + chunk(b"IEND", b"")
    png = b"\x89PNG\r\n\x1a\n" + header + image
    pad = (size_mod_3 - len(png) - 14) % 3  # a tEXt chunk: 12 bytes, "c\0", then the pad
    return png[:-12] + chunk(b"tEXt", b"c\0" + b"x" * pad) + png[-12:]  # before IEND


def _size_noted(size: int, texts: list[str]) -> bool:
    """True when some text names `size` as a byte count (27310 or 27,310)."""
    said = re.compile(rf"(?<![\d,.]){size}(?![\d,])|(?<![\d,.]){size:,}(?![\d,])")
    return any(said.search(text) for text in texts)


def _assert_no_base64(texts: list[str]) -> None:
    for text in texts:
        run = BASE64_RUN.search(text)
        assert run is None, f"{len(run[0])} characters of base64 in text: {run[0][:40]}..."


def test_png_fixture_is_a_27_kb_png_whose_size_has_padding() -> None:
    """The image the filesystem tests read is a real PNG of ~27 KB, its base64 padded."""
    png = _png()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert 26_000 < len(png) < 29_000
    assert 1 == len(png) % 3
    assert base64.b64encode(png).endswith(b"==")


# mcp-server-time


def test_time_lists_its_tools_read_only(time_server: Served) -> None:
    """Both tools listed with their schemas; readOnlyHint makes them `none`."""
    listed = {info.name: info for info in time_server.manager.list_tools("time")}
    assert ["time__convert_time", "time__get_current_time"] == sorted(listed)
    now, convert = listed["time__get_current_time"], listed["time__convert_time"]
    assert ("get_current_time", ["timezone"]) == (now.tool, _required(now))
    assert ["source_timezone", "target_timezone", "time"] == _required(convert)
    assert {Effects.NONE} == {info.effects for info in listed.values()}
    assert True is now.annotations["readOnlyHint"]


def test_time_calls_through_the_manager_and_a_step(
    time_server: Served, step_context: ToolContext
) -> None:
    """get_current_time through the manager, convert_time as a step's tool: real answers."""
    now = json.loads(time_server.call("get_current_time", {"timezone": "Asia/Tokyo"}))
    stamp = datetime.fromisoformat(now["datetime"])
    assert ("Asia/Tokyo", timedelta(hours=9)) == (now["timezone"], stamp.utcoffset())
    assert abs(datetime.now(UTC) - stamp) < timedelta(hours=1)
    tools = time_server.tools()
    args: Args = {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Kolkata"}
    converted = json.loads(tools["time__convert_time"].run(step_context, args))
    assert converted["target"]["datetime"].endswith("T17:30:00+05:30")
    assert "+5.5h" == converted["time_difference"]


def test_time_error_is_a_tool_error_and_the_session_goes_on(time_server: Served) -> None:
    """An unknown time zone is a `ToolError` naming it, in one line; the next call works."""
    with pytest.raises(ToolError, match="Mars/Olympus") as caught:
        time_server.call("get_current_time", {"timezone": "Mars/Olympus"})
    assert "\n" not in str(caught.value)
    assert (
        "UTC" == json.loads(time_server.call("get_current_time", {"timezone": "UTC"}))["timezone"]
    )


def _client_infos(served: Served) -> list[dict[str, Any]]:
    """Every clientInfo the server read: in `initialize`, and in each request's `_meta`."""
    found = []
    for sent in served.received():
        params = sent.get("params") or {}
        found.append(params.get("clientInfo"))
        found.append((params.get("_meta") or {}).get(CLIENT_INFO_META))
    return [info for info in found if info is not None]


@pytest.mark.parametrize("fixture", ["time_server", "everything"])
def test_client_says_it_is_cairn_agents(fixture: str, request: pytest.FixtureRequest) -> None:
    """Every clientInfo a server read names cairn-agents at its installed version.

    mcp-server-time speaks the stateless protocol (clientInfo in each request's `_meta`);
    server-everything, on an older SDK, gets an `initialize` request.
    """
    served: Served = request.getfixturevalue(fixture)
    served.manager.list_tools(served.server)
    infos = _client_infos(served)
    assert infos, f"{served.server} read no clientInfo"
    expected = {"name": "cairn-agents", "version": importlib.metadata.version("cairn-agents")}
    assert [expected] == [dict(s) for s in {tuple(sorted(i.items())) for i in infos}]


# mcp-server-git


def test_git_lists_its_tools_with_effects(git_server: Served) -> None:
    """Readers are `none`; committing, staging, resetting, branching are `external`."""
    listed = {info.tool: info for info in git_server.manager.list_tools("git")}
    readers = {"git_status", "git_diff_unstaged", "git_diff_staged", "git_diff", "git_log",
               "git_show", "git_branch"}  # fmt: skip
    writers = {"git_commit", "git_add", "git_reset", "git_create_branch", "git_checkout"}
    assert readers | writers == set(listed)
    assert {Effects.NONE} == {listed[name].effects for name in readers}
    assert {Effects.EXTERNAL} == {listed[name].effects for name in writers}
    assert True is listed["git_reset"].annotations["destructiveHint"]
    assert ["message", "repo_path"] == _required(listed["git_commit"])


def test_git_commit_as_a_step_runs_once_with_its_key(
    git_server: Served, step_context: ToolContext
) -> None:
    """git_add and git_commit as a step's tools: one commit, and the key in the call's `_meta`.

    The server ignores the key; what it read shows the key was sent with exactly one call.
    """
    repo, tools = git_server.home, git_server.tools()
    (repo / "notes.txt").write_text("stones\n")
    before, sent_before = _commits(repo), len(git_server.calls_of("git_commit"))
    staged = tools["git__git_add"].run(
        replace(step_context, key="mcp-servers:clerk:1:0:aaaa"),
        {"repo_path": str(repo), "files": ["notes.txt"]},
    )
    assert "staged" in staged.lower()
    args: Args = {"repo_path": str(repo), "message": "notes: one stone"}
    assert "committed" in tools["git__git_commit"].run(step_context, args).lower()
    assert before + 1 == _commits(repo)
    assert "notes: one stone" == _git(repo, "log", "-1", "--format=%s")
    sent = git_server.calls_of("git_commit")[sent_before:]
    assert [KEY] == [params["_meta"][META_KEY] for params in sent]
    assert "notes: one stone" in tools["git__git_log"].run(step_context, {"repo_path": str(repo)})


def test_git_refuses_a_path_outside_its_repository(git_server: Served) -> None:
    """A repo_path outside --repository is the server's error, read as a `ToolError`."""
    with pytest.raises(ToolError, match="outside the allowed repository"):
        git_server.call("git_status", {"repo_path": "/"})
    assert "clean" in git_server.call("git_status", {"repo_path": str(git_server.home)})


def test_killed_git_server_is_restarted_and_commits_exactly_once(own_git: Served) -> None:
    """A stdio server killed between calls: the next call starts it again and runs once.

    Between calls: after the manager saw the server hang up (its log says so). A call made
    before that races the manager's notice of the closed pipe.
    """
    repo = own_git.home
    assert "clean" in own_git.call("git_status", {"repo_path": str(repo)}, "k-status")
    with capture_logs() as logs:
        first = own_git.kill()
        hung_up = {"event": "MCP server hung up", "server": "git"}
        _wait_for(lambda: any(hung_up.items() <= e.items() for e in logs), "the hang-up noticed")
    (repo / "after.txt").write_text("after the kill\n")
    own_git.call("git_add", {"repo_path": str(repo), "files": ["after.txt"]}, "k-add")
    own_git.call("git_commit", {"repo_path": str(repo), "message": "after"}, "k-commit")
    assert [first] == own_git.starts()[:1]
    assert 2 == len(own_git.starts())
    assert _alive(own_git.starts()[-1])
    assert 2 == _commits(repo)
    assert ["k-commit"] == [p["_meta"][META_KEY] for p in own_git.calls_of("git_commit")]


# @modelcontextprotocol/server-filesystem


def test_files_lists_its_tools_with_effects(files_server: Served) -> None:
    """Readers are `none`; writers (destructive ones so marked) are `external`."""
    listed = {info.tool: info for info in files_server.manager.list_tools("files")}
    readers = {"read_text_file", "read_media_file", "list_directory", "search_files",
               "get_file_info", "directory_tree", "list_allowed_directories"}  # fmt: skip
    writers = {"write_file", "edit_file", "move_file", "create_directory"}
    assert readers | writers <= set(listed)
    assert {Effects.NONE} == {listed[name].effects for name in readers}
    assert {Effects.EXTERNAL} == {listed[name].effects for name in writers}
    assert True is listed["write_file"].annotations["destructiveHint"]
    assert ["content", "path"] == _required(listed["write_file"])


def test_files_write_edit_read_as_a_step(files_server: Served, step_context: ToolContext) -> None:
    """write_file, edit_file and read_text_file as a step's tools change and read the disk."""
    root, tools = files_server.home, files_server.tools()
    path = str(root / "cairn.txt")
    wrote = tools["files__write_file"].run(step_context, {"path": path, "content": "a pile\n"})
    assert f"Successfully wrote to {path}" == wrote
    edits: JsonValue = [{"oldText": "pile", "newText": "pile of stones"}]
    assert "+a pile of stones" in tools["files__edit_file"].run(
        step_context, {"path": path, "edits": edits}
    )
    assert "a pile of stones\n" == (root / "cairn.txt").read_text()
    assert "a pile of stones\n" == files_server.call("read_text_file", {"path": path})
    assert "[FILE] cairn.txt" in files_server.call("list_directory", {"path": str(root)})


def test_files_refuses_a_path_outside_its_directory(files_server: Served) -> None:
    """Reading outside the allowed directory is a `ToolError` with the server's reason."""
    with pytest.raises(ToolError, match="Access denied - path outside allowed directories"):
        files_server.call("read_text_file", {"path": "/etc/hostname"})


def test_files_png_reaches_a_step_without_base64(
    files_server: Served, step_context: ToolContext
) -> None:
    """read_media_file of a 27 KB PNG: no base64 in the text, its exact byte size noted."""
    png = _png()
    path = files_server.home / "stones.png"
    path.write_bytes(png)
    read = files_server.tools()["files__read_media_file"]
    for result in (
        files_server.call("read_media_file", {"path": str(path)}),
        read.run(step_context, {"path": str(path)}),
    ):
        _assert_no_base64([result])
        assert _size_noted(len(png), [result]), result[:200]


# What a model gets: a step's request to the provider, after the tool ran.


def _images_and_texts(value: JsonValue) -> tuple[list[bytes], list[str]]:
    """The images a provider request shows (decoded), and every other string in it.

    An image is an Anthropic `{"type": "image", "source": {"type": "base64", "data": ...}}`
    block or an OpenAI `image_url` part with a `data:` URL; everything else is text.
    """
    images: list[bytes] = []
    texts: list[str] = []

    def walk(node: JsonValue) -> None:
        if isinstance(node, str):
            texts.append(node)
        elif isinstance(node, list):
            for item in node:
                walk(item)
        elif isinstance(node, dict):
            source, part = node.get("source"), node.get("image_url")
            if node.get("type") == "image" and isinstance(source, dict):
                images.append(base64.b64decode(str(source.get("data")), validate=True))
                walk({k: v for k, v in source.items() if k != "data"})
            elif node.get("type") == "image_url" and isinstance(part, dict):
                url = str(part.get("url"))
                assert url.startswith("data:"), url[:40]
                images.append(base64.b64decode(url.split(",", 1)[1], validate=True))
            else:
                for key, item in node.items():
                    texts.append(key)
                    walk(item)

    walk(value)
    return images, texts


@pytest.fixture
def model_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[ScriptedServer]:
    """A scripted model endpoint (OpenAI's or Anthropic's shape) on 127.0.0.1."""
    yield from serve_scripted(monkeypatch)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_png_reaches_the_model_as_an_image_or_a_note(
    provider: str,
    files_server: Served,
    model_server: ScriptedServer,
    real_store: CheckpointStore,
    tmp_path: Path,
) -> None:
    """A PNG a step read reaches the model as an image of its bytes or a note of its size.

    The step reads it with server-filesystem; the model's next request holds no base64 as
    text, whatever the provider: an image block shows exactly the PNG's bytes, and without
    one some text names its exact size.
    """
    png = _png()
    path = files_server.home / f"seen-by-{provider}.png"
    path.write_bytes(png)
    call: Args = {"path": str(path)}
    if provider == "openai":
        function: Args = {"name": "files__read_media_file", "arguments": json.dumps(call)}
        turn: list[dict[str, JsonValue]] = [{"id": "c1", "type": "function", "function": function}]
        model_server.script = [reply(None, turn), reply("a noisy picture")]
        base_url = model_server.base_url
    else:
        use = tool_use("c1", "files__read_media_file", call)
        model_server.script = [message(use), message(text_block("a noisy picture"))]
        base_url = model_server.root_url
    agent = AgentSpec(
        name=AGENT,
        model=f"{provider}:test-model",
        base_url=base_url,
        tools=["mcp:files/read_media_file"],
    )
    task = f"png-{provider}"
    start_task(real_store, TaskRecord(task=task, goal="Look at the picture.", agents=[agent]), {})
    drive(real_store, task, tmp_path / "cache", mcp=files_server.manager)
    assert 2 == len(model_server.received)
    images, texts = _images_and_texts(model_server.received[1].body)
    _assert_no_base64(texts)
    assert all(png == image for image in images), "an image that is not the PNG read"
    if not images:
        assert _size_noted(len(png), texts), "the image is neither shown nor its size noted"


# @modelcontextprotocol/server-everything over stdio


def _tiny_image_size() -> int:
    """The byte size of server-everything's tiny image, from its installed source."""
    source = NPM_BIN.parent / "@modelcontextprotocol/server-everything/dist/tools/get-tiny-image.js"
    found = re.search(r'MCP_TINY_IMAGE = "([A-Za-z0-9+/=]+)"', source.read_text())
    assert found is not None, f"no MCP_TINY_IMAGE in {source}"
    return len(base64.b64decode(found[1]))


def test_everything_lists_its_tools_with_effects(everything: Served) -> None:
    """Its plain tools are listed; readOnlyHint ones `none`, the others `external`."""
    listed = {info.tool: info for info in everything.manager.list_tools("everything")}
    readers = {"echo", "get-sum", "get-tiny-image", "get-structured-content",
               "get-resource-links", "trigger-long-running-operation"}  # fmt: skip
    writers = {"toggle-simulated-logging", "gzip-file-as-resource"}
    assert readers | writers <= set(listed)
    assert {Effects.NONE} == {listed[name].effects for name in readers}
    assert {Effects.EXTERNAL} == {listed[name].effects for name in writers}
    assert "everything__get-sum" == listed["get-sum"].name
    assert ["a", "b"] == _required(listed["get-sum"])


def test_everything_task_only_tool_is_not_offered(everything: Served) -> None:
    """simulate-research-query can only run as a task (taskSupport required): not offered."""
    listed = {info.tool for info in everything.manager.list_tools("everything")}
    assert "echo" in listed
    assert "simulate-research-query" not in listed


def test_everything_calls_through_the_manager_and_a_step(
    everything: Served, step_context: ToolContext
) -> None:
    """Text, sums, structured content and resource links come back as the model reads them."""
    assert "Echo: stones" == everything.call("echo", {"message": "stones"})
    tools = everything.tools()
    assert "The sum of 2 and 3 is 5." == tools["everything__get-sum"].run(
        step_context, {"a": 2, "b": 3}
    )
    weather = json.loads(everything.call("get-structured-content", {"location": "Chicago"}))
    assert {"temperature", "conditions", "humidity"} <= set(weather)
    links = tools["everything__get-resource-links"].run(step_context, {"count": 2})
    assert 2 == links.count("demo://resource/")


def test_everything_invalid_arguments_are_a_tool_error(everything: Served) -> None:
    """A call missing a required argument is a `ToolError` saying which; the session lives on."""
    with pytest.raises(ToolError, match="message"):
        everything.call("echo", {})
    assert "Echo: again" == everything.call("echo", {"message": "again"})


def test_everything_tiny_image_is_a_note_not_base64(
    everything: Served, step_context: ToolContext
) -> None:
    """get-tiny-image: the text around it kept, the image noted with its exact size."""
    size = _tiny_image_size()
    for result in (
        everything.call("get-tiny-image", {}),
        everything.tools()["everything__get-tiny-image"].run(step_context, {}),
    ):
        assert "Here's the image you requested:" in result
        _assert_no_base64([result])
        assert _size_noted(size, [result]), result


def test_stdio_server_killed_mid_call_fails_that_call_and_serves_the_next(
    own_everything: Served,
) -> None:
    """A call in flight when its stdio server dies is a `ToolError`; the next call works."""
    served, slow = own_everything, "trigger-long-running-operation"
    assert "Echo: before" == served.call("echo", {"message": "before"}, "k-before")
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(served.call, slow, {"duration": 60, "steps": 60}, "k-slow")
        _wait_for(lambda: bool(served.calls_of(slow)), "the slow call to reach the server")
        served.kill()
        with pytest.raises(ToolError, match="taken effect"):  # it may have: the model decides
            pending.result(TIMEOUT)
    assert "Echo: after" == served.call("echo", {"message": "after"}, "k-after")


# server-everything over streamable HTTP


@dataclass
class HttpServer:
    """server-everything serving streamable HTTP on a port, as a process this test owns."""

    port: int
    log: Path  # its stdout and stderr: a line per request it receives
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        """Its MCP endpoint."""
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self) -> None:
        """Start it (on the same port as before, after a kill) and wait until it listens."""
        command = _npm_server("mcp-server-everything")
        with self.log.open("a") as out:
            self.proc = subprocess.Popen(
                [str(command), "streamableHttp"],
                env={**os.environ, "PORT": str(self.port)},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        _wait_for(self._listening, f"server-everything to listen on {self.port}")

    def _listening(self) -> bool:
        assert self.proc is not None
        assert self.proc.poll() is None, f"server-everything exited: {self.log.read_text()}"
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        except OSError:
            return False
        return True

    def posts(self) -> int:
        """How many POSTs (client requests and notifications) it has received."""
        return self.log.read_text().count("Received MCP POST request")

    def kill(self) -> None:
        """SIGKILL it and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(TIMEOUT)


def _http(tmp: Path) -> Iterator[tuple[HttpServer, McpManager]]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = HttpServer(port, tmp / "everything-http.log")
    server.start()
    config = tmp / "http.mcp.json"
    entry = {"url": server.url, "timeout": TIMEOUT}
    config.write_text(json.dumps({"mcpServers": {"remote": entry}}))
    try:
        with McpManager(load_mcp_config(config), connect_timeout=TIMEOUT) as manager:
            yield server, manager
    finally:
        server.kill()


@pytest.fixture(scope="module")
def everything_http(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[HttpServer, McpManager]]:
    """server-everything over streamable HTTP and a manager of it, shared by the module."""
    yield from _http(tmp_path_factory.mktemp("everything-http"))


@pytest.fixture
def own_http(tmp_path: Path) -> Iterator[tuple[HttpServer, McpManager]]:
    """server-everything over streamable HTTP for one test, which may kill and restart it."""
    yield from _http(tmp_path)


def test_everything_over_http_lists_and_calls(
    everything_http: tuple[HttpServer, McpManager], step_context: ToolContext
) -> None:
    """Over streamable HTTP: the same tools and effects, calls as a step makes them."""
    _, manager = everything_http
    listed = {info.tool: info.effects for info in manager.list_tools("remote")}
    assert (Effects.NONE, Effects.EXTERNAL) == (listed["echo"], listed["toggle-simulated-logging"])
    tools = agent_tools(["mcp:remote/echo", "mcp:remote/get-sum"], builtin_tools(), manager)
    assert ["remote__echo", "remote__get-sum"] == list(tools)
    assert "Echo: over http" == tools["remote__echo"].run(step_context, {"message": "over http"})
    assert "The sum of 4 and 5 is 9." == manager.call_tool(
        "remote", "get-sum", {"a": 4, "b": 5}, KEY
    )
    with pytest.raises(ToolError, match="message"):
        manager.call_tool("remote", "echo", {}, KEY)


def test_everything_over_http_image_is_a_note_not_base64(
    everything_http: tuple[HttpServer, McpManager],
) -> None:
    """get-tiny-image over HTTP: no base64 in the text, the image's exact size noted."""
    _, manager = everything_http
    result = manager.call_tool("remote", "get-tiny-image", {}, KEY)
    _assert_no_base64([result])
    assert _size_noted(_tiny_image_size(), [result]), result


def test_http_server_restarted_between_calls_serves_the_next_call(
    own_http: tuple[HttpServer, McpManager],
) -> None:
    """Killed and started again between calls: the next call and listing work (a new session)."""
    server, manager = own_http
    assert "Echo: before" == manager.call_tool("remote", "echo", {"message": "before"}, "k1")
    server.kill()
    server.start()
    assert "Echo: after" == manager.call_tool("remote", "echo", {"message": "after"}, "k2")
    assert "echo" in {info.tool for info in manager.list_tools("remote")}


def test_http_server_killed_mid_call_fails_that_call_and_serves_the_next(
    own_http: tuple[HttpServer, McpManager],
) -> None:
    """A call in flight when the server dies is a `ToolError`; after a restart the next works."""
    server, manager = own_http
    assert "Echo: before" == manager.call_tool("remote", "echo", {"message": "before"}, "k1")
    seen = server.posts()
    with ThreadPoolExecutor(1) as pool:
        args = {"duration": 60, "steps": 60}
        pending = pool.submit(
            manager.call_tool, "remote", "trigger-long-running-operation", args, "k-slow"
        )
        _wait_for(lambda: server.posts() > seen, "the slow call to reach the server")
        server.kill()
        with pytest.raises(ToolError, match="taken effect"):  # it may have: the model decides
            pending.result(2 * TIMEOUT)
    server.start()
    assert "Echo: after" == manager.call_tool("remote", "echo", {"message": "after"}, "k2")
