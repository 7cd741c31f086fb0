"""What happened in a task, as a plain data model: steps, checkpoints, retries, restores.

`gather` reads every committed global checkpoint of a task, hot or cold, and walks its
agents' local-checkpoint chains back until they meet an LC already read, so each LC is
read once. An LC holds what one step added to its agent's history, so the timeline has
every step a checkpoint kept, also the ones a later restore undid, each with its messages,
tool calls, usage and its place in time (its trace records' start and end).

Next to the steps it keeps what comparing any two GCs takes, as `cairn.coordinator.diff` does:
each GC's member LCs and workspace manifest, each LC's additions (`History`, indexes into
shared pools of messages and trace records, so a message shared by many histories is held
once) and the files' contents, within limits. The CLI draws it as a self-contained HTML
page (`cairn trace TASK --html FILE`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

import redis

from cairn.coordinator import gcviews, views
from cairn.coordinator.failures import FailureEvent, StepFailure, read_failures
from cairn.coordinator.viewbase import JSON
from cairn.errors import CairnError, TaskNotFound
from cairn.storage.public import public
from cairn.storage.records import GCStatus, LCRef, LocalCheckpoint, TraceRecord, Usage
from cairn.storage.store import CheckpointStore

RANKED = 5  # rows in each analytics table
FILE_LIMIT = 256 * 1024  # bytes of one file version whose text the timeline carries
FILES_LIMIT = 8 * 1024 * 1024  # bytes of all the file versions' text it carries
READ_LIMIT = 64 * 1024 * 1024  # bytes of file versions read to find them
BLOB_BATCH = 256  # file versions read in one round trip
EPOCH = "1970-01-01T00:00:00+00:00"  # where a step without a start time sorts


@dataclass
class StepCell:
    """One step of one agent: where it sits in time, how it went, what it called."""

    agent: str
    superstep: int
    step: int
    duration_ms: float = 0.0  # from the model turn's start to the last tool call's end
    started_at: str | None = None
    finished_at: str | None = None
    attempt: int = 1
    epoch: int | None = None
    agent_status: str | None = None
    tools: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lc: str = ""  # the id of the LC the step wrote, which names the step on the page
    usage: JSON | None = None  # the model calls' tokens, and their `cost_usd` when recorded
    compacted: int = 0  # messages the step's compactions left out of what the model is sent
    undone: bool = False  # a restore undid it: the latest checkpoint's history lacks it

    @property
    def status(self) -> str:
        """`failed` when a record of the step carries an error, `retried`, else `ok`."""
        if self.errors:
            return "failed"
        return "retried" if self.attempt > 1 else "ok"


@dataclass
class CheckpointMark:
    """A global checkpoint: its superstep, epoch, outcome, where it lives, if it restores."""

    number: int
    superstep: int | None  # None: unknown, its only record is damaged (`error` says how)
    status: str
    hot: bool
    cold: bool
    epoch: int | None = None
    created_at: str | None = None
    restore: bool = False  # its epoch rose: it restates an earlier superstep after a restore
    error: str | None = None
    committed_at: str | None = None
    members: dict[str, str] = field(default_factory=dict)  # agent → the id of its LC
    files: dict[str, str] | None = None  # path → sha256; None: it cannot be compared
    spawned: dict[str, str] = field(default_factory=dict)  # member → who spawned it

    @property
    def at(self) -> str | None:
        """When it took effect: its commit, else (aborted, unread) its creation."""
        return self.committed_at or self.created_at


@dataclass
class History:
    """What one LC adds to its agent's history, as indexes into the timeline's pools."""

    agent: str
    parent: str | None  # the LC it extends; None: its additions are the whole history
    messages: list[int] = field(default_factory=list)
    trace: list[int] = field(default_factory=list)


@dataclass
class FileVersion:
    """One file content a checkpoint names: its size, and its text when the timeline has it."""

    size: int
    binary: bool = False
    text: str | None = None  # None: binary, or past FILE_LIMIT / FILES_LIMIT


@public
@dataclass
class Timeline:
    """Everything the HTML timeline shows of one task."""

    task: str
    status: str
    reason: str | None
    agents: list[str]
    supersteps: list[int]
    cells: list[StepCell]  # the steps the latest checkpoint's history holds
    checkpoints: list[CheckpointMark]
    slowest: list[StepCell]
    troubled: list[StepCell]
    error: str | None = None  # why some steps or checkpoints are missing, when some are
    forked_from: str | None = None  # `task@checkpoint` it was forked from, if it was
    steps: list[StepCell] = field(default_factory=list)  # every step, undone ones too
    histories: dict[str, History] = field(default_factory=dict)  # LC id → its additions
    messages: list[JSON] = field(default_factory=list)  # the pool `History.messages` indexes
    records: list[JSON] = field(default_factory=list)  # the pool `History.trace` indexes
    files: dict[str, FileVersion] = field(default_factory=dict)  # sha256 → one, if read
    # member spawned at run time → who spawned it, in any checkpoint (also ones a restore
    # went back before)
    spawned: dict[str, str] = field(default_factory=dict)
    # failed attempts, retries, rollbacks, as recorded while they happened (failures.py)
    attempts: list[StepFailure] = field(default_factory=list)

    def cell(self, agent: str, superstep: int) -> StepCell | None:
        """The agent's step in that superstep of the latest checkpoint's history, if any."""
        for cell in self.cells:
            if (cell.agent, cell.superstep) == (agent, superstep):
                return cell
        return None

    @property
    def restores(self) -> list[CheckpointMark]:
        """The checkpoints written by a restore."""
        return [mark for mark in self.checkpoints if mark.restore]

    @property
    def retries(self) -> int:
        """How many extra attempts the steps took: as recorded, or as their checkpoints say.

        The checkpoints know only the retries of steps that went on to commit; the record
        also knows those of a step still failing, or rolled back.
        """
        kept = sum(cell.attempt - 1 for cell in self.steps)
        recorded = sum(1 for event in self.attempts if event.event is FailureEvent.RETRIED)
        return max(kept, recorded)

    @property
    def failures(self) -> int:
        """How many steps had an error, the attempts that failed, and the aborted checkpoints."""
        aborted = sum(1 for mark in self.checkpoints if mark.status == GCStatus.ABORTED.value)
        failed = {(e.epoch, e.superstep, e.agent, e.attempt) for e in self.attempts}
        return sum(1 for cell in self.steps if cell.errors) + len(failed) + aborted


class _Pool:
    """JSON objects held once each, by their content; `add` returns an object's index."""

    def __init__(self) -> None:
        self.items: list[JSON] = []
        self._index: dict[str, int] = {}

    def add(self, item: JSON) -> int:
        key = json.dumps(item, sort_keys=True)
        if key not in self._index:
            self._index[key] = len(self.items)
            self.items.append(item)
        return self._index[key]


