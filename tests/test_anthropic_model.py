"""AnthropicModel against a scripted Messages API server on 127.0.0.1."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from pydantic import JsonValue

from cairn.agents.models.anthropic import API_VERSION, DEFAULT_MAX_TOKENS, AnthropicModel
from cairn.agents.models.base import ModelRequest, ToolSchema
from cairn.agents.models.registry import build_model
from cairn.agents.spec import AgentSpec
from cairn.errors import ModelError
from cairn.storage.records import ImagePart, Message, Role, ToolCall, Usage
from tests.test_openai_model import Scripted, ScriptedServer, ask, serve_scripted

FAKE_KEY = "sk-ant-test-secret-0123456789"
CACHED: dict[str, Any] = {"cache_control": {"type": "ephemeral"}}  # a cache breakpoint


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[ScriptedServer]:
    """A scripted server on a free port of 127.0.0.1."""
    yield from serve_scripted(monkeypatch)


def message(*blocks: dict[str, JsonValue], usage: dict[str, JsonValue] | None = None) -> Scripted:
    """A 200 Messages API response with `blocks` as its content."""
    body: dict[str, JsonValue] = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": list(blocks),
        "stop_reason": "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn",
        "usage": usage or {"input_tokens": 10, "output_tokens": 2},
    }
    return Scripted(200, orjson.dumps(body))


def text(value: str) -> dict[str, JsonValue]:
    """A text content block."""
    return {"type": "text", "text": value}


def tool_use(id_: str, name: str, input_: JsonValue) -> dict[str, JsonValue]:
    """A tool_use content block."""
    return {"type": "tool_use", "id": id_, "name": name, "input": input_}


def failure(status: int, kind: str, why: str, headers: dict[str, str] | None = None) -> Scripted:
    """An error response in Anthropic's `{"type": "error", "error": {...}}` shape."""
    body = {"type": "error", "error": {"type": kind, "message": why}}
    return Scripted(status, orjson.dumps(body), headers or {})


def model_for(server: ScriptedServer, sleeps: list[float], **options: Any) -> AnthropicModel:
    """A model of `server` whose sleeps are recorded in `sleeps` instead of slept."""
    return AnthropicModel("claude-test", base_url=server.root_url, sleep=sleeps.append, **options)


def test_plain_text_answer(server: ScriptedServer) -> None:
    """A text answer comes back as content, from a POST to {base_url}/v1/messages."""
    server.script = [message(text("hello"))]
    answer = model_for(server, [], api_key=FAKE_KEY).complete(ask("hi"))
    assert "hello" == answer.content
    got = server.received[0]
    assert "/v1/messages" == got.path
    assert FAKE_KEY == got.headers["x-api-key"]
    assert API_VERSION == got.headers["anthropic-version"]
    assert "Authorization" not in got.headers
    expected = {
        "max_tokens": DEFAULT_MAX_TOKENS,
        "model": "claude-test",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi", **CACHED}]}],
    }
    assert expected == got.body


