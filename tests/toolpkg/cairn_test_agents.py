"""An agent written in Python, for the tests: found through a `cairn.agents` entry point."""

from __future__ import annotations

import cairn


@cairn.agent
def echoer(ctx: cairn.AgentContext) -> str:
    """Writes the goal to GOAL.md and finishes."""
    ctx.write("GOAL.md", ctx.goal)
    return "finish"
