"""Approvals on a real redis-server: a decision holds for the one call a person saw.

A person decides through `record_decision`, what `cairn approve` and `Task.approve` call.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
import redis

from cairn.agents.approval import decide, decision_for
from cairn.agents.models.base import ModelReply, ModelRequest
from cairn.agents.models.openai import _parse_reply
from cairn.agents.spec import AgentSpec, TaskRecord
from cairn.agents.task import start_task
from cairn.coordinator.approvals import record_decision
from cairn.coordinator.restore import Restorer
from cairn.errors import InvalidSpec, RecordNotFound
from cairn.storage.records import AgentState, Role, ToolCall, Usage
from cairn.storage.store import CheckpointStore
from tests.agent_harness import files_of, superstep

WRITES = [
    ToolCall(id="call_0", name="write_file", args={"path": "notes.md", "content": "harmless"}),
    ToolCall(id="call_0", name="write_file", args={"path": "deploy.sh", "content": "curl x|sh"}),
]


class Writer:
    """A model on a server that numbers calls by their place: each turn's call is `call_0`."""

    def complete(self, request: ModelRequest) -> ModelReply:
        """Ask for the next write, then halt."""
        turn = sum(1 for m in request.messages if m.role is Role.ASSISTANT)
        if turn >= len(WRITES):
            return ModelReply(content="done", usage=Usage())
        return ModelReply(content=f"turn {turn}", usage=Usage(), tool_calls=[WRITES[turn]])


def start_writer(store: CheckpointStore, task: str) -> None:
    """Submit one agent whose every write waits for a person."""
    agent = AgentSpec(name="a", model="scripted", tools=["write_file"], approve=["write_file"])
    start_task(store, TaskRecord(task=task, goal="g", agents=[agent]), {"f": b"x"})


def step(store: CheckpointStore, task: str, cache: Path) -> AgentState:
    """Run one superstep of the writer; return its status after it."""
    gc = superstep(store, task, cache, lambda _: Writer())
    assert gc is not None
    return gc.statuses["a"]


def test_an_approval_does_not_approve_a_later_call_with_the_same_id(
    real_store: CheckpointStore, tmp_path: Path
) -> None:
    """Approving `call_0` (notes.md) lets that write run; the next turn's `call_0` waits."""
    cache = tmp_path / "cache"
    start_writer(real_store, "same-id")
    assert AgentState.WAITING_APPROVAL == step(real_store, "same-id", cache)
    decision = record_decision(real_store, "same-id", "a", None, approved=True)
    assert ("call_0", "notes.md") == (decision.call, decision.arguments["path"])
    assert AgentState.ACTIVE == step(real_store, "same-id", cache)  # wrote notes.md
    assert AgentState.WAITING_APPROVAL == step(real_store, "same-id", cache)
    assert superstep(real_store, "same-id", cache, lambda _: Writer()) is None  # still waits
    gc = real_store.latest_gc("same-id")
    assert gc is not None
    assert {"f", "notes.md"} == set(files_of(real_store, gc))
    decision = record_decision(real_store, "same-id", "a", None, approved=True)
    assert "deploy.sh" == decision.arguments["path"]  # what the person sees is what runs
    assert AgentState.ACTIVE == step(real_store, "same-id", cache)
    gc = real_store.latest_gc("same-id")
    assert gc is not None
    assert {"f", "notes.md", "deploy.sh"} == set(files_of(real_store, gc))


def test_a_decision_is_gone_once_its_call_ran(
    redis_client: redis.Redis, real_store: CheckpointStore, tmp_path: Path
) -> None:
    """The step that used a decision deletes it, from Redis and from the archive."""
    start_writer(real_store, "used")
    step(real_store, "used", tmp_path / "cache")
    record_decision(real_store, "used", "a", None, approved=True)
    assert redis_client.keys("*doc:approval-*")
    step(real_store, "used", tmp_path / "cache")
    assert [] == redis_client.keys("*doc:approval-*")
    assert [] == [p.name for p in (tmp_path / "archive").rglob("approval-*")]


def test_a_decision_holds_for_its_call_where_it_waits_and_nothing_else(
    real_store: CheckpointStore,
) -> None:
    """Another id, tool, argument or waiting LC finds no decision; only the call decided on."""
    start_writer(real_store, "bound")
    call = WRITES[0]
    decide(real_store, "bound", "a", "lc-1", call, approved=True)
    assert decision_for(real_store, "bound", "a", "lc-1", call) is not None
    others = [
        ("lc-1", call.model_copy(update={"id": "call_1"})),
        ("lc-1", call.model_copy(update={"name": "apply_patch"})),
        ("lc-1", WRITES[1]),  # same id, other arguments
        ("lc-2", call),  # the same call waiting elsewhere (after a restore, say)
    ]
    assert [None] * 4 == [decision_for(real_store, "bound", "a", at, c) for at, c in others]
    assert decision_for(real_store, "bound", "b", "lc-1", call) is None


def test_a_decision_does_not_outlive_a_restore(
    redis_client: redis.Redis, real_store: CheckpointStore, tmp_path: Path
) -> None:
    """Restored before its call ran, the agent waits again: a person is asked again."""
    start_writer(real_store, "restored")
    step(real_store, "restored", tmp_path / "cache")
    record_decision(real_store, "restored", "a", None, approved=True)
    Restorer(redis_client, real_store, workers=False).restore("restored", reason="asked")
    assert superstep(real_store, "restored", tmp_path / "cache", lambda _: Writer()) is None
    decision = record_decision(real_store, "restored", "a", None, approved=True)
    assert "notes.md" == decision.arguments["path"]
    assert AgentState.ACTIVE == step(real_store, "restored", tmp_path / "cache")


def test_a_person_may_decide_any_pending_call_of_the_turn(
    real_store: CheckpointStore, tmp_path: Path
) -> None:
    """`approve TASK AGENT CALL` names one pending call; an unknown one is refused."""
    start_writer(real_store, "named")
    step(real_store, "named", tmp_path / "cache")
    with pytest.raises(InvalidSpec, match="no pending call"):
        record_decision(real_store, "named", "a", "call_9", approved=True)
    decision = record_decision(real_store, "named", "a", "call_0", approved=False, reason="no")
    assert (False, "write_file") == (decision.approved, decision.tool)
    assert AgentState.ACTIVE == step(real_store, "named", tmp_path / "cache")
    gc = real_store.latest_gc("named")
    assert gc is not None
    state = real_store.read_state("named", "a", gc.members["a"].id)
    assert "error: rejected by a person: no" == state.messages[-1].content


def test_a_deleted_document_is_gone_from_redis_and_the_archive(store: CheckpointStore) -> None:
    """`delete_doc` (how a used decision goes) leaves nothing to read; twice is harmless."""
    start_writer(store, "docs")
    decision = decide(store, "docs", "a", "lc-1", WRITES[0], approved=True)
    name = "approval-gone"
    store.put_doc("docs", name, decision)
    store.delete_doc("docs", name)
    assert (None, None) == (store.hot.get_doc("docs", name), store.cold.get_doc("docs", name))
    with pytest.raises(RecordNotFound):
        store.read_doc("docs", name, type(decision))
    store.delete_doc("docs", name)


def test_calls_without_an_id_get_ids_no_other_call_has() -> None:
    """A server that sends no call ids: every call of every reply still gets its own."""
    call = {"function": {"name": "write_file", "arguments": '{"path": "a"}'}}
    body = orjson.dumps({"choices": [{"message": {"content": None, "tool_calls": [call, call]}}]})
    ids = [c.id for _ in range(2) for c in _parse_reply(body).tool_calls]
    assert 4 == len(set(ids))
