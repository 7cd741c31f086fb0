"""Incremental local checkpoints: cutting a delta from an agent's state, rebuilding it.

An LC stores what its parent lacked (messages and trace are append-only), so its cost
depends on the step, not on the length of the conversation. Every `full_every`-th step LC
is full, bounding the chain a read walks. A tool-level LC is cut from the same parent as
the step LC that follows it, so tool LCs never become parents.

A state read from verified LCs leaves its trace unbuilt until something reads `trace`:
building a thousand trace records costs more than verifying and parsing everything else,
and a step only appends to the trace (`WorkingState.add_trace`) and writes its new part.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

from pydantic import ConfigDict, Field, GetPydanticSchema, JsonValue
from pydantic_core import core_schema

from cairn.errors import CorruptCheckpoint
from cairn.storage.codec import parse
from cairn.storage.ids import new_id
from cairn.storage.records import (
    AgentResult,
    AgentState,
    BaseLocalCheckpoint,
    ContextView,
    InboxMessage,
    Level,
    LocalCheckpoint,
    Message,
    Record,
    SpawnRequest,
    TraceRecord,
    Usage,
)

DEFAULT_FULL_EVERY = 20
T = TypeVar("T")

# A trace record counted but not built: checked to be a JSON object, its fields skipped.
UnbuiltTraceRecord = Annotated[
    dict[str, object],
    GetPydanticSchema(
        lambda _type, _handler: core_schema.typed_dict_schema({}, extra_behavior="ignore")
    ),
]


class UnbuiltLC(BaseLocalCheckpoint[UnbuiltTraceRecord]):
    """An LC parsed whole but for its trace records, which are only counted."""


class _TraceOnly(Record):
    """An LC's trace, the rest of its JSON skipped."""

    model_config = ConfigDict(extra="ignore")

    trace: list[TraceRecord] = Field(default_factory=list)


@dataclass(frozen=True, slots=True)
class VerifiedTrace:
    """The trace records of verified LCs, kept as the LCs' canonical JSON until built.

    `parts` are (LC id, verified JSON) of the LCs holding some, oldest first; `count` is
    how many they hold together.
    """

    parts: tuple[tuple[str, bytes], ...]
    count: int

    def build(self) -> list[TraceRecord]:
        """The trace records, validated as a whole read of each LC validates them.

        Raises `CorruptCheckpoint` naming the LC whose trace does not validate.
        """
        return [record for lc, data in self.parts for record in parse(_TraceOnly, data, lc).trace]


@dataclass(slots=True)
class _UnbuiltTrace:
    """A trace while it is unbuilt: the verified part, and records added since."""

    verified: VerifiedTrace
    added: list[TraceRecord]


@dataclass(slots=True)
class LCBase:
    """The step LC a state descends from: where the next delta starts."""

    id: str
    checksum: str
    depth: int
    message_count: int
    trace_count: int


