"""Other frameworks' agents as Cairn agent kinds (cairn.agents.adapters), on real workers.

Each adapted agent answers a feeder's questions over several supersteps, its model
Cairn's scripted one, so every model call of the framework goes through `ctx.converse`:
counted, traced, journaled. For each adapter: a run end to end; a worker killed in the
middle of a step (inside the framework's own tool) retries to the same end as a run
without the fault, paying for no model call twice; a restore to an earlier global
checkpoint rewinds the framework's own history with everything else.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage
from pydantic_ai import messages as pm
from pydantic_ai.tools import ToolDefinition

import cairn
from cairn.agents.models.base import ModelReply, ToolSchema
from cairn.storage.chain import WorkingState
from cairn.storage.records import Role, ToolCall, Usage
from tests import adapter_agents
from tests.cluster import Cluster

VARYING = frozenset({"timestamp", "request_timestamp", "duration", "run_id", "conversation_id"})
ANSWERS = ["Answer one.", "Answer two.", "Answer three."]


@dataclass(frozen=True)
class Adapted:
    """One adapter under test: its kind, and its framework's tool that notes."""

    kind: str
    framework: str
    tool: str

    def history(self, state: WorkingState) -> Any:
        """The framework's history the agent's state keeps, without what differs per run."""
        kept = own(state)["history"]
        if self.framework == "langgraph":
            return adapter_agents.graph_messages(kept)
        return steady(kept)


ADAPTERS = [
    Adapted("pydantic_helper", "pydantic_ai", "note_pydantic"),
    Adapted("sdk_helper", "openai_agents", "note_sdk"),
    Adapted("graph_helper", "langgraph", "note_graph"),
]


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """The world outside the workspace: the note ledger and the fault markers."""
    path = tmp_path / "outside"
    path.mkdir()
    return path


@pytest.fixture
def cluster(cluster: Cluster, outside: Path) -> Cluster:
    """The conftest cluster; its workers load the adapted agents as a user's module."""
    cluster.env.update({"CAIRN_TOOLS": "tests.adapter_agents", "ADAPTERS_DIR": str(outside)})
    return cluster


def team(adapted: Adapted, **fields: Any) -> cairn.Team:
    """The feeder and the adapted agent, whose scripted model notes the goal, then answers."""
    script = [
        {"tools": [{"name": adapted.tool, "args": {"text": "the goal"}}]},
        {"say": "Ready for questions."},
        *({"say": answer} for answer in ANSWERS),
    ]
    member = {"name": adapted.kind, "kind": adapted.kind, "model": "scripted", "script": script}
    feeder = adapter_agents.feeder.spec(tools=["send_message"])
    return cairn.Team("Answer the questions.", [feeder, member], **fields)


def run(cluster: Cluster, spec: cairn.TaskSpec, workers: int = 1) -> str:
    """Start the workers, submit, drive the task to its end; its id."""
    for _ in range(workers):
        cluster.start_worker()
    cluster.wait_for_workers(workers)
    task = cluster.tasks.submit(spec)
    cluster.drive(task, timeout=90)
    return task


def state_at(cluster: Cluster, task: str, agent: str, number: int | None = None) -> WorkingState:
    """The agent's state at the task's GC `number` (the latest when None)."""
    gc = cluster.store.latest_gc(task) if number is None else cluster.store.read_gc(task, number)
    assert gc is not None
    ref = gc.members[agent]
    return cluster.store.read_state(task, agent, ref.id, ref.checksum)


def steady(value: Any) -> Any:
    """A framework's history without what differs between two runs (times, run ids)."""
    if isinstance(value, dict):
        return {k: steady(v) for k, v in value.items() if k not in VARYING}
    if isinstance(value, list):
        return [steady(v) for v in value]
    return value


def own(state: WorkingState) -> dict[str, Any]:
    """The adapted agent's own state (`ctx.state`), as its last step left it."""
    kept = state.kind_state["state"]
    assert isinstance(kept, dict)
    return kept


def model_calls(state: WorkingState) -> list[object]:
    """What each model call of the agent's trace answered."""
    return [row.result for row in state.trace if row.tool is None]


def notes(outside: Path) -> list[str]:
    """The texts the frameworks' `note` tools recorded, in order."""
    path = outside / "ledger.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line)["text"] for line in lines]