class _Chains:
    """The task's LC chains, each LC read once, as histories and steps."""

    def __init__(self, store: CheckpointStore, task: str) -> None:
        self.store, self.task = store, task
        self.histories: dict[str, History] = {}
        self.steps: list[StepCell] = []
        self.messages, self.records = _Pool(), _Pool()

    def read(self, members: dict[str, LCRef]) -> None:
        """Read the members' LCs and their ancestors back to LCs already read (or a root)."""
        new = {agent: ref for agent, ref in members.items() if ref.id not in self.histories}
        for agent, head in self.store.read_lcs_fields(self.task, new, LocalCheckpoint).items():
            lc = head
            self._add(agent, lc)
            while lc.parent_id is not None and lc.parent_id not in self.histories:
                parent = LCRef(id=lc.parent_id, checksum=lc.parent_checksum or "")
                lc = self.store.read_lc_fields(self.task, agent, parent, LocalCheckpoint)
                self._add(agent, lc)

    def _add(self, agent: str, lc: LocalCheckpoint) -> None:
        messages, trace = lc.added_messages, lc.added_trace
        self.histories[lc.id] = History(
            agent=agent,
            parent=lc.parent_id,
            messages=[
                self.messages.add(m.model_dump(mode="json", exclude_defaults=True))
                for m in messages
            ],
            trace=[
                self.records.add(r.model_dump(mode="json", exclude={"schema_version"}))
                for r in trace
            ],
        )
        # No step wrote a chain's first LC (a fork's copies its source's trace), nor one
        # that adds no trace record (a restore's note).
        if lc.parent_id is not None and trace:
            self.steps.append(step_cell(agent, lc, trace))

    def lineage(self, heads: Iterable[str]) -> set[str]:
        """The ids of the LCs `heads` grew from, themselves included."""
        found: set[str] = set()
        for head in heads:
            lc: str | None = head
            while lc is not None and lc not in found and lc in self.histories:
                found.add(lc)
                lc = self.histories[lc].parent
        return found


