"""OpenAIModel against a scripted chat-completions server on 127.0.0.1.

The server (`ScriptedServer`, an http.server in a thread on a free port) answers every POST
with the next response of its script, whatever the path, so the Anthropic tests use it too.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

import orjson
import pytest
from pydantic import JsonValue

from cairn.agents.models.base import ModelRequest, ToolSchema
from cairn.agents.models.openai import OpenAIModel
from cairn.agents.models.registry import build_model, default_key_variables
from cairn.agents.spec import AgentSpec
from cairn.errors import ModelError
from cairn.storage.records import ImagePart, Message, Role, ToolCall, Usage

FAKE_KEY = "sk-test-secret-0123456789"


@dataclass
class Scripted:
    """One response the server will give: status, body, headers, and a delay first.

    With `trickle`, the body goes out one byte at a time, `trickle` seconds apart.
    With `events`, the answer is a `text/event-stream`, chunked, one chunk an event (a byte,
    with `trickle`), `gap` seconds apart; with `hold`, it stops before event `hold_at`
    until `hold` is set; with `drop`, it ends without the last chunk (a dropped connection).
    """

    status: int = 200
    body: bytes = b"{}"
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    trickle: float = 0.0
    events: list[bytes] | None = None
    gap: float = 0.0
    hold: threading.Event | None = None
    hold_at: int = 0
    drop: bool = False


@dataclass
class Received:
    """One request the server got."""

    path: str
    headers: dict[str, str]
    body: Any


class ScriptedServer(ThreadingHTTPServer):
    """Serves `script` in order and records what it receives in `received`."""

    # Non-daemon handler threads, so that server_close() joins them: a clean teardown.
    daemon_threads = False

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), ScriptedHandler)
        self.script: list[Scripted] = []
        self.received: list[Received] = []
        self.stopping = threading.Event()
        self.lock = threading.Lock()

    @property
    def base_url(self) -> str:
        """The `base_url` an OpenAI-compatible model should be given."""
        return f"{self.root_url}/v1"

    @property
    def root_url(self) -> str:
        """The server's root URL (Anthropic's `base_url` has no /v1)."""
        return f"http://127.0.0.1:{self.server_address[1]}"

    def next_response(self, received: Received) -> Scripted:
        """Record `received` and return the next scripted response (a 599 once out)."""
        with self.lock:
            self.received.append(received)
            return self.script.pop(0) if self.script else Scripted(599, b"script exhausted")


class ScriptedHandler(BaseHTTPRequestHandler):
    """Answers each POST with the server's next scripted response."""

    def do_POST(self) -> None:
        """Record the request, wait the scripted delay, send the scripted response."""
        server = cast(ScriptedServer, self.server)
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        received = Received(self.path, dict(self.headers.items()), orjson.loads(raw))
        response = server.next_response(received)
        if response.delay:
            server.stopping.wait(response.delay)
        if response.events is not None:
            self._stream(server, response, response.events)
            return
        try:
            self.send_response(response.status)
            for name, value in response.headers.items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(response.body)))
            self.end_headers()
            if not response.trickle:
                self.wfile.write(response.body)
            for index in range(len(response.body) if response.trickle else 0):
                self.wfile.write(response.body[index : index + 1])
                self.wfile.flush()
                if server.stopping.wait(response.trickle):
                    break
        except OSError:
            pass  # the client gave up (a timeout test); nobody is left to answer

    def _stream(self, server: ScriptedServer, response: Scripted, events: list[bytes]) -> None:
        """Send `events` as a chunked event stream, as `response` says (gaps, hold, drop)."""
        self.protocol_version = "HTTP/1.1"  # chunked transfer, as the providers stream
        try:
            self.send_response(response.status)
            for name, value in response.headers.items():
                self.send_header(name, value)
            self.send_header("Content-Type", "text/event-stream; charset=utf-8")
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Connection", "close")
            self.end_headers()
            for index, event in enumerate(events):
                if response.hold is not None and index == response.hold_at:
                    _wait_for(response.hold, server.stopping)
                step = 1 if response.trickle else len(event)
                for start in range(0, len(event), step):
                    piece = event[start : start + step]
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    if response.trickle and server.stopping.wait(response.trickle):
                        return
                if response.gap and server.stopping.wait(response.gap):
                    return
            if not response.drop:
                self.wfile.write(b"0\r\n\r\n")
        except OSError:
            pass  # the client gave up (a timeout test); nobody is left to answer

    def log_message(self, format: str, *args: Any) -> None:
        """Keep the test output quiet."""


