"""The step runtime end to end on a real redis-server: models, tools, workspace, resume."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from structlog.contextvars import merge_contextvars
from structlog.testing import capture_logs

from cairn.agents.barrier import build_gc
from cairn.agents.models.scripted import ScriptedModel
from cairn.agents.spec import AgentSpec, CheckpointTriggers, StepPolicy
from cairn.agents.step import FIRST_BEAT_MS, run_step
from cairn.agents.task import start_task
from cairn.agents.tools import idempotency_key
from cairn.coordinator.approvals import record_decision
from cairn.errors import FencedWrite, InvalidSpec, ModelError
from cairn.storage.records import AgentState, Role
from cairn.storage.store import CheckpointStore
from cairn.testing.redis_server import RedisServer
from tests.agent_harness import drive, files_of, record, scripted, superstep

CALC = "def add(a, b):\n    return a - b\n"
TEST = "from calc import add\nassert add(2, 3) == 5, add(2, 3)\nprint('ok')\n"
FIX = """\
--- a/calc.py
+++ b/calc.py
@@ -1,2 +1,2 @@
 def add(a, b):
-    return a - b
+    return a + b
"""


def coding_script() -> list[dict[str, object]]:
    """Twenty turns: look around, see the test fail, patch, see it pass, document, finish."""
    turns: list[dict[str, object]] = [
        {"say": "Let me look.", "tools": [{"name": "list_files", "args": {}}]},
        {"tools": [{"name": "read_file", "args": {"path": "calc.py"}}]},
        {"tools": [{"name": "read_file", "args": {"path": "test_calc.py"}}]},
        {"tools": [{"name": "run_command", "args": {"command": "python3 -B test_calc.py"}}]},
        {"say": "add subtracts.", "tools": [{"name": "apply_patch", "args": {"patch": FIX}}]},
        {"tools": [{"name": "run_command", "args": {"command": "python3 -B test_calc.py"}}]},
    ]
    notes = [{"path": f"docs/note_{i}.md", "content": f"note {i}\n"} for i in range(12)]
    turns += [{"tools": [{"name": "write_file", "args": note}]} for note in notes]
    turns.append(
        {"tools": [{"name": "write_file", "args": {"path": "README.md", "content": "# calc\n"}}]}
    )
    turns.append({"say": "Done.", "tools": [{"name": "finish", "args": {"summary": "fixed add"}}]})
    return turns


def test_twenty_step_coding_task_ends_with_the_expected_files(
    real_store: CheckpointStore, tmp_path: Path
) -> None:
    """One scripted agent fixes a bug in 20 steps; the final GC holds the expected files."""
    start_task(
        real_store,
        record("calc", scripted("coder", coding_script())),
        {"calc.py": CALC.encode(), "test_calc.py": TEST.encode()},
    )
    gc = drive(real_store, "calc", tmp_path / "cache")
    assert 20 == gc.superstep
    files = files_of(real_store, gc)
    assert b"    return a + b\n" in files["calc.py"]
    assert {f"docs/note_{i}.md" for i in range(12)} | {
        "README.md",
        "calc.py",
        "test_calc.py",
    } == set(files)
    state = real_store.read_state("calc", "coder", gc.members["coder"].id)
    assert AgentState.FINISHED == state.status
    results = [m.content or "" for m in state.messages if m.role is Role.TOOL]
    assert results[3].startswith("exit code 1")
    assert "AssertionError" in results[3]
    assert results[5] == "exit code 0\nok\n"
    assert 20 == state.step
    assert 20 == len([r for r in state.trace if r.tool is None])  # one model call per step


CRASHER = """
import sys
from pathlib import Path
from cairn.agents.spec import AgentSpec
from cairn.agents.models.scripted import ScriptedModel
from cairn.agents.sandbox import UNSANDBOXED, use_sandbox
from cairn.agents.step import FIRST_BEAT_MS, run_step
from cairn.storage.backends.disk import DiskArchive
from cairn.storage.backends.redis import RedisHotStore, connect
from cairn.storage.codec import Codec
from cairn.storage.store import CheckpointStore
from cairn.testing.faults import install_fault_hook

url, archive, cache, log, task, agent, superstep, attempt = sys.argv[1:9]
# Its commands stand for the world outside: they write a ledger beside the workspace, or
# kill this process, which a sandboxed command cannot.
use_sandbox(UNSANDBOXED)
install_fault_hook()  # a scripted crash kills this process
store = CheckpointStore(RedisHotStore(connect(url)), DiskArchive(archive), Codec())