def step_cell(agent: str, lc: LocalCheckpoint, trace: list[TraceRecord]) -> StepCell:
    """The step an LC wrote, from the trace records it added."""
    started = min(record.started_at for record in trace)
    finished = max(record.finished_at for record in trace)
    calls = [record for record in trace if record.tool is None and record.usage is not None]
    spent = Usage()
    for record in calls:
        assert record.usage is not None
        spent = spent.plus(record.usage)
    return StepCell(
        agent=agent,
        superstep=lc.superstep,
        step=lc.step,
        duration_ms=(finished - started).total_seconds() * 1000,
        started_at=started.isoformat(),
        finished_at=finished.isoformat(),
        attempt=lc.attempt,
        epoch=lc.epoch,
        agent_status=lc.status.value,
        tools=[record.tool for record in trace if record.tool is not None],
        errors=[record.error for record in trace if record.error],
        lc=lc.id,
        usage=spent.model_dump(mode="json") if calls else None,
        compacted=sum(record.compacted or 0 for record in trace),
    )


def marks(checkpoints: list[gcviews.CheckpointInfo]) -> list[CheckpointMark]:
    """The GCs of `gcviews.checkpoints`, oldest first, a restore marked where epoch rises."""
    found: list[CheckpointMark] = []
    epoch: int | None = None
    for info in sorted(checkpoints, key=lambda c: c.number):
        mark = CheckpointMark(
            number=info.number,
            superstep=info.superstep,
            status=info.status.value,
            hot=info.hot,
            cold=info.cold,
            epoch=info.epoch,
            created_at=None if info.created_at is None else info.created_at.isoformat(),
            error=info.error,
        )
        if mark.epoch is not None:
            mark.restore = epoch is not None and mark.epoch > epoch
            epoch = mark.epoch if epoch is None else max(epoch, mark.epoch)
        found.append(mark)
    return found


def gather(client: redis.Redis, store: CheckpointStore, task: str) -> Timeline:
    """The task's timeline, read from the store; raises `TaskNotFound` for an unknown task."""
    views.require_task(client, store, task)
    forked_from = None
    try:
        status = views.task_status(client, store, task)
        state, reason = status.state.value, status.reason
        if status.forked_from is not None:
            forked_from = f"{status.forked_from.task_id}@{status.forked_from.checkpoint}"
    except TaskNotFound:  # only its archive is left
        state, reason = "unknown", None
    checkpoints = marks(gcviews.checkpoints(store, task))
    problems: list[str] = []
    try:
        agents = views.team(store, task)
    except CairnError as exc:
        agents = []
        problems.append(str(exc))
    chains = _Chains(store, task)
    for mark in checkpoints:
        if mark.status == GCStatus.COMMITTED.value and not mark.error:
            try:
                _read_checkpoint(store, task, mark, chains)
            except CairnError as exc:
                problems.append(f"checkpoint {mark.number}: {exc}")
    steps = _distinct(chains.steps, chains.histories)
    latest = next((mark for mark in reversed(checkpoints) if mark.files is not None), None)
    if latest is not None:
        kept = chains.lineage(latest.members.values())
        for cell in steps:
            cell.undone = cell.lc not in kept
    for cell in steps:
        if cell.agent not in agents:
            agents.append(cell.agent)
    steps.sort(key=lambda c: (_instant(c.started_at), _rank(agents, c.agent)))
    cells = sorted(
        (c for c in steps if not c.undone), key=lambda c: (c.superstep, _rank(agents, c.agent))
    )
    files: dict[str, FileVersion] = {}
    try:
        files = file_versions(store, task, checkpoints)
    except CairnError as exc:
        problems.append(f"files: {exc}")
    return Timeline(
        task=task,
        status=state,
        reason=reason or None,
        agents=agents,
        supersteps=sorted(
            {c.superstep for c in cells}
            | {m.superstep for m in checkpoints if m.superstep is not None}
        ),
        cells=cells,
        checkpoints=checkpoints,
        slowest=sorted(steps, key=lambda c: -c.duration_ms)[:RANKED],
        troubled=sorted(
            (c for c in steps if c.errors or c.attempt > 1),
            key=lambda c: (-(len(c.errors) + c.attempt - 1), _instant(c.started_at)),
        )[:RANKED],
        error="; ".join(problems) or None,
        forked_from=forked_from,
        steps=steps,
        histories=chains.histories,
        messages=chains.messages.items,
        records=chains.records.items,
        files=files,
        spawned={child: parent for m in checkpoints for child, parent in m.spawned.items()},
        attempts=read_failures(client, task),
    )


