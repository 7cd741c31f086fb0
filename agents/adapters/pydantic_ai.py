"""A PydanticAI `Agent` as a Cairn agent kind: `kind(agent, name="researcher")`.

Each step is one `agent.run_sync` on the step's input (`cairn.agents.adapters.base`),
with the agent's message history kept as JSON in the Cairn agent's state
(`ModelMessagesTypeAdapter`), and the agent's model replaced by `CairnModel`: every model
request of the run is a call of the Cairn agent's own model (`ctx.converse`), counted,
traced and journaled, so a step replayed after a crash is answered from the journal.
The agent's own tools run in the worker as PydanticAI runs them (again, on a replay).

Needs the `pydantic-ai` extra: `pip install 'cairn-agents[pydantic-ai]'`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

try:
    from pydantic_ai import Agent
    from pydantic_ai.messages import (
        InstructionPart,
        ModelMessage,
        ModelMessagesTypeAdapter,
        ModelRequest,
        ModelResponse,
        ModelResponsePart,
        RetryPromptPart,
        SystemPromptPart,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )
    from pydantic_ai.models import Model, ModelRequestParameters
    from pydantic_ai.settings import ModelSettings
    from pydantic_ai.tools import ToolDefinition
    from pydantic_ai.usage import RequestUsage
    from pydantic_core import to_jsonable_python
except ImportError as exc:  # the optional extra is not installed
    raise ImportError(
        "cairn.agents.adapters.pydantic_ai needs the pydantic-ai extra: "
        f"pip install 'cairn-agents[pydantic-ai]' ({exc})"
    ) from exc

from pydantic import JsonValue

from cairn.agents.adapters.base import HISTORY, Ending, end_step, engine_errors, take_input
from cairn.agents.kinds.code import AgentContext, Outcome
from cairn.agents.kinds.python import CodeAgent, agent
from cairn.agents.models.base import ModelReply, ToolSchema
from cairn.storage.records import Message, Role, ToolCall

__all__ = ["CairnModel", "kind", "to_messages", "to_response", "to_schemas"]

Deps = Callable[[AgentContext], Any]


def kind(
    pydantic_agent: Agent[Any, Any],
    *,
    name: str,
    finish: bool = False,
    send_to: str | None = None,
    deps: Deps | None = None,
) -> CodeAgent:
    """The Cairn agent kind `name` whose steps are runs of `pydantic_agent`.

    `finish`: each run's output finishes the agent, as its result; otherwise it halts
    until the next message. `send_to`: a teammate each run's output is sent to.
    `deps(ctx)` makes the run's dependencies (PydanticAI's `deps`) from the step's context.
    """
    ending = Ending(finish, send_to)

    def step(ctx: AgentContext) -> Outcome:
        prompt = take_input(ctx)
        if prompt is None:
            return Outcome.HALT
        history = ModelMessagesTypeAdapter.validate_python(ctx.state.get(HISTORY, []))
        with engine_errors(ctx):
            result = pydantic_agent.run_sync(
                prompt,
                message_history=history,
                model=CairnModel(ctx),
                deps=None if deps is None else deps(ctx),
            )
        kept = ModelMessagesTypeAdapter.dump_python(result.all_messages(), mode="json")
        ctx.state[HISTORY] = kept
        output: JsonValue = to_jsonable_python(result.output)
        text = output if isinstance(output, str) else json.dumps(output)
        return end_step(ctx, output, text, ending)

    return agent(name=name)(step)


class CairnModel(Model):
    """A PydanticAI model that is the Cairn agent's own: each request is `ctx.converse`."""

    def __init__(self, ctx: AgentContext) -> None:
        super().__init__()
        self._ctx = ctx

    @property
    def model_name(self) -> str:
        """The Cairn agent's model, as its spec names it."""
        return self._ctx.spec.model

    @property
    def system(self) -> str:
        """The provider, as PydanticAI names one."""
        return "cairn"

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        """Send the request through the Cairn agent's model and read its reply."""
        model_settings, params = self.prepare_request(model_settings, model_request_parameters)
        parts = self._get_instruction_parts(messages, params)
        instructions = InstructionPart.join(parts) if parts else None
        sent = to_messages(messages, instructions)
        tools = to_schemas([*params.function_tools, *params.output_tools])
        reply = self._ctx.converse(sent, tools)
        return to_response(reply, self.model_name)


def to_messages(messages: Iterable[ModelMessage], instructions: str | None) -> list[Message]:
    """PydanticAI's history as Cairn's chat-shaped messages, `instructions` first.

    Text, tool calls and tool results are kept; what a chat model is not sent (thinking,
    files the framework keeps beside a prompt) is left out, a non-text prompt noted.
    """
    out: list[Message] = []
    if instructions:
        out.append(Message(role=Role.SYSTEM, content=instructions))
    for message in messages:
        if isinstance(message, ModelRequest):
            for part in message.parts:
                out.extend(_request_part(part))
        else:
            out.append(_response(message))
    return out


def _request_part(part: object) -> list[Message]:
    if isinstance(part, SystemPromptPart):
        return [Message(role=Role.SYSTEM, content=part.content)]
    if isinstance(part, UserPromptPart):
        content = part.content
        if not isinstance(content, str):
            content = "\n".join(
                p if isinstance(p, str) else f"[{type(p).__name__}]" for p in content
            )
        return [Message(role=Role.USER, content=content)]
    if isinstance(part, ToolReturnPart):
        text, failed = part.model_response_str(), part.outcome != "success"
        return [Message(role=Role.TOOL, tool_call_id=part.tool_call_id, name=part.tool_name,
                        content=text, error=failed)]  # fmt: skip
    if isinstance(part, RetryPromptPart):  # a direct caller's, unprepared (the agent's are not)
        if part.tool_name is None:
            return [Message(role=Role.USER, content=part.model_response())]
        return [Message(role=Role.TOOL, tool_call_id=part.tool_call_id, name=part.tool_name,
                        content=part.model_response(), error=True)]  # fmt: skip
    return []  # a part that carries nothing a chat model is sent


def _response(message: ModelResponse) -> Message:
    texts = [part.content for part in message.parts if isinstance(part, TextPart)]
    calls = [
        ToolCall(id=part.tool_call_id, name=part.tool_name, args=part.args_as_dict())
        for part in message.parts
        if isinstance(part, ToolCallPart)
    ]
    return Message(role=Role.ASSISTANT, content="".join(texts) or None, tool_calls=calls)


def to_schemas(tools: Iterable[ToolDefinition]) -> list[ToolSchema]:
    """PydanticAI's tool definitions (function and output tools) as Cairn's tool schemas."""
    return [ToolSchema(t.name, t.description or "", t.parameters_json_schema) for t in tools]


def to_response(reply: ModelReply, model_name: str) -> ModelResponse:
    """A Cairn model reply as PydanticAI's `ModelResponse`, its usage included."""
    parts: list[ModelResponsePart] = []
    text = reply.content or reply.refusal  # a refusal is the model's answer, as `ask` keeps it
    if text:
        parts.append(TextPart(content=text))
    parts.extend(
        ToolCallPart(tool_name=call.name, args=dict(call.args), tool_call_id=call.id)
        for call in reply.tool_calls
    )
    usage = RequestUsage(
        input_tokens=reply.usage.prompt_tokens,
        output_tokens=reply.usage.completion_tokens,
        cache_read_tokens=reply.usage.cached_tokens,
        cache_write_tokens=reply.usage.cache_write_tokens,
    )
    return ModelResponse(parts=parts, usage=usage, model_name=model_name,
                         finish_reason="length" if reply.cut else None)  # fmt: skip
