"""`AgentContext`: what an agent written in Python sees and does in one step.

Everything the function does goes through its context, and so through the same machinery
a built-in step uses: its model calls are counted, traced and compacted; its tool calls
follow the tools' effects (a tool-level checkpoint before an `external` one, its
idempotency key); its messages go out at the barrier. Each action is also an entry of the
run's `Journal`, so a step retried from a tool-level checkpoint replays the function to
where it was without paying for anything twice (`cairn.agents.kinds.journal`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ParamSpec, TypeVar

from pydantic import JsonValue

from cairn.agents.barrier import pending_calls
from cairn.agents.context import StepContext
from cairn.agents.kinds.journal import Journal
from cairn.agents.models.base import ModelReply, ToolSchema
from cairn.agents.results import check_value
from cairn.agents.spec import AgentSpec
from cairn.errors import InvalidState, SpawnRefused, ToolError
from cairn.storage.public import public
from cairn.storage.records import AgentResult, Message, Role, ToolCall, Usage
from cairn.storage.redact import redact

P = ParamSpec("P")
R = TypeVar("R")
ERROR_PREFIX = "error: "  # how a failed call's result starts (`StepContext._result`)


@public
class Outcome(StrEnum):
    """Where an agent in code stands after its step: what its function returns.

    `continue`: it takes another step next superstep. `halt`: it rests until a message
    arrives (what returning None says too). `finish`: it is done (a message still wakes it).
    """

    CONTINUE = "continue"
    HALT = "halt"
    FINISH = "finish"


@public
@dataclass(frozen=True, slots=True)
class Reply:
    """A model turn, as an agent in code reads it: its text and the tools it asked for."""

    text: str | None
    calls: list[ToolCall] = field(default_factory=list)


class Waiting(BaseException):
    """Raised out of the function when a call waits for a person's approval."""


