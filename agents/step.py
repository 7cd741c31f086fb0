"""`run_step`: one agent iteration, as a worker runs it.

Load the agent's state (from the latest GC, or from the tool-level LC an earlier attempt
left), deliver its inbox, take one model turn, run the tool calls it asked for (with
tool-level LCs as the triggers and the tools' effects say), then write the step's LC and
vote, in one fenced write. A retry after a crash resumes where the last tool-level LC left
off: the model is not asked again for a turn it already took, and tools already done are
not run again.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

from pydantic import JsonValue
from structlog.contextvars import bound_contextvars

from cairn.agents.accounting import cost
from cairn.agents.approval import consume, decision_for
from cairn.agents.barrier import pending_calls
from cairn.agents.cache import WORKER, WorkerCache
from cairn.agents.heartbeat import Heartbeat, worker_token
from cairn.agents.logs import get_logger
from cairn.agents.mcp.tools import agent_tools
from cairn.agents.models import registry
from cairn.agents.models.base import Model, ModelReply, ModelRequest
from cairn.agents.spec import AgentSpec, StepPolicy, TaskRecord
from cairn.agents.toolkit import ToolRegistry, installed_tools
from cairn.agents.tools import Tool, ToolContext, idempotency_key
from cairn.agents.workspace import apply_changes, manifest_blob, net_changes
from cairn.errors import FencedWrite, ToolError
from cairn.storage.codec import Place
from cairn.storage.keys import SPEC_DOC
from cairn.storage.records import (
    AgentState,
    Effects,
    GlobalCheckpoint,
    LCRef,
    Level,
    Message,
    Role,
    ToolCall,
    TraceRecord,
    Usage,
)
from cairn.storage.redact import redact, redact_json, redact_optional
from cairn.storage.store import CheckpointStore

if TYPE_CHECKING:
    from cairn.agents.mcp.manager import McpManager

log = get_logger(__name__)
FIRST_BEAT_MS = 3_000  # the TTL of the first beat, sent before the task's policy is read
ModelFactory = Callable[[AgentSpec], Model]


def build_model(spec: AgentSpec, environ: Mapping[str, str] = MappingProxyType({})) -> Model:
    """Return the model an agent's spec names; its API key, if any, from `environ`."""
    return registry.build_model(spec, environ)


@dataclass(frozen=True, slots=True)
class StepResult:
    """What a step left: its LC (voted), the agent's status, what ran."""

    lc: LCRef
    status: AgentState
    tools_run: int
    model_called: bool
    resumed: bool


def run_step(
    task: str,
    agent: str,
    superstep: int,
    epoch: int,
    attempt: int,
    *,
    store: CheckpointStore,
    cache: Path,
    models: ModelFactory = build_model,
    warm: WorkerCache = WORKER,
    tools: ToolRegistry | None = None,
    mcp: McpManager | None = None,
) -> StepResult:
    """Run `agent`'s step of `superstep` as attempt `attempt` of `epoch`; return its outcome.

    Raises `FencedWrite` (and changes nothing) when the epoch or attempt is not current or
    the superstep does not follow the latest GC, `MissingTool` (before the model is asked)
    when the agent names a tool `tools` lacks, and `ModelError` when the model fails.
    `warm` is what this worker keeps between steps (states it wrote, manifests, workspace
    directories); a miss reads from the store. `tools` is the worker's (`load_tools`);
    without it, the built-ins and installed packages' entry points. `mcp` serves the
    agent's `mcp:` tools (a worker without it has none); a server it cannot reach raises
    `ToolUnreachable` before the model is asked.
    """
    token = worker_token(epoch, superstep, attempt)
    with bound_contextvars(
        task=task, agent=agent, superstep=superstep, epoch=epoch, attempt=attempt
    ):
        step = _Step(store, task, agent, superstep, epoch, attempt, cache, warm, token,
                     installed_tools() if tools is None else tools, mcp)  # fmt: skip
        beats = Heartbeat(
            store.hot,
            task,
            agent,
            token,
            step.policy.heartbeat_ms,
            beat_now=False,  # step_start beat, with a TTL of FIRST_BEAT_MS
            first_wait_ms=FIRST_BEAT_MS // 3,
        )
        with beats:
            return step.run(models(step.spec))


