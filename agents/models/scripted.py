"""`ScriptedModel`: a deterministic model that plays a script, for demos, tests and faults.

The turn it plays is a pure function of the agent's state, the number of assistant turns
already in the history (as the Forge seed's mock model does), so a restored agent goes on
with its script exactly where its checkpoint left it. Past the end it answers without tool
calls, and the agent halts. A turn's `crash` arms a fault point of the step it answers
(`cairn.agents.faults`): only a worker with a fault hook dies there.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from cairn.agents import faults
from cairn.agents.models.base import ModelReply, ModelRequest
from cairn.agents.spec import Turn
from cairn.errors import ModelError
from cairn.storage.records import Role, ToolCall, Usage

FINISHED = "(nothing left in my script)"


class ScriptedModel:
    """A `Model` playing `script`; `on_call(turn)` observes every call (tests count them)."""

    def __init__(
        self,
        script: list[Turn],
        *,
        sleep: Callable[[float], None] = time.sleep,
        on_call: Callable[[int], None] | None = None,
    ) -> None:
        self.script = script
        self._sleep = sleep
        self._on_call = on_call

    def complete(self, request: ModelRequest) -> ModelReply:
        """Play the turn after the assistant turns already in the history.

        A compaction's summary request is answered with a line naming what it summarizes,
        no turn played.
        """
        prompt_tokens = sum(len(m.content or "") for m in request.messages) // 4
        if request.purpose == "summary":
            said = request.messages[-1].content or ""
            summary = f"(a scripted summary of {said.count(chr(10) + '[') + 1} messages)"
            return ModelReply(content=summary, usage=Usage(prompt_tokens=prompt_tokens))
        index = request.turn
        if index is None:
            index = sum(1 for m in request.messages if m.role is Role.ASSISTANT)
        if self._on_call is not None:
            self._on_call(index)
        if index >= len(self.script):
            return ModelReply(content=FINISHED, usage=Usage(prompt_tokens=prompt_tokens))
        turn = self.script[index]
        if turn.latency:
            self._sleep(turn.latency)
        if turn.fail is not None and request.attempt in turn.fail.attempts:
            raise ModelError(turn.fail.message, retryable=turn.fail.error == "retryable")
        calls = [
            # Ids derive from the turn, so a replayed turn names its calls the same way.
            ToolCall(id=f"call_{index}_{i}", name=tool.name, args=tool.args)
            for i, tool in enumerate(turn.tools)
        ]
        crash = turn.crash
        if crash is not None and request.attempt in crash.attempts:
            faults.arm(faults.Crash(crash.after_tools))
        return ModelReply(
            content=turn.say,
            tool_calls=calls,
            usage=Usage(prompt_tokens=prompt_tokens, completion_tokens=len(turn.say or "") // 4),
        )
