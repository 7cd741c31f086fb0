"""An OpenAI Agents SDK `Agent` as a Cairn agent kind: `kind(agent, name="triager")`.

Each step is one `Runner.run_sync` on the step's input (`cairn.agents.adapters.base`),
after the conversation so far: the run's items (`result.to_input_list()`) are kept as
JSON in the Cairn agent's state. Every model call of the run, the agents it hands off
to included, is a call of the Cairn agent's own model (`CairnModel`, set as the run's
model: `ctx.converse`), counted, traced and journaled; the SDK's tracing is off (Cairn's
trace has the calls). The agent's function tools run in the worker as the SDK runs them
(again, on a replay). The SDK's Responses-shaped items become chat messages by its own
converter (`Converter`), as its chat-completions model does it.

The SDK's top-level package is `agents`; Cairn's own are all under `cairn.`, so the two
live side by side. Needs the `openai-agents` extra:
`pip install 'cairn-agents[openai-agents]'`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable
from typing import Any, NoReturn

try:
    from openai.types.chat import (
        ChatCompletionMessage,
        ChatCompletionMessageFunctionToolCall,
        ChatCompletionMessageParam,
        ChatCompletionToolParam,
    )
    from openai.types.chat.chat_completion_message_function_tool_call import Function
    from openai.types.responses.response_prompt_param import ResponsePromptParam
    from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails
    from pydantic_core import to_jsonable_python

    from agents import Agent, Handoff, Model, ModelResponse, RunConfig, Runner, Tool, Usage
    from agents.agent_output import AgentOutputSchemaBase
    from agents.items import TResponseInputItem, TResponseStreamEvent
    from agents.model_settings import ModelSettings
    from agents.models.chatcmpl_converter import Converter
    from agents.models.interface import ModelTracing
except ImportError as exc:  # the optional extra is not installed
    raise ImportError(
        "cairn.agents.adapters.openai_agents needs the openai-agents extra: "
        f"pip install 'cairn-agents[openai-agents]' ({exc})"
    ) from exc

from pydantic import JsonValue

from cairn.agents.adapters.base import HISTORY, Ending, end_step, engine_errors, take_input
from cairn.agents.kinds.code import AgentContext, Outcome
from cairn.agents.kinds.python import CodeAgent, agent
from cairn.agents.models.base import ModelReply, ToolSchema
from cairn.storage.records import Message, Role, ToolCall

__all__ = ["CairnModel", "kind", "to_messages", "to_response", "to_schema"]

ROLES = {"system": Role.SYSTEM, "developer": Role.SYSTEM, "user": Role.USER,
         "assistant": Role.ASSISTANT, "tool": Role.TOOL}  # fmt: skip


def kind(
    sdk_agent: Agent[Any],
    *,
    name: str,
    finish: bool = False,
    send_to: str | None = None,
    max_turns: int = 10,
) -> CodeAgent:
    """The Cairn agent kind `name` whose steps are runs of `sdk_agent` (`Runner.run_sync`).

    `finish`: each run's final output finishes the agent, as its result; otherwise it
    halts until the next message. `send_to`: a teammate each final output is sent to.
    `max_turns`: the SDK's bound on model calls in one run. Raises `ValueError` for an
    agent whose output is not text (Cairn's models take no response format).
    """
    if sdk_agent.output_type not in (None, str):
        raise ValueError(f"agent {sdk_agent.name!r}: only text output (output_type=str) is "
                         "supported: Cairn's models take no response format")  # fmt: skip
    ending = Ending(finish, send_to)

    def step(ctx: AgentContext) -> Outcome:
        prompt = take_input(ctx)
        if prompt is None:
            return Outcome.HALT
        kept = ctx.state.get(HISTORY, [])
        items: list[TResponseInputItem] = [*kept, {"role": "user", "content": prompt}]
        config = RunConfig(model=CairnModel(ctx), tracing_disabled=True)
        with engine_errors(ctx):
            result = Runner.run_sync(sdk_agent, items, run_config=config, max_turns=max_turns)
        ctx.state[HISTORY] = to_jsonable_python(result.to_input_list())
        output: JsonValue = to_jsonable_python(result.final_output)
        text = output if isinstance(output, str) else json.dumps(output)
        return end_step(ctx, output, text, ending)

    return agent(name=name)(step)


class CairnModel(Model):  # type: ignore[misc] # the SDK is Any to mypy here (pyproject.toml)
    """An Agents SDK model that is the Cairn agent's own: each response is `ctx.converse`."""

    def __init__(self, ctx: AgentContext) -> None:
        self._ctx = ctx

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff[Any, Any]],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> ModelResponse:
        """Send the turn through the Cairn agent's model and read its reply."""
        messages = to_messages(system_instructions, Converter.items_to_messages(input))
        offered = [Converter.tool_to_openai(tool) for tool in tools]
        offered += [Converter.convert_handoff_tool(handoff) for handoff in handoffs]
        reply = self._ctx.converse(messages, [to_schema(tool) for tool in offered])
        return to_response(reply)

    def stream_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff[Any, Any]],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> AsyncIterator[TResponseStreamEvent]:
        """Not offered: a step runs the agent with `Runner.run_sync`, which does not stream."""
        _no_streaming()


