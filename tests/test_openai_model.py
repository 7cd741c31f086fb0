"""OpenAIModel against a scripted chat-completions server on 127.0.0.1."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

import orjson
import pytest
from pydantic import JsonValue

from agents.models.base import ModelRequest, ToolSchema
from agents.models.openai import API_KEY_VARIABLES, OpenAIModel
from storage.errors import ModelError
from storage.records import Message, Role, ToolCall, Usage

FAKE_KEY = "sk-test-secret-0123456789"


@dataclass
class Scripted:
    """One response the server will give: status, body, headers, and a delay first."""

    status: int = 200
    body: bytes = b"{}"
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


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
        """The `base_url` a model should be given."""
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

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
        try:
            self.send_response(response.status)
            for name, value in response.headers.items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(response.body)))
            self.end_headers()
            self.wfile.write(response.body)
        except OSError:
            pass  # the client gave up (a timeout test); nobody is left to answer

    def log_message(self, format: str, *args: Any) -> None:
        """Keep the test output quiet."""


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[ScriptedServer]:
    """A scripted server on a free port of 127.0.0.1, with no API key in the environment."""
    yield from serve_scripted(monkeypatch)


def serve_scripted(monkeypatch: pytest.MonkeyPatch) -> Iterator[ScriptedServer]:
    """Run a `ScriptedServer` until resumed (a fixture's body: tests of other files share it)."""
    for variable in API_KEY_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    # A proxy configured in the environment must not see the requests to 127.0.0.1.
    monkeypatch.setenv("no_proxy", "*")
    monkeypatch.setenv("NO_PROXY", "*")
    scripted = ScriptedServer()
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
    """Prompt and completion tokens come back as Usage; a reply without usage has zeros."""
    server.script = [reply("a", usage={"prompt_tokens": 12, "completion_tokens": 3}), reply("b")]
    model = model_for(server, [])
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


def test_timeout_is_retryable(server: ScriptedServer) -> None:
    """A server slower than the timeout is retried, then raises a retryable ModelError."""
    server.script = [Scripted(delay=10.0), Scripted(delay=10.0)]
    sleeps: list[float] = []
    with pytest.raises(ModelError) as caught:
        model_for(server, sleeps, timeout=0.2, max_retries=1).complete(ask())
    assert caught.value.retryable
    assert "timed out" in str(caught.value)
    assert 2 == len(server.received)


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


def test_key_from_environment(server: ScriptedServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """CAIRN_OPENAI_API_KEY is preferred to OPENAI_API_KEY when no key is given."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-generic")
    monkeypatch.setenv("CAIRN_OPENAI_API_KEY", "sk-cairn")
    server.script = [reply("ok")]
    model_for(server, []).complete(ask())
    assert "Bearer sk-cairn" == server.received[0].headers["Authorization"]
