"""Agents' commands in the bubblewrap sandbox: what a hostile command tries, and fails to do.

Each attack is a scripted agent's `run_command`, run by a real step on a private
redis-server (in this process, or on real worker processes where the worker's own
environment is the point). The process cap, the file size cap and the sandbox's refusal
are checked with the sandbox's own runner too.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cairn.agents.sandbox import (
    MAX_PROCESSES,
    WORKDIR,
    CommandLimits,
    Sandbox,
    process_sandbox,
    sandbox_for,
)
from cairn.agents.spec import StepPolicy
from cairn.agents.task import start_task
from cairn.coordinator.settings import load_settings
from cairn.coordinator.spec import TaskSpec
from cairn.errors import InvalidSpec, MissingTool
from cairn.storage import keys
from cairn.storage.records import Role
from cairn.storage.store import CheckpointStore
from tests.agent_harness import drive, files_of, record, scripted
from tests.cluster import ROOT, Cluster, files_and_histories

CANARY = "canary-7f3e9b2d"  # a secret in no shape redaction knows: kept wherever it reaches


def run_commands(
    store: CheckpointStore, tmp_path: Path, task: str, *commands: str, network: bool = False
) -> tuple[list[str], dict[str, bytes]]:
    """One scripted agent runs `commands` in one turn; return their results and the files."""
    turn = {
        "say": "Trying.",
        "tools": [{"name": "run_command", "args": {"command": c}} for c in commands],
    }
    policy = StepPolicy(command_timeout=30.0, network=network)
    agent = scripted("agent", [turn])
    start_task(store, record(task, agent, policy=policy), {"README.md": b"hi\n"})
    gc = drive(store, task, tmp_path / "cache")
    state = store.read_state(task, "agent", gc.members["agent"].id)
    results = [
        str(t.result) if t.error is None else f"error: {t.error}"
        for t in state.trace
        if t.tool == "run_command"
    ]
    return results, files_of(store, gc)


def spec_running(name: str, command: str) -> TaskSpec:
    """A task of one scripted agent that runs `command`, then finishes."""
    return TaskSpec.model_validate({
        "name": name, "goal": "Run a command.",
        "agents": [{"name": "agent", "model": "scripted", "script": [{"say": "Running.", "tools": [
            {"name": "run_command", "args": {"command": command}},
            {"name": "finish", "args": {"summary": "done"}},
        ]}]}],
    })  # fmt: skip


def tool_results(cluster: Cluster, task: str) -> list[str]:
    """What the task's agent read back from its tools, in order."""
    _files, histories = files_and_histories(cluster, task)
    return [content or "" for role, content, _calls in histories["agent"] if role == Role.TOOL]


def processes_running(marker: str) -> list[int]:
    """The host's processes whose command line starts with `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue  # gone meanwhile
            if line.startswith(marker):
                found.append(int(entry.name))
    return found


@pytest.fixture
def listening() -> Iterator[int]:
    """A TCP server on 127.0.0.1 that accepts connections; yields its port."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.listen(8)
        yield server.getsockname()[1]


# the worker's secrets -----------------------------------------------------------------------
def test_a_command_sees_no_variable_of_its_worker(cluster: Cluster) -> None:
    """/proc/1/environ, /proc/$PPID/environ and `env` show only what Cairn gave the command.

    The worker holds secrets in its environment (a model's API key, anything else); the
    command reads every environment it can reach, and none shows one.
    """
    cluster.env.update({"CAIRN_SANDBOX": "bwrap", "OPENAI_API_KEY": CANARY, "MY_TOKEN": CANARY})
    cluster.start_worker()
    command = (
        "for f in /proc/1/environ /proc/$PPID/environ; do tr '\\0' '\\n' < $f; done; echo ---; env"
    )
    task = cluster.tasks.submit(spec_running("snoop", command))
    status = cluster.drive(task, timeout=90)
    assert "succeeded" == status["status"], status
    [output, _finished] = tool_results(cluster, task)
    assert CANARY not in output
    names = set(re.findall(r"^([A-Z_]+)=", output.split("---", 1)[1], re.MULTILINE))
    assert {"CAIRN_IDEMPOTENCY_KEY", "HOME", "PATH", "PWD", "PYTHONDONTWRITEBYTECODE"} <= names
    assert names <= {"CAIRN_IDEMPOTENCY_KEY", "HOME", "PATH", "PWD", "PYTHONDONTWRITEBYTECODE",
                     "LANG", "LC_ALL", "TZ"}  # fmt: skip
    assert f"HOME={WORKDIR}" in output


