"""Prompt caching: Anthropic's breakpoints, OpenAI's stable prefix and cache key, what is billed.

Every request is checked against the SDK's own request type (`tests.sdk_wire`). What a
prompt cache makes of the requests is billed by `bench.cache_server`, a local Messages API
that bills as Anthropic documents its cache (breakpoints, the 20-block lookback, 1.25x
writes, 0.1x reads), its responses checked against the SDK's `Message`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import orjson
import pytest
from anthropic.types import Message as AnthropicMessage
from anthropic.types import ToolUseBlock
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import JsonValue

from bench.cache_server import (
    MAX_BREAKPOINTS,
    BadRequest,
    Bill,
    ModelServer,
    Play,
    PromptCache,
    Reply,
)
from cairn.agents.cache import WorkerCache
from cairn.agents.models.anthropic import AnthropicModel
from cairn.agents.models.base import ModelRequest, ToolSchema
from cairn.agents.models.openai import OpenAIModel, prompt_cache_key
from cairn.agents.spec import AgentSpec, TaskRecord
from cairn.agents.task import start_task
from cairn.coordinator.spend import read_spend
from cairn.storage.backends.redis import RedisHotStore
from cairn.storage.records import ImagePart, Message, Role, ToolCall, TraceRecord
from cairn.storage.store import CheckpointStore
from tests import sdk_wire
from tests.agent_harness import superstep
from tests.sdk_wire import anthropic_request_errors, history, openai_reply, openai_request_errors
from tests.test_openai_model import ScriptedServer, serve_scripted

TOOLS = [
    ToolSchema("read_file", "Read a file.", {"type": "object", "properties": {}}),
    ToolSchema("write_file", "Write a file.", {"type": "object", "properties": {}}),
]
PNG = ImagePart(media_type="image/png", data="iVBORw0KGgo=")
DONE = Reply([{"type": "text", "text": "done"}])  # an answer with no tool calls
BIG = "word " * 2000  # 10,000 bytes: 2,500 tokens, over the least prefix Anthropic caches


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[ScriptedServer]:
    """A scripted server on a free port of 127.0.0.1."""
    yield from serve_scripted(monkeypatch)


def cache_points(value: object, where: str = "$") -> list[str]:
    """Where in a request's JSON a `cache_control` is set (not null), as paths."""
    found: list[str] = []
    if isinstance(value, dict):
        if value.get("cache_control") is not None:
            found.append(where)
        for key, item in value.items():
            found += cache_points(item, f"{where}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += cache_points(item, f"{where}[{index}]")
    return found


def anthropic_body(server: ScriptedServer, history: list[Message], **options: Any) -> Any:
    """The body `AnthropicModel` sends for `history` with TOOLS on offer."""
    server.script = [sdk_wire.anthropic_reply(sdk_wire.text("ok"))]
    model = AnthropicModel("m-test", base_url=server.root_url, **options)
    model.complete(ModelRequest(history, TOOLS))
    return server.received[-1].body


def pairs_intact(messages: list[Any]) -> bool:
    """Each assistant turn's tool_use ids open the next user turn as tool_results, in order."""
    for index, turn in enumerate(messages):
        uses = [b["id"] for b in turn["content"] if b["type"] == "tool_use"]
        if not uses:
            continue
        if index + 1 == len(messages):
            return False
        answered = [b["tool_use_id"] for b in messages[index + 1]["content"][: len(uses)]
                    if b["type"] == "tool_result"]  # fmt: skip
        if messages[index + 1]["role"] != "user" or answered != uses:
            return False
    return True


# --- Anthropic: where the breakpoints go ------------------------------------------------------


def test_anthropic_marks_the_tools_the_system_and_the_last_two_requests_ends(
    server: ScriptedServer,
) -> None:
    """Breakpoints: the last tool, the system, the ends of this request and the one before.

    The request before ended with the turn ahead of the last assistant turn. Four, no more.
    """
    body = anthropic_body(server, history())
    assert [] == anthropic_request_errors(body)
    assert [
        "$.messages[0].content[0]",
        "$.messages[2].content[2]",
        "$.system[0]",
        "$.tools[1]",
    ] == sorted(cache_points(body))
    system = {"type": "text", "text": "You are a coder.", "cache_control": {"type": "ephemeral"}}
    assert [system] == body["system"]
    assert {"type": "ephemeral"} == body["messages"][2]["content"][2]["cache_control"]
    assert pairs_intact(body["messages"])


def test_a_tool_result_with_an_image_is_the_marked_end_and_keeps_its_image(
    server: ScriptedServer,
) -> None:
    """A tool result holding an image, at the end of the request, carries the breakpoint."""
    history = [
        Message(role=Role.USER, content="look"),
        Message(role=Role.ASSISTANT, tool_calls=[ToolCall(id="t1", name="see", args={})]),
        Message(role=Role.TOOL, content="[image/png, 8 bytes]", tool_call_id="t1", images=[PNG]),
    ]
    body = anthropic_body(server, history)
    assert [] == anthropic_request_errors(body)
    [result] = body["messages"][-1]["content"]
    assert {
        "type": "tool_result",
        "tool_use_id": "t1",
        "content": [
            {"type": "text", "text": "[image/png, 8 bytes]"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": PNG.data}},
        ],
        "cache_control": {"type": "ephemeral"},
    } == result  # fmt: skip
    expected = ["$.messages[0].content[0]", "$.messages[2].content[0]", "$.tools[1]"]
    assert expected == sorted(cache_points(body))


def test_params_cache_control_turns_cairns_breakpoints_off(server: ScriptedServer) -> None:
    """Caching is on by default; a `cache_control` in `params` leaves it to them.

    `null` sends no breakpoint; `{type: ephemeral}` leaves the one breakpoint to the API.
    """
    assert 4 == len(cache_points(anthropic_body(server, history())))
    off = anthropic_body(server, history(), params={"cache_control": None})
    assert ([], []) == (cache_points(off), anthropic_request_errors(off))
    assert off["cache_control"] is None
    automatic = {"type": "ephemeral", "ttl": "1h"}
    auto = anthropic_body(server, history(), params={"cache_control": automatic})
    assert (["$"], []) == (cache_points(auto), anthropic_request_errors(auto))


texts = st.sampled_from(["", " ", "a", "do it", "\n"])


@st.composite
def histories(draw: st.DrawFn) -> list[Message]:
    """Histories of any shape: system messages anywhere, empty turns, turns of many calls."""
    leading = draw(st.integers(0, 2))
    messages = [Message(role=Role.SYSTEM, content=draw(texts)) for _ in range(leading)]
    for turn in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["user", "assistant", "calls", "system"]))
        if kind == "calls":
            calls = [ToolCall(id=f"c{turn}_{i}", name="read_file", args={"path": "x", "n": i})
                     for i in range(draw(st.integers(1, 24)))]  # fmt: skip
            messages.append(Message(role=Role.ASSISTANT, content=draw(texts), tool_calls=calls))
            messages += [
                Message(role=Role.TOOL, tool_call_id=call.id, content=draw(texts),
                        images=[PNG] if draw(st.booleans()) else [], error=draw(st.booleans()))
                for call in calls
            ]  # fmt: skip
        else:
            role = {"user": Role.USER, "assistant": Role.ASSISTANT, "system": Role.SYSTEM}[kind]
            messages.append(Message(role=role, content=draw(texts)))
    return messages


