"""What a user sees of a task's global checkpoints: each listed, one in detail, one by number.

`checkpoints` lists every GC, hot or cold, damaged or aborted (an aborted GC whose record
left Redis is listed from the archive's note of it), so a gap in the numbering is always
explained; `checkpoint` shows one with its members and files; `checkpoint_at` and `latest`
give the record itself. A number with no GC raises `CheckpointNotFound`, saying why.
"""

from __future__ import annotations

from pydantic import Field

from cairn.agents.barrier import StepOutputs
from cairn.agents.team import spawned_by
from cairn.coordinator.viewbase import JSON, IsoTime, View
from cairn.errors import CairnError, CheckpointNotFound
from cairn.storage.aborted import aborted_gcs
from cairn.storage.public import public
from cairn.storage.records import (
    AgentState,
    GCOrigin,
    GCStatus,
    GlobalCheckpoint,
    InboxMessage,
)
from cairn.storage.store import CheckpointStore


@public
class CheckpointInfo(View):
    """One global checkpoint of a task, as `cairn checkpoints` lists it.

    `created_at` is when its record was written (a restore's GC: when the restore wrote
    it, not when the GC it restored was). `origin` says what wrote it (None: a record of
    schema 6 or older, which did not say), `source` which GC a restore, a rollback or a
    fork started from (of task `source_task`, for a fork). An aborted GC whose record left
    Redis is listed from the archive's note of it, `dropped`: its number stays taken.
    """

    number: int
    status: GCStatus
    superstep: int | None  # None: unknown, the archive's only copy of its record is damaged
    members: dict[str, str]  # agent → its local checkpoint's id
    hot: bool
    cold: bool
    created_at: IsoTime | None
    size_bytes: int
    epoch: int | None = None
    damaged: bool = False  # its record cannot be read whole: no restore uses it
    error: str | None = None  # why the record could not be read whole, when it could not
    origin: GCOrigin | None = None
    source: int | None = None
    source_task: str | None = None
    dropped: bool = False  # aborted, its record gone from Redis: only the note is left


class CheckpointMember(View):
    """One agent of a global checkpoint: its local checkpoint, its status, its step."""

    name: str
    lc_id: str
    checksum: str
    status: AgentState
    step: int | None  # None when its local checkpoint is gone (an aborted checkpoint's)
    # The member that spawned it; None (and left out of the JSON): the task's spec lists it.
    spawned_by: str | None = Field(default=None, exclude_if=lambda parent: parent is None)
    # Why it takes no step: its subtree's budget is reached (coordinator/budgets.py).
    held: str | None = Field(default=None, exclude_if=lambda why: why is None)


@public
class CheckpointDetail(View):
    """One global checkpoint in detail, as `cairn checkpoint` shows it.

    Its record, where it lives, each member's step, the workspace's files (path → sha256)
    and the messages delivered but not yet read.
    """

    number: int
    name: str
    status: GCStatus
    superstep: int
    epoch: int
    created_at: IsoTime  # when its record was written
    committed_at: IsoTime | None
    origin: GCOrigin | None  # what wrote it; None: a record of schema 6 or older
    source: int | None  # the GC a restore, rollback or fork started from
    source_task: str | None  # a fork's source task
    hot: bool
    cold: bool
    size_bytes: int
    checksum: str
    members: dict[str, str]  # agent → its local checkpoint's id
    agents: list[CheckpointMember]
    workspace: str  # the workspace manifest's id
    files: dict[str, str]
    inbox: list[InboxMessage]


def latest(store: CheckpointStore, task: str) -> GlobalCheckpoint:
    """The task's latest committed GC; `CheckpointNotFound` when it has none."""
    gc = store.latest_gc(task)
    if gc is None:
        raise CheckpointNotFound(f"task {task} has no committed checkpoint")
    return gc


def checkpoint_at(store: CheckpointStore, task: str, number: int | None) -> GlobalCheckpoint:
    """GC `number` of the task (the latest committed when None); `CheckpointNotFound` if absent."""
    if number is None:
        return latest(store, task)
    listed = [info.number for info in store.list_gcs(task)]
    if number not in listed:
        raise CheckpointNotFound(missing_checkpoint(store, task, number, listed))
    return store.read_gc(task, number)