@public
class AgentContext:
    """One step of an agent written in Python (`cairn.agent`), as its function sees it.

    `state` is the agent's own JSON state, kept in every checkpoint: what the function
    keeps between its steps. `history` is the agent's conversation with its model.
    """

    def __init__(
        self, step: StepContext, journal: Journal, state: dict[str, Any], base: int
    ) -> None:
        self._step = step
        self._journal = journal
        self._state = state
        self._shown = base  # how much of the history a replay has reached
        self.engine_error: BaseException | None = None  # raised by Cairn, not by the code

    # What the step is about ------------------------------------------------------------
    @property
    def name(self) -> str:
        """The agent's name."""
        return self._step.agent

    @property
    def task(self) -> str:
        """The task's id."""
        return self._step.task

    @property
    def goal(self) -> str:
        """The task's goal, as submitted."""
        return self._step.goal

    @property
    def superstep(self) -> int:
        """The superstep this step belongs to (1 for the first)."""
        return self._step.lc.superstep

    @property
    def team(self) -> list[str]:
        """The team's members, in team order (the agent among them)."""
        return list(self._step.team)

    @property
    def spec(self) -> AgentSpec:
        """The agent's spec: its model, tools, system prompt, limits."""
        return self._step.spec

    @property
    def state(self) -> dict[str, Any]:
        """The agent's own state: JSON, kept in every checkpoint, restored with the task.

        Typed loosely for code's ease; what is not JSON fails the step, naming where.
        """
        return self._state

    @property
    def history(self) -> list[Message]:
        """The agent's conversation so far (a copy): system prompt, goal, turns, messages."""
        messages = self._step.history
        return list(messages[: self._shown] if self._journal.replaying else messages)

    @property
    def replaying(self) -> bool:
        """Whether the step is replaying what it did before a crash (nothing runs twice)."""
        return self._journal.replaying

    # What it can do ---------------------------------------------------------------------
    def inbox(self) -> list[Message]:
        """Take the messages teammates sent since the agent last read; they join the history."""
        entry = self._journal.replay("inbox", {})
        if entry is None:
            got = self._engine(self._step.inbox)
            self._journal.record("inbox", {}, upto=len(self._step.history), count=len(got))
            return got
        upto, count = _int(entry, "upto"), _int(entry, "count")
        self._shown = upto
        return list(self._step.history[upto - count : upto])

    def ask(self, prompt: str | None = None, *, tools: bool = False) -> Reply:
        """Ask the agent's model for one turn on the history (`prompt` first joins it).

        With `tools`, the agent's tools are on offer and the reply may ask for calls:
        `run_calls` runs them. The turn joins the history.
        """
        args: dict[str, JsonValue] = {"prompt": prompt, "tools": tools}
        entry = self._journal.replay("ask", args)
        if entry is None:
            if prompt is not None:
                self._step.history.append(Message(role=Role.USER, content=redact(prompt)))
            self._engine(self._step.ask, offer_tools=tools)
            self._journal.record("ask", args, upto=len(self._step.history))
            if self._step.policy.triggers.model_reply:
                self._engine(self._step.checkpoint)
            upto = len(self._step.history)
        else:
            upto = self._shown = _int(entry, "upto")
        turn = self._step.history[upto - 1]
        return Reply(turn.content, list(turn.tool_calls))

    def converse(self, messages: Sequence[Message], tools: Sequence[ToolSchema] = ()) -> ModelReply:
        """One call of the agent's model on a conversation the code keeps itself.

        Counted and traced like a turn; the agent's history is left as it is. What an
        adapter of another framework's agent calls its model through.
        """
        sent = list(messages)
        args: dict[str, JsonValue] = {
            "messages": [m.model_dump(mode="json") for m in sent],
            "tools": [t.name for t in tools],
        }
        entry = self._journal.replay("converse", args)
        if entry is not None:
            return _reply_of(entry)
        reply = self._engine(self._step.converse, sent, list(tools))
        self._journal.record("converse", args, reply=_dump_reply(reply))
        if self._step.policy.triggers.model_reply:  # as `ask`: a crash does not pay again
            self._engine(self._step.checkpoint)
        return reply

    def run_calls(self, reply: Reply | None = None) -> None:
        """Run the tool calls the model's last turn asked for, their results into the history.

        A call a person approves stops the step until one decides (the function runs again
        then, and its actions so far are replayed).
        """
        entry = self._journal.replay("run_calls", {})
        if entry is not None:
            self._shown = _int(entry, "upto")
            return
        pending = pending_calls(self._step.history)
        last = next(m for m in reversed(self._step.history) if m.role is Role.ASSISTANT)
        places = {call.id: place for place, call in enumerate(last.tool_calls)}
        for call in pending:
            if not self._engine(self._step.call, call, places[call.id]):
                raise Waiting
        self._journal.record("run_calls", {}, upto=len(self._step.history))

    def tool(self, name: str, /, **args: JsonValue) -> str:
        """Call one of the agent's tools from code; its result, or `ToolError` with why not.

        The call is traced and follows the tool's effects, as a model's call does; it is
        not part of the history (the model did not make it). A tool a person approves is
        refused here: approvals are of a model's calls (`run_calls`).
        """
        said: dict[str, JsonValue] = {"name": name, "args": dict(args)}
        entry = self._journal.replay("tool", said)
        if entry is None and name in self._step.approved:
            raise ToolError(
                f"{name} waits for a person's approval of each call, which only "
                "a model's call gets: offer it (ask(tools=True), run_calls)"
            )
        if entry is None:
            seq = self._journal.at  # the call's place: the same on every replay
            call = ToolCall(id=f"code-{self.superstep}-{seq}", name=name, args=dict(args))
            if not self._engine(self._step.call, call, -1 - seq, into_history=False):
                raise Waiting
            made = self._step.result_message
            assert made is not None  # a call that ran has a result
            entry = {"result": made.content, "error": made.error}
            self._journal.record("tool", said, **entry)
        text = entry.get("result")
        text = text if isinstance(text, str) else ""
        if entry.get("error"):
            raise ToolError(text.removeprefix(ERROR_PREFIX))
        return text

    def read(self, path: str) -> str:
        """A workspace file's text (through the agent's `read_file` tool)."""
        return self.tool("read_file", path=path)

    def write(self, path: str, content: str) -> None:
        """Write a workspace file (through the agent's `write_file` tool)."""
        self.tool("write_file", path=path, content=content)

    def files(self) -> list[str]:
        """The workspace's file paths (through the agent's `list_files` tool)."""
        listed = self.tool("list_files")
        if listed == "(no files)":
            return []
        return [line for line in listed.splitlines() if not line.startswith("… and ")]

    def send(self, to: str, text: str) -> None:
        """Send `text` to teammate `to`, delivered at the barrier (`send_message`)."""
        self.tool("send_message", to=to, content=text)

    def spawn(self, name: str, spec: AgentSpec, brief: str) -> str:
        """Add member `name` (`spec`) to the team, `brief` its first message; what it is told.

        It joins at this step's barrier, takes its first step next superstep, and its
        result comes back as a message when it finishes. Raises `SpawnRefused` saying why
        (a name taken, a spec that does not parse, the task at its `max_agents`).
        """
        said: dict[str, JsonValue] = {"name": name, "spec": spec.model_dump(mode="json"),
                                      "brief": brief}  # fmt: skip
        entry = self._journal.replay("spawn", said)
        if entry is None:
            try:
                told = self._step.spawn(name, spec, brief)
            except SpawnRefused as exc:
                entry = {"refused": str(exc)}
            else:
                entry = {"told": told}
            self._journal.record("spawn", said, **entry)
        refused = entry.get("refused")
        if isinstance(refused, str):
            raise SpawnRefused(refused)
        answer = entry.get("told")
        return answer if isinstance(answer, str) else ""

    def handoff(self, to: str, note: str, *, include_history: bool = True) -> Outcome:
        """Hand the conversation to teammate `to` (`cairn.agents.handoff`); returns `halt`.

        For `return ctx.handoff(...)`: the agent rests until a message wakes it.
        """
        self.tool("handoff", to=to, note=note, include_history=include_history)
        return Outcome.HALT

    def finish(self, result: JsonValue = None) -> Outcome:
        """Say the agent is done, with its result (checked against the task's schema, if any).

        Returns `Outcome.FINISH`, for `return ctx.finish(...)`. Raises `ToolError`, saying
        what does not fit, for a result the task's schema refuses.
        """
        schema = self._step.record.result
        if schema is not None:
            check_value(schema, result)
        if result is not None or schema is not None:
            self._step.lc.result = AgentResult(value=result, superstep=self.superstep)
        return Outcome.FINISH

    def _engine(self, action: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """Do `action` of the engine; what it raises is the step's, not the code's."""
        try:
            return action(*args, **kwargs)
        except BaseException as exc:
            self.engine_error = exc
            raise


def _int(entry: dict[str, JsonValue], key: str) -> int:
    value = entry.get(key)
    if not isinstance(value, int):
        raise InvalidState(f"a journal entry of the agent's state has no {key}")
    return value


def _dump_reply(reply: ModelReply) -> JsonValue:
    """A model reply as a journal keeps it."""
    return {
        "content": reply.content,
        "calls": [call.model_dump(mode="json") for call in reply.tool_calls],
        "usage": reply.usage.model_dump(mode="json"),
        "refusal": reply.refusal,
        "cut": reply.cut,
    }


def _reply_of(entry: dict[str, JsonValue]) -> ModelReply:
    """The model reply a journal entry kept."""
    kept = entry.get("reply")
    if not isinstance(kept, dict):
        raise InvalidState("a journal entry of the agent's state has no reply")
    content, refusal, calls = kept.get("content"), kept.get("refusal"), kept.get("calls")
    return ModelReply(
        content=content if isinstance(content, str) else None,
        tool_calls=[ToolCall.model_validate(c) for c in calls] if isinstance(calls, list) else [],
        usage=Usage.model_validate(kept.get("usage") or {}),
        refusal=refusal if isinstance(refusal, str) else None,
        cut=bool(kept.get("cut")),
    )