def models(spec: AgentSpec) -> ScriptedModel:
    def on_call(turn: int) -> None:
        with open(log, "a") as f:
            f.write(f"{spec.name} {turn} attempt {attempt}\\n")
    return ScriptedModel(spec.script, on_call=on_call)

epoch = store.hot.get_epoch(task)
result = run_step(
    task, agent, int(superstep), epoch, int(attempt), store=store, cache=Path(cache), models=models
)
print(result.status.value, flush=True)
"""


def crash_script(ledger: Path, crash: bool) -> list[dict[str, object]]:
    """A turn of four tools; with `crash`, attempt 1 dies while the fourth is starting."""
    first: dict[str, object] = {
        "say": "Working.",
        "tools": [
            {"name": "write_file", "args": {"path": "a.txt", "content": "alpha\n"}},
            {"name": "run_command", "args": {"command": f"echo c1 >> {ledger}"}},
            {"name": "read_file", "args": {"path": "a.txt"}},
            {
                "name": "run_command",
                "args": {"command": f"echo c2 >> {ledger} && echo beta > b.txt"},
            },
        ],
    }
    if crash:
        first["crash"] = {"attempts": [1], "after_tools": 3}
    return [
        first,
        {
            "say": "Next.",
            "tools": [{"name": "write_file", "args": {"path": "c.txt", "content": "gamma\n"}}],
        },
    ]


def run_in_process(
    server: RedisServer,
    archive: Path,
    cache: Path,
    log: Path,
    task: str,
    superstep: int,
    attempt: int,
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.run(
        [sys.executable, "-c", CRASHER, server.url, str(archive), str(cache), str(log),
         task, "coder", str(superstep), str(attempt)],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip


def test_sigkill_mid_step_then_retry_gives_the_fault_free_result(
    own_redis: RedisServer, own_store: CheckpointStore, tmp_path: Path
) -> None:
    """A worker killed mid-step: the retry resumes; each model turn and each done tool ran once."""
    kills = 0
    store = own_store
    outcomes = {}
    for task, crash in (("clean", False), ("crashy", True)):
        ledger, log = tmp_path / f"{task}.ledger", tmp_path / f"{task}.log"
        start_task(
            store,
            record(task, scripted("coder", crash_script(ledger, crash))),
            {"README.md": b"hi\n"},
        )
        for s in (1, 2):
            store.hot.begin_attempt(task, "coder", s, 1)
            first = run_in_process(
                own_redis, tmp_path / "archive", tmp_path / f"cache-{task}", log, task, s, 1
            )
            if first.returncode == -signal.SIGKILL:
                assert crash
                assert s == 1
                kills += 1
                store.hot.begin_attempt(task, "coder", s, 2)  # the coordinator's retry
                second = run_in_process(
                    own_redis,
                    tmp_path / "archive",
                    tmp_path / "cache-other-worker",
                    log,
                    task,
                    s,
                    2,
                )
                assert 0 == second.returncode, second.stderr
            else:
                assert 0 == first.returncode, first.stderr
            gc = store.latest_gc(task)
            assert gc is not None
            vote = store.hot.get_votes(task, 1, s)
            barrier = build_gc(
                store, gc, vote, ["coder"], number=gc.number + 1, superstep=s, epoch=1
            )
            store.commit_gc(barrier.gc)
        gc = store.latest_gc(task)
        assert gc is not None
        state = store.read_state(task, "coder", gc.members["coder"].id)
        history = [m.model_dump_json().replace(str(ledger), "LEDGER") for m in state.messages]
        outcomes[task] = (files_of(store, gc), history, ledger.read_text(), log.read_text())
    assert 1 == kills
    clean, crashy = outcomes["clean"], outcomes["crashy"]
    assert clean[0] == crashy[0]  # same files
    assert clean[1] == crashy[1]  # same history, message for message
    assert "c1\nc2\n" == clean[2] == crashy[2]  # each command ran exactly once
    assert ["coder 0 attempt 1", "coder 1 attempt 1"] == clean[3].splitlines()
    # The retry did not ask the model for turn 0 again.
    assert ["coder 0 attempt 1", "coder 1 attempt 1"] == crashy[3].splitlines()


def test_model_reply_trigger_saves_the_model_call(
    own_redis: RedisServer, own_store: CheckpointStore, tmp_path: Path
) -> None:
    """With model_reply, a worker killed before its first tool retries without a model call."""
    store = own_store
    turns = [{"say": "hi", "tools": [{"name": "read_file", "args": {"path": "README.md"}}],
              "crash": {"attempts": [1], "after_tools": 0}}]  # fmt: skip
    policy = StepPolicy(triggers=CheckpointTriggers(model_reply=True, tool_call="none"))
    start_task(store, record("trig", scripted("coder", turns), policy=policy), {"README.md": b"x"})
    log = tmp_path / "calls.log"
    store.hot.begin_attempt("trig", "coder", 1, 1)
    first = run_in_process(own_redis, tmp_path / "archive", tmp_path / "c1", log, "trig", 1, 1)
    assert -signal.SIGKILL == first.returncode
    store.hot.begin_attempt("trig", "coder", 1, 2)
    second = run_in_process(own_redis, tmp_path / "archive", tmp_path / "c2", log, "trig", 1, 2)
    assert 0 == second.returncode, second.stderr
    assert ["coder 0 attempt 1"] == log.read_text().splitlines()
    state = store.read_state("trig", "coder", store.hot.get_votes("trig", 1, 1)["coder"].id)
    assert "x" == state.messages[-1].content


def test_zombie_attempt_is_fenced_before_it_calls_the_model(
    real_store: CheckpointStore, tmp_path: Path
) -> None:
    """A stale attempt or epoch is refused up front, with no model call; a stale superstep too."""
    start_task(real_store, record("fence", scripted("coder", [{"say": "x"}])), {})
    real_store.hot.begin_attempt("fence", "coder", 1, 2)
    calls: list[int] = []

    def models(spec: AgentSpec) -> ScriptedModel:
        return ScriptedModel(spec.script, on_call=calls.append)

    with pytest.raises(FencedWrite, match="stale attempt"):
        run_step("fence", "coder", 1, 1, 1, store=real_store, cache=tmp_path, models=models)
    with pytest.raises(FencedWrite, match="stale epoch"):
        run_step("fence", "coder", 1, 7, 2, store=real_store, cache=tmp_path, models=models)
    assert [] == calls  # fenced before the model was paid for
    assert {} == real_store.hot.get_votes("fence", 1, 1)  # none of it wrote anything
    current = run_step("fence", "coder", 1, 1, 2, store=real_store, cache=tmp_path)
    assert {"coder": current.lc} == real_store.hot.get_votes("fence", 1, 1)
    real_store.hot.begin_attempt("fence", "coder", 3, 1)
    with pytest.raises(FencedWrite, match="does not follow"):
        run_step("fence", "coder", 3, 1, 1, store=real_store, cache=tmp_path)


@pytest.mark.parametrize(("error", "retryable"), [("retryable", True), ("fatal", False)])
def test_model_failure_is_typed_and_writes_nothing(
    real_store: CheckpointStore, tmp_path: Path, error: str, retryable: bool
) -> None:
    """A failing model turn raises ModelError with its kind; no LC, no vote."""
    turns = [{"say": "x", "fail": {"attempts": [1], "error": error, "message": "boom"}}]
    start_task(real_store, record("fail", scripted("coder", turns)), {})
    real_store.hot.begin_attempt("fail", "coder", 1, 1)
    with pytest.raises(ModelError, match="boom") as caught:
        run_step("fail", "coder", 1, 1, 1, store=real_store, cache=tmp_path)
    assert retryable == caught.value.retryable
    assert {} == real_store.hot.get_votes("fail", 1, 1)
    real_store.hot.begin_attempt("fail", "coder", 1, 2)
    assert (
        AgentState.HALTED
        == run_step("fail", "coder", 1, 1, 2, store=real_store, cache=tmp_path).status
    )


def test_approval_pauses_then_resumes(real_store: CheckpointStore, tmp_path: Path) -> None:
    """A tool needing approval waits; approved, it runs with no new model call; rejected, not."""
    calls: list[int] = []

    turns = [
        {"tools": [{"name": "run_command", "args": {"command": "echo deployed > out.txt"}}]},
        {"tools": [{"name": "run_command", "args": {"command": "echo again > out2.txt"}}]},
    ]
    start_task(real_store, record("ok", scripted("coder", turns, approve=["run_command"])), {})

    def models(spec: AgentSpec) -> ScriptedModel:
        return ScriptedModel(spec.script, on_call=calls.append)

    cache = tmp_path / "cache"
    gc = superstep(real_store, "ok", cache, models)
    assert gc is not None
    assert AgentState.WAITING_APPROVAL == gc.statuses["coder"]
    assert "out.txt" not in files_of(real_store, gc)
    assert superstep(real_store, "ok", cache, models) is None  # nobody decided: nothing runs
    record_decision(real_store, "ok", "coder", "call_0_0", approved=True)
    gc = superstep(real_store, "ok", cache, models)
    assert gc is not None
    assert b"deployed\n" == files_of(real_store, gc)["out.txt"]
    assert [0] == calls  # the approved call ran without asking the model again
    gc = superstep(real_store, "ok", cache, models)  # turn 1 asks for another command
    assert gc is not None
    record_decision(real_store, "ok", "coder", "call_1_0", approved=False, reason="not on a Friday")
    gc = superstep(real_store, "ok", cache, models)
    assert gc is not None
    state = real_store.read_state("ok", "coder", gc.members["coder"].id)
    assert "error: rejected by a person: not on a Friday" == state.messages[-1].content
    assert "out2.txt" not in files_of(real_store, gc)


def test_messages_are_delivered_at_the_barrier_and_conflicts_reported(
    real_store: CheckpointStore, tmp_path: Path
) -> None:
    """Messages arrive next superstep; two writers of a path: the later wins, the other is told."""
    planner = scripted("planner", [
        {"tools": [{"name": "send_message", "args": {"to": "coder", "content": "fix calc.py"}},
                   {"name": "write_file", "args": {"path": "plan.md", "content": "plan A\n"}}]},
    ])  # fmt: skip
    coder = scripted("coder", [
        {"tools": [{"name": "write_file", "args": {"path": "plan.md", "content": "plan B\n"}}]},
        {"say": "on it"},
    ])  # fmt: skip
    start_task(real_store, record("team", planner, coder), {})
    cache = tmp_path / "cache"
    gc = superstep(real_store, "team", cache)
    assert gc is not None
    assert b"plan B\n" == files_of(real_store, gc)["plan.md"]
    assert [("coder", "fix calc.py"), ("planner", None)] == [
        (m.recipient, m.content if m.sender != "cairn" else None) for m in gc.inbox
    ]
    gc = superstep(real_store, "team", cache)
    assert gc is not None
    coder_state = real_store.read_state("team", "coder", gc.members["coder"].id)
    assert "Message from planner: fix calc.py" in [m.content for m in coder_state.messages]
    planner_state = real_store.read_state("team", "planner", gc.members["planner"].id)
    assert any(
        "Write conflict" in (m.content or "") and "plan.md" in (m.content or "")
        for m in planner_state.messages
    )
    assert [] == gc.inbox  # both read their messages


def test_a_gc_names_the_manifest_a_lone_writer_stored_else_the_merged_one(
    real_store: CheckpointStore, tmp_path: Path
) -> None:
    """Two writers: the barrier stores their merge; one: the manifest its LC write stored."""
    planner = scripted("planner", [
        {"tools": [{"name": "write_file", "args": {"path": "plan.md", "content": "plan\n"}}]},
        {"tools": [{"name": "write_file", "args": {"path": "plan.md", "content": "plan 2\n"}}]},
    ])  # fmt: skip
    coder = scripted("coder", [
        {"tools": [{"name": "write_file", "args": {"path": "calc.py", "content": "x = 1\n"}}]},
        {"say": "done"},
    ])  # fmt: skip
    start_task(real_store, record("team", planner, coder), {})
    cache = tmp_path / "cache"
    for files in ({"plan.md": b"plan\n"}, {"plan.md": b"plan 2\n"}):
        gc = superstep(real_store, "team", cache)
        assert gc is not None
        assert {**files, "calc.py": b"x = 1\n"} == files_of(real_store, gc)
        after = {
            real_store.read_lc("team", agent, ref.id).workspace_after
            for agent, ref in gc.members.items()
        }
        assert (gc.workspace in after) == (gc.superstep == 2)  # superstep 2: one writer


def test_logs_carry_the_step_context(real_store: CheckpointStore, tmp_path: Path) -> None:
    """Every event of a step names task, agent, superstep, epoch and attempt."""
    start_task(real_store, record("logs", scripted("coder", [{"say": "hi"}])), {})
    real_store.hot.begin_attempt("logs", "coder", 1, 1)
    with capture_logs(processors=[merge_contextvars]) as logs:
        run_step("logs", "coder", 1, 1, 1, store=real_store, cache=tmp_path)
    done = [e for e in logs if e["event"] == "step done"]
    assert 1 == len(done)
    assert ("logs", "coder", 1, 1, 1) == tuple(
        done[0][k] for k in ("task", "agent", "superstep", "epoch", "attempt")
    )


def test_bad_workspace_paths_are_refused_at_start(real_store: CheckpointStore) -> None:
    """An initial file outside the workspace is an invalid spec, and nothing is stored."""
    with pytest.raises(InvalidSpec, match="leaves the workspace"):
        start_task(real_store, record("bad", scripted("coder", [])), {"../x": b""})
    assert 0 == real_store.hot.get_epoch("bad")


def test_heartbeat_is_alive_while_the_step_runs(
    real_store: CheckpointStore, tmp_path: Path
) -> None:
    """During a slow model turn the step's heartbeat key is there, naming this process."""
    policy = StepPolicy(heartbeat_ms=100)
    start_task(
        real_store,
        record("hb", scripted("coder", [{"say": "x", "latency": 1.0}]), policy=policy),
        {},
    )
    real_store.hot.begin_attempt("hb", "coder", 1, 1)
    seen: list[str | None] = []

    def watch() -> None:
        for _ in range(8):
            seen.append(real_store.hot.beating("hb", "coder"))
            time.sleep(0.1)

    watcher = threading.Thread(target=watch)
    watcher.start()
    run_step("hb", "coder", 1, 1, 1, store=real_store, cache=tmp_path)
    watcher.join()
    token = f"{socket.gethostname()}:{os.getpid()}:1:1:1"  # epoch, superstep, attempt
    assert all(token == beat for beat in seen[1:7]), seen