@settings(max_examples=150, deadline=None)
@given(history=histories(), with_tools=st.booleans())
def test_any_history_gets_at_most_four_breakpoints_the_last_block_one(
    history: list[Message], with_tools: bool
) -> None:
    """Any history: an admitted request, at most 4 breakpoints, the last block one of them.

    And every tool_use is answered at the start of the next turn, as before.
    """
    request = ModelRequest(history, TOOLS if with_tools else [])
    body: Any = AnthropicModel("m-test").request_body(request)
    points = cache_points(body)
    assert [] == anthropic_request_errors(body)
    assert len(points) <= MAX_BREAKPOINTS
    messages = body["messages"]
    if messages:
        last = f"$.messages[{len(messages) - 1}].content[{len(messages[-1]['content']) - 1}]"
        assert last in points
    assert ("$.tools[1]" in points) == with_tools
    assert pairs_intact(messages)


# --- Anthropic: what the cache bills, through steps -----------------------------------------


def write_turn(number: int, calls: int = 1) -> Reply:
    """A reply writing `calls` files of BIG."""
    uses = [{"type": "tool_use", "id": f"toolu_{number}_{i}", "name": "write_file",
             "input": {"path": f"f{i}.txt", "content": BIG}} for i in range(calls)]  # fmt: skip
    return Reply([{"type": "text", "text": f"turn {number}"}, *uses], "tool_use")