def _no_streaming() -> NoReturn:
    raise NotImplementedError("a Cairn step runs the agent whole (Runner.run_sync)")


def to_messages(
    instructions: str | None, chat: Iterable[ChatCompletionMessageParam]
) -> list[Message]:
    """The SDK's chat-shaped messages (from its converter) as Cairn's, `instructions` first."""
    out = [Message(role=Role.SYSTEM, content=instructions)] if instructions else []
    for message in chat:
        data: dict[str, Any] = dict(message)
        role = ROLES.get(str(data.get("role")))
        if role is None:
            continue  # a role a chat model is not sent
        calls = [
            ToolCall(id=call["id"], name=call["function"]["name"],
                     args=json.loads(call["function"]["arguments"] or "{}"))
            for call in data.get("tool_calls") or []
            if call.get("type", "function") == "function"
        ]  # fmt: skip
        out.append(Message(role=role, content=_text(data.get("content")), tool_calls=calls,
                           tool_call_id=data.get("tool_call_id")))  # fmt: skip
    return out


def _text(content: object) -> str | None:
    """A chat message's content as text: its text parts joined, other parts named."""
    if content is None or isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else [content]
    texts = [
        str(part.get("text", "")) if part.get("type") == "text" else f"[{part.get('type')}]"
        for part in parts
        if isinstance(part, dict)
    ]
    return "".join(texts)


def to_schema(tool: ChatCompletionToolParam) -> ToolSchema:
    """A chat-completions tool (as the SDK's converter makes one) as Cairn's tool schema."""
    function = tool["function"]
    parameters: dict[str, JsonValue] = to_jsonable_python(function.get("parameters") or {})
    return ToolSchema(function["name"], function.get("description") or "", parameters)


def to_response(reply: ModelReply) -> ModelResponse:
    """A Cairn model reply as the SDK's `ModelResponse` (output items and usage)."""
    calls = [
        ChatCompletionMessageFunctionToolCall(
            id=call.id, type="function",
            function=Function(name=call.name, arguments=json.dumps(call.args)),
        )
        for call in reply.tool_calls
    ]  # fmt: skip
    message = ChatCompletionMessage(role="assistant", content=reply.content or reply.refusal,
                                    tool_calls=calls or None)  # fmt: skip
    used = reply.usage
    usage = Usage(
        requests=1,
        input_tokens=used.prompt_tokens,
        output_tokens=used.completion_tokens,
        total_tokens=used.tokens,
        input_tokens_details=InputTokensDetails(
            cached_tokens=used.cached_tokens, cache_write_tokens=used.cache_write_tokens
        ),
        output_tokens_details=OutputTokensDetails(reasoning_tokens=0),
    )
    return ModelResponse(output=Converter.message_to_output_items(message), usage=usage,
                         response_id=None)  # fmt: skip
