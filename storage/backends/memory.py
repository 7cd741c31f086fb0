"""In-memory twins of the hot store and the cold archive (for unit speed only).

They enforce the same rules as the Redis and disk backends and pass the same conformance
tests; nothing that claims a guarantee rests on them alone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

from storage.base import GCEntry, GCInfo, LCEntry, LCLink
from storage.errors import CommitRefused, FencedWrite
from storage.keys import check_name
from storage.records import GCStatus, LCRef


@dataclass(slots=True)
class _HotLC:
    entry: LCEntry
    committed: bool = False


@dataclass(slots=True)
class _HotGC:
    entry: GCEntry


class MemoryHotStore:
    """A `HotStore` in a dict, guarded by one lock (the twin of Redis's atomic scripts)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self._epochs: dict[str, int] = {}
        self._attempts: dict[tuple[str, str], tuple[int, int]] = {}
        self._lcs: dict[tuple[str, str], _HotLC] = {}
        self._superstep_lcs: dict[tuple[str, int, int], set[str]] = {}
        self._votes: dict[tuple[str, int, int], dict[str, LCRef]] = {}
        self._gcs: dict[tuple[str, int], _HotGC] = {}
        self._latest: dict[str, int] = {}
        self._blobs: dict[tuple[str, str], bytes] = {}
        self._blob_times: dict[tuple[str, str], float] = {}

    def init_task(self, task: str) -> int:
        check_name("task", task)  # as storage.keys does for Redis
        with self._lock:
            return self._epochs.setdefault(task, 1)

    def get_epoch(self, task: str) -> int:
        with self._lock:
            return self._epochs.get(task, 0)

    def raise_epoch(self, task: str, to: int) -> int:
        with self._lock:
            self._epochs[task] = max(self._epochs.get(task, 0), to)
            return self._epochs[task]

    def begin_attempt(self, task: str, agent: str, superstep: int, attempt: int) -> None:
        with self._lock:
            self._attempts[(task, agent)] = (superstep, attempt)

    def write_lc(self, entry: LCEntry, *, vote: bool = False) -> None:
        check_name("task", entry.task)
        with self._lock:
            epoch = self._epochs.get(entry.task, 0)
            if epoch != entry.epoch:
                raise FencedWrite(f"stale epoch {entry.epoch} (task is at {epoch})")
            current = self._attempts.get((entry.task, entry.agent))
            if current != (entry.superstep, entry.attempt):
                raise FencedWrite(
                    f"stale attempt {entry.superstep}:{entry.attempt} (current {current})"
                )
            key = (entry.task, entry.id)
            old = self._lcs.get(key)
            if old is not None and old.entry.sealed.checksum != entry.sealed.checksum:
                raise FencedWrite(f"LC {entry.id} exists with another checksum")
            if old is None:
                self._lcs[key] = _HotLC(entry)
                self._superstep_lcs.setdefault(
                    (entry.task, entry.epoch, entry.superstep), set()
                ).add(entry.id)
            if vote:
                self._votes.setdefault((entry.task, entry.epoch, entry.superstep), {})[
                    entry.agent
                ] = LCRef(id=entry.id, checksum=entry.sealed.checksum)

    def read_chain(self, task: str, lc_id: str, max_links: int) -> list[bytes]:
        with self._lock:
            out: list[bytes] = []
            current: str | None = lc_id
            while current is not None and len(out) < max_links:
                hot = self._lcs.get((task, current))
                if hot is None:
                    break
                out.append(hot.entry.sealed.data)
                current = None if hot.entry.full else hot.entry.parent_id
            return out

    def lc_link(self, task: str, lc_id: str) -> LCLink | None:
        with self._lock:
            hot = self._lcs.get((task, lc_id))
            if hot is None:
                return None
            e = hot.entry
            return LCLink(e.id, e.agent, e.parent_id, e.full)

    def delete_lcs(self, task: str, lc_ids: Iterable[str]) -> None:
        with self._lock:
            for lc_id in lc_ids:
                self._lcs.pop((task, lc_id), None)

    def get_votes(self, task: str, epoch: int, superstep: int) -> dict[str, LCRef]:
        with self._lock:
            return dict(self._votes.get((task, epoch, superstep), {}))

    def prepare_gc(self, entry: GCEntry) -> None:
        with self._lock:
            epoch = self._epochs.get(entry.task, 0)
            if epoch != entry.epoch:
                raise CommitRefused(f"stale epoch {entry.epoch} (task is at {epoch})")
            old = self._gcs.get((entry.task, entry.number))
            if old is not None and old.entry.status is not GCStatus.PREPARING:
                raise CommitRefused(f"GC {entry.number} is already {old.entry.status.value}")
            self._gcs[(entry.task, entry.number)] = _HotGC(entry)

    def commit_gc(self, entry: GCEntry) -> None:
        with self._lock:
            epoch = self._epochs.get(entry.task, 0)
            if epoch != entry.epoch:
                raise CommitRefused(f"stale epoch {entry.epoch} (task is at {epoch})")
            old = self._gcs.get((entry.task, entry.number))
            if old is not None and old.entry.status is GCStatus.COMMITTED:
                if old.entry.sealed.checksum == entry.sealed.checksum:
                    return
                raise CommitRefused(f"GC {entry.number} is already committed")
            if old is not None and old.entry.status is GCStatus.ABORTED:
                raise CommitRefused(f"GC {entry.number} was aborted")
            if (entry.task, entry.workspace) not in self._blobs:
                raise CommitRefused(f"workspace manifest {entry.workspace} is not stored")
            for agent, ref in entry.members.items():
                hot = self._lcs.get((entry.task, ref.id))
                if hot is None:
                    raise CommitRefused(f"LC {ref.id} of {agent} is missing")
                if hot.entry.sealed.checksum != ref.checksum or hot.entry.agent != agent:
                    raise CommitRefused(f"LC {ref.id} of {agent} does not match its vote")
            self._gcs[(entry.task, entry.number)] = _HotGC(entry)
            for ref in entry.members.values():
                self._commit_chain(entry.task, ref.id)
            self._drop_tentative(entry)
            if entry.number > self._latest.get(entry.task, -1):
                self._latest[entry.task] = entry.number

    def _commit_chain(self, task: str, lc_id: str) -> None:
        """Mark an LC committed with its tentative ancestors (a member is a delta on them)."""
        hot: _HotLC | None = self._lcs[(task, lc_id)]
        while hot is not None:
            hot.committed = True
            if hot.entry.full or hot.entry.parent_id is None:
                return
            hot = self._lcs.get((task, hot.entry.parent_id))
            if hot is not None and hot.committed:
                return

    def abort_gc(self, entry: GCEntry) -> None:
        with self._lock:
            old = self._gcs.get((entry.task, entry.number))
            if old is not None and old.entry.status is GCStatus.COMMITTED:
                raise CommitRefused(f"GC {entry.number} is committed and cannot be aborted")
            self._gcs[(entry.task, entry.number)] = _HotGC(entry)
            self._drop_tentative(entry)

    def _drop_tentative(self, entry: GCEntry) -> None:
        """Forget the superstep's votes and every LC of it that no commit named."""
        key = (entry.task, entry.epoch, entry.superstep)
        for lc_id in self._superstep_lcs.pop(key, set()):
            hot = self._lcs.get((entry.task, lc_id))
            if hot is not None and not hot.committed:
                del self._lcs[(entry.task, lc_id)]
        self._votes.pop(key, None)

    def read_gc(self, task: str, number: int) -> bytes | None:
        with self._lock:
            hot = self._gcs.get((task, number))
            return None if hot is None else hot.entry.sealed.data

    def list_gcs(self, task: str) -> list[GCInfo]:
        with self._lock:
            found = [
                GCInfo(n, h.entry.status, h.entry.superstep, h.entry.sealed.size)
                for (t, n), h in self._gcs.items()
                if t == task
            ]
        return sorted(found, key=lambda info: info.number)

    def latest_gc(self, task: str) -> int | None:
        with self._lock:
            return self._latest.get(task)

    def delete_gc(self, task: str, number: int) -> None:
        with self._lock:
            self._gcs.pop((task, number), None)

    def put_blob(self, task: str, sha: str, data: bytes) -> None:
        check_name("task", task)
        with self._lock:
            self._blobs.setdefault((task, sha), data)
            self._blob_times[(task, sha)] = time.time()

    def get_blob(self, task: str, sha: str) -> bytes | None:
        with self._lock:
            return self._blobs.get((task, sha))

    def blob_times(self, task: str) -> dict[str, float]:
        with self._lock:
            return {sha: t for (tk, sha), t in self._blob_times.items() if tk == task}

    def delete_blobs(self, task: str, shas: Iterable[str]) -> None:
        with self._lock:
            for sha in shas:
                self._blobs.pop((task, sha), None)
                self._blob_times.pop((task, sha), None)

    def flush(self) -> None:
        """Forget everything, as FLUSHALL does to Redis (for recovery tests)."""
        with self._lock:
            self._reset()


class MemoryArchive:
    """A `ColdArchive` in dicts: write-once entries, blob times for sweeping."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._blobs: dict[str, bytes] = {}
        self._blob_times: dict[str, float] = {}
        self._lcs: dict[tuple[str, str, str], bytes] = {}
        self._gcs: dict[tuple[str, int], bytes] = {}

    def put_blob(self, sha: str, data: bytes) -> None:
        with self._lock:
            self._blobs.setdefault(sha, data)
            self._blob_times[sha] = time.time()

    def get_blob(self, sha: str) -> bytes | None:
        with self._lock:
            return self._blobs.get(sha)

    def has_blob(self, sha: str) -> bool:
        with self._lock:
            if sha not in self._blobs:
                return False
            self._blob_times[sha] = time.time()
            return True

    def blob_times(self) -> dict[str, float]:
        with self._lock:
            return dict(self._blob_times)

    def delete_blob(self, sha: str) -> None:
        with self._lock:
            self._blobs.pop(sha, None)
            self._blob_times.pop(sha, None)

    def put_lc(self, task: str, agent: str, lc_id: str, data: bytes) -> None:
        with self._lock:
            self._lcs.setdefault((task, agent, lc_id), data)

    def get_lc(self, task: str, agent: str, lc_id: str) -> bytes | None:
        with self._lock:
            return self._lcs.get((task, agent, lc_id))

    def has_lc(self, task: str, agent: str, lc_id: str) -> bool:
        with self._lock:
            return (task, agent, lc_id) in self._lcs

    def list_lcs(self, task: str) -> list[tuple[str, str]]:
        with self._lock:
            return sorted((a, i) for (t, a, i) in self._lcs if t == task)

    def delete_lc(self, task: str, agent: str, lc_id: str) -> None:
        with self._lock:
            self._lcs.pop((task, agent, lc_id), None)

    def sync(self) -> None:
        """Nothing to do: memory is as durable as it gets."""

    def put_gc(self, task: str, number: int, data: bytes) -> None:
        with self._lock:
            self._gcs.setdefault((task, number), data)

    def get_gc(self, task: str, number: int) -> bytes | None:
        with self._lock:
            return self._gcs.get((task, number))

    def list_gcs(self, task: str) -> list[int]:
        with self._lock:
            return sorted(n for (t, n) in self._gcs if t == task)

    def delete_gc(self, task: str, number: int) -> None:
        with self._lock:
            self._gcs.pop((task, number), None)

    def tasks(self) -> list[str]:
        with self._lock:
            names = {t for (t, _, _) in self._lcs} | {t for (t, _) in self._gcs}
        return sorted(names)
