"""MCP servers and Python tool modules on real worker processes, end to end.

Each test runs a private redis-server, worker processes started by the cluster harness
with `CAIRN_MCP_CONFIG` (or `CAIRN_TOOLS`) in their environment, and the coordinator
ticked by the test. The MCP server is tests/mcp_server.py: a worker starts it over stdio
from its config file, or the test serves it over streamable HTTP. Its `record` tool is an
outside ledger that applies each idempotency key once (the record file), and logs every
call that arrives (the calls file); the server writes its pid to the pids file as it
starts, so a test can kill it and, at the end, make sure none is left.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pytest

from cairn import Client
from cairn.agents.tools import idempotency_key
from cairn.coordinator.spec import TaskSpec
from cairn.storage import keys
from cairn.storage.records import GCStatus, TraceRecord
from cairn.testing.redis_server import RedisServer
from tests.cluster import ROOT, Cluster
from tests.test_restore import run_until

SERVER = Path(__file__).with_name("mcp_server.py")
AGENT = "clerk"
FINISH = {"name": "finish", "args": {"summary": "done"}}


@dataclass(frozen=True)
class Files:
    """What the test server writes: applied keys, calls that arrived, its pids."""

    record: Path
    calls: Path
    pids: Path


@pytest.fixture
def files(tmp_path: Path) -> Files:
    """The test server's files, in the test's directory."""
    return Files(tmp_path / "record.tsv", tmp_path / "calls.tsv", tmp_path / "mcp.pids")


@pytest.fixture
def cluster(own_redis: RedisServer, tmp_path: Path, files: Files) -> Iterator[Cluster]:
    """A cluster whose workers can start the test server (stdio) from a config file.

    Closed before the servers are looked for: a worker's stdio server ends with it (its
    input closes); one still there after a few seconds is killed, by its pid.
    """
    built = Cluster(own_redis, tmp_path)
    config = tmp_path / "mcp.json"
    notes = {
        "command": sys.executable,
        "args": [str(SERVER)],
        "env": {
            "MCP_RECORD_FILE": "${MCP_TEST_RECORD}",
            "MCP_CALLS_FILE": "${MCP_TEST_CALLS}",
            "MCP_PID_FILE": "${MCP_TEST_PIDS}",
        },
        "timeout": 10,
    }
    config.write_text(json.dumps({"mcpServers": {"notes": notes}}))
    built.env.update(
        {
            "CAIRN_MCP_CONFIG": str(config),
            "MCP_TEST_RECORD": str(files.record),
            "MCP_TEST_CALLS": str(files.calls),
            "MCP_TEST_PIDS": str(files.pids),
        }
    )
    try:
        yield built
    finally:
        built.close()
        left = [pid for pid in _pids(files.pids) if not _ends(pid, 5.0)]
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        assert not left, f"MCP servers outlived their workers: {left}"


def _pids(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def _alive(pid: int) -> bool:
    """True while `pid` runs (a zombie, waiting for its parent to reap it, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc here: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _ends(pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _logged(path: Path, text: str, within: float) -> bool:
    """True once the log at `path` holds `text`; False if it does not within `within` s."""
    deadline = time.monotonic() + within
    while text not in path.read_text(errors="replace"):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _keys(path: Path) -> list[str]:
    """The keys of a ledger file, in the order written."""
    return [line.split("\t")[0] for line in path.read_text().splitlines()] if path.exists() else []


def spec(name: str, turns: list[dict[str, object]], tools: list[str] | None = None) -> TaskSpec:
    """One scripted agent, `clerk`, with the test server's tools and `finish`."""
    agent = {
        "name": AGENT,
        "model": "scripted",
        "tools": tools or ["mcp:notes", "finish"],
        "script": turns,
    }
    return TaskSpec.model_validate({"name": name, "goal": "Keep the ledger.", "agents": [agent]})


def record(note: str, server: str = "notes") -> dict[str, object]:
    """A scripted call of the server's `record`."""
    return {"name": f"{server}__record", "args": {"note": note}}


def lookup(word: str) -> dict[str, object]:
    """A scripted call of the server's read-only `lookup`."""
    return {"name": "notes__lookup", "args": {"word": word}}


def key(task: str, superstep: int, place: int, note: str, server: str = "notes") -> str:
    """The idempotency key of `record(note)`, the `place`-th call of its turn."""
    return idempotency_key(task, AGENT, superstep, place, f"{server}__record", {"note": note})


def trace(cluster: Cluster, task: str) -> list[TraceRecord]:
    """The agent's trace as the task's latest GC holds it: its committed calls."""
    gc = cluster.store.latest_gc(task)
    assert gc is not None
    ref = gc.members[AGENT]
    return cluster.store.read_state(task, AGENT, ref.id, ref.checksum).trace


def calls(rows: list[TraceRecord], tool: str) -> list[TraceRecord]:
    """The trace's calls of `tool`."""
    return [row for row in rows if row.tool == tool]


def drive_counting_lcs(
    cluster: Cluster, task: str, timeout: float = 30.0
) -> tuple[dict[str, object], dict[int, Counter[str]]]:
    """Drive `task` to its end; return its status and each superstep's LCs, by level.

    A superstep's LCs are tentative until the coordinator commits it, and the commit drops
    the tool-level ones. So while a step runs the coordinator is not ticked; once the
    agent's vote is in (its LCs all written, the step's last), they are counted, then the
    tick commits them.
    """
    levels: dict[int, Counter[str]] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = cluster.tasks.status(task)
        if status.ended:
            return status.to_json(), levels
        run = cast(dict[bytes, bytes], cluster.client.hgetall(keys.run(task)))
        superstep = int(run.get(b"superstep", b"0"))
        if superstep:
            epoch = int(run[b"epoch"])
            if AGENT not in cluster.store.hot.get_votes(task, epoch, superstep):
                time.sleep(0.02)
                continue
            lcs = keys.superstep_lcs(task, epoch, superstep)
            ids = cast(list[bytes], cluster.client.hkeys(lcs))
            found = [cluster.client.hget(keys.lc(task, i.decode()), "level") for i in ids]
            levels[superstep] = Counter(cast(bytes, level).decode() for level in found)
        cluster.coordinator.tick()
    raise AssertionError(f"task {task} did not end: {cluster.status(task)}")


# stdio servers the worker starts -----------------------------------------------------------
def test_a_worker_runs_its_stdio_servers_tools_and_checkpoints_before_external_calls(
    cluster: Cluster, files: Files
) -> None:
    """`record` in supersteps 1 and 2, `lookup` in 1 and 3: the task succeeds.

    Each committed `record` is applied once, under its key; each took a tool-level LC
    first, while `lookup` (read-only, `none`) took none: one tool LC in supersteps 1 and
    2 (the `lookup` before the `record` of 1 took none), none in 3.
    """
    worker = cluster.start_worker()
    turns: list[dict[str, object]] = [
        {"say": "Look up, then record.", "tools": [lookup("cairn"), record("one")]},
        {"say": "Record again.", "tools": [record("two")]},
        {"say": "Check and finish.", "tools": [lookup("mcp"), FINISH]},
    ]
    task = cluster.tasks.submit(spec("record twice", turns))
    status, levels = drive_counting_lcs(cluster, task)
    assert "succeeded" == status["status"], status
    assert {1: {"tool": 1, "step": 1}, 2: {"tool": 1, "step": 1}, 3: {"step": 1}} == levels

    rows = trace(cluster, task)
    committed = [key(task, 1, 1, "one"), key(task, 2, 0, "two")]
    assert committed == [row.idempotency_key for row in calls(rows, "notes__record")]
    assert committed == _keys(files.record) == _keys(files.calls)  # each applied once
    for row in calls(rows, "notes__record"):
        assert ("external", True) == (row.effects, row.side_effect)
    looked = calls(rows, "notes__lookup")
    assert [("none", False, None)] * 2 == [
        (row.effects, row.side_effect, row.idempotency_key) for row in looked
    ]
    assert ["a pile of stones marking a path", "Model Context Protocol"] == [
        row.result for row in looked
    ]
    [pid] = _pids(files.pids)  # one server, one session, across the three steps
    assert f"recorded one (pid {pid})" == calls(rows, "notes__record")[0].result
    assert worker.poll() is None


def test_a_killed_worker_and_a_restore_apply_each_committed_call_once(
    cluster: Cluster, files: Files, tmp_path: Path
) -> None:
    """A worker dies right after `record`; later the task is restored to superstep 1's GC.

    The retry resumes from the tool-level LC taken after the call (before the next tool),
    so it does not call `record` again. The replay of superstep 2 after the restore makes
    its call again, with the same key: the ledger, applying a key once, does not apply it
    twice. What it applied is exactly the committed calls' keys, each once.
    """
    cluster.start_worker()
    cluster.start_worker()  # takes the retry when the first one to run the step dies
    turns: list[dict[str, object]] = [
        {
            "say": "Record, then look up.",
            "tools": [record("one"), lookup("cairn")],
            "crash": {"attempts": [1], "after_tools": 1},  # SIGKILL as `lookup` starts
        },
        {"say": "Record again.", "tools": [record("two")]},
        {"say": "Finish.", "tools": [FINISH]},
    ]
    task = cluster.tasks.submit(spec("killed and restored", turns))
    first, second = key(task, 1, 0, "one"), key(task, 2, 0, "two")
    run_until(cluster, task, 2)
    assert [-signal.SIGKILL] == [w.returncode for w in cluster.workers if w.poll() is not None]
    assert [first, second] == _keys(files.calls)  # the retry did not call `record` again

    [gc1] = [
        gc
        for gc in cluster.store.list_gcs(task)
        if gc.superstep == 1 and gc.status is GCStatus.COMMITTED
    ]
    with Client(cluster.server.url, tmp_path / "archive") as client:
        restored = client.task(task).restore(to=gc1.number)
    assert gc1.number == restored.restored_to
    status = cluster.drive(task)
    assert "succeeded" == status["status"], status

    rows = calls(trace(cluster, task), "notes__record")
    committed = [row.idempotency_key for row in rows]
    assert [first, second] == committed
    assert committed == _keys(files.record)  # applied: each committed key, once
    assert [first, second, second] == _keys(files.calls)  # the replay called again...
    assert str(rows[1].result).startswith("already recorded two")  # ...and was not applied


def test_a_killed_mcp_server_is_started_again_by_the_next_step(
    cluster: Cluster, files: Files
) -> None:
    """The worker's stdio server is killed between supersteps: the next step starts it anew.

    The next superstep starts once the worker logged the end of its server: a call the
    step made before the worker heard of it would go to the dead session (and be told it
    may or may not have taken effect), a race this test does not mean to run.
    """
    worker = cluster.start_worker()
    turns: list[dict[str, object]] = [
        {"tools": [record("one")]},
        {"tools": [record("two")]},
        {"tools": [FINISH]},
    ]
    task = cluster.tasks.submit(spec("server killed", turns))
    run_until(cluster, task, 1)
    [killed] = _pids(files.pids)
    os.kill(killed, signal.SIGKILL)
    assert _ends(killed, 5.0)
    assert _logged(cluster.tmp / "worker-0.log", "MCP server hung up", 5.0)
    status = cluster.drive(task)
    assert "succeeded" == status["status"], status

    [again] = _pids(files.pids)[1:]
    rows = calls(trace(cluster, task), "notes__record")
    assert [f"recorded one (pid {killed})", f"recorded two (pid {again})"] == [
        row.result for row in rows
    ]
    assert [key(task, 1, 0, "one"), key(task, 2, 0, "two")] == _keys(files.record)
    assert worker.poll() is None
    assert {} == cluster.client.hgetall(keys.outcomes(task, 1, 2))  # no attempt failed


# streamable HTTP ---------------------------------------------------------------------------
@pytest.fixture
def http_server(files: Files) -> Iterator[tuple[str, int]]:
    """The test server over streamable HTTP on a free port of 127.0.0.1: its url and pid."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "MCP_RECORD_FILE": str(files.record)}
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), "--http", str(port)], env=env, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            assert proc.poll() is None, "the HTTP server exited"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, f"nothing listens on port {port}"
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp", proc.pid
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_worker_reaches_an_mcp_server_over_streamable_http(
    cluster: Cluster, files: Files, tmp_path: Path, http_server: tuple[str, int]
) -> None:
    """A server at a url in the worker's config: one `record` round trip, under its key."""
    url, pid = http_server
    config = tmp_path / "remote.json"
    config.write_text(json.dumps({"mcpServers": {"remote": {"url": url, "timeout": 10}}}))
    cluster.env["CAIRN_MCP_CONFIG"] = str(config)
    cluster.start_worker()
    turns: list[dict[str, object]] = [
        {"tools": [record("over http", "remote")]},
        {"tools": [FINISH]},
    ]
    task = cluster.tasks.submit(spec("over http", turns, ["mcp:remote", "finish"]))
    status = cluster.drive(task)
    assert "succeeded" == status["status"], status
    [row] = calls(trace(cluster, task), "remote__record")
    expected = key(task, 1, 0, "over http", "remote")
    assert (f"recorded over http (pid {pid})", expected) == (row.result, row.idempotency_key)
    assert [expected] == _keys(files.record)


# Python tool modules -----------------------------------------------------------------------
STAMPS = '''\
"""Tools a worker loads because CAIRN_TOOLS names this module."""

import os
from pathlib import Path

from cairn import ToolContext, tool


@tool(effects="external")
def stamp(ctx: ToolContext, label: str) -> str:
    """Stamp a label in the ledger STAMP_LEDGER names, with the call's key.

    Args:
        ctx: the call's context
        label: what to stamp

    """
    with Path(os.environ["STAMP_LEDGER"]).open("a", encoding="utf-8") as out:
        out.write(f"{ctx.idempotency_key}\\t{label}\\n")
    return f"stamped {label} (pid {os.getpid()})"
'''


def test_a_worker_runs_the_tools_of_a_module_cairn_tools_names(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A module on the worker's path, named by `CAIRN_TOOLS` (no entry point): its tool runs."""
    modules, ledger = tmp_path / "modules", tmp_path / "stamps.tsv"
    modules.mkdir()
    (modules / "cairn_worker_stamps.py").write_text(STAMPS)
    cluster.env.update(
        {
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(modules)]),
            "CAIRN_TOOLS": "cairn_worker_stamps",
            "STAMP_LEDGER": str(ledger),
        }
    )
    worker = cluster.start_worker()
    turns: list[dict[str, object]] = [
        {"tools": [{"name": "stamp", "args": {"label": "approved"}}]},
        {"tools": [FINISH]},
    ]
    task = cluster.tasks.submit(spec("stamp", turns, ["stamp", "finish"]))
    status = cluster.drive(task)
    assert "succeeded" == status["status"], status
    [row] = calls(trace(cluster, task), "stamp")
    expected = idempotency_key(task, AGENT, 1, 0, "stamp", {"label": "approved"})
    assert (f"stamped approved (pid {worker.pid})", expected, "external") == (
        row.result,
        row.idempotency_key,
        row.effects,
    )
    assert [expected] == _keys(ledger)


@pytest.mark.parametrize(
    ("command", "env", "expected"),
    [
        (
            ["cairn.coordinator.worker"],
            {"CAIRN_TOOLS": "nope.module"},
            "worker.py: error: cannot import tools module 'nope.module': ModuleNotFoundError",
        ),
        (
            ["cairn.cli", "worker", "--tools", "nope.module"],
            {},
            "cairn: cannot import tools module 'nope.module': ModuleNotFoundError",
        ),
        (
            ["cairn.cli", "up", "--tools", "nope.module"],
            {},
            "cairn: cannot import tools module 'nope.module': ModuleNotFoundError",
        ),
        (
            ["cairn.coordinator.worker"],
            {"CAIRN_MCP_CONFIG": "MISSING"},
            "worker.py: error: MCP config MISSING: cannot read",
        ),
        (
            ["cairn.cli", "worker", "--mcp-config", "MISSING"],
            {},
            "cairn: MCP config MISSING: cannot read",
        ),
    ],
    ids=["worker-tools", "cli-tools", "up-tools", "worker-mcp", "cli-mcp"],
)
def test_a_worker_with_tools_it_cannot_load_refuses_to_start_with_one_line(
    own_redis: RedisServer, tmp_path: Path, command: list[str], env: dict[str, str], expected: str
) -> None:
    """A tools module that does not exist, an MCP file that cannot be read: exit 2, one line."""
    missing = str(tmp_path / "missing.json")
    argv = [arg.replace("MISSING", missing) for arg in command]
    environ = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "CAIRN_REDIS_URL": own_redis.url,
        "CAIRN_CACHE_DIR": str(tmp_path / "cache"),
        **{name: value.replace("MISSING", missing) for name, value in env.items()},
    }
    done = subprocess.run(
        [sys.executable, "-m", *argv],
        env=environ,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert (2, "") == (done.returncode, done.stdout)
    [line] = done.stderr.splitlines()
    assert line.startswith(expected.replace("MISSING", missing)), line