@pytest.mark.parametrize("adapted", ADAPTERS, ids=lambda a: a.framework)
def test_an_adapted_agent_runs_its_framework_through_cairns_model(
    cluster: Cluster, outside: Path, adapted: Adapted
) -> None:
    """Each model call is traced with its usage; each run's output is kept; history grows."""
    task = run(cluster, team(adapted))
    status = cluster.status(task)
    assert "succeeded" == status["status"], (status, cluster.worker_logs())
    state = state_at(cluster, task, adapted.kind)
    assert [None, "Ready for questions.", *ANSWERS] == model_calls(state)
    calls = [row for row in state.trace if row.tool is None]
    assert all(row.usage is not None and row.usage.prompt_tokens > 0 for row in calls)
    assert "Answer three." == own(state)["output"]
    said = json.dumps(adapted.history(state))
    assert all(f"Question {n}?" in said for n in (1, 2, 3))
    assert all(answer in said for answer in ANSWERS)
    assert ["the goal"] == notes(outside)


@pytest.mark.parametrize("adapted", ADAPTERS, ids=lambda a: a.framework)
def test_a_worker_killed_in_the_frameworks_tool_retries_to_the_same_end(
    cluster: Cluster, outside: Path, adapted: Adapted
) -> None:
    """The model call before the kill is replayed from the journal; the tool runs again."""
    spec = team(adapted, checkpoints={"model_reply": True})
    clean = run(cluster, spec)
    (outside / "ledger.jsonl").unlink()
    (outside / f"die-{adapted.framework}").touch()
    faulted = run(cluster, spec, workers=2)  # one dies; the other takes the retry
    assert not (outside / f"die-{adapted.framework}").exists()  # the fault fired
    status = cluster.status(faulted)
    assert "succeeded" == status["status"], cluster.worker_logs()
    a, b = (state_at(cluster, task, adapted.kind) for task in (clean, faulted))
    assert adapted.history(a) == adapted.history(b)
    assert own(a)["output"] == own(b)["output"]
    assert model_calls(a) == model_calls(b)
    assert ["the goal", "the goal"] == notes(outside)  # the framework's own tool ran again
    [agent] = [row for row in status["agents"] if row["name"] == adapted.kind]  # type: ignore[attr-defined]
    assert 0 == agent["usage"]["replayed"]["prompt_tokens"]  # no model call paid twice


@pytest.mark.parametrize("adapted", ADAPTERS, ids=lambda a: a.framework)
def test_a_restore_rewinds_the_frameworks_own_history(cluster: Cluster, adapted: Adapted) -> None:
    """Restored to GC 2, the adapted agent's history is GC 2's; it ends as it did before."""
    task = run(cluster, team(adapted))
    ended = state_at(cluster, task, adapted.kind)
    at_two = state_at(cluster, task, adapted.kind, 2)
    assert len(adapted.history(at_two)) < len(adapted.history(ended))
    cluster.coordinator.restorer.restore(task, to=2)
    assert at_two.kind_state == state_at(cluster, task, adapted.kind).kind_state
    assert "succeeded" == cluster.drive(task, timeout=90)["status"], cluster.worker_logs()
    again = state_at(cluster, task, adapted.kind)
    assert adapted.history(ended) == adapted.history(again)
    assert own(ended)["output"] == own(again)["output"]
    assert model_calls(ended) == model_calls(again)[: len(model_calls(ended))]


def test_pydantic_ai_history_and_replies_convert_as_its_own_types_say() -> None:
    """PydanticAI's messages become chat messages; a reply its `ModelResponse`, usage kept."""
    convert = adapter_agents.pydantic_ai_adapter
    history: list[pm.ModelMessage] = [
        pm.ModelRequest(parts=[pm.SystemPromptPart("Be brief."), pm.UserPromptPart("Hi?")]),
        pm.ModelResponse(
            parts=[pm.TextPart("Looking."), pm.ToolCallPart("look", {"q": "x"}, "c1")]
        ),
        pm.ModelRequest(
            parts=[
                pm.ToolReturnPart("look", "found", "c1"),
                pm.ToolReturnPart("look", "bad args", "c2", outcome="retried"),
            ]
        ),
    ]
    sent = convert.to_messages(history, "Answer questions.")
    assert [
        (Role.SYSTEM, "Answer questions.", [], None),
        (Role.SYSTEM, "Be brief.", [], None),
        (Role.USER, "Hi?", [], None),
        (Role.ASSISTANT, "Looking.", [ToolCall(id="c1", name="look", args={"q": "x"})], None),
        (Role.TOOL, "found", [], "c1"),
    ] == [(m.role, m.content, m.tool_calls, m.tool_call_id) for m in sent[:5]]
    assert (Role.TOOL, "c2", True) == (sent[5].role, sent[5].tool_call_id, sent[5].error)
    assert "bad args" in (sent[5].content or "")
    tool = ToolDefinition(
        name="look", description="Look.", parameters_json_schema={"type": "object"}
    )
    assert [ToolSchema("look", "Look.", {"type": "object"})] == convert.to_schemas([tool])
    used = Usage(prompt_tokens=10, completion_tokens=3, cached_tokens=4)
    calls = [ToolCall(id="c3", name="look", args={"q": "y"})]
    response = convert.to_response(ModelReply("Again.", calls, used), "scripted")
    [text, call] = response.parts
    assert isinstance(text, pm.TextPart)
    assert "Again." == text.content
    assert isinstance(call, pm.ToolCallPart)
    assert ("look", {"q": "y"}, "c3") == (call.tool_name, call.args_as_dict(), call.tool_call_id)
    assert (10, 3, 4) == (
        response.usage.input_tokens,
        response.usage.output_tokens,
        response.usage.cache_read_tokens,
    )
    kept = pm.ModelMessagesTypeAdapter.dump_json([*history, response])  # what the state keeps
    assert [*history, response] == pm.ModelMessagesTypeAdapter.validate_json(kept)