def _wait_for(hold: threading.Event, stopping: threading.Event, limit: float = 60.0) -> None:
    """Wait until `hold` is set, the server stops, or `limit` seconds pass (a failed test)."""
    deadline = time.monotonic() + limit
    while not hold.wait(0.05) and not stopping.is_set() and time.monotonic() < deadline:
        pass


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[ScriptedServer]:
    """A scripted server on a free port of 127.0.0.1, with no API key in the environment."""
    yield from serve_scripted(monkeypatch)


def serve_scripted(
    monkeypatch: pytest.MonkeyPatch, scripted: ScriptedServer | None = None
) -> Iterator[ScriptedServer]:
    """Run `scripted` (a new `ScriptedServer` by default) until resumed.

    A fixture's body: tests of other files share it.
    """
    for variable in (*default_key_variables("openai"), *default_key_variables("anthropic")):
        monkeypatch.delenv(variable, raising=False)
    # A proxy configured in the environment must not see the requests to 127.0.0.1.
    monkeypatch.setenv("no_proxy", "*")
    monkeypatch.setenv("NO_PROXY", "*")
    scripted = ScriptedServer() if scripted is None else scripted
    thread = threading.Thread(target=scripted.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    yield scripted
    scripted.stopping.set()
    scripted.shutdown()
    thread.join()
    scripted.server_close()


def reply(
    content: str | None = None,
    tool_calls: list[dict[str, JsonValue]] | None = None,
    usage: dict[str, JsonValue] | None = None,
) -> Scripted:
    """A 200 chat-completions response with one choice."""
    message: dict[str, JsonValue] = {"role": "assistant", "content": content}
    if tool_calls is not None:
        message["tool_calls"] = cast(JsonValue, tool_calls)
    body: dict[str, JsonValue] = {"choices": [{"index": 0, "message": message}]}
    if usage is not None:
        body["usage"] = usage
    return Scripted(200, orjson.dumps(body))


def failure(status: int, message: str, headers: dict[str, str] | None = None) -> Scripted:
    """An error response in OpenAI's `{"error": {"message": ...}}` shape."""
    return Scripted(status, orjson.dumps({"error": {"message": message}}), headers or {})


def ask(text: str = "hi") -> ModelRequest:
    """A one-message request with no tools."""
    return ModelRequest(messages=[Message(role=Role.USER, content=text)], tools=[])


def model_for(server: ScriptedServer, sleeps: list[float], **options: Any) -> OpenAIModel:
    """A model of `server` whose sleeps are recorded in `sleeps` instead of slept."""
    return OpenAIModel("gpt-test", base_url=server.base_url, sleep=sleeps.append, **options)


def test_plain_text_answer(server: ScriptedServer) -> None:
    """A text answer comes back as content, from a POST to {base_url}/chat/completions."""
    server.script = [reply("hello")]
    answer = model_for(server, []).complete(ask("hi"))
    assert "hello" == answer.content
    assert [] == answer.tool_calls
    assert "/v1/chat/completions" == server.received[0].path
    expected = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}
    assert expected == server.received[0].body


def test_tool_calls_round_trip(server: ScriptedServer) -> None:
    """Tools, earlier tool calls and tool results go out in chat format; calls come back."""
    server.script = [
        reply(
            None,
            [
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "write", "arguments": '{"path": "b.txt", "text": "x"}'},
                }
            ],
        )
    ]
    tool = ToolSchema(
        name="read",
        description="Read a file.",
        parameters={"type": "object", "properties": {"path": {"type": "string"}}},
    )
    history = [
        Message(role=Role.SYSTEM, content="be brief"),
        Message(role=Role.USER, content="copy a.txt", name="lead"),
        Message(
            role=Role.ASSISTANT,
            tool_calls=[ToolCall(id="call_1", name="read", args={"path": "a.txt"})],
        ),
        Message(role=Role.TOOL, content="x", tool_call_id="call_1"),
    ]
    answer = model_for(server, []).complete(ModelRequest(messages=history, tools=[tool]))

    assert [ToolCall(id="call_2", name="write", args={"path": "b.txt", "text": "x"})] == (
        answer.tool_calls
    )
    assert answer.content is None
    sent = server.received[0].body
    assert [
        {
            "type": "function",
            "function": {
                "name": "read",
                "description": "Read a file.",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
            },
        }
    ] == sent["tools"]
    assert [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "copy a.txt", "name": "lead"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "read", "arguments": '{"path":"a.txt"}'},
                }
            ],
        },
        {"role": "tool", "content": "x", "tool_call_id": "call_1"},
    ] == sent["messages"]