def scripted_play(replies: list[Reply]) -> Play:
    """A `play` answering the n-th request (n assistant turns before it) with replies[n]."""

    def play(body: Mapping[str, Any]) -> Reply:
        answered: int = sum(m["role"] == "assistant" for m in body["messages"])
        return replies[answered]

    return play


def claude(url: str, name: str = "a", **params: JsonValue) -> AgentSpec:
    """An `anthropic:` agent of the server at `url`, with write_file."""
    return AgentSpec(name=name, model="anthropic:claude-test", base_url=url, system=BIG,
                     tools=["write_file"], params=params)  # fmt: skip


def run(store: CheckpointStore, task: str, agent: AgentSpec, cache: Path, steps: int) -> None:
    """Start `task` with `agent` and run `steps` supersteps of it."""
    prices = {agent.model: {"input": 3.0, "output": 15.0, "cached": 0.3}}
    fields = {"task": task, "goal": "Write the files.", "agents": [agent], "prices": prices}
    start_task(store, TaskRecord.model_validate(fields), {})
    for _ in range(steps):
        superstep(store, task, cache)


def model_turns(store: CheckpointStore, task: str) -> list[TraceRecord]:
    """The model turns in agent a's trace at the task's latest GC."""
    gc = store.latest_gc(task)
    assert gc is not None
    return [t for t in store.read_state(task, "a", gc.members["a"].id).trace if t.tool is None]


def test_each_step_reads_the_request_before_from_the_cache_and_is_counted(
    real_store: CheckpointStore, tmp_path: Path
) -> None:
    """Step n+1 reads all of step n's prompt from the cache and writes only what is new.

    On another worker too (the state read back from the store). The trace and the task's
    spend count the cached tokens; the cost prices them as cached.
    """
    play = scripted_play([write_turn(1), write_turn(2), DONE])
    with ModelServer(play) as model:
        run(real_store, "reads", claude(model.url), tmp_path / "cache", 2)
        superstep(real_store, "reads", tmp_path / "other", warm=WorkerCache())
    first, second, third = model.bills
    # Each reads the whole request before, and writes what it adds.
    assert [(0, first.prompt), (first.prompt, second.prompt - first.prompt),
            (second.prompt, third.prompt - second.prompt)] == [
        (b.cache_read_input_tokens, b.cache_creation_input_tokens) for b in model.bills
    ]  # fmt: skip
    assert [] == [e for raw in model.received for e in anthropic_request_errors(orjson.loads(raw))]
    turns = model_turns(real_store, "reads")
    usages = [t.usage for t in turns if t.usage is not None]
    assert [(b.prompt, b.cache_read_input_tokens) for b in model.bills] == [
        (u.prompt_tokens, u.cached_tokens) for u in usages
    ]
    assert [b.cache_creation_input_tokens for b in model.bills] == [
        u.cache_write_tokens for u in usages
    ]
    # Reads at the table's `cached`, writes at 1.25x `input` (Anthropic's), the rest at `input`.
    uncached = third.prompt - third.cache_read_input_tokens - third.cache_creation_input_tokens
    price = (
        uncached * 3.0
        + third.cache_creation_input_tokens * 3.75
        + (third.cache_read_input_tokens * 0.3 + third.output_tokens * 15.0)
    )
    assert price / 1e6 == pytest.approx(usages[2].cost_usd)
    assert isinstance(real_store.hot, RedisHotStore)
    spent = read_spend(real_store.hot.redis, "reads")[0]["a"]
    prompt, read = (sum(b.prompt for b in model.bills), sum(cached(b)[1] for b in model.bills))
    assert (prompt, read) == (spent.prompt_tokens, spent.cached_tokens)


