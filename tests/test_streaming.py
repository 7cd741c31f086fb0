"""Streamed model replies: asked for as the SDKs define it, read back whole, shown live.

The providers run against `ScriptedServer` (tests/test_openai_model.py) answering with
`text/event-stream` bodies built from the SDKs' own event models (tests/sdk_wire.py),
chunked, one chunk an event (or a byte), with gaps, a pause or a dropped connection. A
streamed reply must be the very `ModelReply` the same answer unstreamed gives; a stream
cut before its last event is a retryable error, and nothing of it is returned. A step on
a real Redis shows the reply so far under its live key while its model streams, and
`cairn watch` and the console (its API and its page, in Chromium) show it too.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from playwright.sync_api import expect, sync_playwright
from structlog.testing import capture_logs

from cairn.agents import live
from cairn.agents.live import LIVE_TTL_MS, LiveCall, LiveReply, read_live
from cairn.agents.models import http
from cairn.agents.models.anthropic import AnthropicModel
from cairn.agents.models.base import Model, ModelRequest, ReplySoFar, ToolSchema
from cairn.agents.models.openai import OpenAIModel
from cairn.agents.models.registry import build_model
from cairn.agents.models.sse import Event, EventDecoder
from cairn.agents.spec import AgentSpec, parse_model
from cairn.agents.task import start_task
from cairn.cli.render import live_view, watch_line
from cairn.client import Client
from cairn.coordinator.spec import TaskSpec
from cairn.errors import InvalidSpec, ModelError
from cairn.storage import keys
from cairn.storage.backends.memory import MemoryHotStore
from cairn.storage.backends.redis import RedisHotStore
from cairn.storage.base import HotStore
from cairn.storage.chain import WorkingState
from cairn.storage.records import Message, Role, ToolCall, Usage
from cairn.storage.store import CheckpointStore
from cairn.testing.redis_server import RedisServer, free_port
from tests.agent_harness import record, superstep
from tests.cli_harness import spawn, stop
from tests.sdk_wire import (
    anthropic_reply,
    anthropic_request_errors,
    anthropic_stream,
    anthropic_stream_error,
    openai_reply,
    openai_request_errors,
    openai_stream,
    openai_stream_error,
    pieces,
    sse,
    streamed,
    text,
    thinking,
    tool_use,
)
from tests.test_openai_model import ScriptedServer, failure, serve_scripted

ROOT = Path(__file__).resolve().parents[1]
WAIT_S = 30.0  # for a step, a process or a page to show what the test waits for
TOOL = ToolSchema(
    name="read_file",
    description="Read a file.",
    parameters={"type": "object", "properties": {"path": {"type": "string"}}},
)


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[ScriptedServer]:
    """A scripted server on a free port of 127.0.0.1, no key or proxy in the environment."""
    yield from serve_scripted(monkeypatch)


def openai(server: ScriptedServer, sleeps: list[float], **options: Any) -> OpenAIModel:
    """An `openai:` model of `server` that streams; its sleeps recorded, not slept."""
    options.setdefault("stream", True)
    return OpenAIModel("gpt-test", base_url=server.base_url, sleep=sleeps.append, **options)


def anthropic(server: ScriptedServer, sleeps: list[float], **options: Any) -> AnthropicModel:
    """An `anthropic:` model of `server` that streams; its sleeps recorded, not slept."""
    options.setdefault("stream", True)
    return AnthropicModel("claude-test", base_url=server.root_url, sleep=sleeps.append, **options)


def history() -> ModelRequest:
    """A request with a system prompt, a tool call and its result, and a tool on offer."""
    messages = [
        Message(role=Role.SYSTEM, content="be brief"),
        Message(role=Role.USER, content="read a.txt"),
        Message(role=Role.ASSISTANT, tool_calls=[ToolCall(id="c0", name="read_file", args={})]),
        Message(role=Role.TOOL, content="x", tool_call_id="c0", name="read_file"),
    ]
    return ModelRequest(messages=messages, tools=[TOOL])


# what is asked ---------------------------------------------------------------------------


def test_openai_asks_for_a_stream_as_the_sdk_defines_it(server: ScriptedServer) -> None:
    """`stream: true` in a spec: the body is a `CompletionCreateParamsStreaming`, usage asked."""
    spec = AgentSpec(name="a", model="openai:gpt-test", base_url=server.base_url, stream=True)
    server.script = [streamed(openai_stream("hi"))]
    build_model(spec, {}).complete(history())
    got = server.received[0]
    assert [] == openai_request_errors(got.body, streaming=True)
    assert True is got.body["stream"]
    assert {"include_usage": True} == got.body["stream_options"]
    assert "text/event-stream" == got.headers["Accept"]


def test_anthropic_asks_for_a_stream_as_the_sdk_defines_it(server: ScriptedServer) -> None:
    """`stream: true` in a spec: the body is a `MessageCreateParamsStreaming`."""
    spec = AgentSpec(name="a", model="anthropic:claude-test", base_url=server.root_url,
                     stream=True)  # fmt: skip
    server.script = [streamed(anthropic_stream(text("hi")))]
    build_model(spec, {}).complete(history())
    got = server.received[0]
    assert [] == anthropic_request_errors(got.body, streaming=True)
    assert True is got.body["stream"]
    assert "text/event-stream" == got.headers["Accept"]


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_an_agent_that_does_not_stream_asks_for_no_stream(
    server: ScriptedServer, provider: str
) -> None:
    """Streaming is off by default: the request is the SDK's non-streaming one."""
    url = server.base_url if provider == "openai" else server.root_url
    spec = AgentSpec(name="a", model=f"{provider}:m", base_url=url)
    server.script = [openai_reply("hi") if provider == "openai" else anthropic_reply(text("hi"))]
    assert "hi" == build_model(spec, {}).complete(history()).content
    body = server.received[0].body
    check = openai_request_errors if provider == "openai" else anthropic_request_errors
    assert [] == check(body)
    assert "stream" not in body


