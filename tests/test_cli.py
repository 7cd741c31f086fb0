"""The `cairn` CLI against a real redis-server, coordinator and worker processes.

One private stack serves the module: a redis-server, a `cairn coordinator` and a
`cairn worker` process. Commands run in-process through `main(argv)` where the exit code
is all a test needs, and as real processes where it needs stderr and the exit status.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis

from cairn import Client
from cairn import __version__ as cairn_version
from cairn.coordinator.settings import display_url, load_settings
from cairn.errors import InvalidSpec
from cairn.testing.redis_server import RedisServer, free_port
from tests.cli_harness import (
    Run,
    cairn,
    children,
    cli_runner,
    cmdline,
    private_stack,
    spawn,
    stop,
    wait_until,
)
from tests.cluster import TEAM

ROOT = Path(__file__).resolve().parents[1]
AGENTS = {"planner", "coder", "reviewer"}
STATUS_KEYS = {"task_id", "status", "superstep", "epoch", "latest_checkpoint", "agents"}
CHECKPOINT_KEYS = {
    "number",
    "status",
    "superstep",
    "members",
    "hot",
    "cold",
    "created_at",
    "size_bytes",
}
TRACE_KEYS = {
    "agent",
    "step",
    "superstep",
    "tool",
    "arguments",
    "result",
    "error",
    "started_at",
    "finished_at",
    "duration_ms",
}
APPROVAL = """
name: Ask first
goal: Write b.txt, with permission.
files: {"a.txt": "a\\n"}
agents:
  - name: writer
    model: scripted
    approve: [write_file]
    script:
      - say: May I?
        tools:
          - {name: write_file, args: {path: b.txt, content: "b\\n"}}
"""


@dataclass
class Stack:
    """The module's private Redis, with a coordinator and a worker process on it."""

    url: str
    env: dict[str, str]
    tmp: Path

    def spec(self, name: str, slow: float = 0.0) -> Path:
        """Write the three-agent team's spec (tests/cluster.py) and return its path."""
        path = self.tmp / f"{name}.yaml"
        ledger = self.tmp / f"{name}.ledger"
        path.write_text(TEAM.replace("LEDGER", str(ledger)).replace("SLOW", str(slow)))
        return path


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A private redis-server, `cairn coordinator` and `cairn worker` for the module."""
    tmp = tmp_path_factory.mktemp("cli")
    with private_stack(tmp, "cli-test") as (url, env):
        yield Stack(url, env, tmp)


@pytest.fixture
def run(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Iterator[Run]:
    """Call `main(argv)` in this process with the stack's environment; (code, out, err)."""
    env = {name: value for name, value in stack.env.items() if name.startswith("CAIRN_")}
    with cli_runner(env, monkeypatch, capsys) as call:
        yield call


def status_of(run: Run, task: str) -> dict[str, Any]:
    code, out, err = run("status", task, "--json")
    assert 0 == code, err
    found: dict[str, Any] = json.loads(out)
    return found


def wait_for(run: Run, task: str, wanted: set[str], timeout: float = 30) -> dict[str, Any]:
    """Poll `cairn status` until the task's status is one of `wanted`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = status_of(run, task)
        if status["status"] in wanted:
            return status
        time.sleep(0.1)
    raise AssertionError(f"{task} never became {wanted}: {status}")


@pytest.fixture(scope="module")
def finished(stack: Stack) -> tuple[str, subprocess.CompletedProcess[str]]:
    """The team's task, submitted with `submit --wait --json` and run to its end."""
    done = cairn("submit", str(stack.spec("team")), "--wait", "--json", env=stack.env)
    return json.loads(done.stdout)["task_id"], done


