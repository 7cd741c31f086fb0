"""In-memory twins of the hot store and the cold archive (for unit speed only).

They enforce the same rules as the Redis and disk backends and pass the same conformance
tests; nothing that claims a guarantee rests on them alone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from cairn.errors import ArchiveConflict, CommitRefused, FencedWrite
from cairn.storage.base import GCEntry, GCInfo, LCEntry, LCLink, NextSuperstep, StepStart
from cairn.storage.keys import SPEC_DOC, check_name
from cairn.storage.records import GCStatus, GlobalCheckpoint, LCRef, Level, Usage


@dataclass(slots=True)
class _HotLC:
    entry: LCEntry


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
        self._attempts: dict[tuple[str, str], tuple[int, int, int]] = {}
        self._lcs: dict[tuple[str, str], _HotLC] = {}
        # (task, epoch, superstep) → the tentative LCs written in it: id → the parent it
        # rests on if that is tentative too, else "" (as write_lc.lua records them)
        self._superstep_lcs: dict[tuple[str, int, int], dict[str, str]] = {}
        self._votes: dict[tuple[str, int, int], dict[str, LCRef]] = {}
        self._gcs: dict[tuple[str, int], _HotGC] = {}
        self._latest: dict[str, int] = {}
        self._blobs: dict[tuple[str, str], bytes] = {}
        self._blob_times: dict[tuple[str, str], float] = {}
        self._progress: dict[tuple[str, int, int], dict[str, LCRef]] = {}
        self._beats: dict[tuple[str, str], tuple[str, float]] = {}
        self._docs: dict[tuple[str, str], bytes] = {}
        self._owners: dict[str, int] = {}
        self._spent: dict[tuple[str, int, int], dict[tuple[str, int, int], Usage]] = {}
        self._live: dict[tuple[str, str], tuple[bytes, float]] = {}  # → (data, until)

    def init_task(self, task: str) -> int:
        check_name("task", task)  # as cairn.storage.keys does for Redis
        with self._lock:
            return self._epochs.setdefault(task, 1)

    def get_epoch(self, task: str) -> int:
        with self._lock:
            return self._epochs.get(task, 0)

    def raise_epoch(self, task: str, to: int, owner: int | None = None) -> int:
        with self._lock:
            if owner is not None and self._owners.get(task) != owner:
                raise FencedWrite(f"coordinator token {owner} no longer owns the task")
            self._epochs[task] = max(self._epochs.get(task, 0), to)
            return self._epochs[task]

    def begin_attempt(
        self, task: str, agent: str, superstep: int, attempt: int, *, epoch: int | None = None
    ) -> None:
        with self._lock:
            current_epoch = self._epochs.get(task, 0)
            if epoch is not None and epoch != current_epoch:
                raise FencedWrite(f"stale epoch {epoch} (task is at {current_epoch})")
            wanted = (current_epoch, superstep, attempt)
            current = self._attempts.get((task, agent))
            if current is not None and current > wanted:
                raise FencedWrite(f"attempt {wanted} is older than {current}")
            self._attempts[(task, agent)] = wanted

    def begin_attempts(
        self,
        task: str,
        attempts: Mapping[str, int],
        superstep: int,
        *,
        epoch: int,
        prepare: GCEntry | None = None,
        owner: int | None = None,
    ) -> None:
        if prepare is not None:
            self.prepare_gc(prepare, owner)
        for agent, attempt in attempts.items():
            self.begin_attempt(task, agent, superstep, attempt, epoch=epoch)

    def write_first_lcs(self, entries: Iterable[LCEntry]) -> None:
        for entry in entries:
            lc = entry.record
            self.begin_attempt(lc.task, lc.agent, lc.superstep, lc.attempt, epoch=lc.epoch)
            self.write_lc(entry)

    def write_spawned_lcs(self, entries: Iterable[LCEntry], spawner: str, attempt: int) -> None:
        for entry in entries:
            lc = entry.record
            with self._lock:
                epoch = self._epochs.get(lc.task, 0)
                if epoch != lc.epoch:
                    raise FencedWrite(f"stale epoch {lc.epoch} (task is at {epoch})")
                current = self._attempts.get((lc.task, spawner))
                if current != (lc.epoch, lc.superstep, attempt):
                    raise FencedWrite(f"stale attempt {lc.epoch}:{lc.superstep}:{attempt} "
                                      f"(current {current})")  # fmt: skip
                old = self._lcs.get((lc.task, lc.id))
                if old is not None and old.entry.sealed.checksum != entry.sealed.checksum:
                    raise FencedWrite(f"LC {lc.id} exists with another checksum")
                if old is None:
                    self._lcs[(lc.task, lc.id)] = _HotLC(entry)
                    tentative = self._superstep_lcs.setdefault(
                        (lc.task, lc.epoch, lc.superstep), {}
                    )
                    tentative[lc.id] = ""

    def write_lc(self, entry: LCEntry, *, vote: bool = False) -> None:
        lc = entry.record
        check_name("task", lc.task)
        with self._lock:
            epoch = self._epochs.get(lc.task, 0)
            if epoch != lc.epoch:
                raise FencedWrite(f"stale epoch {lc.epoch} (task is at {epoch})")
            current = self._attempts.get((lc.task, lc.agent))
            if current != (lc.epoch, lc.superstep, lc.attempt):
                raise FencedWrite(
                    f"stale attempt {lc.epoch}:{lc.superstep}:{lc.attempt} (current {current})"
                )
            old = self._lcs.get((lc.task, lc.id))
            if old is not None and old.entry.sealed.checksum != entry.sealed.checksum:
                raise FencedWrite(f"LC {lc.id} exists with another checksum")
            superstep = (lc.task, lc.epoch, lc.superstep)
            if old is None:
                self._lcs[(lc.task, lc.id)] = _HotLC(entry)
                tentative = self._superstep_lcs.setdefault(superstep, {})
                rests_on = not lc.full and lc.parent_id in tentative
                tentative[lc.id] = (lc.parent_id or "") if rests_on else ""
            now = time.time()
            for sha, data in entry.blobs.items():
                self._blobs.setdefault((lc.task, sha), data)
                self._blob_times[(lc.task, sha)] = now
            ref = LCRef(id=lc.id, checksum=entry.sealed.checksum)
            if lc.level is Level.TOOL:
                self._progress.setdefault(superstep, {})[lc.agent] = ref
            if vote:
                self._votes.setdefault(superstep, {})[lc.agent] = ref

    def read_chain(self, task: str, lc_id: str, max_links: int) -> list[bytes]:
        with self._lock:
            out: list[bytes] = []
            current: str | None = lc_id
            while current is not None and len(out) < max_links:
                hot = self._lcs.get((task, current))
                if hot is None:
                    break
                out.append(hot.entry.sealed.data)
                lc = hot.entry.record
                current = None if lc.full else lc.parent_id
            return out

    def read_lcs(self, task: str, lc_ids: Iterable[str]) -> dict[str, bytes]:
        with self._lock:
            found = ((i, self._lcs.get((task, i))) for i in lc_ids)
            return {i: hot.entry.sealed.data for i, hot in found if hot is not None}

    def lc_link(self, task: str, lc_id: str) -> LCLink | None:
        with self._lock:
            hot = self._lcs.get((task, lc_id))
            if hot is None:
                return None
            e = hot.entry.record
            return LCLink(e.id, e.agent, e.parent_id, e.full)

    def walk_chains(self, task: str, heads: Iterable[str], known: Iterable[str] = ()) -> set[str]:
        with self._lock:
            seen = set(known)
            visited: set[str] = set()
            for head in heads:
                current: str | None = head
                while current is not None and current not in seen:
                    hot = self._lcs.get((task, current))
                    if hot is None:
                        break
                    seen.add(current)
                    visited.add(current)
                    lc = hot.entry.record
                    current = None if lc.full else lc.parent_id
            return visited

    def delete_lcs(self, task: str, lc_ids: Iterable[str]) -> None:
        with self._lock:
            for lc_id in lc_ids:
                self._lcs.pop((task, lc_id), None)

    def get_votes(self, task: str, epoch: int, superstep: int) -> dict[str, LCRef]:
        with self._lock:
            return dict(self._votes.get((task, epoch, superstep), {}))

    def step_start(
        self, task: str, agent: str, epoch: int, superstep: int, token: str, ttl_ms: int
    ) -> StepStart:
        self.beat(task, agent, token, ttl_ms)
        with self._lock:
            latest = self._latest.get(task)
            gc = None if latest is None else self._gcs.get((task, latest))
            current = self._attempts.get((task, agent))
            return StepStart(
                epoch=self._epochs.get(task, 0),
                latest=latest,
                gc=None if gc is None else gc.entry.sealed.data,
                progress=self._progress.get((task, epoch, superstep), {}).get(agent),
                spec=self._docs.get((task, SPEC_DOC)),
                current=None if current is None else ":".join(map(str, current)),
            )

    def get_progress(self, task: str, epoch: int, superstep: int, agent: str) -> LCRef | None:
        with self._lock:
            return self._progress.get((task, epoch, superstep), {}).get(agent)

    def beat(self, task: str, agent: str, token: str, ttl_ms: int) -> bool:
        check_name("agent", agent)
        with self._lock:
            current = self._attempts.get((task, agent))
            if current is not None and not token.endswith(":" + ":".join(map(str, current))):
                return False
            self._beats[(task, agent)] = (token, time.monotonic() + ttl_ms / 1000)
            return True

    def beating(self, task: str, agent: str) -> str | None:
        with self._lock:
            token, until = self._beats.get((task, agent), ("", 0.0))
            return token if until > time.monotonic() else None

    def record_spend(
        self,
        task: str,
        agent: str,
        epoch: int,
        superstep: int,
        attempt: int,
        usage: Usage,
        call: int = 0,
    ) -> bool:
        with self._lock:
            counted = self._spent.setdefault((task, epoch, superstep), {})
            if (agent, attempt, call) in counted:
                return False
            counted[(agent, attempt, call)] = usage
            return True

    def send_spend(
        self,
        task: str,
        agent: str,
        epoch: int,
        superstep: int,
        attempt: int,
        usage: Usage,
        call: int = 0,
    ) -> Callable[[], bool]:
        counted = self.record_spend(task, agent, epoch, superstep, attempt, usage, call)
        return lambda: counted

    def put_doc(self, task: str, name: str, data: bytes) -> None:
        check_name("task", task)
        check_name("document", name)
        with self._lock:
            self._docs[(task, name)] = data

    def get_doc(self, task: str, name: str) -> bytes | None:
        with self._lock:
            return self._docs.get((task, name))

    def delete_doc(self, task: str, name: str) -> None:
        with self._lock:
            self._docs.pop((task, name), None)

    def put_live(self, task: str, agent: str, data: bytes, ttl_ms: int) -> None:
        check_name("task", task)  # as cairn.storage.keys does for Redis
        check_name("agent", agent)
        with self._lock:
            self._live[(task, agent)] = (data, time.monotonic() + ttl_ms / 1000)

    def get_live(self, task: str, agents: Iterable[str]) -> dict[str, bytes]:
        now = time.monotonic()
        with self._lock:
            shown = {agent: self._live.get((task, agent)) for agent in agents}
        return {agent: kept[0] for agent, kept in shown.items() if kept and kept[1] > now}

    def clear_live(self, task: str, agent: str) -> None:
        with self._lock:
            self._live.pop((task, agent), None)

    def claim(self, task: str, token: int) -> None:
        with self._lock:
            current = self._owners.get(task, 0)
            if current > token:
                raise FencedWrite(f"task is owned by coordinator token {current}")
            self._owners[task] = token

    def _check_owner(self, task: str, owner: int | None) -> None:
        if owner is not None and self._owners.get(task) != owner:
            raise FencedWrite(f"coordinator token {owner} no longer owns the task")

    def prepare_gc(self, entry: GCEntry, owner: int | None = None) -> None:
        gc = entry.record
        with self._lock:
            self._check_owner(gc.task, owner)
            self._check_epoch(gc.task, gc.epoch)
            old = self._gc_status(gc.task, gc.number)
            if old is not None and old is not GCStatus.PREPARING:
                raise CommitRefused(f"GC {gc.number} is already {old.value}")
            self._gcs[(gc.task, gc.number)] = _HotGC(entry)

    def commit_gc(
        self, entry: GCEntry, owner: int | None = None, then: NextSuperstep | None = None
    ) -> bool:
        gc = entry.record
        with self._lock:
            self._check_owner(gc.task, owner)
            self._check_epoch(gc.task, gc.epoch)
            old = self._gcs.get((gc.task, gc.number))
            if old is not None and old.entry.record.status is GCStatus.COMMITTED:
                if old.entry.sealed.checksum == entry.sealed.checksum:
                    return False
                raise CommitRefused(f"GC {gc.number} is already committed")
            if old is not None and old.entry.record.status is GCStatus.ABORTED:
                raise CommitRefused(f"GC {gc.number} was aborted")
            if (gc.task, gc.workspace) not in self._blobs:
                raise CommitRefused(f"workspace manifest {gc.workspace} is not stored")
            for agent, ref in gc.members.items():
                hot = self._lcs.get((gc.task, ref.id))
                if hot is None:
                    raise CommitRefused(f"LC {ref.id} of {agent} is missing")
                if hot.entry.sealed.checksum != ref.checksum or hot.entry.record.agent != agent:
                    raise CommitRefused(f"LC {ref.id} of {agent} does not match its vote")
            begin = None if then is None else self._next_attempts(gc, then)
            self._gcs[(gc.task, gc.number)] = _HotGC(entry)
            self._drop_tentative(gc, keep=[ref.id for ref in gc.members.values()])
            if gc.number > self._latest.get(gc.task, -1):
                self._latest[gc.task] = gc.number
            if then is None or begin is None:
                return False
            self._gcs[(gc.task, then.prepare.record.number)] = _HotGC(then.prepare)
            for agent, wanted in begin.items():
                self._attempts[(gc.task, agent)] = wanted
            return True

    def _next_attempts(
        self, gc: GlobalCheckpoint, then: NextSuperstep
    ) -> dict[str, tuple[int, int, int]] | None:
        """The attempts `then` fences in, or None if its begin would be refused (held lock)."""
        nxt = then.prepare.record
        old = self._gc_status(gc.task, nxt.number)
        if old is not None and old is not GCStatus.PREPARING:
            return None
        wanted = {a: (gc.epoch, nxt.superstep, n) for a, n in then.attempts.items()}
        for agent, at in wanted.items():
            current = self._attempts.get((gc.task, agent))
            if current is not None and current > at:
                return None
        return wanted

    def _check_epoch(self, task: str, epoch: int) -> None:
        current = self._epochs.get(task, 0)
        if current != epoch:
            raise FencedWrite(f"stale epoch {epoch} (task is at {current})")

    def _gc_status(self, task: str, number: int) -> GCStatus | None:
        hot = self._gcs.get((task, number))
        return None if hot is None else hot.entry.record.status

    def confirm_replicas(self, task: str, number: int, replicas: int, timeout_ms: int) -> int:
        return 0  # one process's memory has no replicas

    def abort_gc(self, entry: GCEntry, owner: int | None = None) -> None:
        gc = entry.record
        with self._lock:
            self._check_owner(gc.task, owner)
            if self._gc_status(gc.task, gc.number) is GCStatus.COMMITTED:
                raise CommitRefused(f"GC {gc.number} is committed and cannot be aborted")
            self._gcs[(gc.task, gc.number)] = _HotGC(entry)
            self._drop_tentative(gc)

    def _drop_tentative(self, gc: GlobalCheckpoint, keep: Iterable[str] = ()) -> None:
        """End the superstep: drop its votes and its LCs but those `keep` and their chains.

        A kept LC's ancestors written in the same superstep stay too (it is a delta on
        them); every LC that survives is committed from here on.
        """
        key = (gc.task, gc.epoch, gc.superstep)
        tentative = self._superstep_lcs.pop(key, {})
        for lc_id in keep:
            current = lc_id
            while current in tentative:
                parent = tentative.pop(current)
                if not parent:
                    break
                current = parent
        for lc_id in tentative:
            self._lcs.pop((gc.task, lc_id), None)
        self._votes.pop(key, None)
        self._progress.pop(key, None)

    def read_gc(self, task: str, number: int) -> bytes | None:
        with self._lock:
            hot = self._gcs.get((task, number))
            return None if hot is None else hot.entry.sealed.data

    def list_gcs(self, task: str) -> list[GCInfo]:
        with self._lock:
            found = [
                GCInfo(n, h.entry.record.status, h.entry.record.superstep, h.entry.sealed.size)
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

    def get_blobs(self, task: str, shas: Iterable[str]) -> dict[str, bytes]:
        with self._lock:
            found = ((sha, self._blobs.get((task, sha))) for sha in shas)
            return {sha: data for sha, data in found if data is not None}

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
        self._docs: dict[tuple[str, str], bytes] = {}

    def put_doc(self, task: str, name: str, data: bytes) -> None:
        with self._lock:
            self._docs[(task, name)] = data

    def get_doc(self, task: str, name: str) -> bytes | None:
        with self._lock:
            return self._docs.get((task, name))

    def delete_doc(self, task: str, name: str) -> None:
        with self._lock:
            self._docs.pop((task, name), None)

    def update_doc(
        self, task: str, name: str, change: Callable[[bytes | None], bytes | None]
    ) -> None:
        with self._lock:
            data = change(self._docs.get((task, name)))
            if data is not None:
                self._docs[(task, name)] = data

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
            if self._gcs.setdefault((task, number), data) != data:
                raise ArchiveConflict(
                    f"archive already holds another GC {number} of task {task}; not replaced"
                )

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
            names |= {t for (t, _) in self._docs}
        return sorted(names)
