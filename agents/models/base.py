"""The `Model` protocol: messages and tool schemas in; text, tool calls and usage out.

A model either answers with a `ModelReply` or raises `cairn.errors.ModelError`, whose
`retryable` flag tells the coordinator whether a retry of the step may help. A provider
(`ModelProvider`) builds a model from a `ModelConfig`: the part of `model:` after the
colon and the agent's options. docs/models.md is the guide for writing one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

import orjson
from pydantic import JsonValue

from cairn.errors import ModelError
from cairn.storage.records import ImagePart, Message, ToolCall, Usage

MAX_REPLY_CHARS = 1_000_000  # characters of a reply's text
MAX_TOOL_CALLS = 64  # tool calls in one reply
MAX_ARGS_BYTES = 1_000_000  # bytes of one tool call's arguments, serialized as JSON
# Image types the providers that take images all take (Anthropic, OpenAI, Gemini).
IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
NOT_SHOWN = "not shown to this model"  # what an image's note adds when a model lacks it


@dataclass(frozen=True, slots=True)
class ToolSchema:
    """A tool as a model sees it (the chat-completions `function` shape)."""

    name: str
    description: str
    parameters: dict[str, JsonValue]


@dataclass(slots=True)
class CallSoFar:
    """A tool call as it streams in: its id and name once sent, its arguments' text so far."""

    index: int  # the stream's number for it (OpenAI's `index`, Anthropic's block index)
    id: str = ""
    name: str = ""
    parts: list[str] = field(default_factory=list)  # the arguments' JSON text, as it came

    def arguments(self) -> str:
        """The arguments' JSON text so far (whole once the stream ended)."""
        return "".join(self.parts)


@dataclass(frozen=True, slots=True)
class CallView:
    """A tool call of a `ReplyView`: its name and its arguments' text as they stood."""

    name: str
    parts: list[str]  # grows after the view was taken; `count` is where the view ends
    count: int

    def tail(self, limit: int) -> str:
        """The last `limit` characters of the arguments as they stood."""
        return _tail(self.parts, self.count, limit)


@dataclass(frozen=True, slots=True)
class ReplyView:
    """A streamed reply as it stood when the view was taken, to read on another thread.

    It holds the reply's lists of parts, which only ever grow, and how far each went: the
    stream may go on adding to them while another thread reads the view.
    """

    parts: list[str]
    count: int
    chars: int
    calls: tuple[CallView, ...]

    def tail(self, limit: int) -> str:
        """The last `limit` characters of the text as it stood."""
        return _tail(self.parts, self.count, limit)


class ReplySoFar:
    """A streamed reply as it arrives: its text and its tool calls so far.

    A provider that streams adds each part as it comes and hands this to
    `ModelRequest.on_delta` after each event. It stops a runaway generation as it runs: a
    text past `MAX_REPLY_CHARS` or a call past `MAX_TOOL_CALLS` raises the retryable
    `ModelError` `check_reply` would raise at the end. Its parts are only ever appended,
    so a `view` costs little and may be read on another thread while the reply grows.
    """

    __slots__ = ("_calls", "_text", "chars")

    def __init__(self) -> None:
        self._text: list[str] = []
        self.chars = 0  # characters of text so far
        self._calls: dict[int, CallSoFar] = {}

    def add_text(self, part: str) -> None:
        """Append `part` to the text."""
        if part:
            self._text.append(part)
            self.chars += len(part)
            if self.chars > MAX_REPLY_CHARS:
                raise ModelError(f"reply text is over {MAX_REPLY_CHARS} characters", retryable=True)

    def call(self, index: object) -> CallSoFar:
        """The tool call the stream numbers `index`, begun if it is new.

        Raises `TypeError` for an index that is no integer (a malformed stream).
        """
        if not isinstance(index, int) or isinstance(index, bool):
            raise TypeError(f"a tool call's index is {type(index).__name__}")
        found = self._calls.get(index)
        if found is None:
            if len(self._calls) >= MAX_TOOL_CALLS:
                raise ModelError(f"reply makes over {MAX_TOOL_CALLS} tool calls", retryable=True)
            found = self._calls[index] = CallSoFar(index)
        return found

    def text(self) -> str:
        """The text so far."""
        return "".join(self._text)

    @property
    def calls(self) -> list[CallSoFar]:
        """The tool calls so far, in the order the stream numbers them."""
        return [self._calls[index] for index in sorted(self._calls)]

    def view(self) -> ReplyView:
        """The reply as it stands now, for another thread to read (see `ReplyView`)."""
        calls = tuple(CallView(c.name, c.parts, len(c.parts)) for c in self.calls)
        return ReplyView(self._text, len(self._text), self.chars, calls)


def _tail(parts: list[str], count: int, limit: int) -> str:
    """The last `limit` characters of `parts[:count]` joined, reading only the parts it needs."""
    taken: list[str] = []
    size = 0
    for index in range(count - 1, -1, -1):
        if size >= limit:
            break
        taken.append(parts[index])
        size += len(parts[index])
    text = "".join(reversed(taken))
    return text[len(text) - limit :] if len(text) > limit else text


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """One model turn to take: the history, the tools on offer, and who asks."""

    messages: list[Message]
    tools: list[ToolSchema]
    agent: str = ""
    attempt: int = 1
    task: str = ""  # the task's id: with `agent`, whose prompt cache a request may share
    # An output limit to use instead of the agent's: set when a cut reply is asked again
    # with room (`cairn.agents.context`). A provider with no such limit may ignore it.
    max_tokens: int | None = None
    # The assistant turns the agent took before this one: `messages` may hold fewer once
    # its history was compacted. None: count them in `messages`.
    turn: int | None = None
    # "turn" for the agent's own turn; "summary" for a compaction's summary of its earlier
    # turns (no tools offered; a scripted model answers it without playing a turn).
    purpose: Literal["turn", "summary"] = "turn"
    # Called with the reply so far after each part a streamed reply brings (the step shows
    # it live, `cairn.agents.live`); a provider that does not stream never calls it.
    on_delta: Callable[[ReplySoFar], None] | None = None


