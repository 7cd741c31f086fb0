"""What every adapter shares: a step's input, its ending, and the engine's own errors.

An adapted agent's step is one run of the framework's agent: on the agent's first step
its input is the task's goal (and any message already there), later the messages
teammates sent since (`take_input`); its final output is the step's result, kept in the
state as `output`, sent to a teammate if the adapter says so, and the agent halts until
the next message, or finishes with it as its result (`end_step`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from pydantic import JsonValue

from cairn.agents.kinds.code import AgentContext, Outcome

HISTORY = "history"  # the framework's own history, as JSON, in the agent's state
OUTPUT = "output"  # the last run's final output, as JSON


@dataclass(frozen=True, slots=True)
class Ending:
    """What an adapted agent does with a run's final output.

    `finish`: the agent finishes with it as its result (`ctx.finish`); otherwise it halts
    until a teammate's message wakes it. `send_to`: a teammate it is sent to as text too.
    """

    finish: bool = False
    send_to: str | None = None


def take_input(ctx: AgentContext) -> str | None:
    """The user input of this step's run; None when nothing new came (the agent halts).

    The first run (no history kept yet) is given the task's goal, then any messages;
    each later run the messages teammates sent since the last, each on its own paragraph.
    """
    texts = [note.content or "" for note in ctx.inbox()]
    if HISTORY not in ctx.state:
        texts.insert(0, ctx.goal)
    return "\n\n".join(texts) if texts else None


def end_step(ctx: AgentContext, output: JsonValue, text: str, ending: Ending) -> Outcome:
    """Keep the run's output, send `text` as `ending` says, and say where the agent stands."""
    ctx.state[OUTPUT] = output
    if ending.send_to is not None:
        ctx.send(ending.send_to, text)
    return ctx.finish(output) if ending.finish else Outcome.HALT


@contextmanager
def engine_errors(ctx: AgentContext) -> Iterator[None]:
    """Raise Cairn's own error as it is when a framework wrapped it in one of its own.

    A model call's failure (`ModelError`) or a fenced write raised inside the framework's
    run must fail the step as Cairn raised it (retried as its kind says), not as the
    agent's code failing.
    """
    try:
        yield
    except BaseException as exc:
        engine = ctx.engine_error
        if engine is None or exc is engine:
            raise
        raise engine from None