class _Step:
    """One run of one step; its fields are what the phases share."""

    def __init__(
        self,
        store: CheckpointStore,
        task: str,
        agent: str,
        superstep: int,
        epoch: int,
        attempt: int,
        cache: Path,
        warm: WorkerCache,
        token: str,
        tools: ToolRegistry,
        mcp: McpManager | None,
    ) -> None:
        # One round trip: the first heartbeat, the epoch, the latest GC, progress, the spec.
        start = store.hot.step_start(task, agent, epoch, superstep, token, FIRST_BEAT_MS)
        if start.epoch != epoch:
            raise FencedWrite(f"stale epoch {epoch} (task is at {start.epoch})")
        if start.current != f"{epoch}:{superstep}:{attempt}":
            # Fenced before the model is paid for: another attempt owns this step now.
            raise FencedWrite(f"stale attempt {superstep}:{attempt} (current {start.current})")
        record = warm.record(store, Place.doc(task, SPEC_DOC), start.spec, TaskRecord)
        if record is None:
            record = store.read_doc(task, SPEC_DOC, TaskRecord)
        gc = None
        if start.latest is not None:
            gc = warm.record(store, Place.gc(task, start.latest), start.gc, GlobalCheckpoint)
        if gc is None:
            gc = store.latest_gc(task)
        if gc is None or gc.superstep != superstep - 1:
            at = "none" if gc is None else gc.superstep
            raise FencedWrite(
                f"superstep {superstep} does not follow the latest GC (superstep {at})"
            )
        self.store, self.warm, self.gc = store, warm, gc
        self.spec = record.agent(agent)
        # Before the model is asked: a tool this worker lacks fails the step (a retry here
        # would find the same tools), an MCP server it cannot reach is worth a retry.
        self.offered: dict[str, Tool] = agent_tools(self.spec.tools, tools, mcp, f"agent {agent}")
        self.approved_names = set(agent_tools(self.spec.approve, tools, mcp, f"agent {agent}"))
        self.task, self.agent = task, agent
        self.policy: StepPolicy = record.policy
        self.prices = record.prices
        self.attempt = attempt
        progress = start.progress
        self.resumed = progress is not None
        if progress is not None:
            self.state = store.read_state(task, agent, progress.id, progress.checksum)
            log.info("resuming from tool-level checkpoint", lc=progress.id)
        else:
            ref = gc.members[agent]
            cached = warm.state(task, agent, ref)
            self.state = cached or store.read_state(task, agent, ref.id, ref.checksum)
            self.state.step += 1
            self.state.changes, self.state.outbox = {}, []
            self.state.workspace_before = gc.workspace
        self.state.superstep, self.state.epoch, self.state.attempt = superstep, epoch, attempt
        self.base_files = warm.manifest(store, task, gc.workspace)
        self.workspace = warm.workspace(cache, task)
        self.workspace.sync(store, apply_changes(self.base_files, self.state.changes),
                            lazy=True, limits=self.policy.size_limits())  # fmt: skip
        self.crash_at: int | None = None
        # A decision holds for a call waiting in the LC this step starts from (`approval`).
        self.waiting_at = gc.members[agent].id if agent in gc.members else ""
        self.decided: list[ToolCall] = []  # calls whose decision this step used
        self.spent: Callable[[], bool] | None = None  # the model call's spend, on its way
        self.dirty = False  # an external call ran since the last tool-level checkpoint
        self.touched = False  # a tool ran since the tree was last synced or captured
        self.unstored: dict[str, bytes] = {}  # captured contents the next LC write stores
        # What this attempt's tool-level LCs stored: the step's LC carries what of it its
        # change set still names, so the LC and every blob it names land on one Redis even
        # if the connection moved to another primary in between (a failover).
        self.stored: dict[str, bytes] = {}
        self.ctx = ToolContext(
            workspace=self.workspace,
            agent=agent,
            team=[a.name for a in record.agents],
            superstep=superstep,
            policy=self.policy,
            task=task,
            outbox=self.state.outbox,
        )

    def run(self, model: Model) -> StepResult:
        try:
            return self._run(model)  # settles the spend before its LC writes
        except BaseException:
            with contextlib.suppress(Exception):  # the step's own error is the one to raise
                self._settle()
            raise

    def _settle(self) -> None:
        """Wait for the model call's spend to be counted (raising what counting raised)."""
        spent, self.spent = self.spent, None
        if spent is not None:
            spent()

    def _run(self, model: Model) -> StepResult:
        state = self.state
        pending = pending_calls(state.messages)
        start = state.base.message_count if state.base else 0
        turn_taken = any(m.role is Role.ASSISTANT for m in state.messages[start:])
        reply: ModelReply | None = None
        if not pending and not turn_taken:
            self._deliver_inbox()
            reply = self._ask(model)
            pending = list(reply.tool_calls)
            if self.policy.triggers.model_reply:
                self._checkpoint_tools()
        # Fault injection: die during tool `crash_at` (0-based), after its checkpoint.
        self.crash_at = reply.crash_after_tools if reply is not None else None
        places = _places(state.messages)
        ran = 0
        for index, call in enumerate(pending):
            if not self._call(call, index, places[call.id]):
                break  # waiting for a person's approval
            ran += 1
        if self.crash_at is not None:
            _crash()  # past the last tool: die before the step's checkpoint
        return self._finish(reply, ran)

    def _deliver_inbox(self) -> None:
        state = self.state
        mine = sorted(
            (m for m in self.gc.inbox if m.recipient == self.agent and m.seq > state.inbox_cursor),
            key=lambda m: m.seq,
        )
        for message in mine:
            state.messages.append(
                Message(
                    role=Role.USER,
                    name=message.sender,
                    content=redact(f"Message from {message.sender}: {message.content}"),
                )
            )
            state.inbox_cursor = message.seq

    def _ask(self, model: Model) -> ModelReply:
        tools = [tool.schema for tool in self.offered.values()]
        started = datetime.now(UTC)
        clock = time.perf_counter()
        reply = model.complete(
            ModelRequest(self.state.messages, tools, agent=self.agent, attempt=self.attempt)
        )
        # Counted as soon as it is paid for, whatever becomes of the step (spend.lua): sent
        # before any tool runs, its answer awaited before the step's next write.
        price = self.prices.get(self.spec.model)
        usage = reply.usage.model_copy(update={"cost_usd": cost(reply.usage, price)})
        at = (self.state.epoch, self.state.superstep, self.attempt)
        self.spent = self.store.hot.send_spend(self.task, self.agent, *at, usage)
        self.state.usage = self.state.usage.plus(usage)
        content = redact_optional(reply.content)
        # Tool calls are kept as the model made them: a retry runs them from here.
        self.state.messages.append(
            Message(role=Role.ASSISTANT, content=content, tool_calls=reply.tool_calls)
        )
        self._trace(None, {}, content, None, None, started, clock, usage)
        # At debug: "step done" carries the turn's tokens, so a step logs one line at info.
        log.debug("model answered", tool_calls=len(reply.tool_calls), tokens=usage.tokens)
        return reply

    def _call(self, call: ToolCall, index: int, place: int) -> bool:
        """Run one tool call (the `place`-th of its turn); False when it waits for approval."""
        tool = self.offered.get(call.name)
        if tool is not None and call.name in self.approved_names:
            decision = decision_for(self.store, self.task, self.agent, self.waiting_at, call)
            if decision is None:
                self.state.status = AgentState.WAITING_APPROVAL
                log.info("waiting for approval", tool=call.name, call=call.id)
                return False
            self.decided.append(call)
            if not decision.approved:
                self._result(call, tool, None, f"rejected by a person: {decision.reason}")
                return True
        if tool is not None and self._wants_checkpoint(tool):
            self._checkpoint_tools()
        if self.crash_at == index:
            _crash()
        started, clock = datetime.now(UTC), time.perf_counter()
        if tool is None:
            self._result(call, None, None, f"unknown tool {call.name!r}", started, clock)
            return True
        self.dirty = self.dirty or tool.effects is Effects.EXTERNAL
        self.touched = True
        self.ctx.idempotency_key = partial(
            idempotency_key, self.task, self.agent, self.state.superstep, place, call.name,
            call.args,
        )  # fmt: skip
        # The trace records an external call's key; a tool that reads it works it out.
        key = self.ctx.idempotency_key if tool.effects is Effects.EXTERNAL else None
        try:
            result = tool.run(self.ctx, call.args)
        except ToolError as exc:
            self._result(call, tool, None, str(exc), started, clock, key)
        except (OSError, ValueError) as exc:  # e.g. a file that is not UTF-8 text
            # An OSError's text names the worker's real path: the model gets the reason only.
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            self._result(call, tool, None, f"{type(exc).__name__}: {why}", started, clock, key)
        else:
            self._result(call, tool, result, None, started, clock, key)
        return True

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
    ) -> None:
        redacted = redact_optional(result)
        content = redacted if error is None else redact(f"error: {error}")
        images, self.ctx.images = self.ctx.images, []  # a failed call's go nowhere
        self.state.messages.append(
            Message(
                role=Role.TOOL,
                tool_call_id=call.id,
                name=call.name,
                content=content,
                images=images if error is None else [],
            )
        )
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
    ) -> None:
        now = datetime.now(UTC)
        self.state.add_trace(
            TraceRecord.model_validate(
                {
                    "step": self.state.step,
                    "superstep": self.state.superstep,
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
                }
            )
        )

    def _capture(self) -> None:
        """Fold what the tools changed on disk into the state's change set."""
        if not self.touched:
            return  # no tool ran since the last sync or capture: the tree is as recorded
        self.workspace.capture(self.store, self.unstored)
        self.touched = False
        self.state.changes = net_changes(self.base_files, self.workspace.files())

    def _checkpoint_tools(self) -> None:
        self._settle()
        self._capture()
        self.dirty = False
        ref = self.store.write_lc(self.state, Level.TOOL, blobs=self.unstored.values())
        self.stored.update(self.unstored)
        self.unstored.clear()
        log.debug("tool-level checkpoint", lc=ref.id)

    def _finish(self, reply: ModelReply | None, ran: int) -> StepResult:
        state = self.state
        state.status = _status(state.messages)
        self._capture()
        files = apply_changes(self.base_files, state.changes)
        state.workspace_after, manifest = manifest_blob(files)
        self.warm.keep_manifest(self.task, state.workspace_after, files)
        # One fenced write: the LC, its vote, the files it changed and its manifest.
        named = set(state.changes.values())
        again = [content for sha, content in self.stored.items() if sha in named]
        blobs = [*again, *self.unstored.values(), manifest]
        self._settle()
        ref = self.store.write_lc(state, Level.STEP, vote=True, blobs=blobs)
        for call in self.decided:  # the vote is in: no retry of this step will need them
            consume(self.store, self.task, self.agent, self.waiting_at, call)
        self.warm.keep_state(state, ref)  # handed over: this step changes it no more
        tokens = None if reply is None else reply.usage.tokens
        log.info("step done", status=state.status.value, tools=ran, tokens=tokens, lc=ref.id)
        return StepResult(ref, state.status, ran, reply is not None, self.resumed)