def test_openai_agents_items_and_replies_convert_as_its_own_types_say() -> None:
    """The SDK's Responses items become chat messages; a reply its output items and usage."""
    convert = adapter_agents.openai_agents_adapter
    converter = adapter_agents.Converter  # the SDK's own, imported beside the checkout
    items: list[Any] = [
        {"role": "user", "content": "Hi?"},
        {"type": "function_call", "call_id": "c1", "name": "look", "arguments": '{"q": "x"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "found"},
    ]
    sent = convert.to_messages("Be brief.", converter.items_to_messages(items))
    assert [
        (Role.SYSTEM, "Be brief.", [], None),
        (Role.USER, "Hi?", [], None),
        (Role.ASSISTANT, None, [ToolCall(id="c1", name="look", args={"q": "x"})], None),
        (Role.TOOL, "found", [], "c1"),
    ] == [(m.role, m.content, m.tool_calls, m.tool_call_id) for m in sent]
    schema = convert.to_schema(converter.tool_to_openai(adapter_agents.note_sdk))
    assert ("note_sdk", ["text"]) == (schema.name, schema.parameters["required"])
    used = Usage(prompt_tokens=10, completion_tokens=3, cached_tokens=4)
    calls = [ToolCall(id="c2", name="look", args={"q": "y"})]
    response = convert.to_response(ModelReply("Again.", calls, used))
    [message, call] = response.output
    assert isinstance(message, ResponseOutputMessage)
    assert "Again." == message.content[0].text  # type: ignore[union-attr]
    assert isinstance(call, ResponseFunctionToolCall)
    assert ("c2", "look", {"q": "y"}) == (call.call_id, call.name, json.loads(call.arguments))
    usage = response.usage
    assert (10, 3, 13, 4) == (
        usage.input_tokens,
        usage.output_tokens,
        usage.total_tokens,
        usage.input_tokens_details.cached_tokens,
    )


def test_langchain_messages_and_replies_convert_as_its_own_types_say() -> None:
    """LangChain's messages become chat messages; a reply its `AIMessage`, usage kept."""
    convert = adapter_agents.langgraph_adapter
    history = [
        SystemMessage("Be brief."),
        HumanMessage("Hi?"),
        AIMessage("", tool_calls=[{"id": "c1", "name": "look", "args": {"q": "x"}}]),
        ToolMessage("found", tool_call_id="c1", name="look"),
        ToolMessage("no such page", tool_call_id="c2", name="look", status="error"),
    ]
    assert [
        (Role.SYSTEM, "Be brief.", [], None, False),
        (Role.USER, "Hi?", [], None, False),
        (Role.ASSISTANT, None, [ToolCall(id="c1", name="look", args={"q": "x"})], None, False),
        (Role.TOOL, "found", [], "c1", False),
        (Role.TOOL, "no such page", [], "c2", True),
    ] == [
        (m.role, m.content, m.tool_calls, m.tool_call_id, m.error)
        for m in convert.to_messages(history)
    ]
    used = Usage(prompt_tokens=10, completion_tokens=3)
    calls = [ToolCall(id="c3", name="look", args={"q": "y"})]
    made = convert.to_ai_message(ModelReply("Again.", calls, used))
    assert "Again." == made.content
    assert [
        {"id": "c3", "name": "look", "args": {"q": "y"}, "type": "tool_call"}
    ] == made.tool_calls
    assert made.usage_metadata is not None
    assert (10, 3, 13) == (
        made.usage_metadata["input_tokens"],
        made.usage_metadata["output_tokens"],
        made.usage_metadata["total_tokens"],
    )