def test_tool_calls_round_trip_several_in_one_turn(server: ScriptedServer) -> None:
    """System, tools, two tool_use blocks and their results go out; two calls come back."""
    server.script = [
        message(
            text("Writing both."),
            tool_use("toolu_3", "write", {"path": "c.txt", "text": "x"}),
            tool_use("toolu_4", "write", {"path": "d.txt", "text": "y"}),
        )
    ]
    tool = ToolSchema(
        name="read",
        description="Read a file.",
        parameters={"type": "object", "properties": {"path": {"type": "string"}}},
    )
    history = [
        Message(role=Role.SYSTEM, content="be brief"),
        Message(role=Role.USER, content="copy a.txt and b.txt"),
        Message(
            role=Role.ASSISTANT,
            content="Reading both.",
            tool_calls=[
                ToolCall(id="toolu_1", name="read", args={"path": "a.txt"}),
                ToolCall(id="toolu_2", name="read", args={"path": "b.txt"}),
            ],
        ),
        Message(role=Role.TOOL, content="x", tool_call_id="toolu_1", name="read"),
        Message(role=Role.TOOL, content="", tool_call_id="toolu_2", name="read"),
        Message(role=Role.USER, name="lead", content="Message from lead: hurry"),
    ]
    answer = model_for(server, []).complete(ModelRequest(messages=history, tools=[tool]))

    assert "Writing both." == answer.content
    assert [
        ToolCall(id="toolu_3", name="write", args={"path": "c.txt", "text": "x"}),
        ToolCall(id="toolu_4", name="write", args={"path": "d.txt", "text": "y"}),
    ] == answer.tool_calls
    sent = server.received[0].body
    assert [{"type": "text", "text": "be brief", **CACHED}] == sent["system"]
    assert [
        {
            "name": "read",
            "description": "Read a file.",
            "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
            **CACHED,
        }
    ] == sent["tools"]
    assert [
        {"role": "user", "content": [text("copy a.txt and b.txt") | CACHED]},
        {
            "role": "assistant",
            "content": [
                text("Reading both."),
                tool_use("toolu_1", "read", {"path": "a.txt"}),
                tool_use("toolu_2", "read", {"path": "b.txt"}),
            ],
        },
        {
            # One user turn: the results first (as the API demands), then the message.
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "x"},
                {"type": "tool_result", "tool_use_id": "toolu_2"},
                text("Message from lead: hurry") | CACHED,
            ],
        },
    ] == sent["messages"]


def test_a_message_between_results_goes_after_them(server: ScriptedServer) -> None:
    """A user message between two tool results (a restore's summary) follows both."""
    server.script = [message(text("ok"))]
    history = [
        Message(role=Role.USER, content="go"),
        Message(
            role=Role.ASSISTANT,
            tool_calls=[
                ToolCall(id="t1", name="read", args={}),
                ToolCall(id="t2", name="read", args={}),
            ],
        ),
        Message(role=Role.TOOL, content="one", tool_call_id="t1"),
        Message(role=Role.USER, name="cairn", content="You were restored."),
        Message(role=Role.TOOL, content="two", tool_call_id="t2"),
    ]
    model_for(server, []).complete(ModelRequest(messages=history, tools=[]))
    last = server.received[0].body["messages"][-1]
    assert ["tool_result", "tool_result", "text"] == [b["type"] for b in last["content"]]
    assert 3 == len(server.received[0].body["messages"])


def test_usage_counts_cache_reads_and_writes(server: ScriptedServer) -> None:
    """The prompt is input plus cache reads and writes; cached tokens are the cache reads."""
    usage: dict[str, JsonValue] = {
        "input_tokens": 20,
        "output_tokens": 7,
        "cache_read_input_tokens": 1000,
        "cache_creation_input_tokens": 300,
    }
    server.script = [message(text("a"), usage=usage)]
    got = model_for(server, []).complete(ask()).usage
    assert Usage(prompt_tokens=1320, completion_tokens=7, cached_tokens=1000,
                 cache_write_tokens=300) == got  # fmt: skip


def test_429_honours_retry_after_and_529_is_retried(server: ScriptedServer) -> None:
    """A 429 with Retry-After: 2 waits two seconds; an overloaded 529 is retried too."""
    server.script = [
        failure(429, "rate_limit_error", "slow down", {"Retry-After": "2"}),
        failure(529, "overloaded_error", "Overloaded"),
        message(text("done")),
    ]
    sleeps: list[float] = []
    assert "done" == model_for(server, sleeps, backoff=0.1).complete(ask()).content
    assert 2.0 == sleeps[0]
    assert 2 == len(sleeps)
    assert 3 == len(server.received)


def test_401_is_fatal_one_line_and_keeps_the_key_secret(server: ScriptedServer) -> None:
    """A 401 fails at once, not retryable, in one line naming the reason but not the key."""
    server.script = [
        failure(401, "authentication_error", f"invalid x-api-key\n{FAKE_KEY} was refused")
    ]
    with pytest.raises(ModelError) as caught:
        model_for(server, [], api_key=FAKE_KEY).complete(ask())
    assert not caught.value.retryable
    assert "HTTP 401: invalid x-api-key *** was refused" == str(caught.value)
    assert 1 == len(server.received)


