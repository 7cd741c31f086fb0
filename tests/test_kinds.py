"""Agent kinds behind the step's protocol, on a real redis-server.

The protocol (fence, load, checkpoints, vote) is the same for every kind; a kind's own
state is JSON kept in every checkpoint. A counting kind shows the state carried from step
to step, stored and read back, and restored with a retry from a tool-level checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from pathlib import Path

import pytest
from pydantic import JsonValue

from cairn.agents import kinds, step
from cairn.agents.context import StepContext
from cairn.agents.kinds.llm import LLM
from cairn.agents.spec import AgentSpec
from cairn.agents.task import start_task
from cairn.errors import InvalidState
from cairn.storage.chain import WorkingState
from cairn.storage.records import AgentState
from cairn.storage.store import CheckpointStore
from tests.agent_harness import drive, record, scripted


@dataclass(frozen=True, slots=True)
class Counter:
    """Counts its steps in its own state, and finishes at three; a second checkpoint per step."""

    name: str = "counter"

    def initial_state(self, spec: AgentSpec) -> dict[str, JsonValue]:
        """Its state at the start."""
        return {"count": 0, "seen": [spec.name]}

    def step(self, ctx: StepContext) -> None:
        """One step."""
        count = ctx.state["count"]
        assert isinstance(count, int)
        ctx.state["count"] = count + 1
        ctx.checkpoint()  # a tool-level LC mid-step: its state is the count so far
        seen = ctx.state["seen"]
        assert isinstance(seen, list)
        seen.append(f"step {ctx.lc.step}")

    def status(self, ctx: StepContext) -> AgentState:
        """Where it stands."""
        count = ctx.state["count"]
        return AgentState.FINISHED if count == 3 else AgentState.ACTIVE


@pytest.fixture
def counting(monkeypatch: pytest.MonkeyPatch) -> Counter:
    """Every agent a `Counter` (the spec has no field to choose a kind yet)."""
    counter = Counter()
    monkeypatch.setattr(step, "kind_of", lambda spec, registry=None: counter)
    monkeypatch.setattr("cairn.agents.task.kind_of", lambda spec, registry=None: counter)
    return counter


def test_a_kind_state_is_carried_from_step_to_step_and_stored(
    counting: Counter, real_store: CheckpointStore, tmp_path: Path
) -> None:
    """Each step sees the state the last one left; every step LC stores it whole."""
    start_task(real_store, record("count", scripted("tally", [])), {"README.md": b"x\n"})
    gc = drive(real_store, "count", tmp_path / "cache")
    assert 3 == gc.superstep
    state = real_store.read_state("count", "tally", gc.members["tally"].id)
    assert AgentState.FINISHED == state.status
    assert {"count": 3, "seen": ["tally", "step 1", "step 2", "step 3"]} == state.kind_state


def test_an_llm_agent_keeps_no_state_and_stores_none(
    real_store: CheckpointStore, tmp_path: Path
) -> None:
    """The `llm` kind's state is empty, and an empty state is left out of the stored LC."""
    assert {} == LLM.initial_state(AgentSpec(name="x", model="scripted"))
    assert kinds.kind_of(AgentSpec(name="x", model="scripted")) is LLM
    start_task(real_store, record("plain", scripted("coder", [{"say": "hi"}])), {})
    gc = drive(real_store, "plain", tmp_path / "cache")
    ref = gc.members["coder"]
    raw = real_store.read_lc("plain", "coder", ref.id)
    assert {} == raw.kind_state
    assert "kind_state" not in raw.model_dump(exclude_defaults=False, mode="json")


@dataclass(frozen=True, slots=True)
class Interrupted:
    """Raises its count, checkpoints, then dies on attempt 1; a resumed step only reads."""

    name: str = "interrupted"

    def initial_state(self, spec: AgentSpec) -> dict[str, JsonValue]:
        """Its state at the start."""
        return {"count": 0}

    def step(self, ctx: StepContext) -> None:
        """One step."""
        if ctx.resumed:  # the tool-level LC holds what attempt 1 did before it died
            ctx.state["resumed_at"] = ctx.state["count"]
            return
        count = ctx.state["count"]
        assert isinstance(count, int)
        ctx.state["count"] = count + 1
        ctx.checkpoint()
        raise RuntimeError("the worker died here")

    def status(self, ctx: StepContext) -> AgentState:
        """Where it stands."""
        return AgentState.HALTED


def first_attempt(
    monkeypatch: pytest.MonkeyPatch, store: CheckpointStore, kind: object, task: str
) -> int:
    """Start `task` of one agent, `tally`, of `kind`; fence attempt 1 of its step 1; the epoch."""
    monkeypatch.setattr(step, "kind_of", lambda spec, registry=None: kind)
    monkeypatch.setattr("cairn.agents.task.kind_of", lambda spec, registry=None: kind)
    start_task(store, record(task, scripted("tally", [])), {})
    store.hot.begin_attempt(task, "tally", 1, 1)
    return store.hot.get_epoch(task)


def test_a_retry_resumes_from_the_kind_state_of_the_tool_level_checkpoint(
    monkeypatch: pytest.MonkeyPatch, real_store: CheckpointStore, tmp_path: Path
) -> None:
    """Attempt 1 raises the count and checkpoints, then dies; attempt 2 starts from there."""
    epoch = first_attempt(monkeypatch, real_store, Interrupted(), "mid")
    with pytest.raises(RuntimeError, match="died"):
        step.run_step("mid", "tally", 1, epoch, 1, store=real_store, cache=tmp_path / "c")
    real_store.hot.begin_attempt("mid", "tally", 1, 2)
    result = step.run_step("mid", "tally", 1, epoch, 2, store=real_store, cache=tmp_path / "c")
    assert result.resumed
    state: WorkingState = real_store.read_state("mid", "tally", result.lc.id, result.lc.checksum)
    assert {"count": 1, "resumed_at": 1} == state.kind_state
    copied = state.copy()
    copied.kind_state["count"] = 99
    assert 1 == state.kind_state["count"]  # a copy shares no JSON with its original


@dataclass(frozen=True, slots=True)
class Careless:
    """Keeps a date in its state, which no checkpoint can hold as JSON."""

    name: str = "careless"

    def initial_state(self, spec: AgentSpec) -> dict[str, JsonValue]:
        """Its state at the start."""
        return {}

    def step(self, ctx: StepContext) -> None:
        """One step."""
        ctx.state["plan"] = [{"when": date(2026, 12, 6)}]  # type: ignore[dict-item]

    def status(self, ctx: StepContext) -> AgentState:
        """Where it stands."""
        return AgentState.ACTIVE


def test_a_state_that_is_not_json_fails_the_step_naming_where(
    monkeypatch: pytest.MonkeyPatch, real_store: CheckpointStore, tmp_path: Path
) -> None:
    """`InvalidState` (fatal) names the path of the value; no LC, no vote is written."""
    epoch = first_attempt(monkeypatch, real_store, Careless(), "careless")
    with pytest.raises(
        InvalidState, match=r"state holds a value that is not JSON at plan\[0\].when"
    ):
        step.run_step("careless", "tally", 1, epoch, 1, store=real_store, cache=tmp_path / "c")
    assert {} == real_store.hot.get_votes("careless", epoch, 1)
