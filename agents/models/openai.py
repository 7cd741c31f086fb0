"""`openai:` — an OpenAI-compatible chat-completions model over the stdlib's HTTP client.

Works with api.openai.com, Azure's v1 endpoint and any server speaking the same
`/chat/completions` dialect (vLLM, llama.cpp, Ollama, LiteLLM...), through `base_url`.
The transport is `cairn.agents.models.http.Endpoint`, not the `openai` SDK: the SDK's timeout
bounds each socket read rather than the call, it honours `Retry-After` only up to 60 s,
it reads bodies without a cap and puts them whole into its errors, and it would add
httpx and five more packages to every worker for a request this module builds in forty
lines (docs/models.md weighs it in full). Transient failures are retried there; what is
left is raised as `ModelError`. A step's request starts with the bytes of the step's before
(`OpenAIModel.request_body`), and carries the agent's `prompt_cache_key` where the server
takes one, so that the provider's prefix cache serves the history they share.
"""

from __future__ import annotations

import hashlib
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import orjson
from pydantic import JsonValue

from cairn.agents.models.base import (
    ModelConfig,
    ModelReply,
    ModelRequest,
    ToolSchema,
    check_reply,
    unshown_images,
)
from cairn.agents.models.http import DEFAULT_TIMEOUT, Endpoint, malformed_reply, redact_error
from cairn.agents.models.openai_stream import ChunkReader
from cairn.errors import ModelError
from cairn.storage.ids import new_id
from cairn.storage.records import Message, Role, ToolCall, Usage

DEFAULT_BASE_URL = "https://api.openai.com/v1"
OPENAI_HOST = "api.openai.com"  # takes `prompt_cache_key`; another server may refuse it
CACHE_KEY = "prompt_cache_key"


class OpenAIModel:
    """A `Model` that asks an OpenAI-compatible server for each turn.

    `params` (temperature, max_tokens, seed, ...) go into every request body; `headers`
    into every request, with `Authorization: Bearer <api_key>` when a key is given.
    `timeout` bounds the whole call, retries included; `Endpoint` says how it retries.
    With `stream`, the reply is asked for as events, each part handed to the request's
    `on_delta`, and put back together into the reply unstreamed (`ChunkReader`).
    """

    def __init__(
        self,
        model: str,
        base_url: str = DEFAULT_BASE_URL,
        api_key: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        max_retries: int = 4,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
        *,
        params: Mapping[str, JsonValue] | None = None,
        headers: Mapping[str, str] | None = None,
        environ: Mapping[str, str] | None = None,
        stream: bool = False,
    ) -> None:
        self.model = model
        self.params = dict(params or {})
        self.stream = stream
        sent = dict(headers or {})
        if api_key:
            sent["Authorization"] = f"Bearer {api_key}"
        self.endpoint = Endpoint(
            base_url.rstrip("/") + "/chat/completions",
            sent,
            secret=api_key,
            timeout=timeout,
            max_retries=max_retries,
            backoff=backoff,
            max_backoff=max_backoff,
            environ=environ,
            sleep=sleep,
        )

    @property
    def url(self) -> str:
        """Where each turn is POSTed."""
        return self.endpoint.url

    def request_body(self, request: ModelRequest) -> dict[str, JsonValue]:
        """The chat-completions body that asks for `request`'s turn.

        From one step to the next only its end changes, for the provider's prefix cache:
        `params`, the model, the cache key (`_place_cache_key`) and the tools come first,
        the messages last, each message's keys in one order.
        """
        body: dict[str, JsonValue] = {**self.params, "model": self.model}
        limit = _output_limit(body)
        if limit is not None and request.max_tokens is not None:
            body[limit[0]] = request.max_tokens
        openai = urllib.parse.urlsplit(self.url).hostname == OPENAI_HOST
        _place_cache_key(body, request, by_default=openai)
        if request.tools:
            body["tools"] = [_wire_tool(tool) for tool in request.tools]
        body["messages"] = [_wire_message(message) for message in request.messages]
        if self.stream:  # usage comes in a last chunk of its own only when asked for
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        return body

    def complete(self, request: ModelRequest) -> ModelReply:
        """Answer one turn, retrying transient failures; raise `ModelError` otherwise."""
        body = self.request_body(request)
        reply = _parse_reply(self._send(body, request), self.endpoint.redact)
        limit = _output_limit(body)
        set_limit = limit[1] if limit is not None else None
        return replace(reply, max_tokens=set_limit if isinstance(set_limit, int) else None)

    def _send(self, body: Mapping[str, JsonValue], request: ModelRequest) -> bytes:
        """The answer's body: read whole, or put together from its stream (`ChunkReader`)."""
        payload = orjson.dumps(body)
        if not self.stream:
            return self.endpoint.post(payload)
        redact = self.endpoint.redact
        return self.endpoint.stream(payload, lambda: ChunkReader(request.on_delta, redact))


