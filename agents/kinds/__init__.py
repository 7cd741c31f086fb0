"""Agent kinds: what an agent does in one step, behind one small interface.

A kind (`AgentKind`) gives a new agent its initial state, takes one step on a
`StepContext`, and says where the agent stands after it. The step's protocol around it
(fencing, heartbeats, checkpoints, the vote) is the same for every kind. `llm`, a model
turn followed by the tool calls it asked for, is built in and the default; any other kind
is an agent written in Python (`cairn.agent`) that the worker loaded with its tools.
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING

from cairn.agents.kinds.base import AgentKind
from cairn.agents.kinds.llm import LLM
from cairn.agents.spec import LLM_KIND, AgentSpec
from cairn.errors import MissingTool

if TYPE_CHECKING:
    from cairn.agents.toolkit import ToolRegistry


def kind_of(spec: AgentSpec, registry: ToolRegistry | None = None) -> AgentKind:
    """The kind that runs the agent `spec` describes, among `registry`'s.

    Raises `MissingTool`, naming the worker and the kinds it has, for a kind it lacks:
    another attempt on this worker would lack it too.
    """
    if spec.kind == LLM_KIND:
        return LLM
    found = registry.kinds.get(spec.kind) if registry is not None else None
    if found is None:
        known = sorted(registry.kinds) if registry is not None else []
        raise MissingTool(
            f"agent {spec.name} is of kind {spec.kind!r}, which worker "
            f"{socket.gethostname()}:{os.getpid()} does not have (it has {known or 'none'}: "
            "load the module that defines it with --tools or CAIRN_TOOLS)"
        )
    return found


__all__ = ["AgentKind", "kind_of"]
