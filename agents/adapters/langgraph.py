"""A compiled LangGraph graph as a Cairn agent kind: `kind(graph, name="researcher")`.

Each step is one invocation of the graph on the step's input, given as a human message
on the graph's messages channel (`cairn.agents.adapters.base`). The graph's thread, its
latest LangGraph checkpoint (every channel's value, serialized by LangGraph's own
serializer), is kept in the Cairn agent's state: the step loads it into an in-memory
checkpointer, invokes the graph from it, and keeps the checkpoint the run reached. So
the graph's state is part of every Cairn checkpoint, and a Cairn restore, fork or retry
puts the graph back exactly where that checkpoint had it; no second store is involved.

Model calls: a node that calls `CairnChatModel` (a LangChain chat model) calls the Cairn
agent's own model through the step (`ctx.converse`): counted, traced, journaled. Any
other chat model a node calls (`ChatOpenAI`, ...) is the graph's own business: Cairn
neither counts it nor replays it, and a crashed step calls it again.

Needs LangGraph: `pip install langgraph` (Cairn's `langgraph` extra holds the checkpoint
library only).
"""

from __future__ import annotations

import base64
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, cast

try:
    from langchain_core.callbacks import CallbackManagerForLLMRun
    from langchain_core.language_models import BaseChatModel, LanguageModelInput
    from langchain_core.messages import (
        AIMessage,
        BaseMessage,
        HumanMessage,
        SystemMessage,
        ToolMessage,
    )
    from langchain_core.messages.ai import UsageMetadata
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.runnables import Runnable, RunnableConfig
    from langchain_core.utils.function_calling import convert_to_openai_tool
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.checkpoint.serde.base import SerializerProtocol
    from langgraph.pregel import Pregel
except ImportError as exc:  # LangGraph is not installed
    raise ImportError(
        f"cairn.agents.adapters.langgraph needs LangGraph: pip install langgraph ({exc})"
    ) from exc

from pydantic import JsonValue

from cairn.agents.adapters.base import HISTORY, Ending, end_step, engine_errors, take_input
from cairn.agents.kinds.code import AgentContext, Outcome
from cairn.agents.kinds.python import CodeAgent, agent
from cairn.agents.models.base import ModelReply, ToolSchema
from cairn.errors import InvalidState
from cairn.storage.records import Message, Role, ToolCall

__all__ = ["CairnChatModel", "kind", "to_ai_message", "to_messages"]

THREAD: RunnableConfig = {"configurable": {"thread_id": "cairn", "checkpoint_ns": ""}}
_STEP: ContextVar[AgentContext | None] = ContextVar("cairn_langgraph_step", default=None)


def kind(
    graph: Pregel[Any, Any, Any, Any],
    *,
    name: str,
    finish: bool = False,
    send_to: str | None = None,
    messages_key: str = "messages",
    serde: SerializerProtocol | None = None,
) -> CodeAgent:
    """The Cairn agent kind `name` whose steps are invocations of the compiled `graph`.

    The step's input is a `HumanMessage` on channel `messages_key`; the run's output is
    the text of that channel's last message. `finish`: the output finishes the agent, as
    its result; otherwise it halts until the next message. `send_to`: a teammate the
    output is sent to. `serde`: the serializer of the graph's state (LangGraph's default).
    """
    ending = Ending(finish, send_to)

    def step(ctx: AgentContext) -> Outcome:
        prompt = take_input(ctx)
        if prompt is None:
            return Outcome.HALT
        saver = InMemorySaver(serde=serde)
        kept = ctx.state.get(HISTORY)
        if isinstance(kept, dict):
            checkpoint = _load(saver, kept["checkpoint"])
            saver.put(THREAD, checkpoint, _load(saver, kept["metadata"]),
                      checkpoint["channel_versions"])  # fmt: skip
        runnable = graph.copy(update={"checkpointer": saver})
        with engine_errors(ctx), _serving(ctx):
            values = runnable.invoke({messages_key: [HumanMessage(prompt)]}, THREAD)
        reached = saver.get_tuple(THREAD)
        if reached is None:
            raise InvalidState(f"graph of agent {ctx.name} kept no checkpoint")
        ctx.state[HISTORY] = {
            "checkpoint": _dump(saver, reached.checkpoint),
            "metadata": _dump(saver, reached.metadata),
        }
        said = values.get(messages_key) if isinstance(values, dict) else None
        output = _text(said[-1].content) if said else ""
        return end_step(ctx, output, output, ending)

    return agent(name=name)(step)


