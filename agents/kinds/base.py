"""`AgentKind`: the interface every kind of agent implements."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from pydantic import JsonValue

from cairn.agents.spec import AgentSpec
from cairn.storage.records import AgentState

if TYPE_CHECKING:
    from cairn.agents.context import StepContext


class AgentKind(Protocol):
    """What an agent does in a step; the step's protocol does the rest.

    `step` may ask the model, call tools, read the inbox and change `ctx.state` (JSON):
    everything it does lands in the step's checkpoint, and a retried step starts again
    from the last tool-level checkpoint it wrote (`ctx.checkpoint()`), its state included.
    It raises what the step should fail with (`ModelError`, `ToolUnreachable`, ...).
    """

    @property
    def name(self) -> str:
        """The kind's name, as a spec would say it."""
        ...

    def initial_state(self, spec: AgentSpec) -> dict[str, JsonValue]:
        """The kind's state of a new agent (kept in its first checkpoint)."""
        ...

    def step(self, ctx: StepContext) -> None:
        """Take one step of the agent."""
        ...

    def status(self, ctx: StepContext) -> AgentState:
        """Where the agent stands after its step: active, halted, finished or waiting."""
        ...
