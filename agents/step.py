"""`run_step`: one agent iteration, as a worker runs it: the protocol around a kind.

The protocol is the same for every kind of agent: fence the attempt (a stale epoch or
attempt changes nothing), keep the heartbeat, load the agent's state (from the latest
GC, or from the tool-level LC an earlier attempt left) and the workspace, let the
agent's kind take its step (`cairn.agents.kinds`, through a `StepContext`), settle the
model calls' spend, then write the step's LC and vote, in one fenced write. A retry
after a crash resumes where the last tool-level LC left off: the model is not asked
again for a turn it already took, and tools already done are not run again.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

from structlog.contextvars import bound_contextvars

from cairn.agents import faults
from cairn.agents.approval import consume
from cairn.agents.cache import WORKER, WorkerCache
from cairn.agents.context import StepContext
from cairn.agents.heartbeat import Heartbeat, worker_token
from cairn.agents.kinds import kind_of
from cairn.agents.logs import get_logger
from cairn.agents.mcp.tools import agent_tools
from cairn.agents.models import registry
from cairn.agents.models.base import Model
from cairn.agents.results import finish_tool
from cairn.agents.spawn import prepare_first_lcs, report_finish
from cairn.agents.spec import AgentSpec, TaskRecord
from cairn.agents.team import member_spec, team
from cairn.agents.toolkit import ToolRegistry, installed_tools
from cairn.agents.workspace import apply_changes, manifest_blob, net_changes
from cairn.errors import FencedWrite, InvalidState
from cairn.storage.chain import WorkingState
from cairn.storage.codec import Place
from cairn.storage.keys import SPEC_DOC
from cairn.storage.records import AgentState, GlobalCheckpoint, LCRef, Level
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


@dataclass(frozen=True, slots=True)
class Attempt:
    """Which attempt of which step a worker runs: what the fence compares."""

    task: str
    agent: str
    superstep: int
    epoch: int
    attempt: int

    @property
    def token(self) -> str:
        """The heartbeat's value: this worker and this attempt."""
        return worker_token(self.epoch, self.superstep, self.attempt)


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
    at = Attempt(task, agent, superstep, epoch, attempt)
    with bound_contextvars(
        task=task, agent=agent, superstep=superstep, epoch=epoch, attempt=attempt
    ):
        record, gc, progress = _fence(store, warm, at)
        beats = Heartbeat(
            store.hot,
            task,
            agent,
            at.token,
            record.policy.heartbeat_ms,
            beat_now=False,  # step_start beat, with a TTL of FIRST_BEAT_MS
            first_wait_ms=FIRST_BEAT_MS // 3,
        )
        with beats:
            step = _Step(store, warm, cache, at, record, gc, progress)
            return step.run(models, installed_tools() if tools is None else tools, mcp)


def not_json(value: object, where: str = "") -> str | None:
    """Where in `value` (a path like `plan[2].when`) the first non-JSON value is, or None.

    JSON: dicts of string keys, lists, strings, finite numbers, booleans and None.
    """
    inside: list[tuple[object, str]] = []
    if isinstance(value, list):
        inside = [(item, f"{where}[{i}]") for i, item in enumerate(value)]
    elif isinstance(value, dict):
        bad = next((key for key in value if not isinstance(key, str)), None)
        if bad is not None:
            return f"{where}[{bad!r}] (a key that is not a string)"
        inside = [(item, f"{where}.{key}" if where else key) for key, item in value.items()]
    elif value is None or isinstance(value, str | bool | int):
        return None
    elif not isinstance(value, float) or not math.isfinite(value):
        return where or "the top"
    found = (not_json(item, spot) for item, spot in inside)
    return next((spot for spot in found if spot is not None), None)