def checkpoints(store: CheckpointStore, task: str) -> list[CheckpointInfo]:
    """Every GC of the task, hot or cold, oldest first.

    A GC whose record cannot be read whole is still listed, `damaged`, with `error` saying
    why.
    """
    listed: list[CheckpointInfo] = []
    for info in store.list_gcs(task):
        entry: JSON = {
            "number": info.number,
            "status": info.status,
            "superstep": info.superstep,
            "members": {},
            "hot": info.hot,
            "cold": info.cold,
            "created_at": None,
            "size_bytes": info.size,
        }
        if info.damaged is not None:  # the listing read it already
            entry["damaged"], entry["error"] = True, info.damaged
        else:
            try:
                gc = store.read_gc(task, info.number)
            except CairnError as exc:
                entry["damaged"], entry["error"] = True, str(exc)
            else:
                entry["members"] = {agent: ref.id for agent, ref in gc.members.items()}
                entry["created_at"] = gc.created_at
                entry["epoch"] = gc.epoch
                entry.update(origin=gc.origin, source=gc.source, source_task=gc.source_task)
        listed.append(CheckpointInfo.model_validate(entry))
    numbers = {info.number for info in listed}
    notes = [note for note in aborted_gcs(store, task).values() if note.number not in numbers]
    listed.extend(
        CheckpointInfo(number=note.number, status=GCStatus.ABORTED, superstep=note.superstep,
                       members={}, hot=False, cold=False, created_at=note.created_at,
                       size_bytes=0, epoch=note.epoch, origin=note.origin, dropped=True)
        for note in notes
    )  # fmt: skip
    return sorted(listed, key=lambda info: info.number)


def checkpoint(store: CheckpointStore, task: str, number: int) -> CheckpointDetail:
    """One GC in detail: its record, where it lives, each member's step and the files."""
    listed = store.list_gcs(task)
    info = next((i for i in listed if i.number == number), None)
    if info is None:
        raise CheckpointNotFound(
            missing_checkpoint(store, task, number, [i.number for i in listed])
        )
    gc = store.read_gc(task, number)
    try:
        steps = {a: o.step for a, o in store.read_lcs_fields(task, gc.members, StepOutputs).items()}
    except CairnError:  # an aborted GC's tentative LCs are gone: the GC is still shown
        steps = {}
    manifest = store.read_manifest(task, gc.workspace)
    parents = spawned_by(gc)
    return CheckpointDetail(
        number=gc.number,
        name=gc.name,
        status=gc.status,
        superstep=gc.superstep,
        epoch=gc.epoch,
        created_at=gc.created_at,
        committed_at=gc.committed_at,
        origin=gc.origin,
        source=gc.source,
        source_task=gc.source_task,
        hot=info.hot,
        cold=info.cold,
        size_bytes=info.size,
        checksum=gc.checksum,
        members={agent: ref.id for agent, ref in gc.members.items()},
        agents=[
            CheckpointMember(
                name=agent,
                lc_id=ref.id,
                checksum=ref.checksum,
                status=gc.statuses.get(agent, AgentState.ACTIVE),
                step=steps.get(agent),
                spawned_by=parents.get(agent),
            )
            for agent, ref in gc.members.items()
        ],
        workspace=gc.workspace,
        files=dict(sorted(manifest.files.items())),
        inbox=gc.inbox,
    )


def missing_checkpoint(store: CheckpointStore, task: str, number: int, listed: list[int]) -> str:
    """Why `task` keeps no record of GC `number`: aborted and dropped, or never one."""
    note = aborted_gcs(store, task).get(number)
    if note is not None:
        return (
            f"checkpoint {number} of task {task} was aborted (superstep {note.superstep}, "
            f"epoch {note.epoch}): it committed nothing, and its record is no longer kept"
        )
    if listed and number < max(listed):
        return (
            f"task {task} keeps no checkpoint {number}: its number was taken by a GC that "
            "aborted, or one trimmed from the archive (cold_keep)"
        )
    return f"task {task} has no checkpoint {number}"
