"""`anthropic:` — Claude through Anthropic's native Messages API, with tool use.

Cairn's history is chat-completions shaped; this module maps it to the Messages API and
back: leading system messages become `system`; an assistant turn's tool calls become
`tool_use` blocks and the tool results after it one user turn of `tool_result` blocks
(several calls in one turn go out and come back together; a failed call's with
`is_error`), a result's images as `image` blocks in its content; turns of one role in a
row are merged, since the API wants user and assistant to alternate. Cache breakpoints
on the tools, the system prompt and the ends of this request and the one before let each
step read the history it shares with the step before from Anthropic's prompt cache
(`_mark_history`). The transport is
`cairn.agents.models.http.Endpoint`, not the `anthropic` SDK, for the reasons in openai.py
and one more: the SDK refuses a non-streaming request whose `max_tokens` could take over
ten minutes unless the caller sets its own timeout (docs/models.md weighs it in full).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import orjson
from pydantic import JsonValue

from cairn.agents.models.anthropic_stream import EventReader
from cairn.agents.models.base import (
    IMAGE_TYPES,
    ModelConfig,
    ModelReply,
    ModelRequest,
    ToolSchema,
    check_reply,
    unshown_images,
)
from cairn.agents.models.http import DEFAULT_TIMEOUT, Endpoint, malformed_reply, redact_error
from cairn.errors import ModelError
from cairn.storage.ids import new_id
from cairn.storage.records import Message, Role, ToolCall, Usage

DEFAULT_BASE_URL = "https://api.anthropic.com"
API_VERSION = "2023-06-01"
DEFAULT_MAX_TOKENS = 8192  # the API requires max_tokens; `params` may set another
# The output limit or the context window stopped the reply before its end.
CUT_STOPS = frozenset({"max_tokens", "model_context_window_exceeded"})


class AnthropicModel:
    """A `Model` that asks Anthropic's Messages API (or a server speaking it) for each turn.

    Requests go to `{base_url}/v1/messages` with `x-api-key` and `anthropic-version`;
    `params` (max_tokens, temperature, top_p, tool_choice, ...) go into every body.
    `timeout` bounds the whole call, retries included; `Endpoint` says how it retries.
    With `stream`, the reply is asked for as events, each part handed to the request's
    `on_delta`, and put back together into the reply unstreamed (`EventReader`).
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
        sent = {"anthropic-version": API_VERSION, **(headers or {})}
        if api_key:
            sent["x-api-key"] = api_key
        self.endpoint = Endpoint(
            base_url.rstrip("/") + "/v1/messages",
            sent,
            secret=api_key,
            timeout=timeout,
            max_retries=max_retries,
            backoff=backoff,
            max_backoff=max_backoff,
            environ=environ,
            sleep=sleep,
        )

    def request_body(self, request: ModelRequest) -> dict[str, JsonValue]:
        """The Messages API body that asks for `request`'s turn.

        With cache breakpoints (`cache_control`) on the last tool, the system prompt, the
        end of the request and the end of the request before, unless `params` set a
        `cache_control` of their own (null: no caching; an object: the API's automatic
        breakpoint). docs/models.md says how they are placed and why.
        """
        cached = "cache_control" not in self.params
        system, messages = _wire_history(request.messages, cached)
        body: dict[str, JsonValue] = {
            "max_tokens": DEFAULT_MAX_TOKENS,
            **self.params,
            "model": self.model,
            "messages": messages,
        }
        if request.max_tokens is not None:
            body["max_tokens"] = request.max_tokens
        if system:
            body["system"] = system
        if request.tools:
            tools: list[JsonValue] = [_wire_tool(tool) for tool in request.tools]
            if cached:
                _mark_breakpoint(tools)
            body["tools"] = tools
        if self.stream:
            body["stream"] = True
        return body

    def complete(self, request: ModelRequest) -> ModelReply:
        """Answer one turn, retrying transient failures; raise `ModelError` otherwise."""
        body = self.request_body(request)
        reply = _parse_reply(self._send(body, request), self.endpoint.redact)
        limit = body["max_tokens"]
        return replace(reply, max_tokens=limit if isinstance(limit, int) else None)

    def _send(self, body: Mapping[str, JsonValue], request: ModelRequest) -> bytes:
        """The answer's body: read whole, or put together from its stream (`EventReader`)."""
        payload = orjson.dumps(body)
        if not self.stream:
            return self.endpoint.post(payload)
        redact = self.endpoint.redact
        return self.endpoint.stream(payload, lambda: EventReader(request.on_delta, redact))