def test_a_step_of_many_tool_calls_still_reads_the_whole_request_before(
    real_store: CheckpointStore, tmp_path: Path
) -> None:
    """A step adding more blocks than the 20-block lookback still reads the request before.

    A breakpoint stays at the end of the request before; one moving breakpoint reads nothing.
    """
    replies = [write_turn(1), write_turn(2, calls=12), DONE]
    with ModelServer(scripted_play(replies)) as model:
        run(real_store, "wide", claude(model.url), tmp_path / "cache", 3)
    assert model.bills[2].cache_read_input_tokens == model.bills[1].prompt
    with ModelServer(scripted_play(replies)) as auto:
        lone = claude(auto.url, cache_control={"type": "ephemeral"})
        run(real_store, "lone", lone, tmp_path / "cache2", 3)
    assert model.bills[1].prompt == auto.bills[1].prompt
    assert (auto.bills[1].cache_read_input_tokens, auto.bills[2].cache_read_input_tokens) == (
        auto.bills[0].prompt,
        0,
    )


# --- the billing server itself ----------------------------------------------------------------


def request(*turns: list[dict[str, Any]], **top: Any) -> dict[str, Any]:
    """A Messages API body of alternating user/assistant `turns`."""
    roles = ["user", "assistant"]
    messages = [{"role": roles[i % 2], "content": blocks} for i, blocks in enumerate(turns)]
    return {"model": "m", "max_tokens": 8, "messages": messages, **top}


def block(text: str, mark: bool = False) -> dict[str, Any]:
    """A text block, a breakpoint when `mark`."""
    point = {"cache_control": {"type": "ephemeral"}} if mark else {}
    return {"type": "text", "text": text, **point}


def cached(bill: Bill) -> tuple[int, int]:
    """What `bill` wrote to the cache and read from it."""
    return bill.cache_creation_input_tokens, bill.cache_read_input_tokens


def test_the_billing_cache_reads_what_a_breakpoint_reaches_and_no_further() -> None:
    """The bench's cache reads what a breakpoint reaches: 20 block boundaries back, no more.

    A prefix shorter than the least is not written; a fifth breakpoint is refused.
    """
    cache = PromptCache(min_tokens=100)
    short = cache.bill(request([block("x" * 40, mark=True)]))
    assert (short.prompt, 0, 0) == (short.input_tokens, *cached(short))
    first = cache.bill(request([block("x" * 400, mark=True)]))
    assert (0, first.prompt, 0) == (first.input_tokens, *cached(first))
    near = request([block("x" * 400), *(block("y") for _ in range(18)), block("z", mark=True)])
    bill = cache.bill(near)
    assert (0, bill.prompt - first.prompt, first.prompt) == (bill.input_tokens, *cached(bill))
    far = request([block("x" * 400), *(block("y") for _ in range(19)), block("z", mark=True)])
    assert 0 == cache.bill(far).cache_read_input_tokens
    marked = [block("a", mark=True) for _ in range(4)]
    automatic = request([*marked, block("b")], cache_control={"type": "ephemeral"})
    with pytest.raises(BadRequest, match="Found 5"):
        cache.bill(automatic)


def test_the_billing_server_answers_as_the_messages_api() -> None:
    """Its responses are the SDK's `Message`, usage and all."""
    with ModelServer(scripted_play([write_turn(1)])) as model:
        status, answer = model.answer(orjson.dumps(request([block("hi")])))
    assert 200 == status
    parsed = AnthropicMessage.model_validate_json(answer)
    assert 0 == parsed.usage.cache_read_input_tokens
    assert isinstance(parsed.content[1], ToolUseBlock)
    assert "write_file" == parsed.content[1].name


# --- OpenAI: a byte-stable prefix and a cache key ------------------------------------------


