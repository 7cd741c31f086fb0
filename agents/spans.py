"""The spans of a step and of its model and tool calls, by the OpenTelemetry GenAI conventions.

A step is an `invoke_agent` span under its superstep's, a model call a `chat` span (client)
and a tool call an `execute_tool` span under the step's (`cairn.agents.tracing` makes and
exports them; without tracing every function here does nothing). Each call's span says
its step's attempt and whether the step replays work a restore discarded
(`cairn.replayed`): every call Cairn makes is a span with the tokens it used, retried and
replayed ones too, so a sum over the spans is what was paid; filter on those two to count
only the work that stands.

Spans hold no message text, tool argument or result unless content is on
(`CAIRN_OTEL_CONTENT=1`, or the GenAI convention's
`OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`); what they hold then is redacted
as the checkpoints are (`cairn.storage.redact`) and cut at `MAX_CONTENT` characters.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cairn.agents.tracing import (
    content,
    current,
    parent_of,
    remote,
    set_attributes,
    start_span,
    step_span_id,
    trace_id_of,
    tracing,
)
from cairn.storage.records import Message, ToolCall, Usage
from cairn.storage.redact import redact, redact_json

if TYPE_CHECKING:  # the `otel` extra's: absent, no span is ever made
    from opentelemetry.trace import Span

MAX_CONTENT = 16_384  # characters of one content attribute, when content is on


# a step's span, and the spans of its calls ------------------------------------------------
@dataclass(frozen=True, slots=True)
class StepAt:
    """Which attempt of which step runs, and on which worker: its span's attributes."""

    task: str
    agent: str
    superstep: int
    epoch: int
    attempt: int
    worker: str


# The step running on this thread: whether it replays a restore's discarded work, its attempt.
_step: ContextVar[tuple[bool, int]] = ContextVar("cairn_traced_step", default=(False, 1))


@contextlib.contextmanager
def step_span(at: StepAt, carried: object) -> Iterator[Span | None]:
    """Run the block in the span of step attempt `at`, under the superstep `carried` names.

    An attempt after the first links to the span of the attempt before it.
    """
    if not tracing():
        yield None
        return
    parent = parent_of(at.task, at.epoch, at.superstep, carried)
    attributes = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": at.agent,
        "cairn.task.id": at.task,
        "cairn.agent": at.agent,
        "cairn.superstep": at.superstep,
        "cairn.epoch": at.epoch,
        "cairn.attempt": at.attempt,
        "cairn.worker": at.worker,
        "cairn.replayed": parent.replayed,
    }
    own = step_span_id(at.task, at.agent, at.epoch, at.superstep, at.attempt)
    before = step_span_id(at.task, at.agent, at.epoch, at.superstep, at.attempt - 1)
    span = start_span(
        f"invoke_agent {at.agent}",
        remote(at.task, parent.span, replayed=parent.replayed),
        attributes,
        ids=(trace_id_of(at.task), own),
        links=[(at.task, before)] if at.attempt > 1 else [],
    )
    token = _step.set((parent.replayed, at.attempt))
    try:
        with current(span):
            yield span
    finally:
        _step.reset(token)


def _repeats() -> dict[str, Any]:
    """What a call's span says of the step it is part of: replayed, retried."""
    replayed, attempt = _step.get()
    return {"cairn.replayed": replayed, "cairn.attempt": attempt}


def model_span(
    model: str,
    params: Mapping[str, object],
    messages: Sequence[Message],
    agent: str,
    task: str,
    purpose: str,
) -> Span | None:
    """Start a model call's span (GenAI `chat`) under the current span; None when not tracing."""
    if not tracing():
        return None
    attributes = model_attributes(model, params, agent, task, purpose) | _repeats()
    attributes["gen_ai.input.messages"] = messages_attribute(messages)
    return start_span(f"chat {attributes['gen_ai.request.model']}", None, attributes,
                      kind="client")  # fmt: skip


def model_replied(
    span: Span | None,
    usage: Usage,
    text: str | None,
    calls: Sequence[ToolCall],
    *,
    cut: bool,
    refused: bool,
) -> None:
    """Set a model call's reply attributes on its span: usage, finish reason, output."""
    if span is None:
        return
    finish = "length" if cut else "content_filter" if refused else "tool_calls" if calls else "stop"
    attributes = usage_attributes(usage, finish)
    attributes["gen_ai.output.messages"] = output_attribute(text, calls, finish)
    set_attributes(span, attributes)