def build_anthropic(config: ModelConfig) -> AnthropicModel:
    """The `anthropic:` provider: an `AnthropicModel` for `config`."""
    return AnthropicModel(
        config.name,
        base_url=config.base_url or DEFAULT_BASE_URL,
        api_key=config.api_key,
        timeout=config.timeout,
        params=config.params,
        headers=config.headers,
        environ=config.environ,
        stream=config.stream,
    )


def _wire_history(history: list[Message], cached: bool) -> tuple[list[JsonValue], list[JsonValue]]:
    """The system prompt's blocks and the alternating user/assistant turns for `history`.

    With `cached`, the breakpoints of the history are marked (`_mark_history`).
    """
    start = 0
    while start < len(history) and history[start].role is Role.SYSTEM:
        start += 1
    text = "\n\n".join(m.content for m in history[:start] if m.content)
    # The API refuses a text block of whitespace alone.
    system: list[JsonValue] = [{"type": "text", "text": text}] if text.strip() else []
    turns: list[tuple[str, list[JsonValue]]] = []
    for message in history[start:]:
        role, blocks = _wire_blocks(message)
        if not blocks:
            continue  # an empty turn: the API refuses empty content
        if turns and turns[-1][0] == role:
            turns[-1][1].extend(blocks)
        else:
            turns.append((role, blocks))
    # In a user turn, tool results come before anything else, or the API refuses it.
    turns = [(role, sorted(blocks, key=_is_not_tool_result)) for role, blocks in turns]
    if cached:
        _mark_history(system, turns)
    wire: list[JsonValue] = [{"role": role, "content": blocks} for role, blocks in turns]
    return system, wire


def _mark_history(system: list[JsonValue], turns: list[tuple[str, list[JsonValue]]]) -> None:
    """Mark the system prompt, the last turn and the turn before the last assistant turn.

    The last turn's breakpoint writes the whole request to the cache. The turn before the
    last assistant turn is where the request before this one ended (the assistant turn is
    its answer): a breakpoint there reads that request back whole, however many blocks
    came after it, where a breakpoint at the end finds a cached prefix only within the
    20 blocks before it. With the tools' breakpoint, four: as many as the API takes.
    """
    if system:
        _mark_breakpoint(system)
    answers = [index for index, (role, _) in enumerate(turns) if role == "assistant"]
    ends = {len(turns) - 1, answers[-1] - 1 if answers else -1}
    for index in sorted(ends - {-1}):
        _mark_breakpoint(turns[index][1])


def _mark_breakpoint(blocks: list[JsonValue]) -> None:
    """Make the last of `blocks` a cache breakpoint: the prefix up to it is cached."""
    last = blocks[-1]
    if isinstance(last, dict):
        last["cache_control"] = {"type": "ephemeral"}


def _is_not_tool_result(block: JsonValue) -> bool:
    return not (isinstance(block, dict) and block.get("type") == "tool_result")


