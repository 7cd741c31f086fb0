"""Fork: a new task that starts from a committed global checkpoint of another.

The new task's GC 0 holds what GC N of the source holds: every agent's history, status and
step, the undelivered inbox and who received what, the workspace's files, and the
superstep. Its agents go on from there as the source's would after a restore to N, except
that a fork tells them nothing: a restore appends a note on what was undone, a fork
undid nothing. The source is only read (from Redis, else the archive), never written.

A fork may change the team's configuration (another model or system prompt for an agent,
other limits) through a spec naming the same agents; a changed system prompt replaces the
first message of that agent's history, which is where every history keeps it. Members
spawned at run time are carried with the GC's membership, their specs and who spawned
them (`GlobalCheckpoint.spawned`); a spec names only the agents the source's spec named.
"""

from __future__ import annotations

import json
import time

from cairn.agents.logs import get_logger
from cairn.agents.spec import TaskRecord
from cairn.agents.team import team
from cairn.coordinator import metrics
from cairn.coordinator.archiver import ArchiveJob, acknowledge, archive
from cairn.coordinator.replication import require
from cairn.coordinator.runs import RunState, TaskState
from cairn.coordinator.spec import LIMITS_DOC, Limits, TaskSpec
from cairn.coordinator.spend import inherit
from cairn.errors import CheckpointNotFound, InvalidSpec
from cairn.storage import keys
from cairn.storage.chain import WorkingState
from cairn.storage.keys import SPEC_DOC
from cairn.storage.records import (
    GCOrigin,
    GCStatus,
    GlobalCheckpoint,
    LCRef,
    Message,
    Role,
    Usage,
    WorkspaceManifest,
)
from cairn.storage.store import CheckpointStore

log = get_logger(__name__)


def committed_gc(store: CheckpointStore, task: str, number: int | None) -> GlobalCheckpoint:
    """GC `number` of `task` (default: the latest committed), hot or archived.

    Raises `CheckpointNotFound` when the task has no committed checkpoint of that number.
    """
    if number is None:
        latest = store.latest_gc(task)
        if latest is None:
            raise CheckpointNotFound(f"task {task} has no committed checkpoint")
        return latest
    listed = store.list_gcs(task)
    if any(g.number == number and g.status is GCStatus.ABORTED for g in listed):
        raise CheckpointNotFound(
            f"checkpoint {number} of task {task} was aborted: it committed nothing"
        )
    if number not in {g.number for g in listed if g.status is GCStatus.COMMITTED}:
        raise CheckpointNotFound(f"task {task} has no committed checkpoint {number}")
    return store.read_gc(task, number)


def fork_task(
    store: CheckpointStore,
    runs: RunState,
    source: str,
    new: str,
    at: int | None = None,
    spec: TaskSpec | None = None,
) -> GlobalCheckpoint:
    """Make task `new` from GC `at` of `source` (default: its latest); return its GC 0.

    `spec`, when given, must name the source's agents (the same names): it sets the new
    task's configuration and limits; otherwise they are the source's. The new task is
    queued to run. Raises `CheckpointNotFound` for an absent checkpoint, `InvalidSpec` for
    a spec of another team.
    """
    gc = committed_gc(store, source, at)
    record = store.read_doc(source, SPEC_DOC, TaskRecord).model_copy(update={"task": new})
    limits = store.read_doc(source, LIMITS_DOC, Limits)
    agents = team(gc, record)  # the source's team at that GC
    if spec is not None:
        # Its members spawned at run time keep the specs they were spawned with (in the GC).
        names = sorted(a.name for a in spec.agents)
        listed = sorted(a for a in agents if a not in gc.spawned)
        if names != listed:
            raise InvalidSpec(
                f"a fork keeps its team: the spec names {', '.join(names)}, task {source} has "
                + ", ".join(listed)
            )
        record, limits = spec.record(new), spec.limits()
    epoch = store.hot.init_task(new)
    store.put_doc(new, SPEC_DOC, record)
    store.put_doc(new, LIMITS_DOC, limits)
    manifest = store.read_manifest(source, gc.workspace)
    contents = store.get_blobs(source, manifest.files.values())
    copied = {path: store.put_blob(new, contents[sha]) for path, sha in manifest.files.items()}
    workspace = store.put_manifest(new, WorkspaceManifest(files=copied))
    members: dict[str, LCRef] = {}
    histories: dict[str, Usage] = {}
    systems = {agent.name: agent.system for agent in record.agents}
    for name in agents:
        ref = gc.members[name]
        state = store.read_state(source, name, ref.id, ref.checksum)
        _move(state, new, epoch, gc.superstep, workspace)
        system = systems.get(name)
        if system and state.messages and state.messages[0].role is Role.SYSTEM:
            state.messages[0] = Message(role=Role.SYSTEM, content=system)
        store.hot.begin_attempt(new, name, gc.superstep, 1, epoch=epoch)
        members[name] = store.write_lc(state, vote=True)
        histories[name] = state.usage
    inherit(runs.redis, new, histories)  # spent by the source: not the fork's own spend
    start = gc.written(
        GCOrigin.FORK,
        gc.number,
        source_task=source,
        task=new,
        number=0,
        epoch=epoch,
        status=GCStatus.PREPARING,
        members=members,
        workspace=workspace,
    )
    store.prepare_gc(start)
    committed = store.commit_gc(start)
    metrics.GC_COMMITS.inc()
    policy = limits.checkpoints
    if policy.durability == "sync" and archive(
        store, ArchiveJob(new, 0, policy.hot_keep, policy.cold_keep)
    ):
        acknowledge(runs, new, 0)
    elif policy.durability == "replicated":  # as a submit: only once a replica holds it
        require(runs, store.hot, new, 0, policy.replica_timeout)
    lineage = json.dumps({"task_id": source, "checkpoint": gc.number})
    run: dict[str, object] = {"status": TaskState.RUNNING, "superstep": 0,
                              "submitted_at": time.time(), "forked_from": lineage}  # fmt: skip
    if limits.budget is not None:  # the spec's: spend is the fork's own, from zero
        run["budget"] = limits.budget.model_dump_json()
    runs.write(new, run)
    runs.redis.sadd(keys.ACTIVE_TASKS, new)
    log.info("task forked", task=new, source=source, checkpoint=gc.number)
    return committed


def _move(state: WorkingState, task: str, epoch: int, superstep: int, workspace: str) -> None:
    """Make a state read from the source the first state of `task`: a new, full chain."""
    state.task, state.epoch, state.attempt, state.superstep = task, epoch, 1, superstep
    state.workspace_before = state.workspace_after = workspace
    state.changes, state.outbox, state.spawns, state.base = {}, [], [], None