def _read_checkpoint(
    store: CheckpointStore, task: str, mark: CheckpointMark, chains: _Chains
) -> None:
    """Fill in a committed GC's commit time, members and files, and read its chains."""
    gc = store.read_gc(task, mark.number)
    mark.committed_at = None if gc.committed_at is None else gc.committed_at.isoformat()
    chains.read(gc.members)
    manifest = store.read_manifest(task, gc.workspace)
    mark.members = {agent: ref.id for agent, ref in gc.members.items()}
    mark.files = dict(manifest.files)
    mark.spawned = {child: joined.parent for child, joined in gc.spawned.items()}


def _distinct(steps: list[StepCell], histories: dict[str, History]) -> list[StepCell]:
    """One cell per step: a tool-level LC's part of a step gives way to the step's own LC."""
    kept: dict[tuple[str, int | None, int, int, str | None], StepCell] = {}
    for cell in steps:
        key = (cell.agent, cell.epoch, cell.superstep, cell.step, cell.started_at)
        held = kept.get(key)
        if held is None or len(histories[cell.lc].trace) > len(histories[held.lc].trace):
            kept[key] = cell
    return list(kept.values())


def file_versions(
    store: CheckpointStore, task: str, checkpoints: list[CheckpointMark]
) -> dict[str, FileVersion]:
    """sha256 → the contents the GCs' files name, the newest GC's first, within the limits.

    Reading stops once FILES_LIMIT of text is kept or READ_LIMIT read: the versions past
    that are left out.
    """
    shas = list(
        dict.fromkeys(
            sha for m in reversed(checkpoints) for _, sha in sorted((m.files or {}).items())
        )
    )
    versions: dict[str, FileVersion] = {}
    kept = read = 0
    for start in range(0, len(shas), BLOB_BATCH):
        if kept >= FILES_LIMIT or read >= READ_LIMIT:
            break
        for sha, content in store.get_blobs(task, shas[start : start + BLOB_BATCH]).items():
            text = _text(content)
            versions[sha] = version = FileVersion(size=len(content), binary=text is None)
            read += len(content)
            if text is not None and len(content) <= min(FILE_LIMIT, FILES_LIMIT - kept):
                version.text = text
                kept += len(content)
    return versions


def _text(content: bytes) -> str | None:
    """The content as text; None when binary (a NUL byte, or not UTF-8, as `cairn diff` says)."""
    try:
        return None if b"\0" in content else content.decode()
    except UnicodeDecodeError:
        return None


def _instant(stamp: str | None) -> datetime:
    return datetime.fromisoformat(stamp or EPOCH)


def _rank(agents: list[str], agent: str) -> int:
    return agents.index(agent) if agent in agents else len(agents)
