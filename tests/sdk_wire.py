"""The OpenAI and Anthropic wire formats as their official SDKs define them, for the tests.

A request Cairn sends is checked against the SDK's own request type
(`CompletionCreateParamsNonStreaming`, `MessageCreateParamsNonStreaming`) as a *closed*
shape: every key must be one the type declares, every required key present, every value
of the declared type, down to the last nested part. The SDK's TypedDicts admit unknown
keys at run time and pydantic checks their `Iterable` fields only lazily, so `conforms`
walks the type hints itself. Rules the SDK states in a docstring but not in a type are
added by name (`openai_request_errors`).

Responses are built from the SDKs' own pydantic models and dumped as they come, so the
shapes a test serves are the providers', not Cairn's idea of them. A streamed answer is a
list of Server-Sent Events made the same way: OpenAI's `ChatCompletionChunk`s then
`[DONE]`; Anthropic's `RawMessageStartEvent`, `RawContentBlockStartEvent`,
`RawContentBlockDeltaEvent` (`TextDelta`, `InputJSONDelta`, `ThinkingDelta`,
`SignatureDelta`), `RawContentBlockStopEvent`, `RawMessageDeltaEvent`,
`RawMessageStopEvent`, and its `error` event (`ErrorResponse`). Streamed requests are
checked against `CompletionCreateParamsStreaming` and `MessageCreateParamsStreaming`.
"""

from __future__ import annotations

import collections.abc
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any

import orjson
import typing_extensions
from anthropic.types import (
    ErrorResponse,
    InputJSONDelta,
    MessageDeltaUsage,
    RawContentBlockDeltaEvent,
    RawContentBlockStartEvent,
    RawContentBlockStopEvent,
    RawMessageDeltaEvent,
    RawMessageStartEvent,
    RawMessageStopEvent,
    SignatureDelta,
    TextBlock,
    TextDelta,
    ThinkingBlock,
    ThinkingDelta,
    ToolUseBlock,
)
from anthropic.types import Message as AnthropicMessage
from anthropic.types import Usage as AnthropicUsage
from anthropic.types.message_create_params import (
    MessageCreateParamsNonStreaming,
    MessageCreateParamsStreaming,
)
from anthropic.types.raw_message_delta_event import Delta as MessageDelta
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessage
from openai.types.chat.chat_completion import Choice
from openai.types.chat.chat_completion_chunk import Choice as ChunkChoice
from openai.types.chat.chat_completion_chunk import (
    ChoiceDelta,
    ChoiceDeltaToolCall,
    ChoiceDeltaToolCallFunction,
)
from openai.types.chat.chat_completion_message_function_tool_call import (
    ChatCompletionMessageFunctionToolCall,
    Function,
)
from openai.types.chat.completion_create_params import (
    CompletionCreateParamsNonStreaming,
    CompletionCreateParamsStreaming,
)
from openai.types.completion_usage import CompletionUsage, PromptTokensDetails
from openai.types.shared import ErrorObject
from pydantic import BaseModel, JsonValue

from cairn.storage.records import Message, Role, ToolCall
from tests.test_openai_model import Scripted

_LISTS = {list, collections.abc.Iterable, collections.abc.Sequence}
_MAPPINGS = {dict, collections.abc.Mapping}
_LITERALS: set[object] = {typing.Literal, typing_extensions.Literal}