def _fence(
    store: CheckpointStore, warm: WorkerCache, at: Attempt
) -> tuple[TaskRecord, GlobalCheckpoint, LCRef | None]:
    """The task's record, the GC this step follows and its progress, if the attempt is current.

    One round trip: the first heartbeat, the epoch, the latest GC, progress, the spec.
    Raises `FencedWrite` before anything is paid for when another attempt owns the step.
    """
    start = store.hot.step_start(at.task, at.agent, at.epoch, at.superstep, at.token,
                                 FIRST_BEAT_MS)  # fmt: skip
    if start.epoch != at.epoch:
        raise FencedWrite(f"stale epoch {at.epoch} (task is at {start.epoch})")
    if start.current != f"{at.epoch}:{at.superstep}:{at.attempt}":
        raise FencedWrite(f"stale attempt {at.superstep}:{at.attempt} (current {start.current})")
    record = warm.record(store, Place.doc(at.task, SPEC_DOC), start.spec, TaskRecord)
    if record is None:
        record = store.read_doc(at.task, SPEC_DOC, TaskRecord)
    gc = None
    if start.latest is not None:
        gc = warm.record(store, Place.gc(at.task, start.latest), start.gc, GlobalCheckpoint)
    if gc is None:
        gc = store.latest_gc(at.task)
    if gc is None or gc.superstep != at.superstep - 1:
        follows = "none" if gc is None else gc.superstep
        raise FencedWrite(
            f"superstep {at.superstep} does not follow the latest GC (superstep {follows})"
        )
    return record, gc, start.progress


