"""An OpenAI-compatible chat-completions model over the stdlib's HTTP client.

Works with api.openai.com and any server speaking the same `/chat/completions` dialect
(vLLM, llama.cpp, Ollama, LiteLLM...). Transient failures are retried here, with
exponential backoff and full jitter; what is left is raised as `ModelError`.
"""

from __future__ import annotations

import http.client
import os
import random
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import orjson
from pydantic import JsonValue

from agents.models.base import ModelReply, ModelRequest, ToolSchema, check_reply
from storage.errors import ModelError
from storage.ids import new_id
from storage.records import Message, ToolCall, Usage

API_KEY_VARIABLES = ("CAIRN_OPENAI_API_KEY", "OPENAI_API_KEY")
# 408 timeout, 409 conflict (OpenAI's "try again"), 429 rate limit; every 5xx as well.
RETRYABLE_STATUSES = frozenset({408, 409, 429})
FIRST_SERVER_ERROR = 500
MAX_ERROR_CHARS = 300
MAX_RESPONSE_BYTES = 16 * 1024 * 1024  # of a 2xx body; a reply within check_reply's is far less
MAX_ERROR_BODY_BYTES = 64 * 1024  # of an error body, of which MAX_ERROR_CHARS are shown


class OpenAIModel:
    """A `Model` that asks an OpenAI-compatible server for each turn.

    Timeouts, dropped connections, HTTP 408, 409, 429 and 5xx are retried up to
    `max_retries` times. Before retry n (from 0) it sleeps a uniform random time in
    [0, min(max_backoff, backoff * 2**n)]; a `Retry-After` header raises that to at
    least the server's wish, and the wait never exceeds `max_backoff`. `timeout` bounds
    each connect and each read, not the whole call. Any other 4xx fails at once.
    """

    def __init__(
        self,
        model: str,
        base_url: str = "https://api.openai.com/v1",
        api_key: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 4,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if urllib.parse.urlsplit(base_url).scheme not in {"http", "https"}:
            raise ValueError(f"base_url must be an http(s) URL, not {base_url!r}")
        self.model = model
        self.url = base_url.rstrip("/") + "/chat/completions"
        self._api_key = api_key if api_key is not None else _api_key_from_environment()
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self._sleep = sleep

    def complete(self, request: ModelRequest) -> ModelReply:
        """Answer one turn, retrying transient failures; raise `ModelError` otherwise."""
        body: dict[str, JsonValue] = {
            "model": self.model,
            "messages": [_wire_message(message) for message in request.messages],
        }
        if request.tools:
            body["tools"] = [_wire_tool(tool) for tool in request.tools]
        payload = orjson.dumps(body)
        retry = 0
        while True:
            try:
                return _parse_reply(self._post(payload))
            except _TransientError as error:
                if retry >= self.max_retries:
                    raise ModelError(
                        f"model call failed after {retry + 1} attempts: {error}", retryable=True
                    ) from error
                self._sleep(self._delay(retry, error.retry_after))
                retry += 1

    def _post(self, payload: bytes) -> bytes:
        """POST once and return the body of a 2xx answer; raise `_TransientError` or fatal."""
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        # S310 warns of file: URLs; __init__ admits http(s) only.
        request = urllib.request.Request(self.url, payload, headers, method="POST")  # noqa: S310
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310
                body: bytes = response.read(MAX_RESPONSE_BYTES + 1)
                if len(body) > MAX_RESPONSE_BYTES:
                    # Retryable as a malformed reply is (see check_reply); nothing more is read.
                    raise ModelError(
                        f"response body is over {MAX_RESPONSE_BYTES} bytes", retryable=True
                    )
                return body
        except urllib.error.HTTPError as error:
            with error:  # closes the connection the error response holds
                message = f"HTTP {error.code}: {self._redact(_server_message(error))}"
                if error.code in RETRYABLE_STATUSES or error.code >= FIRST_SERVER_ERROR:
                    retry_after = _parse_retry_after(error.headers.get("Retry-After"))
                    raise _TransientError(message, retry_after) from error
                raise ModelError(message, retryable=False) from error
        except (OSError, http.client.HTTPException) as error:
            # URLError, timeouts, refused and reset connections are all OSErrors;
            # HTTPException covers a server that hangs up mid-answer.
            reason = getattr(error, "reason", None) or error
            raise _TransientError(self._redact(f"{type(error).__name__}: {reason}")) from error

    def _delay(self, retry: int, retry_after: float | None) -> float:
        """Seconds before retry `retry` (from 0): the larger of jitter and Retry-After, capped."""
        ceiling = min(self.max_backoff, self.backoff * 2**retry)
        jittered = random.uniform(0, ceiling)  # noqa: S311 - jitter needs no cryptographic strength
        return min(self.max_backoff, max(jittered, retry_after or 0.0))

    def _redact(self, text: str) -> str:
        """`text` on one line, bounded, with the API key blotted out should a server echo it."""
        text = " ".join(text.split())[:MAX_ERROR_CHARS]
        return text.replace(self._api_key, "***") if self._api_key else text


class _TransientError(Exception):
    """Raised by one attempt that a retry may fix; carries the server's Retry-After."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def _api_key_from_environment() -> str | None:
    """The first non-empty key among `API_KEY_VARIABLES`, or None."""
    return next((os.environ[v] for v in API_KEY_VARIABLES if os.environ.get(v)), None)


def _wire_message(message: Message) -> dict[str, JsonValue]:
    """`message` in the chat-completions shape."""
    wire: dict[str, JsonValue] = {"role": message.role.value, "content": message.content}
    if message.name is not None:
        wire["name"] = message.name
    if message.tool_calls:
        wire["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": orjson.dumps(call.args).decode()},
            }
            for call in message.tool_calls
        ]
    if message.tool_call_id is not None:
        wire["tool_call_id"] = message.tool_call_id
    return wire


def _wire_tool(tool: ToolSchema) -> dict[str, JsonValue]:
    """`tool` in the chat-completions `function` shape."""
    function: dict[str, JsonValue] = {
        "name": tool.name,
        "description": tool.description,
        "parameters": tool.parameters,
    }
    return {"type": "function", "function": function}


def _parse_reply(body: bytes) -> ModelReply:
    """The reply in a 2xx body; raise a retryable `ModelError` when it has none."""
    try:
        data = orjson.loads(body)
        message = data["choices"][0]["message"]
        content = message.get("content")
        calls = [_parse_tool_call(call) for call in message.get("tool_calls") or []]
        usage = data.get("usage") or {}
        tokens = Usage(
            prompt_tokens=usage.get("prompt_tokens") or 0,
            completion_tokens=usage.get("completion_tokens") or 0,
        )
    except (ValueError, LookupError, TypeError, AttributeError) as error:
        # orjson.JSONDecodeError and pydantic's ValidationError are ValueErrors.
        snippet = " ".join(body[:200].decode(errors="replace").split())
        raise ModelError(f"malformed response ({error!r}): {snippet}", retryable=True) from error
    if not isinstance(content, str | None):
        raise ModelError(f"malformed response: content is {type(content).__name__}", retryable=True)
    return check_reply(ModelReply(content=content, tool_calls=calls, usage=tokens))


def _parse_tool_call(call: Mapping[str, Any]) -> ToolCall:
    """One tool call; arguments that are no JSON object come back as `{"_raw": text}`."""
    function = call["function"]
    raw = function.get("arguments") or "{}"
    args: object = raw
    if isinstance(raw, str):
        try:
            args = orjson.loads(raw)
        except orjson.JSONDecodeError:
            args = None
    if not isinstance(args, dict):
        args = {"_raw": raw if isinstance(raw, str) else orjson.dumps(raw).decode()}
    # Some local servers leave the id out. The runtime needs one per call, and one that no
    # other call shares: a decision on a call's approval, a result, are matched by it.
    return ToolCall(id=call.get("id") or f"call_{new_id()}", name=function["name"], args=args)


def _server_message(error: urllib.error.HTTPError) -> str:
    """The server's `error.message`, else its body, else the HTTP reason."""
    try:
        body = error.read(MAX_ERROR_BODY_BYTES)
    except (OSError, http.client.HTTPException):
        body = b""
    try:
        detail = orjson.loads(body)["error"]
        return str(detail["message"] if isinstance(detail, dict) else detail)
    except (ValueError, LookupError, TypeError):
        return body.decode(errors="replace") or str(error.reason)


def _parse_retry_after(value: str | None) -> float | None:
    """Seconds a `Retry-After` value asks us to wait (delta-seconds or an HTTP date), or None."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())