def conforms(value: object, hint: Any, where: str = "$") -> list[str]:  # noqa: PLR0911 - a kind of hint each
    """Every way `value` (parsed JSON) strays from `hint`, as `path: why`; empty if none."""
    if hint is typing.Any or hint is object:
        return []
    if typing_extensions.is_typeddict(hint):
        return _typed_dict(value, hint, where)
    if isinstance(hint, type) and issubclass(hint, BaseModel):
        # A union of params may admit the SDK's response models too (a content block
        # sent back as it came); a request here is JSON, so it matches their params.
        return [f"{where}: a response model ({hint.__name__}), not a request's JSON"]
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in {typing.Union, types.UnionType}:
        return _union(value, args, where)
    if origin in _LITERALS:
        return [] if value in args else [f"{where}: {value!r} is not one of {list(args)}"]
    if origin in {typing.Annotated, typing_extensions.Annotated}:
        return conforms(value, args[0], where)
    if origin in _LISTS or getattr(origin, "__name__", "") == "SequenceNotStr":
        if not isinstance(value, list):
            return [f"{where}: expected a list, got {type(value).__name__}"]
        item = args[0] if args else typing.Any
        return [e for i, v in enumerate(value) for e in conforms(v, item, f"{where}[{i}]")]
    if origin in _MAPPINGS:
        if not isinstance(value, dict):
            return [f"{where}: expected an object, got {type(value).__name__}"]
        item = args[1] if len(args) == 2 else typing.Any
        return [e for k, v in value.items() for e in conforms(v, item, f"{where}.{k}")]
    return _scalar(value, hint, where)


def _scalar(value: object, hint: Any, where: str) -> list[str]:
    """A JSON scalar against a plain type."""
    if hint is type(None) or hint is None:
        ok = value is None
    elif hint is bool:
        ok = isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif hint is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif hint is str:
        ok = isinstance(value, str)
    else:
        raise TypeError(f"{where}: no check for the hint {hint!r}")
    return [] if ok else [f"{where}: {value!r} is not {getattr(hint, '__name__', hint)}"]


def _typed_dict(value: object, hint: Any, where: str) -> list[str]:
    """`value` against a TypedDict, closed: no key it does not declare."""
    if not isinstance(value, dict):
        return [f"{where}: expected an object ({hint.__name__}), got {type(value).__name__}"]
    hints = typing_extensions.get_type_hints(hint)
    name = hint.__name__
    errors = [f"{where}: unknown key {key!r} ({name})" for key in value if key not in hints]
    errors += [
        f"{where}: missing key {key!r} ({hint.__name__})"
        for key in sorted(hint.__required_keys__)
        if key not in value
    ]
    for key, item in value.items():
        if key in hints:
            errors += conforms(item, hints[key], f"{where}.{key}")
    return errors


def _union(value: object, options: tuple[Any, ...], where: str) -> list[str]:
    """`value` against each option; the errors of the one it came closest to."""
    best: tuple[tuple[bool, int, int], list[str]] | None = None
    for option in options:
        errors = conforms(value, option, where)
        if not errors:
            return []
        # Closest: the option whose tags (`role`, `type`) it has, then the one it strayed
        # from the deepest, then the fewest ways.
        depth = max(_depth(error) for error in errors)
        closeness = (_tags_match(value, option), depth, -len(errors))
        if best is None or closeness > best[0]:
            best = (closeness, errors)
    return best[1] if best is not None else [f"{where}: matches no option"]


def _depth(error: str) -> int:
    """How deep in the value an error's path goes (`$.a[0].b` is 3 deep)."""
    path = error.split(": ", maxsplit=1)[0]
    return path.count(".") + path.count("[")


def _tags_match(value: object, option: Any) -> bool:
    """Whether every Literal-typed key of TypedDict `option` holds one of its values here."""
    if not typing_extensions.is_typeddict(option) or not isinstance(value, dict):
        return False
    hints = typing_extensions.get_type_hints(option)
    tags = {k: h for k, h in hints.items() if typing.get_origin(h) in _LITERALS}
    return all(key in value and value[key] in typing.get_args(h) for key, h in tags.items())


def openai_request_errors(body: Mapping[str, Any], *, streaming: bool = False) -> list[str]:
    """How `body` strays from the chat-completions request the `openai` SDK defines.

    `streaming`: from `CompletionCreateParamsStreaming` (which requires `stream: true`).
    Beyond the types, the rule the SDK's docstring of an assistant message's `content`
    states: "Required unless `tool_calls` or `function_call` is specified."
    """
    kind = CompletionCreateParamsStreaming if streaming else CompletionCreateParamsNonStreaming
    errors = conforms(body, kind)
    for index, message in enumerate(body.get("messages") or []):
        if (
            isinstance(message, dict)
            and message.get("role") == "assistant"
            and message.get("content") is None
            and not message.get("tool_calls")
            and not message.get("function_call")
        ):
            errors.append(f"$.messages[{index}]: an assistant message with neither content nor "
                          "tool_calls")  # fmt: skip
    return errors