class _Step:
    """One run of one step: the agent's state, its tree, and the checkpoints it writes."""

    def __init__(
        self,
        store: CheckpointStore,
        warm: WorkerCache,
        cache: Path,
        at: Attempt,
        record: TaskRecord,
        gc: GlobalCheckpoint,
        progress: LCRef | None,
    ) -> None:
        self.store, self.warm, self.at, self.record, self.gc = store, warm, at, record, gc
        self.resumed = progress is not None
        self.state = self._load(progress)
        self.base_files = warm.manifest(store, at.task, gc.workspace)
        self.workspace = warm.workspace(cache, at.task)
        self.workspace.sync(store, apply_changes(self.base_files, self.state.changes),
                            lazy=True, limits=record.policy.size_limits())  # fmt: skip
        self.unstored: dict[str, bytes] = {}  # captured contents the next LC write stores
        # What this attempt's tool-level LCs stored: the step's LC carries what of it its
        # change set still names, so the LC and every blob it names land on one Redis even
        # if the connection moved to another primary in between (a failover).
        self.stored: dict[str, bytes] = {}
        self.ctx: StepContext | None = None

    def _load(self, progress: LCRef | None) -> WorkingState:
        """The agent's state this step starts from: its progress, or its LC in the GC."""
        at, gc = self.at, self.gc
        if progress is not None:
            state = self.store.read_state(at.task, at.agent, progress.id, progress.checksum)
            log.info("resuming from tool-level checkpoint", lc=progress.id)
        else:
            ref = gc.members[at.agent]
            cached = self.warm.state(at.task, at.agent, ref)
            state = cached or self.store.read_state(at.task, at.agent, ref.id, ref.checksum)
            state.step += 1
            state.changes, state.outbox, state.spawns = {}, [], []
            state.workspace_before = gc.workspace
        state.superstep, state.epoch, state.attempt = at.superstep, at.epoch, at.attempt
        return state

    def run(self, models: ModelFactory, tools: ToolRegistry, mcp: McpManager | None) -> StepResult:
        """Let the agent's kind take its step, then write the step's LC and vote."""
        spec = member_spec(self.record, self.gc, self.at.agent)
        # Before the model is asked: a tool this worker lacks fails the step (a retry here
        # would find the same tools), an MCP server it cannot reach is worth a retry.
        where = f"agent {self.at.agent}"
        kind = kind_of(spec, tools)  # a kind this worker lacks fails the step, as a tool does
        offered = agent_tools(spec.tools, tools, mcp, where)
        if self.record.result is not None and "finish" in offered:  # it takes the result
            offered["finish"] = finish_tool(self.record.result)
        approved = frozenset(agent_tools(spec.approve, tools, mcp, where))
        # A decision holds for a call waiting in the LC this step starts from (`approval`).
        member = self.gc.members.get(self.at.agent)
        ctx = self.ctx = StepContext(
            store=self.store, record=self.record, spec=spec, lc=self.state, gc=self.gc,
            model=models(spec), tools=offered, approved=approved, workspace=self.workspace,
            checkpoint=self._checkpoint_tools, resumed=self.resumed,
            waiting_at=member.id if member is not None else "",
            team=team(self.gc, self.record),  # once a step, not once a tool call
            models=models,
        )  # fmt: skip
        faults.arm(None)  # a crash is armed by this step's own model turn, if any
        try:
            kind.step(ctx)
            faults.past_tools()
            return self._finish(kind.status(ctx))  # settles the spend before its LC writes
        except BaseException:
            with contextlib.suppress(Exception):  # the step's own error is the one to raise
                self._settle()
            raise

    def _settle(self) -> None:
        """Wait for the model call's spend to be counted (raising what counting raised)."""
        ctx = self.ctx
        if ctx is not None and ctx.spent is not None:
            spent, ctx.spent = ctx.spent, None
            spent()

    def _capture(self) -> None:
        """Fold what the tools changed on disk into the state's change set."""
        ctx = self.ctx
        if ctx is None or not ctx.touched:
            return  # no tool ran since the last sync or capture: the tree is as recorded
        self.workspace.capture(self.store, self.unstored)
        ctx.touched = False
        self.state.changes = net_changes(self.base_files, self.workspace.files())

    def _checkpoint_tools(self) -> None:
        self._check_state()
        self._settle()
        self._capture()
        if self.ctx is not None:
            self.ctx.dirty = False
        ref = self.store.write_lc(self.state, Level.TOOL, blobs=self.unstored.values())
        self.stored.update(self.unstored)
        self.unstored.clear()
        log.debug("tool-level checkpoint", lc=ref.id)

    def _check_state(self) -> None:
        """Raise `InvalidState` unless the kind's state is JSON, naming where it is not."""
        where = not_json(self.state.kind_state)
        if where is not None:
            raise InvalidState(f"agent {self.at.agent}'s state holds a value that is not "
                               f"JSON at {where}")  # fmt: skip

    def _finish(self, status: AgentState) -> StepResult:
        state, ctx, task = self.state, self.ctx, self.at.task
        assert ctx is not None
        state.status = status
        if status is AgentState.FINISHED:  # a spawned member's spawner hears of it
            report_finish(state, self.gc)
        self._check_state()
        self._capture()
        files = apply_changes(self.base_files, state.changes)
        state.workspace_after, manifest = manifest_blob(files)
        self.warm.keep_manifest(task, state.workspace_after, files)
        # One fenced write: the LC, its vote, the files it changed and its manifest.
        # The members it spawned get their first LCs now, so its vote names them and
        # the barrier has none to write (`cairn.agents.spawn`).
        prepare_first_lcs(self.store, state, self.gc.workspace)
        named = set(state.changes.values())
        again = [content for sha, content in self.stored.items() if sha in named]
        blobs = [*again, *self.unstored.values(), manifest]
        self._settle()
        ref = self.store.write_lc(state, Level.STEP, vote=True, blobs=blobs)
        for call in ctx.decided:  # the vote is in: no retry of this step will need them
            consume(self.store, task, self.at.agent, ctx.waiting_at, call)
        self.warm.keep_state(state, ref)  # handed over: this step changes it no more
        tally = ctx.tally
        log.info("step done", status=state.status.value, tools=tally.tools_run,
                 tokens=tally.tokens, lc=ref.id)  # fmt: skip
        return StepResult(ref, state.status, tally.tools_run, tally.model_called, self.resumed)