# bad input: exit 2, one line, no traceback ------------------------------------------------
def test_an_invalid_spec_exits_2_with_one_line(stack: Stack) -> None:
    """A spec naming no agents is refused before anything is stored: exit 2, one line."""
    spec = stack.tmp / "invalid.yaml"
    spec.write_text("name: x\ngoal: y\nagents: []\n")
    done = cairn("submit", str(spec), env=stack.env)
    assert 2 == done.returncode
    assert [
        f"cairn: {spec}:3:1: invalid task spec: agents: List should have at least 1 item after "
        "validation, not 0"
    ] == done.stderr.splitlines()
    missing = cairn("submit", str(stack.tmp / "nowhere.yaml"), env=stack.env)
    assert 2 == missing.returncode
    assert 1 == len(missing.stderr.splitlines())
    assert "Traceback" not in done.stderr + missing.stderr


def test_a_spec_naming_no_model_exits_2_naming_the_agent_and_the_choices(stack: Stack) -> None:
    """An agent without `model` is refused at submit (none is assumed): exit 2, one line."""
    spec = stack.tmp / "no-model.yaml"
    spec.write_text("name: x\ngoal: y\nagents: [{name: writer, script: [{say: hi}]}]\n")
    done = cairn("submit", str(spec), env=stack.env)
    assert 2 == done.returncode
    assert [
        f"cairn: {spec}:3:10: invalid task spec: agents[writer]: agent writer names no model: "
        "give "
        "'scripted' or '<provider>:<model name>' (openai:, anthropic:, or a provider a "
        "worker's package adds)"
    ] == done.stderr.splitlines()


def test_an_unreachable_redis_exits_3_fast_without_its_password(stack: Stack) -> None:
    """A closed port: exit 3 (worth retrying) within seconds, one line, the password masked."""
    port = free_port()
    url = f"redis://:hunter2@127.0.0.1:{port}/0"
    started = time.monotonic()
    done = cairn("status", "some-task", env={**stack.env, "CAIRN_REDIS_URL": url})
    assert 3 == done.returncode
    assert time.monotonic() - started < 10  # the interpreter's start included
    [line] = done.stderr.splitlines()
    assert line.startswith(f"cairn: cannot reach Redis at redis://:***@127.0.0.1:{port}/0 ")
    assert "hunter2" not in done.stderr


def test_an_unknown_task_exits_2(stack: Stack, run: Run) -> None:
    """Every command on a task nobody submitted is bad input, named in one line."""
    done = cairn("status", "no-such-task", env=stack.env)
    assert (2, ["cairn: unknown task 'no-such-task'"]) == (
        done.returncode,
        done.stderr.splitlines(),
    )
    for argv in (
        ["checkpoints", "nope"],
        ["trace", "nope"],
        ["restore", "nope"],
        ["pause", "nope"],
        ["cancel", "nope"],
        ["archive", "nope"],
        ["checkpoint", "nope", "0"],
        ["status", "../etc"],
    ):
        code, out, err = run(*argv)
        assert (2, "") == (code, out), argv
        assert 1 == len(err.splitlines()), err


def test_bad_arguments_exit_2_with_one_line(run: Run) -> None:
    """Errors argparse finds are one line too, not the usage text."""
    for argv in (
        ["checkpoint", "t", "x"],
        ["reject", "t", "agent"],
        ["frobnicate"],
        ["worker", "--count", "0"],
        ["--metrics-port", "99999", "status", "t"],
    ):
        code, out, err = run(*argv)
        assert (2, "") == (code, out), argv
        assert 1 == len(err.splitlines()), err
        assert err.startswith("cairn: ")


def test_the_cairn_script_is_installed() -> None:
    """The `cairn` entry point sits beside the interpreter and answers --help."""
    script = Path(sys.executable).parent / "cairn"
    done = subprocess.run([script, "--help"], capture_output=True, text=True, check=False)
    assert 0 == done.returncode
    assert "checkpoints" in done.stdout