@dataclass(slots=True)
class WorkingState:
    """An agent's working state: all of it, as a step works on it (messages are append-only).

    Rebuilt from its chain of LCs (or new), changed by a step, and cut into the next LC.

    Read from verified LCs, its `trace` is built when first read; `trace_count`,
    `add_trace`, `trace_since` and `copy` leave it unbuilt.
    """

    task: str
    agent: str
    epoch: int
    attempt: int = 1
    step: int = 0
    superstep: int = 0
    status: AgentState = AgentState.ACTIVE
    messages: list[Message] = field(default_factory=list)
    trace: list[TraceRecord] = field(default_factory=list)
    workspace_before: str | None = None
    workspace_after: str | None = None
    inbox_cursor: int = 0
    changes: dict[str, str | None] = field(default_factory=dict)
    outbox: list[InboxMessage] = field(default_factory=list)
    spawns: list[SpawnRequest] = field(default_factory=list)  # members spawned this step
    base: LCBase | None = None
    usage: Usage = field(default_factory=Usage)  # of the whole history's model calls
    kind_state: dict[str, JsonValue] = field(default_factory=dict)  # the agent kind's own
    context: ContextView | None = None  # what the model is sent of `messages`, once counted
    result: AgentResult | None = None  # what the agent's last good `finish` gave
    # Set while the `trace` slot is unset: what reading `trace` builds it from.
    _unbuilt: _UnbuiltTrace | None = field(default=None, init=False, repr=False, compare=False)

    if not TYPE_CHECKING:  # hidden from mypy, which would accept any attribute name after it

        def __getattr__(self, name: str) -> list[TraceRecord]:
            # Python calls this only when a slot is unset: `trace`, while it is unbuilt.
            unbuilt = self._unbuilt if name == "trace" else None
            if unbuilt is None:
                raise AttributeError(f"'WorkingState' object has no attribute {name!r}")
            self.trace = [*unbuilt.verified.build(), *unbuilt.added]
            self._unbuilt = None
            return self.trace

    @property
    def trace_count(self) -> int:
        """How many records the trace holds, without building it."""
        unbuilt = self._unbuilt_trace()
        if unbuilt is None:
            return len(self.trace)
        return unbuilt.verified.count + len(unbuilt.added)

    def add_trace(self, record: TraceRecord) -> None:
        """Append `record` to the trace, leaving an unbuilt trace unbuilt."""
        unbuilt = self._unbuilt_trace()
        if unbuilt is None:
            self.trace.append(record)
        else:
            unbuilt.added.append(record)

    def trace_since(self, start: int) -> list[TraceRecord]:
        """The trace records from `start` on; built only if some come from verified LCs."""
        unbuilt = self._unbuilt_trace()
        if unbuilt is None or start < unbuilt.verified.count:
            return self.trace[start:]
        return unbuilt.added[start - unbuilt.verified.count :]

    def copy(self) -> WorkingState:
        """A copy a step may change without touching this state (messages are immutable)."""
        unbuilt = self._unbuilt_trace()
        copied = replace(
            self,
            messages=list(self.messages),
            trace=[] if unbuilt is not None else list(self.trace),
            changes=dict(self.changes),
            outbox=list(self.outbox),
            spawns=list(self.spawns),
            base=None if self.base is None else replace(self.base),
            kind_state=copy.deepcopy(self.kind_state),  # nested JSON a kind changes in place
        )
        if unbuilt is not None:
            copied.defer_trace(unbuilt.verified, list(unbuilt.added))
        return copied

    def defer_trace(self, verified: VerifiedTrace, added: list[TraceRecord]) -> None:
        """Make the trace `verified` then `added`, built from them when first read."""
        del self.trace
        self._unbuilt = _UnbuiltTrace(verified, added)

    def _unbuilt_trace(self) -> _UnbuiltTrace | None:
        """What `trace` will be built from, or None when it is a list already."""
        unbuilt = self._unbuilt
        if unbuilt is None:
            return None
        try:
            object.__getattribute__(self, "trace")  # unlike `self.trace`, builds nothing
        except AttributeError:
            return unbuilt
        return None  # assigned a list since: that list is the trace


# The execution context an WorkingState and its LocalCheckpoint share, field for field.
CONTEXT_FIELDS = (
    "task",
    "agent",
    "epoch",
    "attempt",
    "step",
    "superstep",
    "status",
    "workspace_before",
    "workspace_after",
    "inbox_cursor",
    "changes",
    "outbox",
    "spawns",
    "kind_state",
    "context",
    "result",
)


def _context(source: WorkingState | BaseLocalCheckpoint[T]) -> dict[str, Any]:
    return {name: getattr(source, name) for name in CONTEXT_FIELDS}


def cut_lc(
    state: WorkingState, level: Level, full_every: int = DEFAULT_FULL_EVERY, *, full: bool = False
) -> LocalCheckpoint:
    """Return the LC for `state`: a delta from `state.base`, or full at the cadence or if asked.

    A full LC still names its parent: a read stops at it, while the history it grew from
    (the timeline's lineage) is still linked.
    """
    base = state.base
    depth = 0 if base is None else base.depth + 1
    full = full or base is None or depth % full_every == 0
    message_base = 0 if base is None else base.message_count
    trace_base = 0 if base is None else base.trace_count
    if len(state.messages) < message_base or state.trace_count < trace_base:
        raise ValueError("history shrank since the parent checkpoint: it must be append-only")
    return LocalCheckpoint(
        id=new_id(),
        parent_id=None if base is None else base.id,
        parent_checksum=None if base is None else base.checksum,
        depth=depth,
        full=full,
        level=level,
        message_base=message_base,
        trace_base=trace_base,
        messages=state.messages if full else state.messages[message_base:],
        trace=state.trace if full else state.trace_since(trace_base),
        usage=state.usage,
        **_context(state),
    )