def test_stream_is_an_agent_field_and_params_cannot_set_it() -> None:
    """`stream` is a boolean field, off by default; `stream` and `stream_options` are Cairn's."""
    assert AgentSpec(name="a", model="openai:m").stream is False
    bad_value = {"name": "a", "model": "openai:m", "stream": "sometimes"}
    with pytest.raises(InvalidSpec, match=r"^invalid agent: stream: Input should be a valid bool"):
        parse_model(AgentSpec, bad_value, "agent")
    reserved = {"name": "a", "model": "openai:m", "params": {"stream_options": {}}}
    with pytest.raises(InvalidSpec, match=r"\['stream_options'\] are set by Cairn"):
        parse_model(AgentSpec, reserved, "agent")


# what comes back: the reply unstreamed gives -------------------------------------------

CALLS = [
    ("call_1", "read_file", '{"path": "a.txt"}'),
    ("call_2", "write", '{"p": "b", "n": [1, 2]}'),
]
SAME_REPLY = {
    "openai text": (openai_reply("Hello, wörld ✓ 日本", usage=(1200, 7, 1024)),
                    openai_stream("Hello, wörld ✓ 日本", usage=(1200, 7, 1024))),
    "openai parallel calls, interleaved": (
        openai_reply("Reading both.", CALLS, finish_reason="tool_calls"),
        openai_stream("Reading both.", CALLS, finish_reason="tool_calls", interleave=True),
    ),
    "openai calls without text": (openai_reply(None, CALLS[:1], finish_reason="tool_calls"),
                                  openai_stream(None, CALLS[:1], finish_reason="tool_calls")),
    "openai refusal": (openai_reply(refusal="I can't help with that."),
                       openai_stream(refusal="I can't help with that.")),
    "openai content filter": (openai_reply(finish_reason="content_filter"),
                              openai_stream(finish_reason="content_filter")),
    "openai cut at length": (openai_reply("Half a thou", finish_reason="length"),
                             openai_stream("Half a thou", finish_reason="length")),
    "anthropic text": (anthropic_reply(text("Hello ✓"), usage=(10, 5, 3)),
                       anthropic_stream(text("Hello ✓"), usage=(10, 5, 3))),
    "anthropic thinking, then text": (
        anthropic_reply(thinking("Let me think."), text("Answer.")),
        anthropic_stream(thinking("Let me think."), text("Answer.")),
    ),
    "anthropic parallel tool use": (
        anthropic_reply(text("Reading both."), tool_use("toolu_1", "read_file", {"path": "a"}),
                        tool_use("toolu_2", "read_file", {"path": "b", "n": [1, 2]}),
                        stop_reason="tool_use"),
        anthropic_stream(text("Reading both."), tool_use("toolu_1", "read_file", {"path": "a"}),
                         tool_use("toolu_2", "read_file", {"path": "b", "n": [1, 2]}),
                         stop_reason="tool_use"),
    ),
    "anthropic tool use without input": (
        anthropic_reply(tool_use("toolu_1", "list_files", {}), stop_reason="tool_use"),
        anthropic_stream(tool_use("toolu_1", "list_files", {}), stop_reason="tool_use"),
    ),
    "anthropic max_tokens": (anthropic_reply(text("Half a thou"), stop_reason="max_tokens"),
                             anthropic_stream(text("Half a thou"), stop_reason="max_tokens")),
    "anthropic refusal": (anthropic_reply(text("I won't."), stop_reason="refusal"),
                          anthropic_stream(text("I won't."), stop_reason="refusal")),
}  # fmt: skip