def _status(messages: list[Message]) -> AgentState:
    """Where an agent stands after its step, read from its history alone.

    Waiting while a call of its last turn awaits approval; finished once that turn called
    `finish`; active while the turn asked for tools (it goes on next superstep); else
    halted until a message wakes it.
    """
    if pending_calls(messages):
        return AgentState.WAITING_APPROVAL
    last = next((m for m in reversed(messages) if m.role is Role.ASSISTANT), None)
    if last is None or not last.tool_calls:
        return AgentState.HALTED
    if any(call.name == "finish" for call in last.tool_calls):
        return AgentState.FINISHED
    return AgentState.ACTIVE


def _places(messages: list[Message]) -> dict[str, int]:
    """Each call id of the last assistant turn → its place in that turn (0-based).

    A call's idempotency key uses its place in the turn, not its place among the calls
    still pending, so a step resumed after some tools ran hands the same keys.
    """
    last = next((m for m in reversed(messages) if m.role is Role.ASSISTANT), None)
    return {} if last is None else {call.id: place for place, call in enumerate(last.tool_calls)}


def _crash() -> None:
    """Fault injection: die as a killed worker dies, with no chance to clean up."""
    log.warning("scripted crash: SIGKILL")
    os.kill(os.getpid(), signal.SIGKILL)
