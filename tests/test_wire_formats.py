"""The built-in providers against the wire formats their official SDKs define.

Every request the scripted server receives is checked against the SDK's own request type,
closed (`tests.sdk_wire`); every response it serves is built from the SDK's own models.
The defects these tests pin down were each found that way: a key a strict endpoint
refuses, a refusal that broke the next request and vanished from the trace, a cut reply
taken for a whole one, a refused request paid for four times, a failed tool's result
not marked as an error.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import JsonValue

from cairn.agents.models.anthropic import AnthropicModel
from cairn.agents.models.base import ModelRequest, ToolSchema
from cairn.agents.models.openai import OpenAIModel
from cairn.agents.spec import AgentSpec
from cairn.agents.step import build_model
from cairn.agents.task import start_task
from cairn.coordinator.spec import TaskSpec
from cairn.coordinator.spend import read_spend
from cairn.errors import ModelError
from cairn.storage.backends.redis import RedisHotStore
from cairn.storage.records import Message, Role, TraceRecord, Usage
from cairn.storage.store import CheckpointStore
from tests.agent_harness import record, superstep
from tests.cluster import Cluster
from tests.sdk_wire import (
    anthropic_error,
    anthropic_reply,
    anthropic_request_errors,
    history,
    openai_error,
    openai_reply,
    openai_request_errors,
    text,
    thinking,
    tool_use,
)
from tests.test_openai_model import Scripted, ScriptedServer, serve_scripted

Checker = Callable[[Any], list[str]]


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[ScriptedServer]:
    """A scripted server on a free port of 127.0.0.1."""
    yield from serve_scripted(monkeypatch)


def valid(server: ScriptedServer, check: Checker) -> None:
    """Every request `server` received is one the SDK's request type admits."""
    assert server.received, "no request was sent"
    for number, received in enumerate(server.received):
        assert [] == check(received.body), f"request {number}"


def agent(server: ScriptedServer, provider: str, **fields: object) -> AgentSpec:
    """An agent of `provider` served by `server`, with write_file and finish."""
    url = server.base_url if provider == "openai" else server.root_url
    tools = fields.pop("tools", ["write_file", "finish"])
    return AgentSpec.model_validate(
        {"name": "a", "model": f"{provider}:m-test", "base_url": url, "tools": tools} | fields
    )


TOOLS = [ToolSchema("read_file", "Read a file.", {"type": "object", "properties": {}})]


def spent(store: CheckpointStore, task: str) -> Usage:
    """What agent a's model calls spent, as the task's counters hold it."""
    assert isinstance(store.hot, RedisHotStore)
    own, _ = read_spend(store.hot.redis, task)
    return own["a"]


def traced_turns(store: CheckpointStore, task: str) -> list[TraceRecord]:
    """The model turns in agent a's trace at the task's latest GC."""
    gc = store.latest_gc(task)
    assert gc is not None
    return [t for t in store.read_state(task, "a", gc.members["a"].id).trace if t.tool is None]


# --- requests: the SDK's types, closed ------------------------------------------------------


def test_the_check_refuses_what_the_sdks_types_do_not_admit() -> None:
    """The check can fail: each defect these tests pin down, in the request that had it."""
    tool_named = {"role": "tool", "tool_call_id": "c", "content": "r", "name": "read_file"}
    empty_assistant = {"role": "assistant", "content": None}
    assert openai_request_errors({"model": "m", "messages": [empty_assistant, tool_named]}) == [
        "$.messages[1]: unknown key 'name' (ChatCompletionToolMessageParam)",
        "$.messages[0]: an assistant message with neither content nor tool_calls",
    ]
    result = {"type": "tool_result", "tool_use_id": "c", "content": "e", "is_error": "yes"}
    body = {"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": [result]}]}
    assert anthropic_request_errors(body) == [
        "$.messages[0].content[0].is_error: 'yes' is not bool"
    ]


def test_openai_sends_a_history_its_sdk_admits(server: ScriptedServer) -> None:
    """Tool results carry no `name` (the tool message has none); a peer's message keeps it."""
    server.script = [openai_reply("ok")]
    OpenAIModel("m-test", base_url=server.base_url).complete(ModelRequest(history(), TOOLS))
    valid(server, openai_request_errors)
    sent = server.received[0].body["messages"]
    assert [m.get("name") for m in sent] == [None, None, None, None, None, "reviewer"]