def _dump(saver: InMemorySaver, value: object) -> JsonValue:
    """A LangGraph value as JSON: its serializer's type and its bytes in base64."""
    kind, data = saver.serde.dumps_typed(value)
    return [kind, base64.b64encode(data).decode()]


def _load(saver: InMemorySaver, kept: Any) -> Any:  # noqa: ANN401 - a checkpoint or metadata
    """A value `_dump` kept."""
    kind, data = kept
    return saver.serde.loads_typed((kind, base64.b64decode(data)))


@contextmanager
def _serving(ctx: AgentContext) -> Iterator[None]:
    """Make `ctx` the step `CairnChatModel` calls through while the graph runs."""
    token = _STEP.set(ctx)
    try:
        yield
    finally:
        _STEP.reset(token)


class CairnChatModel(BaseChatModel):
    """A LangChain chat model that is the Cairn agent's own model, in a graph `kind` runs.

    Called outside such a step it raises `RuntimeError`. Tools bound with `bind_tools`
    are offered to the model; its reply's tool calls are the `AIMessage`'s.
    """

    @property
    def _llm_type(self) -> str:
        return "cairn"

    def bind_tools(
        self,
        tools: Sequence[Any],
        **kwargs: Any,  # noqa: ANN401 - LangChain's signature
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """The model with `tools` (LangChain tools, functions or schemas) on offer."""
        schemas = [convert_to_openai_tool(tool) for tool in tools]
        return cast(Runnable[LanguageModelInput, AIMessage], self.bind(tools=schemas, **kwargs))

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,  # noqa: ANN401 - LangChain's signature
    ) -> ChatResult:
        ctx = _STEP.get()
        if ctx is None:
            raise RuntimeError("CairnChatModel answers only in a step of a graph that "
                               "cairn.agents.adapters.langgraph.kind runs")  # fmt: skip
        tools = [
            ToolSchema(f["name"], f.get("description") or "", f.get("parameters") or {})
            for f in (tool["function"] for tool in kwargs.get("tools") or [])
        ]
        reply = ctx.converse(to_messages(messages), tools)
        return ChatResult(generations=[ChatGeneration(message=to_ai_message(reply))])


def to_messages(messages: Sequence[BaseMessage]) -> list[Message]:
    """LangChain messages as Cairn's chat-shaped ones (text, tool calls, tool results)."""
    out: list[Message] = []
    for message in messages:
        text = _text(message.content)
        if isinstance(message, SystemMessage):
            out.append(Message(role=Role.SYSTEM, content=text))
        elif isinstance(message, AIMessage):
            calls = [ToolCall(id=c["id"] or "", name=c["name"], args=c["args"])
                     for c in message.tool_calls]  # fmt: skip
            out.append(Message(role=Role.ASSISTANT, content=text or None, tool_calls=calls))
        elif isinstance(message, ToolMessage):
            out.append(Message(role=Role.TOOL, content=text, tool_call_id=message.tool_call_id,
                               name=message.name, error=message.status == "error"))  # fmt: skip
        else:  # a human message, or another kind a chat model reads as the user's
            out.append(Message(role=Role.USER, content=text))
    return out


def to_ai_message(reply: ModelReply) -> AIMessage:
    """A Cairn model reply as LangChain's `AIMessage`, its usage as `usage_metadata`."""
    used = reply.usage
    usage = UsageMetadata(input_tokens=used.prompt_tokens, output_tokens=used.completion_tokens,
                          total_tokens=used.tokens)  # fmt: skip
    calls = [{"id": c.id, "name": c.name, "args": dict(c.args)} for c in reply.tool_calls]
    return AIMessage(content=reply.content or reply.refusal or "", tool_calls=calls,
                     usage_metadata=usage)  # fmt: skip


def _text(content: object) -> str:
    """A LangChain message's content as text: its text blocks joined, other blocks named."""
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else [content]
    return "".join(
        p if isinstance(p, str) else str(p.get("text", "")) if isinstance(p, dict) and
        p.get("type") == "text" else f"[{p.get('type') if isinstance(p, dict) else p}]"
        for p in parts
    )  # fmt: skip
