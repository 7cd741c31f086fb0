"""Other frameworks' agents as Cairn agent kinds, for tests/test_adapters.py's workers.

Workers load this module as a user's (`CAIRN_TOOLS=tests.adapter_agents`). Each adapted
agent has a tool of its own framework, `note`, that records its text in a ledger outside
the workspace (`ADAPTERS_DIR`) and, once, when marker file `die-<kind>` is there, kills
its worker in the middle of the step. `feeder`, an agent in code, asks the adapted agent
one question a superstep, three in all, so the adapted agent's history grows over
several global checkpoints.

The OpenAI Agents SDK's package is `agents`, which a checkout's own `agents/` folder
shadows while the repository's root is on `sys.path` (as it is for tests and their
workers; an installed Cairn has no such folder): `beside_checkout` imports it first.
"""

from __future__ import annotations

import base64
import importlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from langchain_core.messages import BaseMessage
from langchain_core.tools import tool
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from pydantic_ai import Agent as PydanticAgent

import cairn
from cairn import AgentContext
from cairn.agents.adapters import langgraph as langgraph_adapter
from cairn.agents.adapters import pydantic_ai as pydantic_ai_adapter

QUESTIONS = 3
ROOT = Path(__file__).resolve().parents[1]


def beside_checkout(package: str) -> None:
    """Import top-level `package` with the checkout's root off `sys.path` for the while."""
    kept = sys.path[:]
    sys.path[:] = [p for p in kept if Path(p or ".").resolve() != ROOT]
    try:
        importlib.import_module(package)
    finally:
        sys.path[:] = kept


beside_checkout("agents")  # from here on, `agents` is the SDK's (sys.modules has it)

from agents.models.chatcmpl_converter import Converter  # noqa: E402

from agents import Agent as SdkAgent  # noqa: E402 - after `beside_checkout`
from agents import function_tool  # noqa: E402
from cairn.agents.adapters import openai_agents as openai_agents_adapter  # noqa: E402

__all__ = [
    "Converter",
    "feeder",
    "graph_helper",
    "graph_messages",
    "langgraph_adapter",
    "note_sdk",
    "openai_agents_adapter",
    "pydantic_ai_adapter",
    "pydantic_helper",
    "sdk_helper",
]


def _outside() -> Path:
    return Path(os.environ["ADAPTERS_DIR"])


def note(framework: str, text: str) -> str:
    """Record `text` in the ledger; kill the worker once if `die-<framework>` is there."""
    with (_outside() / "ledger.jsonl").open("a") as ledger:
        ledger.write(json.dumps({"framework": framework, "text": text}) + "\n")
    try:
        (_outside() / f"die-{framework}").unlink()
    except FileNotFoundError:
        return f"noted {text}"
    os.kill(os.getpid(), signal.SIGKILL)  # the worker dies mid-step, as a killed one does
    raise AssertionError("unreachable")


@cairn.agent
def feeder(ctx: AgentContext) -> str:
    """Sends the other member one question a superstep; finishes after the last."""
    sent = ctx.state.get("sent", 0)
    if sent >= QUESTIONS:
        return ctx.finish()
    [other] = [member for member in ctx.team if member != ctx.name]
    ctx.send(other, f"Question {sent + 1}?")
    ctx.state["sent"] = sent + 1
    return "continue"


helper = PydanticAgent(instructions="Answer your teammates' questions.", name="helper")


@helper.tool_plain
def note_pydantic(text: str) -> str:
    """Note `text` down.

    Args:
        text: what to note.

    """
    return note("pydantic_ai", text)


pydantic_helper = pydantic_ai_adapter.kind(helper, name="pydantic_helper")


@function_tool  # type: ignore[untyped-decorator] # the SDK is Any to mypy (pyproject.toml)
def note_sdk(text: str) -> str:
    """Note `text` down.

    Args:
        text: what to note.

    """
    return note("openai_agents", text)


triager = SdkAgent(name="triager", instructions="Answer your teammates' questions.",
                   tools=[note_sdk])  # fmt: skip
sdk_helper = openai_agents_adapter.kind(triager, name="sdk_helper")


@tool
def note_graph(text: str) -> str:
    """Note `text` down.

    Args:
        text: what to note.

    """
    return note("langgraph", text)


def _answer(state: MessagesState) -> dict[str, list[BaseMessage]]:
    """The graph's model node: Cairn's model, the note tool on offer."""
    model = langgraph_adapter.CairnChatModel().bind_tools([note_graph])
    return {"messages": [model.invoke(state["messages"])]}


def _graph() -> CompiledStateGraph[MessagesState, None, MessagesState, MessagesState]:
    """A model-and-tools loop, as LangGraph's guides build one."""
    builder = StateGraph(MessagesState)
    builder.add_node("answer", _answer)
    builder.add_node("tools", ToolNode([note_graph]))
    builder.add_edge(START, "answer")
    builder.add_conditional_edges("answer", tools_condition)
    builder.add_edge("tools", "answer")
    return builder.compile()


graph_helper = langgraph_adapter.kind(_graph(), name="graph_helper")


def graph_messages(kept: dict[str, Any]) -> list[tuple[str, str, list[str]]]:
    """The messages of a graph's thread an adapted graph's state keeps: kind, text, calls."""
    kind, data = kept["checkpoint"]
    checkpoint = JsonPlusSerializer().loads_typed((kind, base64.b64decode(data)))
    return [
        (m.type, str(m.content), [c["name"] for c in getattr(m, "tool_calls", [])])
        for m in checkpoint["channel_values"]["messages"]
    ]