def test_anthropic_marks_a_failed_tools_result_as_an_error(server: ScriptedServer) -> None:
    """A failed call's `tool_result` has `is_error: true`; a call that ran has none."""
    server.script = [anthropic_reply(text("ok"))]
    AnthropicModel("m-test", base_url=server.root_url).complete(ModelRequest(history(), TOOLS))
    valid(server, anthropic_request_errors)
    results = server.received[0].body["messages"][2]["content"]
    assert [(r["tool_use_id"], r.get("is_error")) for r in results[:2]] == [
        ("call_1", None),
        ("call_2", True),
    ]


def test_a_failed_tool_is_an_error_result_through_a_step(
    server: ScriptedServer, real_store: CheckpointStore, tmp_path: Path
) -> None:
    """A tool call that fails in a step reaches the next request as `is_error: true`."""
    start_task(real_store, record("iserr", agent(server, "anthropic", tools=["read_file"])), {})
    server.script = [
        anthropic_reply(
            tool_use("toolu_1", "read_file", {"path": "missing.txt"}), stop_reason="tool_use"
        ),
        anthropic_reply(text("done")),
    ]
    superstep(real_store, "iserr", tmp_path / "cache")
    superstep(real_store, "iserr", tmp_path / "cache")
    valid(server, anthropic_request_errors)
    result = server.received[1].body["messages"][-1]["content"][0]
    assert (result["tool_use_id"], result["is_error"]) == ("toolu_1", True)


# --- refusals --------------------------------------------------------------------------------


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_refusal_is_traced_and_the_next_request_is_valid(
    provider: str, server: ScriptedServer, real_store: CheckpointStore, tmp_path: Path
) -> None:
    """The refusal's text is the turn's, in the history and the trace; the next request passes.

    The next request is made from the history the step checkpointed, with a peer's
    message after it, as the agent's next step would make it.
    """
    task = f"refuse-{provider}"
    start_task(real_store, record(task, agent(server, provider)), {})
    if provider == "openai":
        server.script = [openai_reply(None, refusal="I can't help with that.")]
        check: Checker = openai_request_errors
    else:
        server.script = [anthropic_reply(text("I can't help with that."), stop_reason="refusal")]
        check = anthropic_request_errors
    superstep(real_store, task, tmp_path / "cache")
    [turn] = traced_turns(real_store, task)
    assert turn.error == "refused: I can't help with that."
    assert turn.result == "I can't help with that."
    gc = real_store.latest_gc(task)
    assert gc is not None
    state = real_store.read_state(task, "a", gc.members["a"].id)
    assert "halted" == state.status.value
    last = state.messages[-1]
    assert (last.role, last.content, last.tool_calls) == (Role.ASSISTANT, turn.result, [])

    server.script = [openai_reply("fine") if provider == "openai" else anthropic_reply(text("ok"))]
    nudge = Message(role=Role.USER, name="reviewer", content="Message from reviewer: try again")
    model = build_model(agent(server, provider))
    model.complete(ModelRequest([*state.messages, nudge], []))
    valid(server, check)


# --- cut replies -----------------------------------------------------------------------------


def openai_cut_call(arguments: str) -> tuple[str, str, str]:
    """A write_file call as the model made it (its arguments maybe cut)."""
    return ("call_w", "write_file", arguments)


WHOLE = '{"path": "out.txt", "content": "all of it"}'


