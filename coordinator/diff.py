"""Diff: what changed from one global checkpoint to another, of one task or across a fork.

Who joined the team and who left it; per agent, the messages, tool calls and compactions
the second checkpoint's history has past the longest prefix it shares with the first's;
for the workspace, the files added, removed and changed, each change as a unified diff (a
binary file is named, not dumped).

One counting rule for messages and tool calls: what the second history adds is every
message past the longest prefix of messages the two histories share (messages compared
by their whole content), and the tool calls added are the calls those added messages
make, each shown with its trace record (matched in order by tool name; a call still
waiting for approval has none). So a tool call is added exactly when the message making
it is, never by when it ran, how long it took, what it cost or its idempotency key,
which name a run, not what was done: two branches that did the same (a fork replayed to
the same end) differ by nothing. Compactions change no message: they are the trace
records past the longest prefix of the two traces, records compared by what they did
(step, superstep, tool, arguments, result, error, effects, what they compacted).

Histories are read from their ends: both agents' LC chains are walked back, one delta at a
time, until they meet at a common LC (within one task, where the later GC grew from the
earlier or both from one before a restore), so a diff reads what was added rather than
both whole histories. Chains that never meet (across tasks: a fork starts a new chain)
are read whole.
"""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import Field

from cairn.coordinator.fork import committed_gc
from cairn.coordinator.viewbase import JSON, View
from cairn.storage.public import public
from cairn.storage.records import GlobalCheckpoint, LCRef, LocalCheckpoint, Message, TraceRecord
from cairn.storage.store import CheckpointStore

MAX_DIFF_LINES = 2_000  # of one file's unified diff; past it, the diff says how many were cut


class AgentDiff(View):
    """One agent: what its history at the second checkpoint adds to the first's."""

    messages_added: list[JSON] = Field(default_factory=list)
    tool_calls_added: list[JSON] = Field(default_factory=list)
    # Compactions of what the agent's model is sent: how many messages each left out, and
    # the summary (or marker) sent in their place.
    compactions_added: list[JSON] = Field(default_factory=list)


class FilesDiff(View):
    """The workspace: paths added and removed, and a unified diff per changed path."""

    added: list[str] = Field(default_factory=list)
    removed: list[str] = Field(default_factory=list)
    changed: dict[str, str] = Field(default_factory=dict)


class MembersDiff(View):
    """Who joined the team and who left it, from the first checkpoint to the second.

    `joined` maps each member the second has and the first lacks to the member that
    spawned it (None for one its task's spec lists: a fork's new agent); `left` names the
    members the first has and the second lacks (spawned after it, when a restore went back).
    """

    joined: dict[str, str | None] = Field(default_factory=dict)
    left: list[str] = Field(default_factory=list)


class Side(View):
    """One side of a diff: a task and one of its global checkpoints."""

    task_id: str
    checkpoint: int


@public
class Diff(View):
    """Two global checkpoints compared (`cairn diff --json`)."""

    a: Side
    b: Side
    agents: dict[str, AgentDiff]
    files: FilesDiff
    members: MembersDiff = Field(default_factory=MembersDiff)


def diff(store: CheckpointStore, task_a: str, a: int | None, task_b: str, b: int | None) -> Diff:
    """Compare GC `a` of `task_a` with GC `b` of `task_b` (None: the latest committed).

    Raises `CheckpointNotFound` for an absent checkpoint.
    """
    gc_a, gc_b = committed_gc(store, task_a, a), committed_gc(store, task_b, b)
    agents = {
        agent: _agent_diff(store, gc_a, gc_b, agent, ref) for agent, ref in gc_b.members.items()
    }
    return Diff(
        a=Side(task_id=task_a, checkpoint=gc_a.number),
        b=Side(task_id=task_b, checkpoint=gc_b.number),
        agents=agents,
        files=_files_diff(store, gc_a, gc_b),
        members=MembersDiff(
            joined={m: _parent(gc_b, m) for m in sorted(gc_b.members.keys() - gc_a.members.keys())},
            left=sorted(gc_a.members.keys() - gc_b.members.keys()),
        ),
    )


def _parent(gc: GlobalCheckpoint, member: str) -> str | None:
    joined = gc.spawned.get(member)
    return None if joined is None else joined.parent


def _agent_diff(
    store: CheckpointStore, gc_a: GlobalCheckpoint, gc_b: GlobalCheckpoint, agent: str, ref: LCRef
) -> AgentDiff:
    old = gc_a.members.get(agent)
    if old is None:
        state = store.read_state(gc_b.task, agent, ref.id, ref.checksum)
        return _added([], state.messages, [], state.trace)
    tail_a, tail_b = _tails(store, agent, (gc_a.task, old), (gc_b.task, ref))
    if tail_a is None or tail_b is None:  # the chains never met: compare whole histories
        state_a = store.read_state(gc_a.task, agent, old.id, old.checksum)
        state_b = store.read_state(gc_b.task, agent, ref.id, ref.checksum)
        return _added(state_a.messages, state_b.messages, state_a.trace, state_b.trace)
    messages = (
        [m for lc in tail_a for m in lc.added_messages],
        [m for lc in tail_b for m in lc.added_messages],
    )
    trace = (
        [t for lc in tail_a for t in lc.added_trace],
        [t for lc in tail_b for t in lc.added_trace],
    )
    return _added(messages[0], messages[1], trace[0], trace[1])