def anthropic_request_errors(body: Mapping[str, Any], *, streaming: bool = False) -> list[str]:
    """How `body` strays from the Messages API request the `anthropic` SDK defines.

    `streaming`: from `MessageCreateParamsStreaming` (which requires `stream: true`).
    """
    return conforms(
        body, MessageCreateParamsStreaming if streaming else MessageCreateParamsNonStreaming
    )


def openai_reply(
    content: str | None = None,
    calls: Iterable[tuple[str, str, str]] = (),
    *,
    refusal: str | None = None,
    finish_reason: str = "stop",
    usage: tuple[int, int, int] = (10, 5, 0),
) -> Scripted:
    """A 200 chat completion from the SDK's `ChatCompletion`; `calls` as (id, name, arguments).

    `usage` is (prompt, completion, cached) tokens.
    """
    tool_calls = [
        ChatCompletionMessageFunctionToolCall(
            id=id_, type="function", function=Function(name=name, arguments=arguments)
        )
        for id_, name, arguments in calls
    ]
    message = ChatCompletionMessage(
        role="assistant", content=content, refusal=refusal, tool_calls=tool_calls or None
    )
    prompt, completion, cached = usage
    completion_ = ChatCompletion(
        id="chatcmpl-test",
        object="chat.completion",
        created=1_700_000_000,
        model="gpt-test",
        choices=[Choice(index=0, finish_reason=finish_reason, message=message)],
        usage=CompletionUsage(
            prompt_tokens=prompt,
            completion_tokens=completion,
            total_tokens=prompt + completion,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
        ),
    )
    return Scripted(200, completion_.model_dump_json().encode())


def anthropic_reply(
    *blocks: TextBlock | ToolUseBlock | ThinkingBlock,
    stop_reason: str = "end_turn",
    usage: tuple[int, int, int] = (10, 5, 0),
) -> Scripted:
    """A 200 Messages API response from the SDK's `Message`; `usage` as (input, output, read)."""
    input_tokens, output_tokens, read = usage
    message = AnthropicMessage(
        id="msg_test",
        type="message",
        role="assistant",
        model="claude-test",
        content=list(blocks),
        stop_reason=stop_reason,
        stop_sequence=None,
        usage=AnthropicUsage(
            input_tokens=input_tokens, output_tokens=output_tokens, cache_read_input_tokens=read
        ),
    )
    return Scripted(200, message.model_dump_json().encode())


def text(value: str) -> TextBlock:
    """A text block."""
    return TextBlock(type="text", text=value)


def tool_use(id_: str, name: str, input_: dict[str, JsonValue]) -> ToolUseBlock:
    """A tool_use block."""
    return ToolUseBlock(type="tool_use", id=id_, name=name, input=input_)


def thinking(value: str) -> ThinkingBlock:
    """A thinking block, as a model with extended thinking puts before its text."""
    return ThinkingBlock(type="thinking", thinking=value, signature="sig-test")


def openai_error(status: int, message: str, code: str | None = None) -> Scripted:
    """An error in OpenAI's shape (`{"error": {message, type, param, code}}`)."""
    error = {"message": message, "type": "invalid_request_error", "param": None, "code": code}
    return Scripted(status, orjson.dumps({"error": error}))


def anthropic_error(status: int, kind: str, message: str) -> Scripted:
    """An error in Anthropic's shape (`{"type": "error", "error": {type, message}}`)."""
    body = {"type": "error", "error": {"type": kind, "message": message}}
    return Scripted(status, orjson.dumps(body))


# Streams ---------------------------------------------------------------------------------


def sse(data: BaseModel | str, event: str | None = None) -> bytes:
    """One Server-Sent Event: a model dumped as it comes (or text) as its data."""
    text = data if isinstance(data, str) else data.model_dump_json()
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {text}\n\n".encode()