def tool_span(call: ToolCall, effects: str, agent: str) -> Span | None:
    """Start a tool call's span (GenAI `execute_tool`) under the current span."""
    if not tracing():
        return None
    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": call.name,
        "gen_ai.tool.call.id": call.id,
        "gen_ai.tool.type": "function",
        "gen_ai.agent.name": agent,
        "cairn.tool.effects": effects,
        **_repeats(),
        **tool_content(call.args, None),
    }
    return start_span(f"execute_tool {call.name}", None, attributes)


# GenAI spans -------------------------------------------------------------------------------
def model_attributes(
    model: str, params: Mapping[str, object], agent: str, task: str, purpose: str
) -> dict[str, Any]:
    """A model call's request attributes (GenAI conventions), `model` as a spec names it."""
    provider, _, name = model.partition(":")
    return {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": provider,
        "gen_ai.request.model": name or provider,
        "gen_ai.request.max_tokens": _number(params.get("max_tokens"), int),
        "gen_ai.request.temperature": _number(params.get("temperature"), float),
        "gen_ai.request.top_p": _number(params.get("top_p"), float),
        "gen_ai.agent.name": agent,
        "gen_ai.conversation.id": f"{task}:{agent}",
        "cairn.model.purpose": purpose,
    }


def _number(value: object, kind: type[int] | type[float]) -> int | float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return kind(value)


def usage_attributes(usage: Usage, finish: str) -> dict[str, Any]:
    """A model call's usage attributes (GenAI conventions, plus its cost)."""
    return {
        "gen_ai.usage.input_tokens": usage.prompt_tokens,
        "gen_ai.usage.output_tokens": usage.completion_tokens,
        "gen_ai.usage.cache_read.input_tokens": usage.cached_tokens,
        "gen_ai.usage.cache_creation.input_tokens": usage.cache_write_tokens or None,
        "gen_ai.response.finish_reasons": (finish,),
        "cairn.cost_usd": usage.cost_usd,
    }


def messages_attribute(messages: Sequence[Message]) -> str | None:
    """`messages` as the GenAI conventions' `gen_ai.input.messages` (JSON), if content is on."""
    if not content():
        return None
    return _bounded(json.dumps([_message(m) for m in messages]))


def output_attribute(text: str | None, calls: Sequence[ToolCall], finish: str) -> str | None:
    """A reply as `gen_ai.output.messages` (JSON), if content is on."""
    if not content():
        return None
    parts = _parts(text, calls)
    return _bounded(json.dumps([{"role": "assistant", "parts": parts, "finish_reason": finish}]))


def _message(message: Message) -> dict[str, object]:
    parts = _parts(message.content, message.tool_calls or [])
    said: dict[str, object] = {"role": message.role.value, "parts": parts}
    if message.tool_call_id:
        said["parts"] = [{"type": "tool_call_response", "id": message.tool_call_id,
                          "response": redact(message.content or "")}]  # fmt: skip
    return said


def _parts(text: str | None, calls: Sequence[ToolCall]) -> list[dict[str, object]]:
    parts: list[dict[str, object]] = [{"type": "text", "content": redact(text)}] if text else []
    parts += [{"type": "tool_call", "id": c.id, "name": c.name,
               "arguments": redact_json(c.args)} for c in calls]  # fmt: skip
    return parts


def tool_content(args: Mapping[str, object] | None, result: str | None) -> dict[str, Any]:
    """A tool call's arguments and result attributes, if content is on (else none)."""
    if not content():
        return {}
    return {
        "gen_ai.tool.call.arguments": None if args is None else _bounded(
            json.dumps(redact_json(dict(args)))  # type: ignore[arg-type]  # JSON, as called
        ),
        "gen_ai.tool.call.result": None if result is None else _bounded(redact(result)),
    }  # fmt: skip


def _bounded(text: str) -> str:
    return text if len(text) <= MAX_CONTENT else text[:MAX_CONTENT] + "…"
