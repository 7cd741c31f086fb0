"""Tool-level checkpoints on a real redis-server: what a worker killed mid-step repeats.

A step takes a tool-level LC before each tool with external effects (`run_command`) and
before any tool that follows one. A retry resumes from the latest of them, so a kill costs
at most the tool it interrupted: never the model turn again, never a finished command.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from cairn.agents.task import start_task
from cairn.agents.tools import idempotency_key
from cairn.storage import keys
from cairn.storage.records import Role, sha256_hex
from cairn.storage.store import CheckpointStore
from cairn.testing.redis_server import RedisServer
from tests.agent_harness import record, scripted, superstep
from tests.test_step import run_in_process


def run_killed_step(
    server: RedisServer, store: CheckpointStore, tmp_path: Path, task: str
) -> list[str]:
    """Run superstep 1 of `task`'s coder as attempt 1 (which must die) then attempt 2.

    Each attempt runs in a process of its own with a cache of its own, as on two workers.
    Returns the model calls both made, one `"coder TURN attempt N"` line each.
    """
    log = tmp_path / f"{task}.calls"
    archive = tmp_path / "archive"
    store.hot.begin_attempt(task, "coder", 1, 1)
    first = run_in_process(server, archive, tmp_path / f"{task}-c1", log, task, 1, 1)
    assert -signal.SIGKILL == first.returncode, first.stderr
    store.hot.begin_attempt(task, "coder", 1, 2)  # the coordinator's retry
    second = run_in_process(server, archive, tmp_path / f"{task}-c2", log, task, 1, 2)
    assert 0 == second.returncode, second.stderr
    return log.read_text().splitlines()


def test_a_kill_right_after_the_first_command_does_not_pay_for_the_model_turn_again(
    own_redis: RedisServer, own_store: CheckpointStore, tmp_path: Path
) -> None:
    """The worker dies as its turn's first command ends: the retry asks the model nothing.

    The LC taken before that first `run_command` holds the model's reply, so the retry
    resumes from it: it re-runs only the interrupted command (with the same idempotency
    key), then the rest of the turn.
    """
    ledger, marker = tmp_path / "ledger", tmp_path / "killed-once"
    # The command does its work, then (the first time only) SIGKILLs the step's process.
    command = (
        f'echo "$CAIRN_IDEMPOTENCY_KEY" >> {ledger}; '
        f"if [ ! -e {marker} ]; then touch {marker}; kill -9 $PPID; sleep 1; fi"
    )
    turn = {
        "say": "Working.",
        "tools": [
            {"name": "read_file", "args": {"path": "README.md"}},
            {"name": "run_command", "args": {"command": command}},
            {"name": "write_file", "args": {"path": "done.txt", "content": "done\n"}},
        ],
    }
    start_task(own_store, record("first", scripted("coder", [turn])), {"README.md": b"hi\n"})
    calls = run_killed_step(own_redis, own_store, tmp_path, "first")
    assert ["coder 0 attempt 1"] == calls  # the retry took no model turn
    # At least once: the interrupted command ran again, under the same key.
    key = idempotency_key("first", "coder", 1, 1, "run_command", {"command": command})
    assert [key, key] == ledger.read_text().split()
    vote = own_store.hot.get_votes("first", 1, 1)["coder"]
    state = own_store.read_state("first", "coder", vote.id, vote.checksum)
    assert [Role.ASSISTANT, Role.TOOL, Role.TOOL, Role.TOOL] == [
        m.role for m in state.messages if m.role in (Role.ASSISTANT, Role.TOOL)
    ]
    assert "wrote 5 bytes to done.txt" == state.messages[-1].content


def test_a_finished_command_is_not_run_again_after_a_kill_in_the_next_tool(
    own_redis: RedisServer, own_store: CheckpointStore, tmp_path: Path
) -> None:
    """Killed during the tool after a finished `run_command`: the retry does not repeat it.

    The next tool (a read, with no effects of its own) gets a tool-level LC because a
    command ran before it. The command ignores its idempotency key, as ordinary commands
    do, so only that LC keeps it from running twice.
    """
    ledger = tmp_path / "ledger"
    turn = {
        "say": "Working.",
        "tools": [
            {"name": "run_command", "args": {"command": f"echo ran >> {ledger}"}},
            {"name": "read_file", "args": {"path": "README.md"}},
        ],
        "crash": {"attempts": [1], "after_tools": 1},  # dies as the read starts
    }
    start_task(own_store, record("after", scripted("coder", [turn])), {"README.md": b"hi\n"})
    calls = run_killed_step(own_redis, own_store, tmp_path, "after")
    assert ["ran"] == ledger.read_text().split()  # the command ran exactly once
    assert ["coder 0 attempt 1"] == calls
    vote = own_store.hot.get_votes("after", 1, 1)["coder"]
    state = own_store.read_state("after", "coder", vote.id, vote.checksum)
    results = [m.content for m in state.messages if m.role is Role.TOOL]
    assert ["exit code 0\n", "hi\n"] == results


def test_a_step_lc_stores_again_the_blobs_its_tool_lcs_stored(
    own_redis: RedisServer, own_store: CheckpointStore, tmp_path: Path
) -> None:
    """A file's blob is stored with the LC before a command, and again with the step's LC.

    So the LC a commit names and every blob it names land on one Redis. The command
    deletes that blob from Redis, as a write that went to a primary the connection then
    left (the Sentinels promoted another) would leave it: the GC of the superstep still
    reads the file back from Redis alone.
    """
    content = b"written before the command\n"
    blob = keys.blob("moved", sha256_hex(content))
    command = (
        f"{sys.executable} -c \"import redis; redis.Redis(port={own_redis.port}).delete('{blob}')\""
    )
    turn = {
        "say": "Write, then run.",
        "tools": [
            {"name": "write_file", "args": {"path": "notes.txt", "content": content.decode()}},
            {"name": "run_command", "args": {"command": command}},
        ],
    }
    start_task(own_store, record("moved", scripted("coder", [turn])), {"README.md": b"hi\n"})
    gc = superstep(own_store, "moved", tmp_path / "cache")
    assert gc is not None
    files = own_store.read_manifest("moved", gc.workspace).files
    assert own_store.hot.get_blob("moved", files["notes.txt"]) is not None  # in Redis again
    assert content == own_store.get_blob("moved", files["notes.txt"])