def test_usage_parsed(server: ScriptedServer) -> None:
    """Prompt, completion and cached tokens come back as Usage; no usage gives zeros."""
    server.script = [
        reply(
            "a",
            usage={
                "prompt_tokens": 1200,
                "completion_tokens": 3,
                "prompt_tokens_details": {"cached_tokens": 1024},
            },
        ),
        reply("b", usage={"prompt_tokens": 12, "completion_tokens": 3}),
        reply("c"),
    ]
    model = model_for(server, [])
    expected = Usage(prompt_tokens=1200, completion_tokens=3, cached_tokens=1024)
    assert expected == model.complete(ask()).usage
    assert Usage(prompt_tokens=12, completion_tokens=3) == model.complete(ask()).usage
    assert Usage() == model.complete(ask()).usage


def test_429_honours_retry_after(server: ScriptedServer) -> None:
    """A 429 with Retry-After: 1 is retried after sleeping one second."""
    server.script = [failure(429, "slow down", {"Retry-After": "1"}), reply("done")]
    sleeps: list[float] = []
    answer = model_for(server, sleeps).complete(ask())
    assert "done" == answer.content
    assert [1.0] == sleeps
    assert 2 == len(server.received)


def test_retry_after_http_date_capped_at_max_backoff(server: ScriptedServer) -> None:
    """Retry-After as an HTTP date is honoured, but no wait exceeds max_backoff."""
    later = format_datetime(datetime.now(UTC) + timedelta(seconds=20), usegmt=True)
    server.script = [
        failure(503, "busy", {"Retry-After": later}),
        failure(503, "busy", {"Retry-After": "3600"}),
        reply("done"),
    ]
    sleeps: list[float] = []
    model_for(server, sleeps, max_backoff=30.0).complete(ask())
    assert 17.0 < sleeps[0] <= 20.0
    assert 30.0 == sleeps[1]


def test_503_exhausts_retries(server: ScriptedServer) -> None:
    """Repeated 503s raise a retryable ModelError after max_retries + 1 requests."""
    server.script = [failure(503, "overloaded") for _ in range(5)]
    sleeps: list[float] = []
    with pytest.raises(ModelError) as caught:
        model_for(server, sleeps, max_retries=3, backoff=0.5).complete(ask())
    assert caught.value.retryable
    assert "503" in str(caught.value)
    assert "overloaded" in str(caught.value)
    assert 4 == len(server.received)
    assert 3 == len(sleeps)
    # Full jitter: each wait lies between zero and the doubling ceiling.
    assert all(0.0 <= wait <= 0.5 * 2**n for n, wait in enumerate(sleeps))


def test_401_is_fatal_and_keeps_the_key_secret(server: ScriptedServer) -> None:
    """A 401 fails at once, not retryable, naming the status but never the API key."""
    server.script = [failure(401, f"Incorrect API key provided: {FAKE_KEY}.\nSee docs.")]
    with pytest.raises(ModelError) as caught:
        model_for(server, [], api_key=FAKE_KEY).complete(ask())
    message = str(caught.value)
    assert not caught.value.retryable
    assert 1 == len(server.received)
    assert "HTTP 401: Incorrect API key provided: ***. See docs." == message
    assert FAKE_KEY not in message


def test_other_4xx_is_fatal(server: ScriptedServer) -> None:
    """A 400 fails at once with the server's error message."""
    server.script = [failure(400, "bad tool schema")]
    with pytest.raises(ModelError) as caught:
        model_for(server, []).complete(ask())
    assert "HTTP 400: bad tool schema" == str(caught.value)
    assert not caught.value.retryable


def test_a_reply_past_timeout_is_retryable(server: ScriptedServer) -> None:
    """A server silent past `timeout` gives a retryable ModelError at the deadline.

    `timeout` bounds the whole call, retries included: no retry is started past it.
    """
    server.script = [Scripted(delay=10.0), Scripted(delay=10.0)]
    sleeps: list[float] = []
    started = time.monotonic()
    with pytest.raises(ModelError) as caught:
        model_for(server, sleeps, timeout=0.5, max_retries=3).complete(ask())
    assert time.monotonic() - started < 2.0
    assert caught.value.retryable
    assert "model call failed after 1 attempts: timed out after 0.5 s" == str(caught.value)
    assert 1 == len(server.received)


def test_a_slow_reply_inside_timeout_succeeds(server: ScriptedServer) -> None:
    """A server silent for 1.5 s, then answering, is waited for under a 3 s timeout.

    Nothing cuts the call before `timeout`: no per-read socket timeout shorter than the
    call, which a long generation (no byte sent until it is done) would outlast and pay for
    again on the retry.
    """
    server.script = [Scripted(200, reply("took a while").body, delay=1.5)]
    started = time.monotonic()
    answer = model_for(server, [], timeout=3.0, max_retries=0).complete(ask())
    assert "took a while" == answer.content
    assert time.monotonic() - started >= 1.5