def test_a_cut_tool_call_is_asked_again_with_room_and_never_run(
    server: ScriptedServer, real_store: CheckpointStore, tmp_path: Path
) -> None:
    """`finish_reason: length`: asked again with twice max_tokens; only the whole call runs."""
    spec = agent(server, "openai", params={"max_tokens": 100})
    start_task(real_store, record("cut", spec), {})
    server.script = [
        openai_reply(
            None,
            [openai_cut_call('{"path": "out.txt", "cont')],
            finish_reason="length",
            usage=(40, 100, 0),
        ),
        openai_reply(None, [openai_cut_call(WHOLE)], finish_reason="tool_calls", usage=(40, 30, 0)),
    ]
    gc = superstep(real_store, "cut", tmp_path / "cache")
    assert gc is not None
    valid(server, openai_request_errors)
    assert [r.body["max_tokens"] for r in server.received] == [100, 200]
    manifest = real_store.read_manifest("cut", gc.workspace)
    assert ["out.txt"] == sorted(manifest.files)
    cut, whole = traced_turns(real_store, "cut")
    assert cut.error == "reply cut by the output limit (100 tokens)"
    assert whole.error is None
    paid = spent(real_store, "cut")
    assert (paid.prompt_tokens, paid.completion_tokens) == (80, 130)  # both calls paid


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_reply_cut_twice_fails_the_step_and_runs_nothing(
    provider: str, server: ScriptedServer, real_store: CheckpointStore, tmp_path: Path
) -> None:
    """Cut again with room: the step fails, refused (a rollback would be cut again)."""
    task = f"cut2-{provider}"
    start_task(real_store, record(task, agent(server, provider)), {})
    if provider == "openai":
        cut = openai_reply(None, [openai_cut_call('{"path": "o')], finish_reason="length")
        server.script = [cut, cut]
        check: Checker = openai_request_errors
        limits: list[object] = [None, None]  # the request set none: asked once only
    else:
        cut = anthropic_reply(text("The answer is a long"), stop_reason="max_tokens")
        server.script = [cut, cut]
        check = anthropic_request_errors
        limits = [8192, 16384]
    with pytest.raises(ModelError) as caught:
        superstep(real_store, task, tmp_path / "cache")
    assert caught.value.refused
    assert not caught.value.retryable
    assert "cut by" in str(caught.value)
    valid(server, check)
    asked = len(server.received)
    assert [r.body.get("max_tokens") for r in server.received] == limits[:asked]
    assert asked == (1 if provider == "openai" else 2)
    assert spent(real_store, task).completion_tokens == 5 * asked


def test_a_cut_text_reply_does_not_end_the_agent(
    server: ScriptedServer, real_store: CheckpointStore, tmp_path: Path
) -> None:
    """`stop_reason: max_tokens` on text, after thinking: asked again; the whole text stands."""
    start_task(real_store, record("cuttext", agent(server, "anthropic")), {})
    server.script = [
        anthropic_reply(thinking("plan"), text("The fix is to"), stop_reason="max_tokens"),
        anthropic_reply(
            thinking("plan"), text("The fix is to pin the version."), stop_reason="end_turn"
        ),
    ]
    gc = superstep(real_store, "cuttext", tmp_path / "cache")
    assert gc is not None
    valid(server, anthropic_request_errors)
    state = real_store.read_state("cuttext", "a", gc.members["a"].id)
    assert state.messages[-1].content == "The fix is to pin the version."
    assert [t.result for t in traced_turns(real_store, "cuttext")] == [
        "The fix is to",
        "The fix is to pin the version.",
    ]


# --- a refused request is not sent again -----------------------------------------------------


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_refused_request_is_sent_once_and_the_task_fails_with_why(
    provider: str, server: ScriptedServer, cluster: Cluster
) -> None:
    """A 400 fails the task at once: no rollback sends the same request again."""
    if provider == "openai":
        refusal = openai_error(400, "Invalid 'messages[1].name'", code="invalid_value")
    else:
        refusal = anthropic_error(400, "invalid_request_error", "messages: roles must alternate")
    server.script = [refusal] * 5
    cluster.env.update({"no_proxy": "*", "NO_PROXY": "*"})
    cluster.start_worker()
    spec: dict[str, JsonValue] = {
        "name": f"refused-{provider}",
        "goal": "Say hello.",
        "agents": [{"name": "a", "model": f"{provider}:m-test", "tools": ["finish"],
                    "base_url": server.base_url if provider == "openai" else server.root_url}],
    }  # fmt: skip
    task = cluster.tasks.submit(TaskSpec.model_validate(spec))
    status = cluster.drive(task)
    assert "failed" == status["status"]
    reason = str(status["reason"])
    assert "HTTP 400" in reason, reason
    assert "not rolled back: the same request would be sent again" in reason
    assert 1 == len(server.received)