@pytest.mark.parametrize("case", list(SAME_REPLY))
def test_a_streamed_reply_is_the_reply_unstreamed(server: ScriptedServer, case: str) -> None:
    """Text, tool calls (arguments parsed at the end), usage, refusal and cut: all alike."""
    whole, events = SAME_REPLY[case]
    build = openai if case.startswith("openai") else anthropic
    server.script = [whole, streamed(events)]
    params = {"max_tokens": 50}
    unstreamed = build(server, [], stream=False, params=params).complete(history())
    reply = build(server, [], params=params).complete(history())
    assert unstreamed == reply
    assert reply.content or reply.tool_calls or reply.refusal  # the case says something


def test_streamed_usage_and_calls_are_counted(server: ScriptedServer) -> None:
    """What the final events say of usage is the reply's; calls come whole, in order."""
    server.script = [streamed(openai_stream("ok", CALLS, usage=(1200, 7, 1024), interleave=True))]
    reply = openai(server, []).complete(history())
    assert Usage(prompt_tokens=1200, completion_tokens=7, cached_tokens=1024) == reply.usage
    assert [
        ToolCall(id="call_1", name="read_file", args={"path": "a.txt"}),
        ToolCall(id="call_2", name="write", args={"p": "b", "n": [1, 2]}),
    ] == reply.tool_calls
    server.script = [streamed(anthropic_stream(text("ok"), usage=(10, 5, 3)))]
    reply = anthropic(server, []).complete(history())
    # The prompt counts what was read from the cache: 10 new + 3 read.
    assert Usage(prompt_tokens=13, completion_tokens=5, cached_tokens=3) == reply.usage


def test_a_cut_reply_keeps_the_output_limit_the_request_set(server: ScriptedServer) -> None:
    """`finish_reason: length` streamed: cut, with the request's `max_tokens`."""
    server.script = [streamed(openai_stream("Half a thou", finish_reason="length"))]
    reply = openai(server, [], params={"max_tokens": 50}).complete(history())
    assert (True, 50) == (reply.cut, reply.max_tokens)


def test_text_split_inside_characters_comes_back_whole(server: ScriptedServer) -> None:
    """A stream sent a byte at a time, splitting UTF-8 characters and lines, reads the same."""
    said = "héllo wörld ✓ 日本語\nsecond line"
    server.script = [streamed(openai_stream(said, count=2), trickle=0.0005)]
    assert said == openai(server, []).complete(history()).content


def test_on_delta_sees_the_reply_grow(server: ScriptedServer) -> None:
    """`on_delta` gets the text and the calls' names and arguments so far, then the whole."""
    said = "Reading the file now."
    server.script = [streamed(openai_stream(said, CALLS[:1], count=4))]
    seen: list[tuple[str, list[tuple[str, str]]]] = []

    def note(so_far: ReplySoFar) -> None:
        seen.append((so_far.text(), [(c.name, c.arguments()) for c in so_far.calls]))

    request = ModelRequest(messages=[Message(role=Role.USER, content="go")], tools=[TOOL],
                           on_delta=note)  # fmt: skip
    openai(server, []).complete(request)
    texts = [t for t, _ in seen]
    assert texts == sorted(texts, key=len)  # it only grows
    assert all(said.startswith(t) for t in texts)
    assert said == texts[-1]
    assert ("", []) == seen[0]
    arguments = [calls[0][1] for _, calls in seen if calls]
    assert ["read_file"] == list({calls[0][0] for _, calls in seen if calls})
    assert "" in arguments  # the call was seen before its arguments came
    assert any(0 < len(a) < len(CALLS[0][2]) for a in arguments)  # and half way
    assert CALLS[0][2] == arguments[-1]


def test_a_server_that_does_not_stream_is_read_whole(server: ScriptedServer) -> None:
    """A 200 of `application/json` to a streaming request is that reply."""
    server.script = [openai_reply("whole")]
    assert "whole" == openai(server, []).complete(history()).content


# what breaks ------------------------------------------------------------------------------


