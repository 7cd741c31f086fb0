"""The smaller parts of the agents runtime: scripted model, policy, summary, heartbeat."""

from __future__ import annotations

import contextlib
import contextvars
import io
import json
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from cairn.agents import faults
from cairn.agents.cache import WorkerCache
from cairn.agents.heartbeat import Heartbeat
from cairn.agents.logs import configure_logging, get_logger
from cairn.agents.models.base import ModelRequest
from cairn.agents.models.scripted import FINISHED, ScriptedModel
from cairn.agents.spec import AgentSpec, TaskRecord, Turn, load_policy, parse_model
from cairn.agents.summary import context_summary
from cairn.errors import InvalidSpec, ModelError
from cairn.storage.backends.memory import MemoryHotStore
from cairn.storage.base import HotStore
from cairn.storage.chain import WorkingState
from cairn.storage.records import LCRef, Message, Role, ToolCall, TraceRecord

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def history(assistant_turns: int) -> list[Message]:
    msgs = [Message(role=Role.SYSTEM, content="s"), Message(role=Role.USER, content="goal")]
    msgs += [Message(role=Role.ASSISTANT, content=f"t{i}") for i in range(assistant_turns)]
    return msgs


SCRIPT = [
    Turn(say="look", tools=[{"name": "list_files", "args": {}}]),
    Turn(say="fail", fail={"attempts": [1, 2], "error": "fatal", "message": "bad key"}),
    Turn(say="crash", crash={"attempts": [1], "after_tools": 2}),
]


def test_scripted_turn_depends_only_on_the_history() -> None:
    """The turn played is the count of assistant messages; call ids follow the turn."""
    model = ScriptedModel(SCRIPT)
    first = model.complete(ModelRequest(history(0), []))
    again = model.complete(ModelRequest(history(0), [], attempt=3))
    assert first == again
    assert "look" == first.content
    assert [ToolCall(id="call_0_0", name="list_files")] == first.tool_calls


def test_scripted_failures_follow_the_attempt() -> None:
    """Fail raises on the listed attempts only, with its kind; crash arms the listed attempts."""
    model = ScriptedModel(SCRIPT)
    with pytest.raises(ModelError, match="bad key") as caught:
        model.complete(ModelRequest(history(1), [], attempt=2))
    assert not caught.value.retryable
    assert "fail" == model.complete(ModelRequest(history(1), [], attempt=3)).content
    armed = contextvars.copy_context()
    armed.run(model.complete, ModelRequest(history(2), [], attempt=1))
    assert faults.Crash(after_tools=2) == armed.get(faults._armed)
    spared = contextvars.copy_context()
    spared.run(model.complete, ModelRequest(history(2), [], attempt=2))
    assert spared.get(faults._armed) is None


def test_scripted_model_halts_past_its_script() -> None:
    """Past the last turn the model answers without tool calls."""
    reply = ScriptedModel(SCRIPT).complete(ModelRequest(history(3), []))
    assert (FINISHED, []) == (reply.content, reply.tool_calls)


def test_scripted_latency_is_slept() -> None:
    """A turn's latency is spent in the model."""
    slept: list[float] = []
    ScriptedModel([Turn(latency=0.25)], sleep=slept.append).complete(ModelRequest(history(0), []))
    assert [0.25] == slept


def test_policy_triggers_load_from_yaml() -> None:
    """Checkpoint triggers come from YAML; mistakes name the field."""
    policy = load_policy("triggers:\n  model_reply: true\n  tool_call: all\nfull_every: 5\n")
    assert policy.triggers.model_reply
    assert "all" == policy.triggers.tool_call
    assert 5 == policy.full_every
    with pytest.raises(InvalidSpec, match=r"triggers\.tool_call"):
        load_policy("triggers: {tool_call: sometimes}")
    with pytest.raises(InvalidSpec, match="invalid policy YAML"):
        load_policy("triggers: [")


@pytest.mark.parametrize(
    ("agent", "message"),
    [
        ({"name": "../x", "model": "scripted"}, "invalid agent name"),
        ({"name": "a", "model": "gpt"}, "scripted"),
        ({"name": "a", "model": "openai:"}, "scripted"),
        ({"name": "a", "model": "scripted", "tools": ["rm -rf /"]}, "is not a tool name"),
        (
            {"name": "a", "model": "scripted", "tools": ["read_file"], "approve": ["run_command"]},
            "does not have",
        ),
        ({"name": "a", "model": "scripted", "colour": "red"}, "colour"),
    ],
)
def test_invalid_agent_specs_name_the_field(agent: dict[str, object], message: str) -> None:
    """A bad agent spec is an InvalidSpec saying where and why."""
    with pytest.raises(InvalidSpec, match=message):
        parse_model(AgentSpec, agent, "agent")