# the file system ----------------------------------------------------------------------------
def test_a_command_writes_nowhere_but_the_workspace(
    real_store: CheckpointStore, tmp_path: Path
) -> None:
    """Writes to the host, Cairn's cache or the repository fail; the workspace takes them.

    A hard link to a file outside the workspace fails too (another mount: EXDEV), so no
    write through the workspace can reach a host file.
    """
    outside = tmp_path / "outside.txt"
    cache = tmp_path / "cache"
    results, files = run_commands(
        real_store, tmp_path, "writes",
        f"echo x > {outside}; echo x > {cache}/escaped; echo x > {ROOT}/escaped; "
        "echo x > /usr/escaped; echo x > /etc/escaped; echo x > /escaped; echo x > ~/mine",
        "ln /etc/passwd pw; ln /usr/bin/env env-link",
        f"ls {ROOT} {cache} /home 2>&1; ls -A /root 2>/dev/null",
    )  # fmt: skip
    assert not outside.exists()
    assert not (ROOT / "escaped").exists()
    assert not list(cache.rglob("escaped"))
    assert not any(Path(p).exists() for p in ("/usr/escaped", "/etc/escaped", "/escaped"))
    assert b"x\n" == files["mine"]  # HOME is the workspace
    assert "pw" not in files
    assert "env-link" not in files
    assert 2 == results[1].count("Invalid cross-device link"), results[1]
    listing = results[2]
    assert 3 == listing.count("No such file or directory"), listing  # none is in the sandbox
    python = Path(sys.base_prefix).resolve()  # the one thing of /root it may show
    shown = {python.relative_to("/root").parts[0]} if python.is_relative_to("/root") else set()
    assert set(listing.split("\n")[-2:]) <= {"", *shown}


# processes ----------------------------------------------------------------------------------
def test_nothing_a_command_starts_outlives_it(real_store: CheckpointStore, tmp_path: Path) -> None:
    """`setsid`, `nohup` and a double fork leave no process behind once the command returns."""
    results, _files = run_commands(
        real_store, tmp_path, "linger",
        "setsid sleep 40.3141 > /dev/null 2>&1 & nohup sleep 40.3142 > /dev/null 2>&1 & "
        "(sleep 40.3143 > /dev/null 2>&1 &); echo started",
    )  # fmt: skip
    assert "exit code 0\nstarted\n" == results[0]
    assert [] == processes_running("sleep 40.314")


def test_a_command_dies_with_its_worker(cluster: Cluster) -> None:
    """A worker SIGKILLed while its command runs leaves no process of the command behind."""
    cluster.env["CAIRN_SANDBOX"] = "bwrap"
    worker = cluster.start_worker()
    cluster.tasks.submit(spec_running("orphan", "setsid sleep 40.2718 & sleep 40.2718"))
    cluster.tick_until(lambda: len(processes_running("sleep 40.2718")) == 2, timeout=60)
    worker.kill()
    worker.wait()
    deadline = time.monotonic() + 30  # the kernel ends the sandbox as its parent dies
    while processes_running("sleep 40.2718") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [] == processes_running("sleep 40.2718")


def test_a_fork_bomb_stops_at_the_process_cap(real_store: CheckpointStore, tmp_path: Path) -> None:
    """A command forking without end gets EAGAIN below `MAX_PROCESSES`; the step goes on."""
    bomb = (
        "python3 -c 'import os, time\n"
        "n = 0\n"
        f"while n < {MAX_PROCESSES + 50}:\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError as exc:\n"
        '        print("stopped at", n, exc.errno)\n'
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(5)\n"
        "        os._exit(0)\n"
        "    n += 1\n"
        "else:\n"
        '    print("forked", n)\n'
        "'"
    )
    results, _files = run_commands(real_store, tmp_path, "bomb", bomb, "echo after")
    found = re.search(r"stopped at (\d+) 11$", results[0], re.MULTILINE)  # 11: EAGAIN
    assert found is not None, results[0]
    assert int(found.group(1)) < MAX_PROCESSES
    assert "exit code 0\nafter\n" == results[1]  # the next command runs as ever


def test_a_file_stops_growing_at_the_file_size_cap(tmp_path: Path) -> None:
    """A write past `CommandLimits.file_bytes` is cut there (SIGXFSZ), the file left at the cap."""
    workspace = tmp_path / "files"
    workspace.mkdir()
    limits = CommandLimits(30.0, 4_000, file_bytes=100_000)
    finished = process_sandbox().run("head -c 200000 /dev/zero > big", workspace, limits)
    assert 0 != finished.exit_code
    assert 100_000 == (workspace / "big").stat().st_size


