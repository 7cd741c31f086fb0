"""Agent kinds: what an agent does in one step, behind one small interface.

A kind (`AgentKind`) gives a new agent its initial state, takes one step on a
`StepContext`, and says where the agent stands after it. The step's protocol around it
(fencing, heartbeats, checkpoints, the vote) is the same for every kind. `llm`, a model
turn followed by the tool calls it asked for, is the kind of every agent a spec names.
"""

from __future__ import annotations

from cairn.agents.kinds.base import AgentKind
from cairn.agents.kinds.llm import LLM
from cairn.agents.spec import AgentSpec

KINDS: dict[str, AgentKind] = {LLM.name: LLM}


def kind_of(spec: AgentSpec) -> AgentKind:
    """The kind that runs the agent `spec` describes."""
    return LLM


__all__ = ["KINDS", "AgentKind", "kind_of"]