Tail = list[LocalCheckpoint]


def _tails(
    store: CheckpointStore, agent: str, a: tuple[str, LCRef], b: tuple[str, LCRef]
) -> tuple[Tail | None, Tail | None]:
    """The LCs of each chain after the newest LC both share, oldest first.

    (None, None) when the chains share no LC: one of them reached its full root first.
    """
    tails: tuple[Tail, Tail] = ([], [])
    heads = [_read(store, agent, *a), _read(store, agent, *b)]
    while heads[0].id != heads[1].id:
        # Step back the chain whose newest unread record starts later; both when even.
        ends = [lc.message_base for lc in heads]
        for side in (0, 1):
            if ends[side] < max(ends):
                continue
            lc = heads[side]
            if lc.parent_id is None or lc.parent_checksum is None:
                return None, None
            tails[side].append(lc)
            task = (a, b)[side][0]
            heads[side] = _read(
                store, agent, task, LCRef(id=lc.parent_id, checksum=lc.parent_checksum)
            )
    return tails[0][::-1], tails[1][::-1]


def _read(store: CheckpointStore, agent: str, task: str, ref: LCRef) -> LocalCheckpoint:
    return store.read_lc_fields(task, agent, ref, LocalCheckpoint)


def _added(
    messages_a: list[Message],
    messages_b: list[Message],
    trace_a: list[TraceRecord],
    trace_b: list[TraceRecord],
) -> AgentDiff:
    """What b's history has past the longest prefix it shares with a's (the module's rule)."""
    cut = _common(messages_a, messages_b)
    new_trace = trace_b[_common([_done(r) for r in trace_a], [_done(r) for r in trace_b]) :]
    return AgentDiff(
        messages_added=[m.model_dump(mode="json", exclude_defaults=True) for m in messages_b[cut:]],
        tool_calls_added=_calls(messages_b, trace_b, cut),
        compactions_added=[
            r.model_dump(mode="json", include={"step", "superstep", "compacted", "result"})
            for r in new_trace
            if r.compacted is not None
        ],
    )


def _common(a: list[Any], b: list[Any]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


# What a trace record did, which the counting rule compares (see the module's docstring).
DONE = {"step", "superstep", "tool", "arguments", "result", "error", "effects", "compacted"}


def _done(record: TraceRecord) -> JSON:
    return record.model_dump(mode="json", include=DONE)


def _calls(messages: list[Message], trace: list[TraceRecord], cut: int) -> list[JSON]:
    """The tool calls the messages from `cut` on make, each with its trace record.

    Calls and tool records are paired in order over the whole history, a call with the
    next record of its tool's name: a call no record answers (it waits for approval) is
    shown from its message alone.
    """
    records = [r for r in trace if r.tool is not None]
    at, calls = 0, []
    for index, message in enumerate(messages):
        for call in message.tool_calls:
            match = next((j for j in range(at, len(records)) if records[j].tool == call.name), None)
            if match is not None:
                at = match + 1
            if index < cut:
                continue
            calls.append(
                _call(records[match]) if match is not None
                else {"tool": call.name, "arguments": call.args, "result": None, "error": None}
            )  # fmt: skip
    return calls


def _call(record: TraceRecord) -> JSON:
    return record.model_dump(
        mode="json",
        include={"step", "superstep", "tool", "arguments", "result", "error", "effects"},
    )


def _files_diff(
    store: CheckpointStore, gc_a: GlobalCheckpoint, gc_b: GlobalCheckpoint
) -> FilesDiff:
    files_a = store.read_manifest(gc_a.task, gc_a.workspace).files
    files_b = store.read_manifest(gc_b.task, gc_b.workspace).files
    changed = sorted(p for p in files_a.keys() & files_b.keys() if files_a[p] != files_b[p])
    old = store.get_blobs(gc_a.task, (files_a[p] for p in changed))
    new = store.get_blobs(gc_b.task, (files_b[p] for p in changed))
    return FilesDiff(
        added=sorted(files_b.keys() - files_a.keys()),
        removed=sorted(files_a.keys() - files_b.keys()),
        changed={p: unified(p, old[files_a[p]], new[files_b[p]]) for p in changed},
    )


def unified(path: str, old: bytes, new: bytes) -> str:
    """A unified diff of one file's two versions; a binary file is named, not dumped."""
    lines_a, lines_b = _lines(old), _lines(new)
    if lines_a is None or lines_b is None:
        return f"Binary files a/{path} and b/{path} differ\n"
    lines = [
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
        for line in difflib.unified_diff(lines_a, lines_b, f"a/{path}", f"b/{path}")
    ]
    if len(lines) > MAX_DIFF_LINES:
        lines = [*lines[:MAX_DIFF_LINES], f"... {len(lines) - MAX_DIFF_LINES} more lines\n"]
    return "".join(lines)


def _lines(content: bytes) -> list[str] | None:
    """A text file's lines, ends kept; None for a binary file (a NUL byte, or not UTF-8)."""
    if b"\0" in content:
        return None
    try:
        return content.decode().splitlines(keepends=True)
    except UnicodeDecodeError:
        return None