def test_heartbeat_outlives_the_first_beat_of_a_long_step(
    real_store: CheckpointStore, tmp_path: Path
) -> None:
    """A step longer than its first beat's TTL keeps beating: the key never lapses.

    The first beat (sent with the step's start) lives `FIRST_BEAT_MS`; after that only the
    heartbeat thread's renewals keep the key, each living three intervals.
    """
    policy = StepPolicy(heartbeat_ms=100)
    latency = FIRST_BEAT_MS / 1000 + 1.0
    turn = {"say": "x", "latency": latency}
    start_task(real_store, record("long", scripted("coder", [turn]), policy=policy), {})
    real_store.hot.begin_attempt("long", "coder", 1, 1)
    seen: list[str | None] = []
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.1):
            seen.append(real_store.hot.beating("long", "coder"))

    watcher = threading.Thread(target=watch)
    watcher.start()
    started = time.monotonic()
    try:
        run_step("long", "coder", 1, 1, 1, store=real_store, cache=tmp_path)
    finally:
        done.set()
        watcher.join()
    assert time.monotonic() - started >= latency
    token = f"{socket.gethostname()}:{os.getpid()}:1:1:1"  # epoch, superstep, attempt
    during = seen[1:-2]  # the first and last looks may fall just outside the step
    assert [token] * len(during) == during


