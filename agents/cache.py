"""What a worker keeps between steps, so the next step of the same agent starts warm.

Only what cannot go stale is kept: states under the id and checksum of the LC they were
written as (LCs never change), manifests under their content address, and one workspace
directory per task and cache root (its index is checked against the files on every sync).
Everything is bounded; a miss just reads from the store. Steps running at once in one
process share it (each in a cache root, a lane, of its own), so every table is locked.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path
from typing import Generic, TypeVar

from cairn.agents.workspace import Files, Workspace
from cairn.storage.chain import WorkingState
from cairn.storage.codec import DIGEST_END, Place
from cairn.storage.records import LCRef, Record
from cairn.storage.store import CheckpointStore

STEPS_TREE = "steps"  # the workspace directory steps run in (one per task and lane)
K = TypeVar("K")
R = TypeVar("R", bound=Record)
V = TypeVar("V")


class _LRU(Generic[K, V]):
    def __init__(self, size: int) -> None:
        self._size = size
        self._items: OrderedDict[K, V] = OrderedDict()
        self._guard = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._guard:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> None:
        with self._guard:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self._size:
                self._items.popitem(last=False)


class WorkerCache:
    """A worker's warm state: agent states it wrote, manifests, workspace directories."""

    def __init__(self, states: int = 64, manifests: int = 256, workspaces: int = 256) -> None:
        self._states: _LRU[tuple[str, str], tuple[LCRef, WorkingState]] = _LRU(states)
        self._manifests: _LRU[tuple[str, str], Files] = _LRU(manifests)
        self._workspaces: _LRU[tuple[Path, str], Workspace] = _LRU(workspaces)
        self._records: _LRU[tuple[Place, type, bytes], Record] = _LRU(manifests)

    def state(self, task: str, agent: str, ref: LCRef) -> WorkingState | None:
        """Return a private copy of the state written as LC `ref`, if this worker wrote it."""
        found = self._states.get((task, agent))
        if found is None or found[0] != ref:
            return None
        return found[1].copy()

    def keep_state(self, state: WorkingState, ref: LCRef) -> None:
        """Remember `state` as written as step LC `ref`; the caller changes it no more.

        Kept as it is, not copied: `state` hands out a copy to each step that asks.
        """
        self._states.put((state.task, state.agent), (ref, state))

    def manifest(self, store: CheckpointStore, task: str, manifest_id: str) -> Files:
        """Return a manifest's files, read once per worker (a manifest never changes)."""
        files = self._manifests.get((task, manifest_id))
        if files is None:
            files = store.read_manifest(task, manifest_id).files
            self._manifests.put((task, manifest_id), files)
        return dict(files)

    def keep_manifest(self, task: str, manifest_id: str, files: Files) -> None:
        """Remember a manifest this worker just stored (the next GC often names it)."""
        self._manifests.put((task, manifest_id), dict(files))

    def record(
        self, store: CheckpointStore, place: Place, data: bytes | None, model: type[R]
    ) -> R | None:
        """Return the record sealed in `data` for `place` (None for None), opening each once.

        The digest in the envelope commits to the content and the place, so bytes carrying
        a digest this worker already verified there hold that same record. Treat what it
        returns as read-only.
        """
        if data is None:
            return None
        key = (place, model, data[5:DIGEST_END])
        found = self._records.get(key)
        if found is None:
            found = store.codec.decode(data, model, place)
            self._records.put(key, found)
        assert isinstance(found, model)
        return found

    def workspace(self, root: Path, task: str) -> Workspace:
        """Return the workspace directory the steps of `task` run in under `root`.

        One per task and root (a lane: one step at a time), not per agent: each step starts
        with a sync to its own view, so the next agent pays only for what changed.
        """
        key = (Path(root), task)
        workspace = self._workspaces.get(key)  # a lane is one step's at a time: no race here
        if workspace is None:
            workspace = Workspace(root, task, STEPS_TREE)
            self._workspaces.put(key, workspace)
        return workspace


WORKER = WorkerCache()