def _cut_in_a_call(events: list[bytes], marker: bytes) -> list[bytes]:
    """`events` up to the second one holding `marker` (a call's arguments, half sent)."""
    places = [i for i, event in enumerate(events) if marker in event]
    return events[: places[1] + 1]


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_stream_dropped_mid_tool_call_is_retryable(server: ScriptedServer, provider: str) -> None:
    """A connection that drops inside a call's arguments: retryable, nothing returned."""
    if provider == "openai":
        events = _cut_in_a_call(openai_stream("ok", CALLS[:1], count=4), b'"arguments":"')
        model: Model = openai(server, [], max_retries=0)
    else:
        blocks = (text("ok"), tool_use("toolu_1", "read_file", {"path": "a.txt"}))
        events = _cut_in_a_call(anthropic_stream(*blocks, count=4), b"input_json_delta")
        model = anthropic(server, [], max_retries=0)
    server.script = [streamed(events, drop=True)]
    with pytest.raises(ModelError) as caught:
        model.complete(history())
    assert caught.value.retryable
    assert str(caught.value).startswith("model call failed after 1 attempts: IncompleteRead")


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_stream_that_ends_before_its_last_event_is_retryable(
    server: ScriptedServer, provider: str
) -> None:
    """A body that ends cleanly without `[DONE]` or `message_stop`: retryable."""
    model: Model
    if provider == "openai":
        events, model = openai_stream("ok")[:-1], openai(server, [], max_retries=0)
    else:
        events, model = anthropic_stream(text("ok"))[:-1], anthropic(server, [], max_retries=0)
    server.script = [streamed(events)]
    with pytest.raises(ModelError) as caught:
        model.complete(history())
    assert caught.value.retryable
    expected = (
        "model call failed after 1 attempts: the stream broke: it ended before its last event"
    )
    assert expected == str(caught.value)


def test_a_broken_stream_is_asked_again_within_the_call(server: ScriptedServer) -> None:
    """A retry left, the call starts over and returns the next answer whole, nothing mixed."""
    first = _cut_in_a_call(openai_stream("first", CALLS[:1], count=4), b'"arguments":"')
    server.script = [streamed(first, drop=True), streamed(openai_stream("second"))]
    sleeps: list[float] = []
    reply = openai(server, sleeps, max_retries=1).complete(history())
    assert ("second", []) == (reply.content, reply.tool_calls)
    assert 2 == len(server.received)
    assert 1 == len(sleeps)


def test_an_overloaded_error_event_is_retried_then_raised(server: ScriptedServer) -> None:
    """Anthropic's `error` event (529's `overloaded_error`) mid-stream: retried, then raised."""
    broken = [*anthropic_stream(text("Hel"))[:4], anthropic_stream_error()]
    server.script = [streamed(broken), streamed(broken)]
    sleeps: list[float] = []
    with pytest.raises(ModelError) as caught:
        anthropic(server, sleeps, max_retries=1).complete(history())
    assert caught.value.retryable
    expected = "model call failed after 2 attempts: the stream broke: overloaded_error: Overloaded"
    assert expected == str(caught.value)
    server.script = [streamed(broken), streamed(anthropic_stream(text("Hello")))]
    assert "Hello" == anthropic(server, [], max_retries=1).complete(history()).content


def test_an_error_chunk_breaks_an_openai_stream(server: ScriptedServer) -> None:
    """An OpenAI-compatible server's `{"error": ...}` chunk mid-stream: retryable."""
    events = [*openai_stream("Hel")[:2], openai_stream_error("The server had an error")]
    server.script = [streamed(events)]
    with pytest.raises(ModelError) as caught:
        openai(server, [], max_retries=0).complete(history())
    assert caught.value.retryable
    assert str(caught.value).endswith("the stream broke: The server had an error")


def test_a_trickling_stream_is_cut_at_the_deadline(server: ScriptedServer) -> None:
    """Events 50 ms apart, each read quick: the call's one deadline still ends it."""
    said = "x" * 200
    server.script = [streamed(openai_stream(said, count=200), gap=0.05)]
    seen: list[int] = []
    request = ModelRequest(messages=[Message(role=Role.USER, content="go")], tools=[],
                           on_delta=lambda so_far: seen.append(so_far.chars))  # fmt: skip
    with pytest.raises(ModelError) as caught:
        openai(server, [], timeout=1.0, max_retries=0).complete(request)
    assert caught.value.retryable
    assert "model call failed after 1 attempts: timed out after 1 s" == str(caught.value)
    assert 0 < seen[-1] < len(said)  # it was streaming, and was cut before its end


def test_a_429_before_the_stream_is_retried_as_ever(server: ScriptedServer) -> None:
    """A 429 with Retry-After before any event: waited for, then the stream is read."""
    server.script = [failure(429, "slow down", {"Retry-After": "1"}), streamed(openai_stream("ok"))]
    sleeps: list[float] = []
    assert "ok" == openai(server, sleeps).complete(history()).content
    assert [1.0] == sleeps