def gpt(server: ScriptedServer, name: str = "a", **params: JsonValue) -> AgentSpec:
    """An `openai:` agent of `server`, with read_file and write_file."""
    return AgentSpec(name=name, model="openai:m-test", base_url=server.base_url, params=params,
                     tools=["read_file", "write_file"])  # fmt: skip


def test_each_openai_request_starts_with_the_bytes_of_the_one_before(
    server: ScriptedServer, real_store: CheckpointStore, tmp_path: Path
) -> None:
    """Step n+1's body starts with step n's bytes, up to the end of step n's messages.

    Tools first, messages last, keys in one order: even when another worker, which read the
    state back from the store, sends it.
    """
    written = '{"path": "a.py", "content": "x = 1\\n"}'  # not in sorted order
    server.script = [
        openai_reply(None, [("call_1", "write_file", written)], finish_reason="tool_calls"),
        openai_reply(None, [("call_2", "read_file", '{"path": "a"}')], finish_reason="tool_calls"),
        openai_reply("done"),
    ]
    start_task(real_store, TaskRecord(task="stable", goal="Write a.py.", agents=[gpt(server)]), {})
    superstep(real_store, "stable", tmp_path / "cache")
    superstep(real_store, "stable", tmp_path / "cache")  # on the worker that wrote step 1
    superstep(real_store, "stable", tmp_path / "other", warm=WorkerCache())  # on another
    bodies = [received.body for received in server.received]
    assert [[] for _ in bodies] == [openai_request_errors(body) for body in bodies]
    for before, after in itertools.pairwise(bodies):
        sent = orjson.dumps(before)
        assert sent.endswith(b"]}")  # the messages close the body
        assert orjson.dumps(after).startswith(sent[: -len(b"]}")])
        assert before["tools"] == after["tools"]


def test_openai_sends_a_cache_key_to_openai_or_when_params_ask(server: ScriptedServer) -> None:
    """`prompt_cache_key` goes to api.openai.com, and elsewhere when `params` say true.

    Not when they say false, nor to another server by default; a key of their own as it is.
    """
    sent: list[object] = []
    derived = prompt_cache_key("t1", "coder")
    cases: list[tuple[str, dict[str, JsonValue], str | None]] = [
        ("http://api.openai.com/v1", {}, derived),
        ("http://api.openai.com/v1", {"prompt_cache_key": False}, None),
        (server.base_url, {}, None),
        (server.base_url, {"prompt_cache_key": True}, derived),
        (server.base_url, {"prompt_cache_key": "mine"}, "mine"),
    ]
    for base_url, params, _ in cases:
        server.script = [openai_reply("ok")]
        # api.openai.com is reached through the scripted server as a proxy.
        OpenAIModel("m-test", base_url=base_url, params=params,
                    environ={"http_proxy": server.root_url}).complete(
            ModelRequest(history(), TOOLS, agent="coder", task="t1")
        )  # fmt: skip
        body = server.received[-1].body
        assert [] == openai_request_errors(body)
        sent.append(body.get("prompt_cache_key"))
    assert [expected for *_, expected in cases] == sent


def test_a_cache_key_is_the_agents_own_and_names_nothing(
    server: ScriptedServer, real_store: CheckpointStore, tmp_path: Path
) -> None:
    """Through steps, each agent of a task has a key of its own, another in another task.

    Neither the task's name nor the agent's is in it.
    """
    server.script = [openai_reply("ok") for _ in range(3)]
    team = [gpt(server, name, prompt_cache_key=True) for name in ("coder", "tester")]
    start_task(real_store, TaskRecord(task="keyed", goal="Go.", agents=team), {})
    superstep(real_store, "keyed", tmp_path / "cache")
    start_task(real_store, TaskRecord(task="other", goal="Go.", agents=team[:1]), {})
    superstep(real_store, "other", tmp_path / "cache")
    keys = [received.body["prompt_cache_key"] for received in server.received]
    assert [prompt_cache_key("keyed", "coder"), prompt_cache_key("keyed", "tester"),
            prompt_cache_key("other", "coder")] == keys  # fmt: skip
    assert len(set(keys)) == 3
    assert not any(name in key for key in keys for name in ("keyed", "other", "coder", "tester"))