def test_a_rerun_tool_gets_the_same_idempotency_key(
    own_redis: RedisServer, own_store: CheckpointStore, tmp_path: Path
) -> None:
    """Killed after its last command ran, the step's retry runs it again with the same key.

    The key holds the call's place in its turn: the retry resumes with one call pending,
    and that call still gets index 2, not 0. Its first call, the same command, gets 0.
    """
    ledger, log = tmp_path / "ledger", tmp_path / "log"
    command = f'echo "$CAIRN_IDEMPOTENCY_KEY" >> {ledger}'
    record_key = {"name": "run_command", "args": {"command": command}}
    turn = {
        "say": "Working.",
        "tools": [record_key, {"name": "write_file", "args": {"path": "a", "content": "a"}},
                  record_key],
        "crash": {"attempts": [1], "after_tools": 3},  # all three ran; no step LC yet
    }  # fmt: skip
    start_task(own_store, record("keyed", scripted("coder", [turn])), {"README.md": b"hi\n"})
    own_store.hot.begin_attempt("keyed", "coder", 1, 1)
    first = run_in_process(own_redis, tmp_path / "archive", tmp_path / "c1", log, "keyed", 1, 1)
    assert -signal.SIGKILL == first.returncode
    own_store.hot.begin_attempt("keyed", "coder", 1, 2)
    second = run_in_process(own_redis, tmp_path / "archive", tmp_path / "c2", log, "keyed", 1, 2)
    assert 0 == second.returncode, second.stderr
    # At-least-once without the key: the last command ran twice, under one key.
    at_0, at_2 = (
        idempotency_key("keyed", "coder", 1, index, "run_command", {"command": command})
        for index in (0, 2)
    )
    assert [at_0, at_2, at_2] == ledger.read_text().split()
    vote = own_store.hot.get_votes("keyed", 1, 1)["coder"]
    state = own_store.read_state("keyed", "coder", vote.id, vote.checksum)
    keys = [(r.tool, r.idempotency_key) for r in state.trace if r.tool is not None]
    # The trace names the key of external calls; a write's effect is the step's own.
    assert [("run_command", at_0), ("write_file", None), ("run_command", at_2)] == keys
