"""`StepContext`: what an agent kind may see and do in one step.

The step's protocol (`cairn.agents.step`) fences the attempt, loads the agent's state and
the workspace, and writes the checkpoints; a kind (`cairn.agents.kinds`) decides what
the agent does, through this context only: read its history and goal, take its inbox,
ask its model (counted and traced), call its tools (approval, tool-level checkpoints and
idempotency keys as the spec says), keep a JSON state of its own, and take a tool-level
checkpoint. Each tool call gets a `ToolContext` of its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import partial

from pydantic import JsonValue

from cairn.agents import faults, spans, spawn, tracing
from cairn.agents.accounting import cost
from cairn.agents.approval import decision_for
from cairn.agents.arguments import check_names
from cairn.agents.compaction import (
    Fold,
    budget,
    folded_view,
    marker,
    plan,
    sent,
    size,
    summary_request,
    summary_text,
)
from cairn.agents.live import live_reply
from cairn.agents.logs import get_logger
from cairn.agents.models.base import Model, ModelReply, ModelRequest, ToolSchema
from cairn.agents.spec import AgentSpec, StepPolicy, TaskRecord
from cairn.agents.tools import Tool, ToolContext, idempotency_key
from cairn.agents.workspace import Workspace
from cairn.errors import ModelError, ToolError
from cairn.storage.chain import WorkingState
from cairn.storage.records import (
    AgentState,
    ContextView,
    Effects,
    GlobalCheckpoint,
    Message,
    Role,
    ToolCall,
    TraceRecord,
    Usage,
)
from cairn.storage.redact import redact, redact_json, redact_optional
from cairn.storage.store import CheckpointStore

log = get_logger(__name__)


@dataclass(slots=True)
class Tally:
    """What a step did, for its result and its log line."""

    tools_run: int = 0
    model_called: bool = False
    tokens: int | None = None


@dataclass(slots=True)
class StepContext:
    """One step of one agent, as its kind sees it.

    `history` is the agent's messages (the kind appends to it, through `ask`, `call` and
    `inbox`), `state` its kind's own JSON state, kept in every checkpoint. `checkpoint`
    writes a tool-level LC: a retry of this step starts from the latest one.
    """

    store: CheckpointStore
    record: TaskRecord
    spec: AgentSpec
    lc: WorkingState  # the agent's state this step changes, cut into its checkpoints
    gc: GlobalCheckpoint  # the GC the step follows
    model: Model
    tools: Mapping[str, Tool]  # the agent's tools on this worker, by name
    approved: frozenset[str]  # the tools a person approves each call of
    workspace: Workspace
    checkpoint: Callable[[], None]  # write a tool-level LC now
    resumed: bool  # the step resumes from a tool-level LC an earlier attempt wrote
    team: list[str]  # the members at the GC the step follows, in order (`cairn.agents.team`)
    waiting_at: str  # the LC id a waiting call's decision is filed under (`approval`)
    decided: list[ToolCall] = field(default_factory=list)  # calls whose decision it used
    tally: Tally = field(default_factory=Tally)
    spent: Callable[[], bool] | None = None  # the last model call's spend, on its way
    calls: int = 0  # model calls this attempt made: each one's spend is counted once
    models: Callable[[AgentSpec], Model] | None = None  # builds a summary model the spec names
    dirty: bool = False  # an external call ran since the last tool-level checkpoint
    touched: bool = False  # a tool ran since the tree was last synced or captured
    outcome: AgentState | None = None  # where a kind that decides it says the agent stands
    result_message: Message | None = None  # the last tool call's result, as `_result` made it

    @property
    def task(self) -> str:
        """The task's id."""
        return self.lc.task

    @property
    def agent(self) -> str:
        """The agent's name."""
        return self.lc.agent

    @property
    def goal(self) -> str:
        """The task's goal, as submitted."""
        return self.record.goal

    @property
    def policy(self) -> StepPolicy:
        """The task's step policy (limits, checkpoint triggers)."""
        return self.record.policy

    @property
    def history(self) -> list[Message]:
        """The agent's whole history; what a kind appends is checkpointed with the step."""
        return self.lc.messages

    @property
    def state(self) -> dict[str, JsonValue]:
        """The kind's own state: JSON, kept in every checkpoint (empty for `llm`)."""
        return self.lc.kind_state

    def inbox(self) -> list[Message]:
        """Deliver the messages sent to the agent since it last read, into its history."""
        cursor = self.lc.inbox_cursor
        mine = sorted(
            (m for m in self.gc.inbox if m.recipient == self.agent and m.seq > cursor),
            key=lambda m: m.seq,
        )
        delivered = []
        for note in mine:
            text = redact(f"Message from {note.sender}: {note.content}")
            delivered.append(Message(role=Role.USER, name=note.sender, content=text))
            self.lc.inbox_cursor = note.seq
        self.lc.messages.extend(delivered)
        return delivered

    def spawn(self, name: str, spec: AgentSpec, brief: str) -> str:
        """Add member `name` to the team (`spec`; `brief` its first message): see `agents.spawn`.

        It joins at this step's barrier and starts in the next superstep; its result comes
        back as a message when it finishes. Returns what the agent is told; raises
        `SpawnRefused` saying why (a name taken, a spec that does not parse, the task full).
        The spawn is traced as a call of `spawn`.
        """
        started, clock = datetime.now(UTC), time.perf_counter()
        args: dict[str, JsonValue] = {"name": name, "brief": brief}
        try:
            said = spawn.spawn(self, name, spec, brief)
        except ToolError as exc:
            self._trace("spawn", args, None, Effects.WORKSPACE, str(exc), started, clock, None)
            raise
        self._trace("spawn", args, said, Effects.WORKSPACE, None, started, clock, None)
        return said

    def ask(self, *, offer_tools: bool = True) -> ModelReply:
        """Take one model turn on the history, the agent's tools on offer unless told not.

        The model is sent the history's view (`cairn.agents.compaction`): a call whose
        prompt would pass the agent's budget is preceded by a compaction, and one the
        provider finds too long is asked once more after one. Each call's spend is counted
        as soon as it is paid for, whatever becomes of the step, and each call is traced.
        A reply the output limit cut never passes for an answer: it is asked again once
        with twice the limit, and if that is cut too, or the request set no limit to
        raise, the step fails with the reason (`ModelError`, refused: the same request
        would be cut again). A refusal is the turn's text, in the history (so the next
        request is one the API takes) and in the trace, as the call's error. The turn goes
        into the history (tool calls as the model made them: a retry runs them from there).
        """
        schemas = [tool.schema for tool in self.tools.values()] if offer_tools else []
        limit = budget(self.spec)
        if limit is not None and size(self.lc.messages, self.lc.context, schemas) > limit:
            self._compact()
        request = self._request(schemas)
        try:
            reply = self._complete(request)
        except ModelError as exc:
            if not exc.overflow or self.spec.context.strategy == "off":
                raise
            request = self._after_overflow(exc, schemas)
            reply = self._complete(request)  # one more time; what it raises is the step's
        if reply.cut and reply.max_tokens is not None:
            reply = self._complete(replace(request, max_tokens=2 * reply.max_tokens))
        if reply.cut:
            raise ModelError(_cut_reason(reply.max_tokens), retryable=False, refused=True)
        if limit is not None and reply.usage.prompt_tokens:  # the next estimate starts here
            counted = {"counted": reply.usage.prompt_tokens, "counted_at": len(self.lc.messages)}
            self.lc.context = (self.lc.context or ContextView()).model_copy(update=counted)
        content = redact_optional(reply.content or reply.refusal)
        self.lc.messages.append(
            Message(role=Role.ASSISTANT, content=content, tool_calls=reply.tool_calls)
        )
        # At debug: "step done" carries the turn's tokens, so a step logs one line at info.
        log.debug("model answered", tool_calls=len(reply.tool_calls), tokens=self.tally.tokens)
        return reply

    def converse(self, messages: list[Message], schemas: list[ToolSchema]) -> ModelReply:
        """One call of the agent's model on `messages` a kind built itself, with `schemas`.

        Counted and traced as a turn is, but the history is left as it is: a kind that
        keeps a conversation of its own (another framework's agent) sends it whole.
        """
        turns = sum(1 for message in messages if message.role is Role.ASSISTANT)
        request = ModelRequest(messages, schemas, agent=self.agent, attempt=self.lc.attempt,
                               turn=turns, task=self.task)  # fmt: skip
        return self._complete(request)

    def _request(self, schemas: list[ToolSchema]) -> ModelRequest:
        """The agent's turn, as its model is sent it."""
        turns = sum(1 for message in self.lc.messages if message.role is Role.ASSISTANT)
        return ModelRequest(sent(self.lc.messages, self.lc.context), schemas, agent=self.agent,
                            attempt=self.lc.attempt, turn=turns, task=self.task)  # fmt: skip

    def _after_overflow(self, exc: ModelError, schemas: list[ToolSchema]) -> ModelRequest:
        """The request to send once more after the provider found the prompt too long.

        Compacts first; raises the step's error (refused) when nothing is left to compact.
        """
        about = size(self.lc.messages, self.lc.context, schemas)
        if not self._compact():
            keep = self.spec.context.keep_last
            raise ModelError(f"{exc} (about {about} tokens sent; nothing older than the last "
                             f"{keep} turns is left to compact)", retryable=False,
                             refused=True) from exc  # fmt: skip
        log.info("prompt too long for the model; compacted", tokens=about)
        return self._request(schemas)

    def _compact(self) -> bool:
        """Fold the turns before the last `keep_last` into one message; False if none are.

        A summary is a model call of this step (the summary model's, if the spec names
        one), counted and traced; a summary the model refuses, cuts or cannot make is a
        marker, as `truncate` makes. The new view is checkpointed at once, so a retry of
        the step does not pay for it again.
        """
        policy, view = self.spec.context, self.lc.context
        fold = plan(self.lc.messages, view, policy.keep_last)
        if fold is None:
            return False
        folded = (0 if view is None else view.folded) + len(fold.folded)
        text, traced = marker(folded), self.lc.trace_count
        if policy.strategy == "summarize":
            made = self._summarize(view, fold)
            text = text if not made else summary_text(made, folded)
        if self.lc.trace_count == traced:  # no summary call was made: the marker is the record
            self._trace(None, {}, text, None, None, None, None, None, compacted=len(fold.folded))
        self.lc.context = folded_view(view, fold, text)
        self.checkpoint()
        faults.compacted()
        log.info("context compacted", folded=len(fold.folded), strategy=policy.strategy)
        return True

    def _summarize(self, view: ContextView | None, fold: Fold) -> str | None:
        """A model's summary of `fold`; None when it gave none (refused, cut, too long)."""
        model, name = self.model, self.spec.model
        chosen = self.spec.context.summary_model
        if chosen is not None and self.models is not None:
            name = f"{self.spec.model.split(':', 1)[0]}:{chosen}"
            model = self.models(self.spec.model_copy(update={"model": name}))
        messages = summary_request(self.agent, view, fold)
        request = ModelRequest(messages, [], agent=self.agent, attempt=self.lc.attempt,
                               purpose="summary", task=self.task)  # fmt: skip
        try:
            reply = self._complete(request, model, name, compacted=len(fold.folded))
        except ModelError as exc:
            if not exc.overflow:
                raise
            log.info("the summary's own request is too long; the turns are left out")
            return None
        if reply.cut or reply.refusal is not None or not (reply.content or "").strip():
            return None
        return reply.content

    def _complete(
        self,
        request: ModelRequest,
        model: Model | None = None,
        name: str | None = None,
        compacted: int | None = None,
    ) -> ModelReply:
        """One model call: asked, its spend sent to be counted, traced.

        The agent's model, or `model` called `name`; `compacted` marks a compaction's summary.
        """
        started, clock = datetime.now(UTC), time.perf_counter()
        name = name or self.spec.model
        span = spans.model_span(name, self.spec.params, request.messages, self.agent,
                                  self.task, request.purpose)  # fmt: skip
        with tracing.current(span):
            with live_reply(self.store.hot, self.lc, self.spec.stream) as on_delta:
                reply = (model or self.model).complete(replace(request, on_delta=on_delta))
            price = self.record.prices.get(name)
            usage = reply.usage.model_copy(update={"cost_usd": cost(reply.usage, price)})
            spans.model_replied(span, usage, reply.content or reply.refusal, reply.tool_calls,
                                  cut=reply.cut, refused=reply.refusal is not None)  # fmt: skip
        if self.spent is not None:  # an earlier call's count, on its way: settled first
            spent, self.spent = self.spent, None
            spent()
        at = (self.lc.epoch, self.lc.superstep, self.lc.attempt)
        self.spent = self.store.hot.send_spend(self.task, self.agent, *at, usage, self.calls)
        self.calls += 1
        self.lc.usage = self.lc.usage.plus(usage)
        error = None
        if reply.cut:
            error = f"reply cut by the output limit ({_limit(reply.max_tokens)})"
        elif reply.refusal is not None:
            error = f"refused: {reply.refusal}"
        said = redact_optional(reply.content or reply.refusal)
        self._trace(None, {}, said, None, error, started, clock, usage, compacted=compacted)
        self.tally.model_called = True
        self.tally.tokens = (self.tally.tokens or 0) + usage.tokens
        return reply

    def call(self, call: ToolCall, place: int, *, into_history: bool = True) -> bool:
        """Run one tool call, the `place`-th of its turn; False when it waits for a person.

        A call the agent's spec says a person approves waits until one decides (its
        result, if rejected, says why); a checkpoint precedes it as the policy's triggers
        say; its result (or error) goes into the trace, into the history unless
        `into_history` is False (a call code made, not the model), and `result_message`.
        """
        self.result_message = None
        done = self._call(call, place, into_history)
        self.tally.tools_run += done
        return done

    def _call(self, call: ToolCall, place: int, into_history: bool) -> bool:
        tool = self.tools.get(call.name)
        if tool is not None and call.name in self.approved:
            decision = decision_for(self.store, self.task, self.agent, self.waiting_at, call)
            if decision is None:
                self.lc.status = AgentState.WAITING_APPROVAL
                log.info("waiting for approval", tool=call.name, call=call.id)
                return False
            self.decided.append(call)
            if not decision.approved:
                self._result(call, tool, None, f"rejected by a person: {decision.reason}",
                             into_history=into_history)  # fmt: skip
                return True
        if tool is not None and self._wants_checkpoint(tool):
            self.checkpoint()
        faults.before_tool(place)
        started, clock = datetime.now(UTC), time.perf_counter()
        if tool is None:
            self._result(call, None, None, f"unknown tool {call.name!r}", started, clock,
                         into_history=into_history)  # fmt: skip
            return True
        self.dirty = self.dirty or tool.effects is Effects.EXTERNAL
        self.touched = True
        key = partial(idempotency_key, self.task, self.agent, self.lc.superstep, place,
                      call.name, call.args)  # fmt: skip
        own = ToolContext(workspace=self.workspace, agent=self.agent, team=self.team,
                          superstep=self.lc.superstep, policy=self.policy, task=self.task,
                          outbox=self.lc.outbox, key=key, history=self.lc.messages,
                          spawn=partial(spawn.spawn_from_args, self))  # fmt: skip
        # The trace records an external call's key; a tool that reads it works it out.
        traced = own.idempotency_key if tool.effects is Effects.EXTERNAL else None
        span = spans.tool_span(call, tool.effects.value, self.agent)
        try:
            with tracing.current(span):
                check_names(tool.name, tool.parameters, call.args)
                result = tool.run(own, call.args)
                tracing.set_attributes(span, spans.tool_content(None, result))
        except ToolError as exc:
            self._result(call, tool, None, str(exc), started, clock, traced,
                         into_history=into_history)  # fmt: skip
        except (OSError, ValueError) as exc:  # e.g. a file that is not UTF-8 text
            # An OSError's text names the worker's real path: the model gets the reason only.
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            error = f"{type(exc).__name__}: {why}"
            self._result(call, tool, None, error, started, clock, traced,
                         into_history=into_history)  # fmt: skip
        else:
            self._result(call, tool, result, None, started, clock, traced, own,
                         into_history=into_history)  # fmt: skip
        return True

    def trace_failure(self, where: str, error: str) -> None:
        """Put a failure of the step's own code in the trace (`where` names what failed)."""
        self._trace(where, {}, None, None, error, None, None, None)

    def _wants_checkpoint(self, tool: Tool) -> bool:
        """Say whether to checkpoint before `tool`.

        `all`: before every tool. `side_effects`: before each tool with external effects
        and before any tool that follows one, so a finished external call is on record
        before anything else runs, and a crash repeats at most the call it interrupted.
        Workspace effects need none: a retry discards the step's tree and outbox since the
        last LC and redoes them.
        """
        level = self.policy.triggers.tool_call
        external = tool.effects is Effects.EXTERNAL
        return level == "all" or (level == "side_effects" and (external or self.dirty))

    def _result(
        self,
        call: ToolCall,
        tool: Tool | None,
        result: str | None,
        error: str | None,
        started: datetime | None = None,
        clock: float | None = None,
        key: str | None = None,
        own: ToolContext | None = None,
        *,
        into_history: bool = True,
    ) -> None:
        redacted = redact_optional(result)
        content = redacted if error is None else redact(f"error: {error}")
        images = own.images if own is not None and error is None else []
        message = Message(role=Role.TOOL, tool_call_id=call.id, name=call.name,
                          content=content, images=images, error=error is not None)  # fmt: skip
        self.result_message = message
        if into_history:
            self.lc.messages.append(message)
        effects = tool.effects if tool is not None else None
        self._trace(call.name, call.args, redacted, effects, error, started, clock, None, key)
        if error is not None:
            log.info("tool failed", tool=call.name, error=error)

    def _trace(
        self,
        tool: str | None,
        args: dict[str, JsonValue],
        result: str | None,
        effects: Effects | None,
        error: str | None,
        started: datetime | None,
        clock: float | None,
        usage: Usage | None,
        key: str | None = None,
        *,
        compacted: int | None = None,
    ) -> None:
        now = datetime.now(UTC)
        self.lc.add_trace(
            TraceRecord.model_validate(
                {
                    "step": self.lc.step,
                    "superstep": self.lc.superstep,
                    "tool": tool,
                    "arguments": redact_json(args),
                    "result": result,  # redacted by the caller, as its message's content
                    "side_effect": effects is Effects.EXTERNAL,
                    "effects": effects,
                    "idempotency_key": key,
                    "error": redact_optional(error),
                    "started_at": started or now,
                    "finished_at": now,
                    "duration_ms": 0.0 if clock is None else (time.perf_counter() - clock) * 1000,
                    "usage": usage,
                    "compacted": compacted,
                }
            )
        )


def _limit(max_tokens: int | None) -> str:
    """The output limit a request set, as a reason names it."""
    return "the model's own: the request set none" if max_tokens is None else f"{max_tokens} tokens"


def _cut_reason(max_tokens: int | None) -> str:
    """Why a step fails on a reply the output limit cut (`StepContext.ask`)."""
    if max_tokens is None:
        return ("the model's reply was cut by its own output limit or its context window; "
                "set max_tokens in the agent's params, or shorten what it is sent")  # fmt: skip
    return (f"the model's reply was cut by the output limit twice, the second time at "
            f"{max_tokens} tokens; raise max_tokens in the agent's params")  # fmt: skip