def base_after_write(lc: LocalCheckpoint, state: WorkingState) -> LCBase:
    """Return the base a state has once `lc` (a step LC cut from it) is stored."""
    return LCBase(lc.id, lc.checksum, lc.depth, len(state.messages), state.trace_count)


def rebuild(chain: list[LocalCheckpoint]) -> WorkingState:
    """Rebuild the full state from an LC chain given newest first, verifying every link.

    The oldest record must be full; each later one must name its parent's id and checksum
    and start where its parent ended. A broken link raises `CorruptCheckpoint`.
    """
    state = _replay(chain)
    state.trace = [record for lc in reversed(chain) for record in lc.trace]
    _legacy_usage(state, chain[0])
    return state


def rebuild_unbuilt(chain: list[tuple[UnbuiltLC, bytes]]) -> WorkingState:
    """`rebuild` from LCs parsed as `UnbuiltLC`, each with its verified canonical JSON.

    The trace is left unbuilt, to be built from that JSON when first read.
    """
    state = _replay([lc for lc, _ in chain])
    parts = tuple((lc.id, data) for lc, data in reversed(chain) if lc.trace)
    state.defer_trace(VerifiedTrace(parts, sum(len(lc.trace) for lc, _ in chain)), [])
    _legacy_usage(state, chain[0][0])
    return state


def _legacy_usage(state: WorkingState, newest: BaseLocalCheckpoint[T]) -> None:
    """Add up the usage of a history whose newest LC (schema 1) kept no running total."""
    if newest.usage is None:
        state.usage = Usage()
        for record in state.trace:
            if record.usage is not None:
                state.usage = state.usage.plus(record.usage)


def _replay(chain: Sequence[BaseLocalCheckpoint[T]]) -> WorkingState:
    """The state `chain` (newest first) rebuilds, every link checked, but with no trace."""
    if not chain:
        raise ValueError("empty chain")
    oldest = chain[-1]
    if not oldest.full:
        raise CorruptCheckpoint(oldest.id, f"chain breaks: parent {oldest.parent_id} is missing")
    messages = list(oldest.messages)
    traced = len(oldest.trace)
    parent = oldest
    for lc in reversed(chain[:-1]):
        check_link(parent, lc, len(messages), traced)
        messages.extend(lc.messages)
        traced += len(lc.trace)
        parent = lc
    newest = chain[0]
    if newest.level is Level.STEP:
        base: LCBase | None = LCBase(
            newest.id, newest.checksum, newest.depth, len(messages), traced
        )
    elif newest.parent_id is not None and newest.parent_checksum is not None:
        # Resuming from a tool LC: the step LC to come is cut from the same parent.
        base = LCBase(
            newest.parent_id,
            newest.parent_checksum,
            newest.depth - 1,
            newest.message_base,
            newest.trace_base,
        )
    else:
        base = None
    usage = Usage() if newest.usage is None else newest.usage
    return WorkingState(messages=messages, base=base, usage=usage, **_context(newest))


def check_link(
    parent: BaseLocalCheckpoint[T], child: BaseLocalCheckpoint[T], messages: int, trace: int
) -> None:
    """Raise `CorruptCheckpoint` unless `child` links to `parent`.

    Checked: the parent's id and checksum, task and agent, depth, and that the delta
    starts where the parent's state (`messages` messages, `trace` records) ends.
    """
    if child.parent_id != parent.id or child.parent_checksum != parent.checksum:
        raise CorruptCheckpoint(child.id, f"parent link does not match {parent.id}")
    if (child.task, child.agent) != (parent.task, parent.agent):
        raise CorruptCheckpoint(child.id, "parent belongs to another agent")
    if child.depth != parent.depth + 1:
        raise CorruptCheckpoint(child.id, f"depth {child.depth} after {parent.depth}")
    if child.message_base != messages or child.trace_base != trace:
        raise CorruptCheckpoint(child.id, "delta does not start where its parent ends")
