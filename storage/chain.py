"""Incremental local checkpoints: cutting a delta from an agent's state, rebuilding it.

An LC stores what its parent lacked (messages and trace are append-only), so its cost
depends on the step, not on the length of the conversation. Every `full_every`-th step LC
is full, bounding the chain a read walks. A tool-level LC is cut from the same parent as
the step LC that follows it, so tool LCs never become parents.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from storage.errors import CorruptCheckpoint
from storage.ids import new_id
from storage.records import (
    AgentStatus,
    InboxMessage,
    Level,
    LocalCheckpoint,
    Message,
    TraceRecord,
)

DEFAULT_FULL_EVERY = 20


@dataclass(slots=True)
class LCBase:
    """The step LC a state descends from: where the next delta starts."""

    id: str
    checksum: str
    depth: int
    message_count: int
    trace_count: int


@dataclass(slots=True)
class AgentState:
    """An agent's full state, as the step runtime works on it (messages are append-only)."""

    task: str
    agent: str
    epoch: int
    attempt: int = 1
    step: int = 0
    superstep: int = 0
    status: AgentStatus = AgentStatus.ACTIVE
    messages: list[Message] = field(default_factory=list)
    trace: list[TraceRecord] = field(default_factory=list)
    workspace_before: str | None = None
    workspace_after: str | None = None
    inbox_cursor: int = 0
    changes: dict[str, str | None] = field(default_factory=dict)
    outbox: list[InboxMessage] = field(default_factory=list)
    base: LCBase | None = None


# The execution context an AgentState and its LocalCheckpoint share, field for field.
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
)


def _context(source: AgentState | LocalCheckpoint) -> dict[str, Any]:
    return {name: getattr(source, name) for name in CONTEXT_FIELDS}


def cut_lc(
    state: AgentState, level: Level, full_every: int = DEFAULT_FULL_EVERY
) -> LocalCheckpoint:
    """Return the LC for `state`: a delta from `state.base`, or full at the cadence."""
    base = state.base
    depth = 0 if base is None else base.depth + 1
    full = base is None or depth % full_every == 0
    message_base = 0 if base is None else base.message_count
    trace_base = 0 if base is None else base.trace_count
    if len(state.messages) < message_base or len(state.trace) < trace_base:
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
        trace=state.trace if full else state.trace[trace_base:],
        **_context(state),
    )


def base_after_write(lc: LocalCheckpoint, state: AgentState) -> LCBase:
    """Return the base a state has once `lc` (a step LC cut from it) is stored."""
    return LCBase(lc.id, lc.checksum, lc.depth, len(state.messages), len(state.trace))


def rebuild(chain: list[LocalCheckpoint]) -> AgentState:
    """Rebuild the full state from an LC chain given newest first, verifying every link.

    The oldest record must be full; each later one must name its parent's id and checksum
    and start where its parent ended. A broken link raises `CorruptCheckpoint`.
    """
    if not chain:
        raise ValueError("empty chain")
    oldest = chain[-1]
    if not oldest.full:
        raise CorruptCheckpoint(oldest.id, f"chain breaks: parent {oldest.parent_id} is missing")
    messages = list(oldest.messages)
    trace = list(oldest.trace)
    parent = oldest
    for lc in reversed(chain[:-1]):
        check_link(parent, lc, len(messages), len(trace))
        messages.extend(lc.messages)
        trace.extend(lc.trace)
        parent = lc
    newest = chain[0]
    if newest.level is Level.STEP:
        base: LCBase | None = LCBase(
            newest.id, newest.checksum, newest.depth, len(messages), len(trace)
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
    return AgentState(messages=messages, trace=trace, base=base, **_context(newest))


def check_link(parent: LocalCheckpoint, child: LocalCheckpoint, messages: int, trace: int) -> None:
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