def test_a_transient_failure_is_not_refused(server: ScriptedServer) -> None:
    """A 529 (overloaded) and a 429 are retried, then retryable: never `refused`."""
    server.script = [anthropic_error(529, "overloaded_error", "Overloaded")] * 2
    model = AnthropicModel("m-test", base_url=server.root_url, max_retries=1, sleep=lambda _: None)
    with pytest.raises(ModelError) as caught:
        model.complete(ModelRequest(history(), TOOLS))
    assert caught.value.retryable
    assert not caught.value.refused
    assert 2 == len(server.received)
    valid(server, anthropic_request_errors)


# --- replies and errors in each provider's own shapes ------------------------------------------


def test_parallel_tool_calls_with_null_content_are_parsed(server: ScriptedServer) -> None:
    """OpenAI: two calls and `content: null` in one reply; Anthropic: thinking, text, two uses."""
    server.script = [
        openai_reply(None, [("c1", "read_file", '{"path": "a"}'), ("c2", "read_file", "{}")],
                     finish_reason="tool_calls"),
        anthropic_reply(thinking("first a, then b"), text("Reading."),
                        tool_use("t1", "read_file", {"path": "a"}),
                        tool_use("t2", "read_file", {"path": "b"}), stop_reason="tool_use",
                        usage=(20, 7, 300)),
    ]  # fmt: skip
    first = OpenAIModel("m-test", base_url=server.base_url).complete(ModelRequest(history(), TOOLS))
    assert (first.content, [c.args for c in first.tool_calls]) == (None, [{"path": "a"}, {}])
    second = AnthropicModel("m-test", base_url=server.root_url).complete(
        ModelRequest(history(), TOOLS)
    )
    assert second.content == "Reading."
    assert ["t1", "t2"] == [c.id for c in second.tool_calls]
    assert (320, 7, 300) == (
        second.usage.prompt_tokens,
        second.usage.completion_tokens,
        second.usage.cached_tokens,
    )


@pytest.mark.parametrize(
    ("provider", "answer"),
    [
        ("openai", openai_error(400, "This model's maximum context length is 128000 tokens. "
                                "However, your messages resulted in 130512 tokens.",
                                code="context_length_exceeded")),
        ("anthropic", anthropic_error(400, "invalid_request_error",
                                      "prompt is too long: 210344 tokens > 200000 maximum")),
    ],
)  # fmt: skip
def test_a_context_length_error_is_refused_and_says_overflow(
    provider: str, answer: Scripted, server: ScriptedServer
) -> None:
    """Each provider's real "too long" 400: refused, overflow, sent once."""
    server.script = [answer]
    with pytest.raises(ModelError) as caught:
        build_model(agent(server, provider)).complete(ModelRequest(history(), TOOLS))
    assert (caught.value.refused, caught.value.overflow, caught.value.retryable) == (
        True,
        True,
        False,
    )
    assert 1 == len(server.received)


def test_another_400_is_refused_but_no_overflow(server: ScriptedServer) -> None:
    """A 400 about something else is refused, and not taken for a prompt too long."""
    server.script = [openai_error(400, "Invalid 'tools[0].function.name'", code="invalid_value")]
    with pytest.raises(ModelError) as caught:
        build_model(agent(server, "openai")).complete(ModelRequest(history(), TOOLS))
    assert (caught.value.refused, caught.value.overflow) == (True, False)


def test_a_429_with_retry_after_is_waited_for(server: ScriptedServer) -> None:
    """OpenAI's 429 in its own shape, with Retry-After: waited out, then answered."""
    limited = openai_error(429, "Rate limit reached for requests", code="rate_limit_exceeded")
    limited.headers["Retry-After"] = "2"
    server.script = [limited, openai_reply("fine")]
    sleeps: list[float] = []
    model = OpenAIModel("m-test", base_url=server.base_url, sleep=sleeps.append)
    assert "fine" == model.complete(ModelRequest(history(), TOOLS)).content
    assert sleeps == [2.0]
    valid(server, openai_request_errors)