# settings ------------------------------------------------------------------------------
def test_settings_come_from_the_environment_and_flags_win(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """CAIRN_* variables configure; flags override them; bad values name their source."""
    monkeypatch.setenv("CAIRN_REDIS_URL", "rediss://user:s3cret@cache.example:6380/2")
    monkeypatch.setenv("CAIRN_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("CAIRN_METRICS_PORT", "9100")
    monkeypatch.setenv("CAIRN_LOG_FORMAT", "json")
    settings = load_settings()
    assert ("rediss://user:s3cret@cache.example:6380/2", 9100, "json") == (
        settings.redis_url,
        settings.metrics_port,
        settings.log_format,
    )
    assert tmp_path / "archive" == settings.archive
    assert "rediss://user:***@cache.example:6380/2" == display_url(settings.redis()[0])
    flagged = load_settings(redis_url="redis://127.0.0.1:7000/0", archive_dir="elsewhere")
    assert ("redis://127.0.0.1:7000/0", Path("elsewhere")) == (flagged.redis_url, flagged.archive)
    monkeypatch.setenv("CAIRN_LOG_LEVEL", "chatty")
    with pytest.raises(InvalidSpec, match="CAIRN_LOG_LEVEL"):
        load_settings()
    with pytest.raises(InvalidSpec, match="--metrics-port"):
        load_settings(log_level="info", metrics_port="0")
    with pytest.raises(InvalidSpec, match="--redis-url"):
        load_settings(log_level="info", redis_url="http://127.0.0.1/")


# one task, seen every way ---------------------------------------------------------------
def test_submit_wait_json_prints_the_final_status(
    finished: tuple[str, subprocess.CompletedProcess[str]],
) -> None:
    """`submit --wait --json` exits 0 once the task succeeded and prints its status."""
    task, done = finished
    assert 0 == done.returncode, done.stderr
    status = json.loads(done.stdout)
    assert STATUS_KEYS <= status.keys()
    assert (task, "succeeded", 1) == (status["task_id"], status["status"], status["epoch"])
    assert AGENTS == {a["name"] for a in status["agents"]}
    assert all({"name", "status", "step", "usage"} == a.keys() for a in status["agents"])


def test_status_json(finished: tuple[str, subprocess.CompletedProcess[str]], run: Run) -> None:
    """`status --json` has the documented keys, and the latest checkpoint is the last GC."""
    status = status_of(run, finished[0])
    assert STATUS_KEYS <= status.keys()
    assert (3, 3) == (status["superstep"], status["latest_checkpoint"])
    code, out, _ = run("status", finished[0])
    assert 0 == code
    assert "succeeded" in out
    assert "halted" in out


def test_checkpoints_json(finished: tuple[str, subprocess.CompletedProcess[str]], run: Run) -> None:
    """Every GC is listed once, committed, on disk (the task ended), naming every agent."""
    code, out, _ = run("checkpoints", finished[0], "--json")
    assert 0 == code
    rows = json.loads(out)
    assert [0, 1, 2, 3] == [row["number"] for row in rows]
    assert (0, "COMMITTED") == (run("checkpoints", finished[0])[0], rows[0]["status"])
    for row in rows:
        assert CHECKPOINT_KEYS <= row.keys()
        assert ("COMMITTED", True) == (row["status"], row["cold"])
        assert AGENTS == row["members"].keys()
        assert row["size_bytes"] > 0
    code, detail, _ = run("checkpoint", finished[0], "2", "--json")
    gc = json.loads(detail)
    assert (0, 2, rows[2]["members"]) == (code, gc["number"], gc["members"])
    assert {"PLAN.md", "greet.py"} == gc["files"].keys()
    assert 2 == run("checkpoint", finished[0], "9")[0]
    code, table, _ = run("checkpoint", finished[0], "2")
    assert (0, True) == (code, "PLAN.md" in table)


def test_trace_json(finished: tuple[str, subprocess.CompletedProcess[str]], run: Run) -> None:
    """The trace holds every model turn and tool call, in superstep order; --agent filters."""
    code, out, _ = run("trace", finished[0], "--json")
    assert 0 == code
    records = json.loads(out)
    assert all(TRACE_KEYS <= r.keys() for r in records)
    assert sorted(r["superstep"] for r in records) == [r["superstep"] for r in records]
    calls = [(r["agent"], r["tool"]) for r in records if r["tool"]]
    assert ("coder", "write_file") in calls
    assert calls.index(("planner", "send_message")) < calls.index(("coder", "run_command"))
    code, out, _ = run("trace", finished[0], "--agent", "coder", "--json")
    mine = json.loads(out)
    assert [r for r in records if r["agent"] == "coder"] == mine
    assert 2 == run("trace", finished[0], "--agent", "nobody")[0]
    code, table, _ = run("trace", finished[0], "--agent", "reviewer")
    assert (0, True, False) == (code, "REVIEW.md" in table, "coder" in table)


def test_workspace_writes_the_files_of_a_checkpoint(
    finished: tuple[str, subprocess.CompletedProcess[str]], run: Run, tmp_path: Path
) -> None:
    """`workspace --out` writes the latest GC's files; `--checkpoint 0` the initial ones."""
    latest, first = tmp_path / "latest", tmp_path / "first"
    assert 0 == run("workspace", finished[0], "--out", str(latest))[0]
    expected = {"greet.py": "print('Hello')\n", "PLAN.md": "1. say Hello\n"}
    expected["REVIEW.md"] = "Looks good.\n"
    assert expected == {p.name: p.read_text() for p in latest.iterdir()}
    assert 0 == run("workspace", finished[0], "--checkpoint", "0", "--out", str(first))[0]
    assert {"greet.py": "print('hi')\n"} == {p.name: p.read_text() for p in first.iterdir()}
    code, _, err = run("workspace", finished[0], "--out", str(latest))
    assert 2 == code
    assert "not an empty directory" in err


# changing a task ------------------------------------------------------------------------
def test_restore_to_a_checkpoint(stack: Stack, run: Run) -> None:
    """`restore --to 1 --json` names the target and the new epoch; the task runs on to its end."""
    code, out, err = run("submit", str(stack.spec("restored")), "--wait", "--json")
    assert 0 == code, err
    task = json.loads(out)["task_id"]
    code, out, err = run("restore", task, "--to", "1", "--json")
    assert 0 == code, err
    restored = json.loads(out)
    assert (1, 2, 4) == (restored["restored_to"], restored["epoch"], restored["checkpoint"])
    status = wait_for(run, task, {"succeeded", "failed", "unrecoverable"})
    assert ("succeeded", 2) == (status["status"], status["epoch"])
    code, out, _ = run("checkpoints", task, "--json")
    assert [0, 1, 2, 3, 4, 5, 6] == [row["number"] for row in json.loads(out)]
    assert 2 == run("restore", task, "--to", "99")[0]


def test_restore_with_no_sound_checkpoint_exits_1(
    redis_client: redis.Redis, redis_server: RedisServer, stack: Stack, run: Run, tmp_path: Path
) -> None:
    """With every LC of GC 0 gone, restore fails: exit 1, the reason, task unrecoverable."""
    flags = ["--redis-url", redis_server.url, "--archive-dir", str(tmp_path / "archive")]
    task = json.loads(run(*flags, "submit", str(stack.spec("lost")), "--json")[1])["task_id"]
    redis_client.delete(*redis_client.keys(f"cairn:{{{task}}}:lc:*"))
    code, out, err = run(*flags, "restore", task, "--json")
    assert (1, "") == (code, out)
    [line] = err.splitlines()
    assert line.startswith(f"cairn: no checkpoint of task {task} could be restored: GC 0: ")
    code, out, _ = run(*flags, "status", task, "--json")
    status = json.loads(out)
    assert (0, "unrecoverable", None) == (code, status["status"], status["agents"][0]["step"])


def test_pause_resume_and_cancel(stack: Stack, run: Run) -> None:
    """A task pauses, resumes, is cancelled and forgotten, each only from the right state."""
    code, out, _ = run("submit", str(stack.spec("paused", slow=1.0)), "--json")
    task = json.loads(out)["task_id"]
    code, _, err = run("forget", task)
    assert (2, 1) == (code, len(err.strip().splitlines()))
    assert "only an ended task can be forgotten" in err
    code, out, _ = run("pause", task, "--json")
    assert (0, {"task_id": task, "status": "paused"}) == (code, json.loads(out))
    assert 2 == run("pause", task)[0]
    code, out, _ = run("resume", task, "--json")
    assert (0, "running") == (code, json.loads(out)["status"])
    code, out, _ = run("cancel", task, "--json")
    assert (0, "cancelled") == (code, json.loads(out)["status"])
    assert "cancelled" == status_of(run, task)["status"]
    assert 2 == run("cancel", task)[0]
    assert 2 == run("resume", task)[0]
    code, out, _ = run("forget", task, "--json")
    assert (0, task) == (code, json.loads(out)["task_id"])
    assert json.loads(out)["keys_removed"] > 0
    code, _, err = run("status", task)
    assert (2, 1) == (code, len(err.strip().splitlines()))
    assert "only its archive is left" in err


def test_approve_and_reject_a_tool_call(stack: Stack, run: Run, tmp_path: Path) -> None:
    """A call waiting for a person runs once approved; a rejection's reason is its result."""
    spec = stack.tmp / "approval.yaml"
    spec.write_text(APPROVAL)
    tasks = [json.loads(run("submit", str(spec), "--json")[1])["task_id"] for _ in range(2)]
    for task in tasks:
        waiting = wait_for(run, task, {"waiting_approval"})
        assert "waiting_approval" == waiting["agents"][0]["status"]
    assert 2 == run("approve", tasks[0], "writer", "no-such-call")[0]
    code, out, _ = run("approve", tasks[0], "writer", "--json")
    decision = json.loads(out)
    assert (0, "write_file", True) == (code, decision["tool"], decision["approved"])
    assert 0 == run("reject", tasks[1], "writer", "--reason", "not today")[0]
    for task in tasks:
        assert "succeeded" == wait_for(run, task, {"succeeded", "failed"})["status"]
    assert 2 == run("approve", tasks[0], "writer")[0]  # nothing waits any more
    approved, rejected = tmp_path / "approved", tmp_path / "rejected"
    run("workspace", tasks[0], "--out", str(approved))
    run("workspace", tasks[1], "--out", str(rejected))
    assert ["a.txt", "b.txt"] == sorted(p.name for p in approved.iterdir())
    assert ["a.txt"] == sorted(p.name for p in rejected.iterdir())
    code, out, _ = run("trace", tasks[1], "--json")
    [call] = [r for r in json.loads(out) if r["tool"] == "write_file"]
    assert "rejected by a person: not today" in json.dumps(call)


def test_archive_copies_what_is_only_in_redis(
    redis_client: redis.Redis, redis_server: RedisServer, stack: Stack, run: Run, tmp_path: Path
) -> None:
    """With no coordinator, GC 0 is only hot; `archive` puts it on disk, once.

    Runs on the session's Redis through `--redis-url`, over the stack's CAIRN_REDIS_URL.
    """
    flags = ["--redis-url", redis_server.url, "--archive-dir", str(tmp_path / "archive")]
    code, out, err = run(*flags, "submit", str(stack.spec("idle")), "--json")
    assert 0 == code
    assert "no coordinator is running" in err
    task = json.loads(out)["task_id"]
    assert 2 == run("status", task)[0]  # not in the stack's Redis
    code, out, _ = run(*flags, "archive", task, "--json")
    assert (0, [0]) == (code, [r["number"] for r in json.loads(out)])
    code, out, _ = run(*flags, "checkpoints", task, "--json")
    assert [(0, True, True)] == [(r["number"], r["hot"], r["cold"]) for r in json.loads(out)]
    code, out, _ = run(*flags, "archive", task, "--json")
    assert (0, []) == (code, json.loads(out))


# processes ------------------------------------------------------------------------------
def test_worker_count_restarts_a_killed_worker_and_stops_on_sigterm(
    own_redis: RedisServer, stack: Stack, tmp_path: Path
) -> None:
    """`worker --count 2` replaces a SIGKILLed worker and takes its children down on SIGTERM."""
    env = {**stack.env, "CAIRN_REDIS_URL": own_redis.url}
    supervisor = spawn(["worker", "--count", "2"], env, tmp_path / "workers.log")
    try:
        wait_until(lambda: 2 == len(children(supervisor.pid, "cairn.coordinator.worker")))
        first = children(supervisor.pid, "cairn.coordinator.worker")
        assert all(own_redis.url not in cmdline(pid) for pid in first)  # it is in their env
        victim = min(first)
        os.kill(victim, signal.SIGKILL)
        # SIGKILL is not instant: until the victim is gone, it still counts as a child.
        wait_until(
            lambda: (
                victim not in (alive := children(supervisor.pid, "cairn.coordinator.worker"))
                and {*first} - {victim} < alive
                and 2 == len(alive)
            )
        )
        now = children(supervisor.pid, "cairn.coordinator.worker")
        assert victim not in now
        assert all(own_redis.url not in cmdline(pid) for pid in now)
    finally:
        code = stop(supervisor)
    assert 0 == code
    assert not any(Path(f"/proc/{pid}").exists() for pid in now)
    assert "process exited; restarting" in (tmp_path / "workers.log").read_text()


def test_up_without_redis_server_says_so(stack: Stack, tmp_path: Path) -> None:
    """`up` with no CAIRN_REDIS_URL and no redis-server on PATH: exit 2, one clear line."""
    env = {k: v for k, v in stack.env.items() if k != "CAIRN_REDIS_URL"}
    env["PATH"] = str(tmp_path)
    done = cairn("up", "--state-dir", str(tmp_path / "state"), env=env)
    assert 2 == done.returncode
    assert ["cairn: redis-server is not on PATH: install it (apt-get install redis-server)"] == (
        done.stderr.splitlines()
    )


def test_up_runs_a_private_redis_that_other_commands_find(
    stack: Stack, tmp_path: Path, run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`up` runs Redis (AOF in the state directory), a coordinator and workers.

    Commands run there find its Redis without CAIRN_REDIS_URL; SIGTERM stops all of it.
    """
    state = tmp_path / "state"
    env = {k: v for k, v in stack.env.items() if not k.startswith("CAIRN_")}
    env["CAIRN_STATE_DIR"] = str(state)
    up = spawn(["up", "--workers", "1"], env, tmp_path / "up.log")
    try:
        wait_until((state / "redis.url").exists)
        for name in ("CAIRN_REDIS_URL", "CAIRN_ARCHIVE_DIR", "CAIRN_CACHE_DIR"):
            monkeypatch.delenv(name)
        monkeypatch.setenv("CAIRN_STATE_DIR", str(state))
        code, out, err = run("submit", str(stack.spec("up")), "--wait", "--json")
        assert (0, "succeeded") == (code, json.loads(out)["status"]), err
        assert (state / "redis" / "appendonlydir").is_dir()
        assert (state / "archive" / "tasks" / json.loads(out)["task_id"]).is_dir()
        processes = children(up.pid, "")
        assert 3 == len(processes)  # redis-server, the coordinator, one worker
        url = (state / "redis.url").read_text().strip()
        assert [] == [cmdline(pid) for pid in processes if url in cmdline(pid)]
        # Its Redis asks for a password (a command allowed the network shares the loopback),
        # which only this user can read.
        assert 0o600 == stat.S_IMODE((state / "redis.url").stat().st_mode)
        parts = urlsplit(url)
        assert parts.password
        assert parts.hostname is not None
        assert parts.port is not None
        bare = redis.Redis(host=parts.hostname, port=parts.port)
        with pytest.raises(redis.AuthenticationError):
            bare.ping()
        bare.close()
    finally:
        code = stop(up)
    assert 0 == code
    assert not (state / "redis.url").exists()
    assert not any(Path(f"/proc/{pid}").exists() for pid in processes)


# the command line as its users expect it ---------------------------------------------------
def test_version_and_a_bare_cairn_print_what_they_should(run: Run) -> None:
    """`--version` names the release; `cairn` alone prints its usage and the exit codes."""
    code, out, err = run("--version")
    assert (0, f"cairn {cairn_version}\n", "") == (code, out, err)
    code, out, err = run()
    assert (0, "") == (code, err)
    assert out.startswith("usage: cairn")
    assert "exit codes:" in out
    assert "3  Redis is unreachable, or none is configured (worth retrying)" in out


def test_global_options_are_shown_once_and_taken_anywhere(run: Run) -> None:
    """`cairn --help` lists the global options and the log choices; a command's help does not.

    A global option is still taken after the command's name.
    """
    _, top, _ = run("--help")
    assert 1 == top.count("\n  --redis-url")  # in the options, once
    assert "--log-level {debug,info,warning,error,critical}" in top
    assert "--log-format {console,json}" in top
    _, status_help, _ = run("status", "--help")
    assert "--redis-url" not in status_help
    assert "--json" in status_help
    code, _, err = run("status", "no-such-task", "--log-level", "loud")
    assert 2 == code
    assert "invalid choice: 'loud'" in err


def test_wait_that_runs_out_exits_4_and_the_task_runs_on(stack: Stack, run: Run) -> None:
    """`submit --wait --timeout` exits 4 when the task outlives it; the task is not touched."""
    code, out, err = run("submit", str(stack.spec("outlived", slow=1.0)), "--wait",
                         "--timeout", "0.3", "--json")  # fmt: skip
    assert (4, "") == (code, out)
    [line] = err.splitlines()
    assert "after 0.3 s" in line
    task = line.split()[2]
    assert "succeeded" == wait_for(run, task, {"succeeded", "failed"})["status"]


def test_list_shows_every_task_newest_first(stack: Stack, run: Run) -> None:
    """`list --json` is a list of statuses, the most recently submitted first."""
    first = json.loads(run("submit", str(stack.spec("older")), "--json")[1])["task_id"]
    second = json.loads(run("submit", str(stack.spec("newer")), "--json")[1])["task_id"]
    code, out, _ = run("list", "--json")
    assert 0 == code
    listed = json.loads(out)
    ids = [status["task_id"] for status in listed]
    assert ids.index(second) < ids.index(first)
    assert all(STATUS_KEYS <= status.keys() for status in listed)
    code, table, _ = run("list")
    assert 0 == code
    assert len(table.splitlines()) >= len(listed) + 4  # a header, its rules, a row each
    for task in (first, second):
        wait_for(run, task, {"succeeded"})


def test_status_json_is_the_models_json(
    finished: tuple[str, subprocess.CompletedProcess[str]], run: Run, stack: Stack
) -> None:
    """`status --json` prints exactly `Task.status()` serialized, `state` under `status`."""
    with Client(redis_url=stack.url, archive_dir=stack.env["CAIRN_ARCHIVE_DIR"]) as client:
        expected = client.task(finished[0]).status().model_dump(mode="json")
    assert expected == status_of(run, finished[0])


def test_the_cli_forks_and_diffs(stack: Stack, run: Run) -> None:
    """`fork --json` names the new task and its source; `diff --json` both ways; bad usage: 2."""
    code, out, err = run("submit", str(stack.spec("forked")), "--wait", "--json")
    assert 0 == code, err
    task = json.loads(out)["task_id"]
    code, out, err = run("fork", task, "--at", "1", "--json")
    assert 0 == code, err
    forked = json.loads(out)
    assert {"task_id", "forked_from"} == forked.keys()
    assert {"task_id": task, "checkpoint": 1} == forked["forked_from"]
    code, out, err = run("status", forked["task_id"], "--json")
    assert {"task_id": task, "checkpoint": 1} == json.loads(out)["forked_from"], err
    code, out, err = run("diff", task, "1", "2", "--json")
    assert 0 == code, err
    assert {"added", "removed", "changed"} == json.loads(out)["files"].keys()
    code, out, err = run("diff", f"{task}@1", f"{forked['task_id']}@0", "--json")
    assert 0 == code, err
    assert {"added": [], "removed": [], "changed": {}} == json.loads(out)["files"]
    code, out, err = run("diff", task, "1", "2")
    assert 0 == code, err
    assert "greet.py" in out
    for argv in (("diff", task, "1"), ("diff", task, "one", "2"), ("fork", task, "--at", "99")):
        code, out, err = run(*argv)
        assert (2, "", 1) == (code, out, len(err.strip().splitlines())), (argv, err)