@dataclass(frozen=True, slots=True)
class ModelReply:
    """A model's answer: text, tool calls, tokens used, and how the answer ended.

    `refusal` is the model's stated reason when it declined to answer (OpenAI's `refusal`,
    Anthropic's `stop_reason: refusal`). `cut` says the output limit stopped the reply
    (`finish_reason: length`, `stop_reason: max_tokens`): its text or its last tool call
    is not whole, and it must never pass for an answer. `max_tokens` is the output limit
    the request set, None when it set none (the model's own limit cut it).
    """

    content: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    refusal: str | None = None
    cut: bool = False
    max_tokens: int | None = None


class Model(Protocol):
    """Anything that takes a model turn.

    `complete` is called from a worker thread, once per step, synchronously; it must
    return within the agent's `timeout` or raise. It raises nothing but `ModelError`:
    `retryable=True` for what another attempt may fix (a timeout, a rate limit, a reply
    too large or malformed), `retryable=False` for what it will not (bad credentials, a
    refused request). Its message is one line with no secret in it: it is stored and shown.
    `ModelReply.usage` carries the call's tokens; `check_reply` bounds a reply's size.
    A refusal or a cut reply is returned, not raised: it was paid for, and the step
    decides what becomes of it. An error for a request the provider judged invalid (no
    retry of it, however late, will pass) sets `refused=True`.
    """

    def complete(self, request: ModelRequest) -> ModelReply:
        """Answer one turn, or raise `ModelError` (retryable or fatal)."""


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """What a provider is given to build an agent's model.

    `name` is the part of `model:` after `<provider>:`; `api_key` is the value of the
    agent's `api_key_env` (or the provider's default variable) in the worker's
    environment, None when unset. `params` go into the request body as they are;
    `headers` into every request. `environ` is the worker's environment, for a provider
    that needs more than a key (a region, a proxy). `stream` asks for the reply streamed,
    its parts handed to `ModelRequest.on_delta` as they come (a provider may ignore it).
    """

    provider: str
    name: str
    base_url: str | None = None
    api_key: str | None = None
    timeout: float = 600.0
    params: Mapping[str, JsonValue] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    environ: Mapping[str, str] = field(default_factory=dict)
    stream: bool = False


class ModelProvider(Protocol):
    """What a `cairn.models` entry point names: a callable from a config to a model.

    It may raise `ValueError` for a config it cannot serve (the step fails fatally with
    the message); it should not do network I/O, which belongs in `Model.complete`.
    """

    def __call__(self, config: ModelConfig) -> Model:
        """Build the model `config` describes."""


def check_reply(reply: ModelReply) -> ModelReply:
    """Return `reply`, or raise `ModelError` if its text, tool calls or arguments are too big.

    A reply that large is a runaway generation, not an answer, and would bloat every
    checkpoint after it. It is retryable like a malformed reply: a model samples anew on
    the next attempt, and the step's retry budget bounds what a model that insists costs.
    """
    if reply.content is not None and len(reply.content) > MAX_REPLY_CHARS:
        raise ModelError(
            f"reply text is {len(reply.content)} characters; at most {MAX_REPLY_CHARS}",
            retryable=True,
        )
    if len(reply.tool_calls) > MAX_TOOL_CALLS:
        raise ModelError(
            f"reply makes {len(reply.tool_calls)} tool calls; at most {MAX_TOOL_CALLS}",
            retryable=True,
        )
    for call in reply.tool_calls:
        size = json_size(call.args)
        if size > MAX_ARGS_BYTES:
            raise ModelError(
                f"arguments of tool call {call.id} ({call.name}) are {size} bytes; "
                f"at most {MAX_ARGS_BYTES}",
                retryable=True,
            )
    return reply


def image_note(media_type: str, size: int, why: str = "") -> str:
    """The one line a tool result's text holds for an image: `[image/png, 27,310 bytes]`.

    `why` says why a model is not shown it, when it is not.
    """
    return f"[{media_type}, {size:,} bytes{f': {why}' if why else ''}]"


def unshown_images(message: Message, images: Iterable[ImagePart] | None = None) -> str | None:
    """`message`'s text for a model not shown `images` (all the message's unless given).

    Each of their notes in the text (`image_note`) says so: for a provider that takes no
    images, or not of that type.
    """
    text = message.content
    for image in message.images if images is None else images:
        note = image_note(image.media_type, image.size)
        unshown = image_note(image.media_type, image.size, NOT_SHOWN)
        text = (text or "").replace(note, unshown, 1)
    return text


def json_size(value: JsonValue) -> int:
    """Bytes of `value` as compact JSON text, in UTF-8."""
    try:
        return len(orjson.dumps(value))
    except TypeError:  # integers beyond 64 bits, lone surrogates: orjson refuses them
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        return len(text.encode(errors="surrogatepass"))