def test_duplicate_agents_are_refused() -> None:
    """Two agents with one name make an invalid task."""
    with pytest.raises(InvalidSpec, match="unique"):
        parse_model(
            TaskRecord,
            {
                "task": "t",
                "goal": "g",
                "agents": [{"name": "a", "model": "scripted"}, {"name": "a", "model": "scripted"}],
            },
            "task",
        )


def test_context_summary_tells_what_was_done_and_where_to_go_on() -> None:
    """The summary names the reason, the steps with results, the files and the next move."""
    trace = [
        TraceRecord(step=1, superstep=1, started_at=T0, finished_at=T0, duration_ms=1),
        TraceRecord(step=1, superstep=1, tool="write_file", arguments={"path": "calc.py"},
                    result="wrote 10 bytes to calc.py", side_effect=True,
                    started_at=T0, finished_at=T0, duration_ms=1),
        TraceRecord(step=2, superstep=2, tool="run_command", arguments={"command": "pytest"},
                    error="command timed out after 60 s and was killed",
                    started_at=T0, finished_at=T0, duration_ms=1),
        TraceRecord(step=3, superstep=3, tool="apply_patch", arguments={"patch": "..."},
                    result="applied to a.py, b/c.py", side_effect=True,
                    started_at=T0, finished_at=T0, duration_ms=1),
        TraceRecord(step=3, superstep=3, tool="edit_file", arguments={"path": "d.py"},
                    result="replaced the text at line 3 of d.py",
                    started_at=T0, finished_at=T0, duration_ms=1),
    ]  # fmt: skip
    state = WorkingState(task="t", agent="coder", epoch=2, superstep=3, trace=trace,
                       messages=[Message(role=Role.ASSISTANT, content="Tests next.")])  # fmt: skip
    message = context_summary(state, "the reviewer's step failed 3 times", restored_to=4)
    text = message.content or ""
    assert Role.USER == message.role
    assert "checkpoint 4" in text
    assert "the reviewer's step failed 3 times" in text
    assert "step 1: write_file(calc.py) → wrote 10 bytes to calc.py" in text
    assert "step 2: run_command(pytest) failed: command timed out" in text
    assert "Files you changed: a.py, b/c.py, calc.py, d.py" in text
    assert "Tests next." in text
    assert "do not repeat" in text


def test_heartbeat_lives_while_entered_and_lapses_after() -> None:
    """The key is there from entry, is renewed past its TTL, and lapses once the step ends."""
    hot: HotStore = MemoryHotStore()
    with Heartbeat(hot, "t", "coder", "w:1:1", interval_ms=50):
        assert "w:1:1" == hot.beating("t", "coder")
        time.sleep(0.4)  # several TTLs: only renewals keep it
        assert "w:1:1" == hot.beating("t", "coder")
    time.sleep(0.3)
    assert hot.beating("t", "coder") is None


def test_the_heartbeats_of_many_steps_share_one_thread() -> None:
    """Entering a step's heartbeat starts no thread: one per process beats them all."""
    hot: HotStore = MemoryHotStore()
    agents = [f"a{i}" for i in range(20)]
    with contextlib.ExitStack() as beats:
        beats.enter_context(Heartbeat(hot, "t", agents[0], "w:1:1", interval_ms=50))
        threads = threading.active_count()
        for agent in agents[1:]:
            beats.enter_context(Heartbeat(hot, "t", agent, "w:1:1", interval_ms=50))
        assert threads == threading.active_count()
        time.sleep(0.4)  # several TTLs: only renewals keep the keys
        assert ["w:1:1"] * len(agents) == [hot.beating("t", agent) for agent in agents]


def test_json_log_lines_hold_any_value() -> None:
    """An integer past 64 bits (which orjson refuses) and any object (by its repr) are logged."""
    out = io.StringIO()
    configure_logging("json", "info", out)
    get_logger("tests").info("odd values", big=2**70, path=Path("/x"), text="é")
    get_logger("tests").info("plain", n=1)
    odd, plain = (json.loads(line) for line in out.getvalue().splitlines())
    assert (2**70, "PosixPath('/x')", "é") == (odd["big"], odd["path"], odd["text"])
    assert ("plain", 1, "info") == (plain["event"], plain["n"], plain["level"])


def test_worker_cache_hands_out_private_copies_of_exact_lcs() -> None:
    """A kept state comes back only for the same LC, and changing a copy changes nothing kept."""
    warm = WorkerCache()
    state = WorkingState(
        task="t", agent="a", epoch=1, messages=[Message(role=Role.USER, content="hi")]
    )
    ref = LCRef(id="lc-1", checksum="ab" * 32)
    warm.keep_state(state, ref)  # handed over: the step that wrote it changes it no more
    copy = warm.state("t", "a", ref)
    assert copy is not None
    assert 1 == len(copy.messages)
    copy.messages.append(Message(role=Role.USER, content="mutated"))
    again = warm.state("t", "a", ref)
    assert again is not None
    assert 1 == len(again.messages)
    assert warm.state("t", "a", LCRef(id="lc-1", checksum="cd" * 32)) is None
    assert warm.state("t", "b", ref) is None