def test_a_slow_reply_inside_timeout_succeeds(server: ScriptedServer) -> None:
    """A server silent for 1.5 s, then answering, is waited for under a 3 s timeout."""
    server.script = [Scripted(200, message(text("slow")).body, delay=1.5)]
    assert "slow" == model_for(server, [], timeout=3.0, max_retries=0).complete(ask()).content


def test_a_reply_past_timeout_is_retryable(server: ScriptedServer) -> None:
    """A server silent past `timeout` gives a retryable ModelError at the deadline."""
    server.script = [Scripted(delay=10.0)]
    started = time.monotonic()
    with pytest.raises(ModelError) as caught:
        model_for(server, [], timeout=0.5).complete(ask())
    assert time.monotonic() - started < 2.0
    assert caught.value.retryable
    assert "timed out after 0.5 s" in str(caught.value)


def test_params_and_headers_reach_the_server(server: ScriptedServer) -> None:
    """The params (max_tokens among them) go into the body; headers onto the request."""
    spec = AgentSpec(
        name="a",
        model="anthropic:claude-test",
        base_url=server.root_url,
        params={"max_tokens": 512, "temperature": 0.0, "top_k": 5},
        headers={"anthropic-beta": "prompt-caching-2024-07-31"},
    )
    server.script = [message(text("ok"))]
    build_model(spec, {"ANTHROPIC_API_KEY": FAKE_KEY}).complete(ask())
    got = server.received[0]
    assert (512, 0.0, 5) == (got.body["max_tokens"], got.body["temperature"], got.body["top_k"])
    assert "prompt-caching-2024-07-31" == got.headers["anthropic-beta"]
    assert FAKE_KEY == got.headers["x-api-key"]


def test_malformed_response_is_retryable(server: ScriptedServer) -> None:
    """A 200 with no content list raises a retryable ModelError, without retrying here."""
    server.script = [Scripted(200, b'{"type": "message"}')]
    with pytest.raises(ModelError) as caught:
        model_for(server, []).complete(ask())
    assert caught.value.retryable
    assert "malformed response" in str(caught.value)
    assert 1 == len(server.received)


def test_tool_input_that_is_no_object_comes_back_raw(server: ScriptedServer) -> None:
    """A tool_use whose input is not a JSON object comes back as {"_raw": json}."""
    server.script = [message(tool_use("t1", "f", [1, 2]))]
    answer = model_for(server, []).complete(ask())
    assert [ToolCall(id="t1", name="f", args={"_raw": "[1,2]"})] == answer.tool_calls
    assert answer.content is None


def test_a_tool_results_images_go_out_as_image_blocks(server: ScriptedServer) -> None:
    """A result's images follow its text as base64 `image` blocks; another type is a note.

    The shape is the Messages API's `tool_result` with a list of `text` and `image` blocks
    (`ToolResultBlockParam`, `ImageBlockParam` with a `Base64ImageSourceParam`).
    """
    server.script = [message(text("a red square"))]
    png = ImagePart(media_type="image/png", data="iVBORw0KGgo=")
    bmp = ImagePart(media_type="image/bmp", data="Qk0=")
    notes = "two pictures\n[image/png, 8 bytes]\n[image/bmp, 2 bytes"
    history = [
        Message(role=Role.USER, content="look"),
        Message(role=Role.ASSISTANT, tool_calls=[ToolCall(id="t1", name="see", args={})]),
        Message(role=Role.TOOL, content=f"{notes}]", tool_call_id="t1", images=[png, bmp]),
    ]
    model_for(server, []).complete(ModelRequest(messages=history, tools=[]))
    [result] = server.received[0].body["messages"][-1]["content"]
    assert {
        "type": "tool_result",
        "tool_use_id": "t1",
        "content": [
            text(f"{notes}: not shown to this model]"),
            {
                "type": "image",
                "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
            },
        ],
        **CACHED,
    } == result