def test_a_stream_over_its_cap_is_retryable(
    server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream past `MAX_STREAM_BYTES` is read no further: retryable, not asked again."""
    monkeypatch.setattr(http, "MAX_STREAM_BYTES", 2_000)
    server.script = [streamed(openai_stream("x" * 400, count=40)), streamed(openai_stream("x"))]
    with pytest.raises(ModelError) as caught:
        openai(server, [], max_retries=3).complete(history())
    assert caught.value.retryable
    assert "response stream is over 2000 bytes" == str(caught.value)
    assert 1 == len(server.received)


def test_a_runaway_text_is_stopped_as_it_streams(
    server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Text past `MAX_REPLY_CHARS` stops the stream as it comes: retryable, as check_reply."""
    monkeypatch.setattr("cairn.agents.models.base.MAX_REPLY_CHARS", 10)
    server.script = [streamed(openai_stream("y" * 40, count=4))]
    with pytest.raises(ModelError) as caught:
        openai(server, [], max_retries=0).complete(history())
    assert caught.value.retryable
    assert "reply text is over 10 characters" == str(caught.value)


def test_a_malformed_event_is_retryable_and_says_so(server: ScriptedServer) -> None:
    """An event whose data is no JSON: a retryable malformed reply, not asked again here."""
    server.script = [streamed([sse("{not json"), *openai_stream("ok")])]
    with pytest.raises(ModelError) as caught:
        openai(server, [], max_retries=3).complete(history())
    assert caught.value.retryable
    assert str(caught.value).startswith("malformed response (JSONDecodeError(")
    assert 1 == len(server.received)


# the event stream itself ------------------------------------------------------------------

STREAM = (
    b"\xef\xbb\xbf: a comment, as a keep-alive\r\n"
    b'event: message_start\r\ndata: {"a":\r\ndata: 1}\r\n\r\n'
    b"data: two\rdata: lines\r\r"
    b"id: 7\nretry: 10\ndata:no space\n\n"
    b"event: empty\n\n"
    b"data: \xc3\xa9t\xc3\xa9\n\n"
)
EVENTS = [
    Event('{"a":\n1}', "message_start"),
    Event("two\nlines"),
    Event("no space"),
    Event("été"),
]


def test_events_are_read_as_the_standard_says() -> None:
    """CRLF, CR or LF; comments; multi-line data; `event`; a BOM; no data, no event."""
    assert EVENTS == EventDecoder().feed(STREAM)


@pytest.mark.parametrize("size", [1, 2, 3, 7])
def test_events_split_anywhere_read_the_same(size: int) -> None:
    """However the socket cuts the bytes (inside a CRLF, inside a character), the same events."""
    decoder = EventDecoder()
    got = [e for i in range(0, len(STREAM), size) for e in decoder.feed(STREAM[i : i + size])]
    assert EVENTS == got


def test_an_event_over_its_limit_or_not_utf8_is_refused() -> None:
    """A line of bytes that are not UTF-8, an event past the limit: retryable errors."""
    with pytest.raises(ModelError, match=r"^malformed stream: a line is not UTF-8") as bad:
        EventDecoder().feed(b"data: \xff\n\n")
    assert bad.value.retryable
    with pytest.raises(ModelError, match=r"^an event of the stream is over 64 bytes") as big:
        EventDecoder(limit=64).feed(b"data: " + b"x" * 40 + b"\ndata: " + b"y" * 40)
    assert big.value.retryable
    with pytest.raises(ModelError, match=r"^an event of the stream is over 64 bytes"):
        EventDecoder(limit=64).feed(b"data: " + b"z" * 100)  # a line not yet ended


# the hot store's live key -----------------------------------------------------------------


def test_a_live_reply_shows_until_cleared_or_lapsed(hot: HotStore) -> None:
    """`put_live` shows bytes per agent, replaced by the next, gone when cleared or lapsed."""
    hot.put_live("t", "a", b"one", 60_000)
    hot.put_live("t", "a", b"two", 60_000)
    hot.put_live("t", "b", b"three", 60_000)
    assert {"a": b"two", "b": b"three"} == hot.get_live("t", ["a", "b", "c"])
    assert {} == hot.get_live("other", ["a"])
    hot.clear_live("t", "a")
    hot.clear_live("t", "a")  # gone already: nothing to do
    assert {"b": b"three"} == hot.get_live("t", ["a", "b"])
    hot.put_live("t", "c", b"brief", 50)
    wait_until(lambda: "c" not in hot.get_live("t", ["c"]), "the live reply never lapsed")


def test_the_last_part_before_a_stall_is_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parts within one publishing interval: the last is shown, though no part follows it.

    The refresh (made far off here) is not what shows it: the publisher catches up itself.
    """
    monkeypatch.setattr(live, "REFRESH_EVERY", 600.0)
    hot = MemoryHotStore()
    publisher = live.LivePublisher(hot, WorkingState(task="t", agent="a", epoch=1, superstep=3))
    so_far = ReplySoFar()
    so_far.add_text("one ")
    publisher(so_far)
    wait_until(lambda: _shown(hot, "t", "a") == "one ", "the first part was never shown")
    for part in ("two ", "three"):  # within the interval the first was shown in
        so_far.add_text(part)
        publisher(so_far)
    so_far.call(0).name = "write_file"
    so_far.call(0).parts.append('{"path": "a.txt", "api_key": "sk-proj-' + "x" * 40)
    publisher(so_far)
    wait_until(lambda: _calls_shown(hot) == 1, "the last part was never shown")
    shown = read_live(hot, "t", ["a"])["a"]
    assert ("one two three", 13, 3, 1) == (shown.text, shown.chars, shown.superstep, shown.attempt)
    assert "write_file" == shown.tool_calls[0].name
    assert "sk-proj-" not in shown.tool_calls[0].arguments  # secrets are blotted out
    publisher.close()
    assert {} == hot.get_live("t", ["a"])


def _calls_shown(hot: HotStore) -> int:
    """How many tool calls agent `a` of task `t` shows (0 when it shows nothing)."""
    shown = read_live(hot, "t", ["a"]).get("a")
    return 0 if shown is None else len(shown.tool_calls)


def wait_until(done: Callable[[], object], why: str, limit: float = WAIT_S) -> None:
    """Poll `done` until it is true; fail with `why` after `limit` seconds."""
    deadline = time.monotonic() + limit
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(why)
        time.sleep(0.02)


# a step that streams, on a real Redis ------------------------------------------------------

SAID = "I will read the notes first, then answer."
HOLD_AT = 4  # events sent before the server pauses: the role chunk and 3 pieces of text
NOTES_CALL = ("call_n", "read_file", '{"path": "notes.md"}')


def streaming_spec(server: ScriptedServer, name: str = "Streaming") -> TaskSpec:
    """One agent on `server`'s chat completions that streams, with a file to read."""
    return TaskSpec.model_validate({
        "name": name,
        "goal": "Read the notes.",
        "files": {"notes.md": "the notes\n"},
        "agents": [{"name": "coder", "model": "openai:gpt-test", "base_url": server.base_url,
                    "stream": True, "tools": ["read_file"]}],
    })  # fmt: skip


@dataclass
class Paused:
    """A step whose model has streamed part of its reply and waits for the test to go on."""

    task: str
    client: Client
    said: str  # the text streamed before the pause
    outcome: list[object]  # what the step's superstep returned or raised, once it ended


@contextlib.contextmanager
def paused_step(
    server: ScriptedServer, store: CheckpointStore, url: str, tmp_path: Path
) -> Iterator[Paused]:
    """Submit a streaming task, run its first superstep, yield once Redis shows the pause.

    The server sends part of the reply and waits; on leaving, it sends the rest and the
    step ends.
    """
    hold = threading.Event()
    events = openai_stream(SAID, [NOTES_CALL], count=6, finish_reason="tool_calls")
    server.script = [streamed(events, hold=hold, hold_at=HOLD_AT)]
    said = "".join(pieces(SAID, 6)[: HOLD_AT - 1])
    outcome: list[object] = []

    def run(task: str) -> None:
        try:
            outcome.append(superstep(store, task, tmp_path / "cache"))
        except Exception as exc:  # noqa: BLE001 - the test reads it
            outcome.append(exc)

    with Client(redis_url=url, archive_dir=tmp_path / "archive") as client:
        task = client.submit(streaming_spec(server)).id
        thread = threading.Thread(target=run, args=(task,))
        thread.start()
        try:
            wait_until(lambda: _shown(store.hot, task) == said,
                       f"the live reply never showed {said!r}")  # fmt: skip
            yield Paused(task, client, said, outcome)
        finally:
            hold.set()
            thread.join(WAIT_S)


def _shown(hot: HotStore, task: str, agent: str = "coder") -> str | None:
    """The text the live key of `agent` of `task` shows, None when it shows none."""
    found = read_live(hot, task, [agent]).get(agent)
    return None if found is None else found.text


@pytest.fixture
def url(redis_server: RedisServer, redis_client: redis.Redis) -> str:
    """The session's Redis, flushed (as `real_store`'s is)."""
    return redis_server.url


def test_a_streaming_step_shows_its_reply_in_redis_until_it_ends(
    server: ScriptedServer, real_store: CheckpointStore, url: str, tmp_path: Path,
    redis_client: redis.Redis,
) -> None:  # fmt: skip
    """The reply so far is under the agent's live key while it streams; gone once it ended.

    The whole reply is what the history and trace keep, with its usage.
    """
    with paused_step(server, real_store, url, tmp_path) as paused:
        shown = paused.client.task(paused.task).live_replies()
        reply = shown["coder"]
        assert (paused.said, len(paused.said), []) == (reply.text, reply.chars, reply.tool_calls)
        assert (1, 1) == (reply.superstep, reply.attempt)
        assert 0 < redis_client.pttl(keys.live(paused.task, "coder")) <= LIVE_TTL_MS
    gc = paused.outcome[0]
    assert not isinstance(gc, Exception), gc
    assert 0 == redis_client.exists(keys.live(paused.task, "coder"))
    assert {} == read_live(real_store.hot, paused.task, ["coder"])
    latest = real_store.latest_gc(paused.task)
    assert latest is not None
    state = real_store.read_state(paused.task, "coder", latest.members["coder"].id)
    turn = next(m for m in state.messages if m.role is Role.ASSISTANT)
    assert SAID == turn.content
    assert [ToolCall(id="call_n", name="read_file", args={"path": "notes.md"})] == turn.tool_calls
    assert Usage(prompt_tokens=10, completion_tokens=5) == state.trace[0].usage


def test_a_stream_cut_in_a_step_fails_it_and_keeps_nothing(
    server: ScriptedServer, real_store: CheckpointStore, tmp_path: Path
) -> None:
    """A stream dropped mid-tool-call: a retryable error, and nothing of the reply kept.

    No LC, no vote, no progress; the agent's history is as it was; nothing left shown.
    """
    spec = AgentSpec(name="coder", model="openai:gpt-test", base_url=server.base_url,
                     stream=True, tools=["read_file"])  # fmt: skip
    gc0 = start_task(real_store, record("cut", spec), {"notes.md": b"notes\n"})
    events = openai_stream("Reading.", [NOTES_CALL], count=4, finish_reason="tool_calls")
    server.script = [streamed(_cut_in_a_call(events, b'"arguments":"'), drop=True)]

    def factory(agent: AgentSpec) -> Model:
        return OpenAIModel("gpt-test", base_url=server.base_url, stream=True, max_retries=0)

    with pytest.raises(ModelError) as caught:
        superstep(real_store, "cut", tmp_path / "cache", models=factory)
    assert caught.value.retryable
    epoch = real_store.hot.get_epoch("cut")
    assert {} == real_store.hot.get_votes("cut", epoch, 1)
    assert real_store.hot.get_progress("cut", epoch, 1, "coder") is None
    assert 0 == real_store.latest_gc("cut").number  # type: ignore[union-attr]
    state = real_store.read_state("cut", "coder", gc0.members["coder"].id)
    assert [Role.SYSTEM, Role.USER] == [m.role for m in state.messages]
    assert {} == real_store.hot.get_live("cut", ["coder"])


def test_a_live_view_that_cannot_be_written_never_fails_the_step(
    server: ScriptedServer, real_store: CheckpointStore, url: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Redis refusing the live key's writes: logged once, and the step ends as ever."""
    tried = threading.Event()

    def refused(*args: object) -> None:
        tried.set()
        raise redis.ConnectionError("Connection refused")

    monkeypatch.setattr(RedisHotStore, "put_live", refused)
    monkeypatch.setattr(RedisHotStore, "clear_live", refused)
    hold = threading.Event()
    events = openai_stream(SAID, [NOTES_CALL], count=6, finish_reason="tool_calls")
    server.script = [streamed(events, hold=hold, hold_at=HOLD_AT)]
    spec = streaming_spec(server, "refused").record("refused")
    start_task(real_store, spec, {"notes.md": b"the notes\n"})
    outcome: list[object] = []
    thread = threading.Thread(
        target=lambda: outcome.append(superstep(real_store, "refused", tmp_path / "cache"))
    )
    with capture_logs() as logs:
        thread.start()
        try:
            assert tried.wait(WAIT_S), "the live reply was never written"
        finally:
            hold.set()
            thread.join(WAIT_S)
    assert 1 == outcome[0].number  # type: ignore[attr-defined]
    warned = [entry for entry in logs if entry["event"] == "live reply not shown"]
    assert 1 == len(warned)  # once a call, though both the writes and the clear failed
    assert "ConnectionError: Connection refused" == warned[0]["error"]


# what people see --------------------------------------------------------------------------


def _env(url: str, tmp_path: Path) -> dict[str, str]:
    """The environment of a `cairn` process of the test's Redis and archive."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("CAIRN_")}
    return env | {
        "PYTHONPATH": str(ROOT),
        "CAIRN_REDIS_URL": url,
        "CAIRN_ARCHIVE_DIR": str(tmp_path / "archive"),
        "CAIRN_STATE_DIR": str(tmp_path / "state"),
    }


def test_cairn_watch_shows_the_streaming_reply(
    server: ScriptedServer, real_store: CheckpointStore, url: str, tmp_path: Path
) -> None:
    """`cairn watch --json` prints the agent's reply so far, its last line, as it streams."""
    with (
        paused_step(server, real_store, url, tmp_path) as paused,
        subprocess.Popen(
            [sys.executable, "-m", "cairn.cli", "watch", paused.task, "--json"],
            env=_env(url, tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        ) as watch,
    ):  # fmt: skip
        lines: queue.Queue[str] = queue.Queue()
        reader = threading.Thread(target=_read_lines, args=(watch, lines))
        reader.start()
        try:
            seen = _line_with_live(lines, watch)
        finally:
            watch.kill()
            reader.join()
    assert {"coder": paused.said} == seen["live"]
    assert "running" == seen["status"]


def _read_lines(process: subprocess.Popen[str], lines: queue.Queue[str]) -> None:
    """Put each line `process` prints into `lines`, until it ends."""
    for line in process.stdout or ():
        lines.put(line)


def _line_with_live(lines: queue.Queue[str], watch: subprocess.Popen[str]) -> dict[str, Any]:
    """The first line `cairn watch --json` prints with a live reply in it."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            line: dict[str, Any] = json.loads(lines.get(timeout=0.5))
        except queue.Empty:
            if watch.poll() is not None:
                raise AssertionError(f"cairn watch ended: {watch.stderr.read()}") from None  # type: ignore[union-attr]
            continue
        if line.get("live"):
            return line
    raise AssertionError("cairn watch never showed a live reply")


def test_the_watch_view_shows_each_agents_last_line() -> None:
    """The live view's table gives a streaming agent its reply's last line, as text."""
    status = {"task_id": "t", "status": "running", "superstep": 1, "epoch": 1,
              "latest_checkpoint": 0, "reason": None,
              "agents": [{"name": "coder", "status": "active", "step": 1},
                         {"name": "tester", "status": "active", "step": 1}]}  # fmt: skip
    reply = LiveReply(superstep=1, attempt=1, text="First line.\n[bold]Second[/] line\n",
                      chars=34, at="2026-01-01T00:00:00Z")  # fmt: skip
    assert {"coder": "[bold]Second[/] line"} == watch_line(status, {"coder": reply})["live"]
    from rich.console import Console  # noqa: PLC0415 - the view's own renderer

    console = Console(record=True, width=120)
    console.print(live_view(status, {"coder": reply}))
    shown = console.export_text()
    assert "[bold]Second[/] line" in shown  # markup in a reply is text, not style
    call = LiveCall(name="write_file", arguments='{"path": "a.py"')
    calling = reply.model_copy(update={"tool_calls": [call]})
    assert 'write_file({"path": "a.py"' == calling.last_line()


def test_the_console_shows_the_streaming_reply(
    server: ScriptedServer, real_store: CheckpointStore, url: str, tmp_path: Path
) -> None:
    """`GET /api/tasks/TASK/live` answers it, and the task page draws it (in Chromium)."""
    port = free_port()
    console = spawn(["console", "--port", str(port)], _env(url, tmp_path), tmp_path / "c.log")
    base = f"http://127.0.0.1:{port}"
    try:
        with paused_step(server, real_store, url, tmp_path) as paused:
            wait_until(lambda: _answers(base), f"no console: {(tmp_path / 'c.log').read_text()}")
            with urllib.request.urlopen(f"{base}/api/tasks/{paused.task}/live") as answer:  # noqa: S310 - the test's own
                live = json.loads(answer.read())
            assert ["coder"] == list(live)
            assert (paused.said, []) == (live["coder"]["text"], live["coder"]["tool_calls"])
            _page_shows(f"{base}/tasks/{paused.task}", paused.said)
    finally:
        stop(console)


def _answers(base: str) -> bool:
    """Whether the console answers yet."""
    try:
        with urllib.request.urlopen(base + "/static/console.css", timeout=5):  # noqa: S310
            return True
    except OSError:
        return False


def _page_shows(page_url: str, said: str) -> None:
    """The task page, in Debian's headless Chromium, draws `said` as the agent's reply."""
    executable = shutil.which("chromium")
    assert executable is not None, "chromium is missing: apt-get install chromium (CI does)"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=executable, args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(page_url)
            shown = page.locator('#streaming [data-agent="coder"] pre.live-text')
            expect(shown).to_have_text(said, timeout=WAIT_S * 1000)
            assert [] == errors
        finally:
            browser.close()
