"""A minimal superstep loop for agent tests: run steps, build and commit each barrier's GC.

The coordinator adds retries, timeouts, 2PC bookkeeping and restore; this loop
is only what the agents runtime needs to be exercised end to end on real Redis.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from cairn.agents.barrier import build_gc, runnable
from cairn.agents.cache import WORKER, WorkerCache
from cairn.agents.spec import AgentSpec, StepPolicy, TaskRecord, Turn
from cairn.agents.step import ModelFactory, build_model, run_step
from cairn.storage.keys import SPEC_DOC
from cairn.storage.records import GlobalCheckpoint
from cairn.storage.store import CheckpointStore

if TYPE_CHECKING:  # the `mcp` SDK is imported by the tests that start MCP servers
    from cairn.agents.mcp.manager import McpManager


def record(task: str, *agents: AgentSpec, policy: StepPolicy | None = None) -> TaskRecord:
    """A task record with a fixed goal."""
    return TaskRecord(
        task=task,
        goal="Make the project pass its tests.",
        agents=list(agents),
        policy=policy or StepPolicy(),
    )


def scripted(name: str, turns: Sequence[Mapping[str, object]], **extra: object) -> AgentSpec:
    """A scripted agent from plain turn dicts (as a YAML spec would give them)."""
    return AgentSpec.model_validate(
        {"name": name, "model": "scripted", "script": [Turn.model_validate(t) for t in turns]}
        | extra
    )


def superstep(
    store: CheckpointStore,
    task: str,
    cache: Path,
    models: ModelFactory = build_model,
    mcp: McpManager | None = None,
    warm: WorkerCache = WORKER,
) -> GlobalCheckpoint | None:
    """Run one superstep (attempt 1 for each runnable agent) and commit its GC; None if idle.

    `mcp` serves the agents' `mcp:` tools, as a worker's manager does; `warm` is what the
    worker running the steps kept from its earlier steps (this process's, by default).
    """
    spec = store.read_doc(task, SPEC_DOC, TaskRecord)
    order = [a.name for a in spec.agents]
    gc = store.latest_gc(task)
    assert gc is not None
    agents = runnable(store, gc, order)
    if not agents:
        return None
    s, epoch = gc.superstep + 1, store.hot.get_epoch(task)
    votes = {}
    for agent in agents:
        store.hot.begin_attempt(task, agent, s, 1)
        votes[agent] = run_step(
            task, agent, s, epoch, 1, store=store, cache=cache, models=models, mcp=mcp, warm=warm
        ).lc
    barrier = build_gc(store, gc, votes, order, number=gc.number + 1, superstep=s, epoch=epoch)
    store.prepare_gc(barrier.gc)
    return store.commit_gc(barrier.gc)


def drive(
    store: CheckpointStore,
    task: str,
    cache: Path,
    *,
    limit: int = 60,
    models: ModelFactory = build_model,
    mcp: McpManager | None = None,
) -> GlobalCheckpoint:
    """Run supersteps until no agent is runnable; return the last GC."""
    for _ in range(limit):
        if superstep(store, task, cache, models, mcp) is None:
            gc = store.latest_gc(task)
            assert gc is not None
            return gc
    raise AssertionError(f"task {task} still running after {limit} supersteps")


def files_of(store: CheckpointStore, gc: GlobalCheckpoint) -> dict[str, bytes]:
    """Return the workspace of a GC as path → content."""
    manifest = store.read_manifest(gc.task, gc.workspace)
    return {path: store.get_blob(gc.task, sha) for path, sha in manifest.files.items()}
