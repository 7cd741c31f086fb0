"""Agents written in Python: `cairn.agent` makes a function an agent kind.

The function is called once a step with an `AgentContext` and returns an `Outcome` (or
its name, or None for `halt`). Its kind's name is what a spec's `kind:` says; workers
load it as they load tools (a module named by `--tools`/`CAIRN_TOOLS`, or the
`cairn.agents` entry point group), so a spec names code, never ships it.

What the function keeps between steps is `ctx.state` (JSON). Inside a step, the kind's
state in each checkpoint is the state the run started from, the run's journal and where
its history started (`{"state", "journal", "base"}`): a retry replays the function on
that (`cairn.agents.kinds.journal`). A run that ends leaves `{"state": <its state>}`, or
nothing while its state is empty.

The function's own exceptions are the step's failure, not the worker's: the traceback
goes into the trace (kept by a checkpoint) and the step is retried as the spec's
`max_retries` says (`AgentCodeError`); a return value that is no outcome is a fatal
error naming the agent (`InvalidState`).
"""

from __future__ import annotations

import copy
import re
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import overload

from pydantic import JsonValue

from cairn.agents.context import StepContext
from cairn.agents.kinds.code import AgentContext, Outcome, Waiting
from cairn.agents.kinds.journal import Journal
from cairn.agents.spec import KIND_PATTERN, LLM_KIND, AgentSpec, parse_model
from cairn.errors import AgentCodeError, InvalidState
from cairn.storage.public import public
from cairn.storage.records import AgentState
from cairn.storage.redact import redact

AgentFunction = Callable[[AgentContext], object]
MAX_TRACEBACK = 8_000  # characters of a traceback kept in the trace
_KIND = re.compile(KIND_PATTERN)
_OUTCOMES = frozenset(outcome.value for outcome in Outcome)
STATUS = {
    Outcome.CONTINUE: AgentState.ACTIVE,
    Outcome.HALT: AgentState.HALTED,
    Outcome.FINISH: AgentState.FINISHED,
}


@public
@dataclass(frozen=True, slots=True)
class CodeAgent:
    """An agent kind whose steps a Python function takes (made by `cairn.agent`).

    Calling it calls the function, as if it were not a kind.
    """

    name: str
    func: AgentFunction

    def __call__(self, ctx: AgentContext) -> object:
        """Call the function itself."""
        return self.func(ctx)

    def spec(self, name: str | None = None, **fields: object) -> AgentSpec:
        """A member of this kind for a team declared in Python: `AgentSpec` fields by name.

        Raises `InvalidSpec` naming the first bad field.
        """
        data = {"name": name or self.name, "kind": self.name, **fields}
        return parse_model(AgentSpec, data, f"agent {data['name']}")

    def initial_state(self, spec: AgentSpec) -> dict[str, JsonValue]:
        """An empty state: the function fills `ctx.state` as it goes."""
        return {}

    def step(self, ctx: StepContext) -> None:
        """Run (or replay, then run on) the function; keep where the agent stands."""
        kept = ctx.lc.kind_state
        start = kept.get("state")
        start = start if isinstance(start, dict) else {}
        entries = kept.get("journal")
        entries = entries if isinstance(entries, list) else []
        base = kept.get("base")
        base = base if isinstance(base, int) else len(ctx.history)
        # What every checkpoint of this run keeps: a retry replays the run from it.
        ctx.lc.kind_state = {"state": start, "journal": entries, "base": base}
        live = copy.deepcopy(start)
        agent = AgentContext(ctx, Journal(entries, ctx.agent), live, base)
        try:
            returned = self.func(agent)
        except Waiting:
            ctx.outcome = AgentState.WAITING_APPROVAL  # the run goes on when a person decides
            return
        except (Exception, SystemExit) as exc:
            if exc is agent.engine_error:
                raise  # Cairn's own (a model's failure, a fenced write): the step's as it is
            self._failed(ctx, exc)
        ctx.outcome = STATUS[self._outcome(ctx.agent, returned)]
        # An empty state is left out of the stored LC, as an `llm` agent's is.
        ctx.lc.kind_state = {"state": live} if live else {}

    def status(self, ctx: StepContext) -> AgentState:
        """What the function's outcome said (active if it said nothing: it has not run)."""
        return ctx.outcome or AgentState.ACTIVE

    def _outcome(self, agent: str, returned: object) -> Outcome:
        if returned is None:
            return Outcome.HALT
        if isinstance(returned, str) and returned in _OUTCOMES:
            return Outcome(returned)
        shown = repr(returned)[:80]
        raise InvalidState(
            f"agent {agent} (kind {self.name}) returned {shown}, not an outcome: return "
            "'continue', 'halt', 'finish' (or cairn.Outcome, ctx.finish(...)) or None"
        )

    def _failed(self, ctx: StepContext, exc: BaseException) -> None:
        """Trace the code's traceback, keep it in a checkpoint, and fail the step."""
        lines = traceback.format_exception(exc)
        text = redact("".join(lines))[-MAX_TRACEBACK:]
        ctx.trace_failure(f"{self.name} (code)", text)
        ctx.checkpoint()  # the trace keeps it, and a retry replays up to here
        raise AgentCodeError(
            f"agent {ctx.agent}'s code raised {type(exc).__name__}: {exc}".splitlines()[0]
        ) from exc


@overload
def agent(func: AgentFunction, /) -> CodeAgent: ...


@overload
def agent(*, name: str | None = None) -> Callable[[AgentFunction], CodeAgent]: ...


@public
def agent(
    func: AgentFunction | None = None, /, *, name: str | None = None
) -> CodeAgent | Callable[[AgentFunction], CodeAgent]:
    """Make a function an agent kind: `@agent`, or `@agent(name="researcher")`.

    The function takes an `AgentContext` and returns an `Outcome` (`"continue"`, `"halt"`,
    `"finish"`) or None (`halt`). The kind is called by the function's name unless given
    one; a spec's `kind:` names it, and a worker has it when a module it loads holds it.
    """

    def make(function: AgentFunction) -> CodeAgent:
        called = name or function.__name__
        if called == LLM_KIND or not _KIND.fullmatch(called):
            raise ValueError(f"agent kind name {called!r} must match {KIND_PATTERN} (not llm)")
        return CodeAgent(called, function)

    return make if func is None else make(func)