def test_a_trickled_reply_is_cut_at_timeout(server: ScriptedServer) -> None:
    """A body sent a byte every 50 ms, each read quick, is still cut at the call's deadline."""
    server.script = [Scripted(200, reply("x" * 200).body, trickle=0.05)]
    started = time.monotonic()
    with pytest.raises(ModelError) as caught:
        model_for(server, [], timeout=1.0, max_retries=0).complete(ask())
    assert time.monotonic() - started < 2.0
    assert caught.value.retryable
    assert "timed out after 1 s" in str(caught.value)


def test_no_retry_is_started_past_timeout(server: ScriptedServer) -> None:
    """A 429 asking for a wait that ends past the deadline fails at once, retryable."""
    server.script = [failure(429, "slow down", {"Retry-After": "20"}), reply("late")]
    sleeps: list[float] = []
    with pytest.raises(ModelError) as caught:
        model_for(server, sleeps, timeout=5.0).complete(ask())
    assert caught.value.retryable
    assert "HTTP 429: slow down" in str(caught.value)
    assert [] == sleeps
    assert 1 == len(server.received)


@pytest.mark.usefixtures("server")  # for its environment: no proxy, no key
def test_connection_refused_is_retryable() -> None:
    """Nobody listening on the port is a retryable ModelError after the retries."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    sleeps: list[float] = []
    model = OpenAIModel("m", f"http://127.0.0.1:{port}/v1", max_retries=1, sleep=sleeps.append)
    with pytest.raises(ModelError) as caught:
        model.complete(ask())
    assert caught.value.retryable
    assert 1 == len(sleeps)


def test_malformed_json_is_retryable(server: ScriptedServer) -> None:
    """A 200 whose body is no JSON raises a retryable ModelError, without retrying here."""
    server.script = [Scripted(200, b"<html>oops</html>")]
    with pytest.raises(ModelError) as caught:
        model_for(server, []).complete(ask())
    assert caught.value.retryable
    assert "malformed response" in str(caught.value)
    assert 1 == len(server.received)


def test_missing_choices_is_retryable(server: ScriptedServer) -> None:
    """A JSON body without choices raises a retryable ModelError."""
    server.script = [Scripted(200, b'{"choices": []}')]
    with pytest.raises(ModelError) as caught:
        model_for(server, []).complete(ask())
    assert caught.value.retryable
    assert "malformed response" in str(caught.value)


def test_invalid_tool_arguments_come_back_raw(server: ScriptedServer) -> None:
    """Tool arguments that are not a JSON object come back as {"_raw": text}."""
    calls: list[dict[str, JsonValue]] = [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": '}},
        {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "[1, 2]"}},
    ]
    server.script = [reply(None, calls)]
    answer = model_for(server, []).complete(ask())
    expected = [
        ToolCall(id="c1", name="f", args={"_raw": '{"a": '}),
        ToolCall(id="c2", name="g", args={"_raw": "[1, 2]"}),
    ]
    assert expected == answer.tool_calls


def test_authorization_header_carries_the_key(server: ScriptedServer) -> None:
    """A given API key is sent as a Bearer token."""
    server.script = [reply("ok")]
    model_for(server, [], api_key=FAKE_KEY).complete(ask())
    assert f"Bearer {FAKE_KEY}" == server.received[0].headers["Authorization"]


def test_no_key_no_authorization_header(server: ScriptedServer) -> None:
    """Without a key (none given, none in the environment) no Authorization is sent."""
    server.script = [reply("ok")]
    model_for(server, []).complete(ask())
    assert "Authorization" not in server.received[0].headers


def test_key_from_the_environment_given(server: ScriptedServer) -> None:
    """Without api_key_env, CAIRN_OPENAI_API_KEY is preferred to OPENAI_API_KEY."""
    spec = AgentSpec(name="a", model="openai:gpt-test", base_url=server.base_url)
    environ = {"OPENAI_API_KEY": "sk-generic", "CAIRN_OPENAI_API_KEY": "sk-cairn"}
    server.script = [reply("ok"), reply("ok")]
    build_model(spec, environ).complete(ask())
    build_model(spec, {"OPENAI_API_KEY": "sk-generic"}).complete(ask())
    sent = [r.headers["Authorization"] for r in server.received]
    assert ["Bearer sk-cairn", "Bearer sk-generic"] == sent


def test_the_process_environment_is_not_read(
    server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key in os.environ but not in the environment given is not sent."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-process")
    spec = AgentSpec(name="a", model="openai:gpt-test", base_url=server.base_url)
    server.script = [reply("ok")]
    build_model(spec, {}).complete(ask())
    assert "Authorization" not in server.received[0].headers


def test_params_and_headers_reach_the_server(server: ScriptedServer) -> None:
    """An agent's params go into the body, its headers onto the request, beside the key."""
    spec = AgentSpec(
        name="a",
        model="openai:gpt-test",
        base_url=server.base_url,
        params={"temperature": 0.2, "max_tokens": 50, "seed": 7, "tool_choice": "auto"},
        headers={"X-Team": "blue", "OpenAI-Organization": "org-1"},
    )
    server.script = [reply("ok")]
    build_model(spec, {"OPENAI_API_KEY": FAKE_KEY}).complete(ask())
    got = server.received[0]
    assert {
        "temperature": 0.2,
        "max_tokens": 50,
        "seed": 7,
        "tool_choice": "auto",
        "model": "gpt-test",
        "messages": [{"role": "user", "content": "hi"}],
    } == got.body
    assert "blue" == got.headers["X-Team"]
    assert "org-1" == got.headers["OpenAI-Organization"]
    assert f"Bearer {FAKE_KEY}" == got.headers["Authorization"]


