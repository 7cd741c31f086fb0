"""The `llm` kind: one model turn, then the tool calls it asked for.

A step resumed from a tool-level checkpoint does not ask the model again for a turn it
already took: it runs the calls of that turn still without a result.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import JsonValue

from cairn.agents.barrier import pending_calls
from cairn.agents.context import StepContext
from cairn.agents.results import keep_result
from cairn.agents.spec import AgentSpec
from cairn.storage.records import AgentState, Message, Role


@dataclass(frozen=True, slots=True)
class LlmKind:
    """A model and its tools, in a loop of one turn a step (see the module's docstring)."""

    name: str = "llm"

    def initial_state(self, spec: AgentSpec) -> dict[str, JsonValue]:
        """None: the history is the whole of an `llm` agent's state."""
        return {}

    def step(self, ctx: StepContext) -> None:
        """Take the turn (unless this step took it before a crash), then run its calls."""
        pending = pending_calls(ctx.history)
        base = ctx.lc.base.message_count if ctx.lc.base else 0
        taken = any(m.role is Role.ASSISTANT for m in ctx.history[base:])
        if not pending and not taken:
            ctx.inbox()
            pending = list(ctx.ask().tool_calls)
            if ctx.policy.triggers.model_reply:
                ctx.checkpoint()
        places = _places(ctx.history)
        for call in pending:
            if not ctx.call(call, places[call.id]):
                break  # waiting for a person's approval
            if call.name == "finish" and ctx.record.result is not None:
                keep_result(ctx.lc, call)

    def status(self, ctx: StepContext) -> AgentState:
        """Where the agent stands, read from its history alone.

        Waiting while a call of its last turn awaits approval; finished once that turn
        called `finish` and the call worked (a result that does not fit, say, is an error
        the agent goes on from); halted once it handed the conversation over (`handoff`);
        active while the turn asked for tools (it goes on next superstep); else halted
        until a message wakes it.
        """
        if pending_calls(ctx.history):
            return AgentState.WAITING_APPROVAL
        at = _last_turn(ctx.history)
        if at is None or not ctx.history[at].tool_calls:
            return AgentState.HALTED
        worked = {m.tool_call_id for m in ctx.history[at + 1 :] if m.role is Role.TOOL
                  and not m.error}  # fmt: skip
        if any(c.name == "finish" and c.id in worked for c in ctx.history[at].tool_calls):
            return AgentState.FINISHED
        if any(c.name == "handoff" and c.id in worked for c in ctx.history[at].tool_calls):
            return AgentState.HALTED  # the teammate took the conversation over
        return AgentState.ACTIVE


def _last_turn(messages: list[Message]) -> int | None:
    """Where the last assistant turn is in `messages`; None before the first."""
    return next(
        (at for at in range(len(messages) - 1, -1, -1) if messages[at].role is Role.ASSISTANT),
        None,
    )


def _places(messages: list[Message]) -> dict[str, int]:
    """Each call id of the last assistant turn → its place in that turn (0-based).

    A call's idempotency key uses its place in the turn, not its place among the calls
    still pending, so a step resumed after some tools ran hands the same keys.
    """
    last = next((m for m in reversed(messages) if m.role is Role.ASSISTANT), None)
    return {} if last is None else {call.id: place for place, call in enumerate(last.tool_calls)}


LLM = LlmKind()