def pieces(text: str, count: int) -> list[str]:
    """`text` cut into `count` pieces (fewer when it is shorter), in order."""
    size = max(1, -(-len(text) // max(1, count)))
    return [text[i : i + size] for i in range(0, len(text), size)]


def streamed(events: list[bytes], **options: Any) -> Scripted:
    """A 200 that streams `events` (`Scripted`'s options: gap, hold, hold_at, drop, ...)."""
    return Scripted(200, events=events, **options)


def _openai_chunk(
    delta: ChoiceDelta | None,
    finish_reason: str | None = None,
    usage: CompletionUsage | None = None,
) -> bytes:
    """One `chat.completion.chunk` event; no choice when `delta` is None (the usage chunk)."""
    choices = (
        [] if delta is None else [ChunkChoice(index=0, delta=delta, finish_reason=finish_reason)]
    )
    chunk = ChatCompletionChunk(id="chatcmpl-test", object="chat.completion.chunk",
                                created=1_700_000_000, model="gpt-test", choices=choices,
                                usage=usage)  # fmt: skip
    return sse(chunk)


def openai_stream(
    content: str | None = None,
    calls: Iterable[tuple[str, str, str]] = (),
    *,
    refusal: str | None = None,
    finish_reason: str = "stop",
    usage: tuple[int, int, int] = (10, 5, 0),
    count: int = 3,
    interleave: bool = False,
) -> list[bytes]:
    """A streamed chat completion, as `openai_reply` gives it whole; `calls` as (id, name, args).

    The text, the refusal and each call's arguments come in `count` pieces; the calls one
    after the other, or their pieces taking turns (`interleave`). Then the finish, the
    usage chunk (`include_usage`) and `[DONE]`.
    """
    events = [_openai_chunk(ChoiceDelta(role="assistant", content=""))]
    events += [_openai_chunk(ChoiceDelta(content=piece)) for piece in pieces(content or "", count)]
    events += [_openai_chunk(ChoiceDelta(refusal=piece)) for piece in pieces(refusal or "", count)]
    per_call: list[list[bytes]] = []
    for index, (id_, name, arguments) in enumerate(calls):
        begun = ChoiceDeltaToolCallFunction(name=name, arguments="")
        parts = [ChoiceDeltaToolCall(index=index, id=id_, type="function", function=begun)]
        parts += [
            ChoiceDeltaToolCall(index=index, function=ChoiceDeltaToolCallFunction(arguments=piece))
            for piece in pieces(arguments, count)
        ]
        per_call.append([_openai_chunk(ChoiceDelta(tool_calls=[part])) for part in parts])
    if interleave:
        longest = max((len(parts) for parts in per_call), default=0)
        events += [parts[i] for i in range(longest) for parts in per_call if i < len(parts)]
    else:
        events += [event for parts in per_call for event in parts]
    events.append(_openai_chunk(ChoiceDelta(), finish_reason=finish_reason))
    prompt, completion, cached = usage
    details = PromptTokensDetails(cached_tokens=cached)
    total = CompletionUsage(prompt_tokens=prompt, completion_tokens=completion,
                            total_tokens=prompt + completion,
                            prompt_tokens_details=details)  # fmt: skip
    events.append(_openai_chunk(None, usage=total))
    events.append(sse("[DONE]"))
    return events


def openai_stream_error(message: str, kind: str = "server_error") -> bytes:
    """The chunk an OpenAI-compatible server sends for an error mid-stream (`{"error": ...}`)."""
    error = ErrorObject(message=message, type=kind, param=None, code=None)
    return sse(orjson.dumps({"error": error.model_dump()}).decode())


def anthropic_stream(
    *blocks: TextBlock | ToolUseBlock | ThinkingBlock,
    stop_reason: str = "end_turn",
    usage: tuple[int, int, int] = (10, 5, 0),
    count: int = 3,
) -> list[bytes]:
    """A streamed Messages API answer, as `anthropic_reply` gives it whole.

    Each block's text, thinking or input JSON comes in `count` deltas; a `ping` follows
    the start; usage as (input, output, cache read): the start carries the input, the
    `message_delta` the output.
    """
    input_tokens, output_tokens, read = usage
    start = AnthropicMessage(id="msg_test", type="message", role="assistant", model="claude-test",
                             content=[], stop_reason=None, stop_sequence=None,
                             usage=AnthropicUsage(input_tokens=input_tokens, output_tokens=1,
                                                  cache_read_input_tokens=read))  # fmt: skip
    events = [sse(RawMessageStartEvent(type="message_start", message=start), "message_start"),
              sse('{"type": "ping"}', "ping")]  # fmt: skip
    for index, block in enumerate(blocks):
        events.extend(_anthropic_block(index, block, count))
    end = RawMessageDeltaEvent(type="message_delta",
                               delta=MessageDelta(stop_reason=stop_reason, stop_sequence=None),
                               usage=MessageDeltaUsage(output_tokens=output_tokens))  # fmt: skip
    events.append(sse(end, "message_delta"))
    events.append(sse(RawMessageStopEvent(type="message_stop"), "message_stop"))
    return events


def _anthropic_block(
    index: int, block: TextBlock | ToolUseBlock | ThinkingBlock, count: int
) -> list[bytes]:
    """One content block's events: its start (empty), its deltas, its stop."""
    deltas: list[TextDelta | InputJSONDelta | ThinkingDelta | SignatureDelta]
    if isinstance(block, TextBlock):
        begun: TextBlock | ToolUseBlock | ThinkingBlock = TextBlock(type="text", text="")
        deltas = [TextDelta(type="text_delta", text=piece) for piece in pieces(block.text, count)]
    elif isinstance(block, ToolUseBlock):
        begun = ToolUseBlock(type="tool_use", id=block.id, name=block.name, input={})
        deltas = [InputJSONDelta(type="input_json_delta", partial_json=piece)
                  for piece in pieces(orjson.dumps(block.input).decode(), count)]  # fmt: skip
    else:
        begun = ThinkingBlock(type="thinking", thinking="", signature="")
        deltas = [ThinkingDelta(type="thinking_delta", thinking=piece)
                  for piece in pieces(block.thinking, count)]  # fmt: skip
        deltas.append(SignatureDelta(type="signature_delta", signature=block.signature))
    opened = RawContentBlockStartEvent(type="content_block_start", index=index, content_block=begun)
    events = [sse(opened, "content_block_start")]
    events += [sse(RawContentBlockDeltaEvent(type="content_block_delta", index=index, delta=delta),
                   "content_block_delta") for delta in deltas]  # fmt: skip
    events.append(sse(RawContentBlockStopEvent(type="content_block_stop", index=index),
                      "content_block_stop"))  # fmt: skip
    return events


def anthropic_stream_error(kind: str = "overloaded_error", message: str = "Overloaded") -> bytes:
    """The `error` event the Messages API sends mid-stream (an `ErrorResponse`)."""
    error = ErrorResponse.model_validate(
        {"type": "error", "error": {"type": kind, "message": message}}
    )
    return sse(error, "error")


def history() -> list[Message]:
    """A turn with two tool calls, their results (the second failed) and a message from a peer."""
    calls = [
        ToolCall(id="call_1", name="read_file", args={"path": "a.txt"}),
        ToolCall(id="call_2", name="read_file", args={"path": "b.txt"}),
    ]
    return [
        Message(role=Role.SYSTEM, content="You are a coder."),
        Message(role=Role.USER, content="Goal: fix it."),
        Message(role=Role.ASSISTANT, content=None, tool_calls=calls),
        Message(role=Role.TOOL, tool_call_id="call_1", name="read_file", content="A"),
        Message(
            role=Role.TOOL,
            tool_call_id="call_2",
            name="read_file",
            content="error: no such file",
            error=True,
        ),
        Message(role=Role.USER, name="reviewer", content="Message from reviewer: hurry"),
    ]