def _wire_blocks(message: Message) -> tuple[str, list[JsonValue]]:
    """The role and content blocks of one message of Cairn's history."""
    text = message.content or ""
    if message.role is Role.TOOL:
        result: dict[str, JsonValue] = {
            "type": "tool_result",
            "tool_use_id": message.tool_call_id or "",
        }
        if message.images:
            result["content"] = _result_blocks(message)
        elif text:
            result["content"] = text
        if message.error:
            result["is_error"] = True
        return "user", [result]
    blocks: list[JsonValue] = [{"type": "text", "text": text}] if text.strip() else []
    if message.role is Role.ASSISTANT:
        # Arguments with their keys sorted: as a state read back from the store has them,
        # so that the history's bytes are the same on every worker (a prompt cache's key).
        blocks.extend(
            {"type": "tool_use", "id": call.id, "name": call.name,
             "input": orjson.loads(orjson.dumps(call.args, option=orjson.OPT_SORT_KEYS))}
            for call in message.tool_calls
        )  # fmt: skip
        return "assistant", blocks
    if message.role is Role.SYSTEM and blocks:
        # A system message after the conversation began: the API has no such turn.
        blocks = [{"type": "text", "text": f"(system) {text}"}]
    return "user", blocks


def _result_blocks(message: Message) -> list[JsonValue]:
    """A tool result's text and images as `tool_result` content blocks.

    Images of a type the API takes are `image` blocks after the text; the text notes any
    other as not shown (a record is not bound to this provider's types).
    """
    shown = [image for image in message.images if image.media_type in IMAGE_TYPES]
    text = unshown_images(message, [i for i in message.images if i.media_type not in IMAGE_TYPES])
    blocks: list[JsonValue] = [{"type": "text", "text": text}] if text else []
    blocks.extend(
        {
            "type": "image",
            "source": {"type": "base64", "media_type": image.media_type, "data": image.data},
        }
        for image in shown
    )
    return blocks


def _wire_tool(tool: ToolSchema) -> dict[str, JsonValue]:
    """`tool` in the Messages API's shape."""
    return {"name": tool.name, "description": tool.description, "input_schema": tool.parameters}


def _parse_reply(body: bytes, blot: Callable[[str], str] = redact_error) -> ModelReply:
    """The reply in a 2xx body; raise a retryable `ModelError` when it has none.

    `blot` makes the error's text from the body (`malformed_reply`).
    """
    try:
        data = orjson.loads(body)
        texts: list[str] = []
        calls: list[ToolCall] = []
        for block in data["content"]:
            if block["type"] == "text":
                texts.append(block["text"])
            elif block["type"] == "tool_use":
                calls.append(_parse_tool_use(block))
        tokens = _parse_usage(data.get("usage") or {})
        stop = data.get("stop_reason")
    except (ValueError, LookupError, TypeError, AttributeError) as error:
        # orjson.JSONDecodeError and pydantic's ValidationError are ValueErrors.
        raise malformed_reply(error, body, blot) from error
    if not all(isinstance(text, str) for text in texts):
        raise ModelError("malformed response: a text block holds no string", retryable=True)
    content = "".join(texts) if texts else None
    refusal = None
    if stop == "refusal":  # the text so far, if any, is all there is of the reason
        refusal = content or "the model declined to answer (stop_reason: refusal)"
    reply = ModelReply(content=content, tool_calls=calls, usage=tokens, refusal=refusal,
                       cut=stop in CUT_STOPS)  # fmt: skip
    return check_reply(reply)


def _parse_tool_use(block: Mapping[str, Any]) -> ToolCall:
    """One `tool_use` block; input that is no JSON object comes back as `{"_raw": text}`."""
    args = block.get("input")
    if not isinstance(args, dict):
        args = {"_raw": orjson.dumps(args).decode()}
    return ToolCall(id=block.get("id") or f"toolu_{new_id()}", name=block["name"], args=args)


def _parse_usage(usage: Mapping[str, Any]) -> Usage:
    """Tokens of one call; the prompt counts what was read from and written to the cache."""
    cached = usage.get("cache_read_input_tokens") or 0
    written = usage.get("cache_creation_input_tokens") or 0
    return Usage(
        prompt_tokens=(usage.get("input_tokens") or 0) + cached + written,
        completion_tokens=usage.get("output_tokens") or 0,
        cached_tokens=cached,
        cache_write_tokens=written,
    )