def build_openai(config: ModelConfig) -> OpenAIModel:
    """The `openai:` provider: an `OpenAIModel` for `config`."""
    return OpenAIModel(
        config.name,
        base_url=config.base_url or DEFAULT_BASE_URL,
        api_key=config.api_key,
        timeout=config.timeout,
        params=config.params,
        headers=config.headers,
        environ=config.environ,
        stream=config.stream,
    )


def prompt_cache_key(task: str, agent: str) -> str:
    """The `prompt_cache_key` of one agent of one task: a hash, so no name reaches the server."""
    digest = hashlib.sha256(f"cairn prompt cache\0{task}\0{agent}".encode()).hexdigest()
    return f"cairn-{digest[:32]}"


def _place_cache_key(body: dict[str, JsonValue], request: ModelRequest, by_default: bool) -> None:
    """Set `body`'s `prompt_cache_key`, or leave it out.

    A key `params` set (a string) is sent as it is; `true` there asks for the agent's own
    (`prompt_cache_key`), `false` or `null` for none; without either, the agent's own when
    `by_default` (OpenAI's endpoint), else none: a compatible server may refuse a field
    it does not know.
    """
    asked = body.pop(CACHE_KEY, by_default)
    if asked is True and (request.task or request.agent):
        asked = prompt_cache_key(request.task, request.agent)
    if asked is not None and not isinstance(asked, bool):
        body[CACHE_KEY] = asked


def _output_limit(body: Mapping[str, JsonValue]) -> tuple[str, JsonValue] | None:
    """The output limit `body` sets, as (key, value); None when it sets none.

    `max_completion_tokens` is the current name (reasoning models take no other),
    `max_tokens` the older one that compatible servers still read.
    """
    for key in ("max_completion_tokens", "max_tokens"):
        if key in body:
            return key, body[key]
    return None


def _wire_message(message: Message) -> dict[str, JsonValue]:
    """`message` in the chat-completions shape.

    A tool message takes text only: a result's images are its notes, saying so; and no
    `name`, which only the other roles have. An assistant message with neither text nor
    tool calls has empty text: the API refuses `content: null` without `tool_calls`.
    """
    content = unshown_images(message)
    if content is None and message.role is Role.ASSISTANT and not message.tool_calls:
        content = ""
    wire: dict[str, JsonValue] = {"role": message.role.value, "content": content}
    if message.name is not None and message.role is not Role.TOOL:
        wire["name"] = message.name
    if message.tool_calls:
        wire["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                # Keys sorted, as a state read back from the store has them: the history's
                # bytes are the same on every worker (the prefix cache's key).
                "function": {"name": call.name, "arguments": _sorted_json(call.args)},
            }
            for call in message.tool_calls
        ]
    if message.tool_call_id is not None:
        wire["tool_call_id"] = message.tool_call_id
    return wire


def _sorted_json(args: dict[str, JsonValue]) -> str:
    """`args` as compact JSON text, every object's keys sorted."""
    return orjson.dumps(args, option=orjson.OPT_SORT_KEYS).decode()


def _wire_tool(tool: ToolSchema) -> dict[str, JsonValue]:
    """`tool` in the chat-completions `function` shape."""
    function: dict[str, JsonValue] = {
        "name": tool.name,
        "description": tool.description,
        "parameters": tool.parameters,
    }
    return {"type": "function", "function": function}


def _parse_reply(body: bytes, blot: Callable[[str], str] = redact_error) -> ModelReply:
    """The reply in a 2xx body; raise a retryable `ModelError` when it has none.

    `blot` makes the error's text from the body (`malformed_reply`).
    """
    try:
        data = orjson.loads(body)
        choice = data["choices"][0]
        message = choice["message"]
        content = message.get("content")
        refusal = message.get("refusal")
        if choice.get("finish_reason") == "content_filter" and not refusal:
            refusal = "the provider's content filter stopped the reply"
        calls = [_parse_tool_call(call) for call in message.get("tool_calls") or []]
        usage = data.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
        tokens = Usage(
            prompt_tokens=usage.get("prompt_tokens") or 0,
            completion_tokens=usage.get("completion_tokens") or 0,
            cached_tokens=details.get("cached_tokens") or 0,
        )
    except (ValueError, LookupError, TypeError, AttributeError) as error:
        # orjson.JSONDecodeError and pydantic's ValidationError are ValueErrors.
        raise malformed_reply(error, body, blot) from error
    for name, value in (("content", content), ("refusal", refusal)):
        if not isinstance(value, str | None):
            why = f"malformed response: {name} is {type(value).__name__}"
            raise ModelError(why, retryable=True)
    cut = choice.get("finish_reason") == "length"
    reply = ModelReply(content=content, tool_calls=calls, usage=tokens, refusal=refusal, cut=cut)
    return check_reply(reply)


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