# the network --------------------------------------------------------------------------------
def test_a_command_has_no_network_unless_the_spec_allows_it(
    real_store: CheckpointStore, tmp_path: Path, listening: int
) -> None:
    """A server on the worker's 127.0.0.1 is out of reach; with `network: true` it is reached."""
    connect = (
        "python3 -c 'import socket\n"
        "try:\n"
        f'    socket.create_connection(("127.0.0.1", {listening}), timeout=5)\n'
        '    print("connected")\n'
        "except OSError as exc:\n"
        '    print("unreachable", exc.errno)\n'
        "'"
    )
    closed, _ = run_commands(real_store, tmp_path / "closed", "closed", connect)
    opened, _ = run_commands(real_store, tmp_path / "opened", "opened", connect, network=True)
    assert closed[0].startswith("exit code 0\nunreachable"), closed
    assert "exit code 0\nconnected\n" == opened[0]
    spec = {
        "name": "n",
        "goal": "g",
        "network": True,
        "agents": [{"name": "a", "model": "scripted"}],
    }
    assert TaskSpec.model_validate(spec).policy().network


# a worker that cannot sandbox ---------------------------------------------------------------
def test_a_worker_without_bwrap_refuses_command_steps_saying_why(cluster: Cluster) -> None:
    """No bwrap on the worker's PATH: a step whose agent has run_command fails, saying why.

    It fails fatally, before its model is asked; the task's reason says why, and the
    worker said so as it started. Submitted while the worker is live, it is refused.
    """
    cluster.env.update({"CAIRN_SANDBOX": "bwrap", "PATH": str(cluster.tmp / "empty")})
    task = cluster.tasks.submit(spec_running("bare", "echo ran > ran.txt"))  # no worker yet
    cluster.start_worker()
    status = cluster.drive(task, timeout=90)
    assert "failed" == status["status"]
    reason = str(status["reason"])
    assert "\n" not in reason
    assert "MissingTool: worker" in reason
    assert "cannot sandbox commands (bwrap (bubblewrap) is not on PATH)" in reason
    assert "CAIRN_SANDBOX=off" in reason
    outcome = cluster.client.hget(keys.outcomes(task, 1, 1), "agent")
    assert outcome is not None
    assert b'"kind": "missing"' in outcome
    assert cluster.store.hot.get_votes(task, 1, 1) == {}  # no step ran, no model was asked
    log = (cluster.tmp / "worker-0.log").read_text()
    assert "cairn worker: warning: worker" in log
    assert "cannot sandbox commands" in log
    with pytest.raises(InvalidSpec, match=r"names tool 'run_command', which no live worker "
                       r"has: worker \S+ cannot sandbox commands"):  # fmt: skip
        cluster.tasks.submit(spec_running("bare", "echo ran > ran.txt"))


def test_a_worker_opted_out_runs_commands_unsandboxed_and_says_so(cluster: Cluster) -> None:
    """`CAIRN_SANDBOX=off`: without bwrap, commands run (bare); the worker warned at its start."""
    cluster.env.update({"CAIRN_SANDBOX": "off", "PATH": str(cluster.tmp / "empty")})
    cluster.start_worker()
    task = cluster.tasks.submit(spec_running("opted-out", "echo ran > ran.txt"))
    status = cluster.drive(task, timeout=90)
    assert "succeeded" == status["status"], status
    files, _histories = files_and_histories(cluster, task)
    assert b"ran\n" == files["ran.txt"]
    log = (cluster.tmp / "worker-0.log").read_text()
    assert "cairn worker: warning: CAIRN_SANDBOX=off: agents' commands run unsandboxed" in log


def test_the_sandbox_setting_takes_bwrap_or_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """`CAIRN_SANDBOX` is `bwrap` unless set; another value is a one-line error naming it."""
    monkeypatch.delenv("CAIRN_SANDBOX", raising=False)
    assert "bwrap" == load_settings().sandbox
    monkeypatch.setenv("CAIRN_SANDBOX", "none")
    with pytest.raises(InvalidSpec, match=r"^invalid setting CAIRN_SANDBOX: .*'bwrap' or 'off'$"):
        load_settings()


def test_a_refusing_sandbox_runs_nothing(tmp_path: Path) -> None:
    """A sandbox that cannot run refuses every command with its reason, and runs none."""
    refusing = sandbox_for("bwrap", str(tmp_path))  # no bwrap there
    assert "refused" == refusing.mode
    with pytest.raises(MissingTool, match=r"cannot sandbox commands \(bwrap"):
        refusing.run(f"touch {tmp_path}/ran", tmp_path, CommandLimits(5.0, 1_000))
    assert not (tmp_path / "ran").exists()
    assert isinstance(process_sandbox(), Sandbox)
    assert "bwrap" == process_sandbox().mode  # this machine sandboxes: the suite relies on it
    assert os.geteuid() != 0 or process_sandbox().privileged