def test_several_tool_calls_in_one_turn(server: ScriptedServer) -> None:
    """Two calls of one turn come back in order; their results go out one message each."""
    calls: list[dict[str, JsonValue]] = [
        {"id": "c1", "type": "function", "function": {"name": "read", "arguments": '{"p": "a"}'}},
        {"id": "c2", "type": "function", "function": {"name": "read", "arguments": '{"p": "b"}'}},
    ]
    server.script = [reply("reading both", calls)]
    model = model_for(server, [])
    answer = model.complete(ask())
    assert [
        ToolCall(id="c1", name="read", args={"p": "a"}),
        ToolCall(id="c2", name="read", args={"p": "b"}),
    ] == answer.tool_calls
    assert "reading both" == answer.content
    history = [
        Message(role=Role.USER, content="hi"),
        Message(role=Role.ASSISTANT, content=answer.content, tool_calls=answer.tool_calls),
        Message(role=Role.TOOL, content="A", tool_call_id="c1", name="read"),
        Message(role=Role.TOOL, content="B", tool_call_id="c2", name="read"),
    ]
    server.script = [reply("done")]
    model.complete(ModelRequest(messages=history, tools=[]))
    sent = server.received[1].body["messages"]
    assert ["c1", "c2"] == [call["id"] for call in sent[1]["tool_calls"]]
    assert [("tool", "c1", "A"), ("tool", "c2", "B")] == [
        (m["role"], m["tool_call_id"], m["content"]) for m in sent[2:]
    ]


def test_a_proxy_from_the_environment_given(server: ScriptedServer) -> None:
    """http_proxy in the environment given carries the request (absolute-form); no_proxy not."""
    server.script = [reply("via proxy"), reply("direct")]
    proxied = OpenAIModel(
        "m", "http://models.invalid/v1", environ={"http_proxy": server.root_url}, max_retries=0
    )
    assert "via proxy" == proxied.complete(ask()).content
    assert "http://models.invalid/v1/chat/completions" == server.received[0].path
    direct = OpenAIModel(
        "m",
        server.base_url,
        environ={"HTTP_PROXY": "http://127.0.0.1:9", "NO_PROXY": "localhost,127.0.0.1"},
        max_retries=0,
    )
    assert "direct" == direct.complete(ask()).content
    assert "/v1/chat/completions" == server.received[1].path


def test_a_tool_results_images_are_notes_saying_they_are_not_shown(
    server: ScriptedServer,
) -> None:
    """A chat `tool` message takes text only: each image's note says the model lacks it."""
    server.script = [reply("ok")]
    image = ImagePart(media_type="image/png", data="iVBORw0KGgo=")
    history = [
        Message(role=Role.USER, content="look"),
        Message(role=Role.ASSISTANT, tool_calls=[ToolCall(id="c1", name="see", args={})]),
        Message(role=Role.TOOL, content="[image/png, 8 bytes]", tool_call_id="c1", images=[image]),
    ]
    model_for(server, []).complete(ModelRequest(messages=history, tools=[]))
    sent = server.received[0].body["messages"][-1]
    assert "[image/png, 8 bytes: not shown to this model]" == sent["content"]
