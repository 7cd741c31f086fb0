"""The storage contract: what a hot store and a cold archive must do.

Backends move sealed bytes (see `cairn.storage.codec`) and enforce the protocol's rules (fencing,
atomic commit); they never parse records. `cairn.storage.store.CheckpointStore` builds on them.
Every backend has an in-memory twin in `cairn.storage.backends.memory`, and
`tests/test_conformance.py` runs the same tests against all of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from cairn.storage.codec import Sealed
from cairn.storage.records import GCStatus, GlobalCheckpoint, LCRef, LocalCheckpoint, Usage


@dataclass(frozen=True, slots=True)
class LCEntry:
    """A local checkpoint with its sealed bytes: the store indexes and fences by the record.

    `blobs` (address → sealed bytes) are stored in the same fenced write: the files and
    manifest its change set names, so a refused write stores none of them.
    """

    record: LocalCheckpoint
    sealed: Sealed
    blobs: Mapping[str, bytes] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class LCLink:
    """Where an LC sits in its chain, read without its body (for retention)."""

    id: str
    agent: str
    parent_id: str | None
    full: bool


@dataclass(frozen=True, slots=True)
class GCEntry:
    """A global checkpoint with its sealed bytes: what a commit checks and writes."""

    record: GlobalCheckpoint
    sealed: Sealed


@dataclass(frozen=True, slots=True)
class NextSuperstep:
    """The superstep a commit may begin in its own write: its GC to be and first attempts.

    `prepare` is the next GC as PREPARING (its epoch and superstep name the attempts'),
    `attempts` agent → the attempt fenced in.
    """

    prepare: GCEntry
    attempts: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class StepStart:
    """What a step reads to begin: the epoch, the latest GC, its progress, the task spec.

    Bytes are sealed records (None when Redis does not have them: read the archive).
    """

    epoch: int
    latest: int | None
    gc: bytes | None
    progress: LCRef | None
    spec: bytes | None
    current: str | None  # the agent's current "epoch:superstep:attempt" (begin_attempt)


@dataclass(frozen=True, slots=True)
class GCInfo:
    """A global checkpoint as listed, without reading its body."""

    number: int
    status: GCStatus
    superstep: int
    size: int


class HotStore(Protocol):
    """Live state in Redis (or its twin): fenced, atomic, bounded by retention."""

    def init_task(self, task: str) -> int:
        """Give a new task epoch 1 (a no-op for a known task); return its epoch."""

    def get_epoch(self, task: str) -> int:
        """Return the task's epoch, 0 when the task is unknown."""

    def raise_epoch(self, task: str, to: int, owner: int | None = None) -> int:
        """Raise the epoch to at least `to`, fencing older writers; return the epoch now.

        It never lowers the epoch, so a retried call is harmless. With `owner` (a
        coordinator's lease token) it raises `FencedWrite` once a newer coordinator owns
        the task.
        """

    def begin_attempt(
        self, task: str, agent: str, superstep: int, attempt: int, *, epoch: int | None = None
    ) -> None:
        """Make (epoch, superstep, attempt) the only attempt of `agent` allowed to write LCs.

        The epoch is the task's current one; a caller that names the `epoch` it acts for
        is refused (`FencedWrite`) once that is no longer current. It only moves forward:
        asking for an older attempt raises `FencedWrite`; the current one again is a no-op.
        """

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
        """`prepare_gc(prepare, owner)` if given, then each agent's `begin_attempt`, at once.

        One round trip for a whole superstep's start; the first refusal is raised, and the
        caller enqueues nothing then. Each part is idempotent as it is alone.
        """

    def write_lc(self, entry: LCEntry, *, vote: bool = False) -> None:
        """Store an LC (its vote, its blobs) if epoch and attempt are current, else `FencedWrite`.

        Each blob is put as `put_blob` puts it. Writing the same LC again is a no-op (its
        blobs' times refreshed), so a retried command is harmless. A store the coordinator
        watches wakes it with a vote (`cairn.coordinator.wakes`).
        """

    def write_first_lcs(self, entries: Iterable[LCEntry]) -> None:
        """Begin each LC's attempt (`begin_attempt` in its epoch), then write it: all at once.

        The first LCs of members who join at a barrier, in one round trip however many
        join. Each LC is written as `write_lc` writes it, and refused as it refuses; the
        first refusal is raised (`FencedWrite`); an LC written meanwhile is tentative, swept
        unless a GC names it. Each part is idempotent as it is alone.
        """

    def write_spawned_lcs(self, entries: Iterable[LCEntry], spawner: str, attempt: int) -> None:
        """Write the first LCs of members `spawner` spawned in its step, all at once.

        Fenced by the spawner's attempt (`attempt` of the LCs' epoch and superstep), as
        its own LC is: a zombie spawner writes none. The members get no attempt (the next
        superstep's begin fences their first step). Each LC is tentative until a GC names
        it; the first refusal is raised (`FencedWrite`); each write is idempotent.
        """

    def read_chain(self, task: str, lc_id: str, max_links: int) -> list[bytes]:
        """Return sealed LCs from `lc_id` back through parents, newest first.

        Stops after a full LC, a missing one, or `max_links` records.
        """

    def read_lcs(self, task: str, lc_ids: Iterable[str]) -> dict[str, bytes]:
        """Return lc_id → sealed bytes of those of `lc_ids` that are hot, in one round trip."""

    def lc_link(self, task: str, lc_id: str) -> LCLink | None:
        """Return the chain fields of a hot LC, or None when it is not hot."""

    def walk_chains(self, task: str, heads: Iterable[str], known: Iterable[str] = ()) -> set[str]:
        """Return the ids of the hot LCs on the chains from `heads` back, in one round trip.

        Each walk follows parent links and stops after a full LC, before a missing one, and
        before an id in `known` or already visited (never returned), so a cycle ends too.
        """

    def delete_lcs(self, task: str, lc_ids: Iterable[str]) -> None:
        """Drop LCs from the hot store (retention; they must be safe elsewhere)."""

    def get_votes(self, task: str, epoch: int, superstep: int) -> dict[str, LCRef]:
        """Return agent → voted LC for one superstep of one epoch."""

    def step_start(
        self, task: str, agent: str, epoch: int, superstep: int, token: str, ttl_ms: int
    ) -> StepStart:
        """Beat the step's heartbeat (fenced as `beat`) and read what it needs to begin."""

    def get_progress(self, task: str, epoch: int, superstep: int, agent: str) -> LCRef | None:
        """Return the latest tool-level LC `agent` wrote in this superstep, to resume from."""

    def beat(self, task: str, agent: str, token: str, ttl_ms: int) -> bool:
        """Say that `token` (a worker's step) is alive for the next `ttl_ms` milliseconds.

        Fenced like an LC write: False, and nothing written, once the agent's current
        attempt (`begin_attempt`) is another than the one `token` ends with
        (`:epoch:superstep:attempt`). A step is beaten before its first attempt begins.
        """

    def beating(self, task: str, agent: str) -> str | None:
        """Return the token of the live heartbeat of `agent`'s step, None once it lapsed."""

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
        """Count what model call `call` (from 0) of that step attempt spent; False if counted.

        Counters per agent that only rise (`cairn.storage.keys.spend`), apart from the restorable
        state, and the attempt's own entry (`cairn.storage.keys.attempt_spend`), which is what
        makes the count idempotent and holds the attempt's calls summed: a step may make
        more than one model call an attempt (a cut reply asked again with room).
        """

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
        """`record_spend` sent now and answered later: the returned call waits for the answer.

        The count is on its way to the store when this returns, so the caller runs its
        tools meanwhile; calling the answer raises what `record_spend` would have raised.
        """

    def put_doc(self, task: str, name: str, data: bytes) -> None:
        """Store (or replace) a task-level document: the task's spec, an approval."""

    def get_doc(self, task: str, name: str) -> bytes | None:
        """Return a task-level document, or None."""

    def delete_doc(self, task: str, name: str) -> None:
        """Delete a task-level document (gone already: nothing to do)."""

    def put_live(self, task: str, agent: str, data: bytes, ttl_ms: int) -> None:
        """Show `data` as the reply `agent`'s model is streaming, for the next `ttl_ms` ms.

        It replaces what was shown; shown bytes are never part of a checkpoint.
        """

    def get_live(self, task: str, agents: Iterable[str]) -> dict[str, bytes]:
        """Return agent → what `put_live` shows now, for those of `agents` that have one."""

    def clear_live(self, task: str, agent: str) -> None:
        """Stop showing a streaming reply of `agent` (none shown: nothing to do)."""

    def claim(self, task: str, token: int) -> None:
        """Make the coordinator holding lease `token` the task's owner, or `FencedWrite`.

        The owner token only rises: once a newer coordinator claimed the task, an older
        one's claim is refused, and so are its GC writes that name its token.
        """

    def prepare_gc(self, entry: GCEntry, owner: int | None = None) -> None:
        """Record a PREPARING global checkpoint (`CommitRefused` if it is already decided).

        `FencedWrite` when the epoch is stale or, with `owner`, that token no longer owns
        the task.
        """

    def commit_gc(
        self, entry: GCEntry, owner: int | None = None, then: NextSuperstep | None = None
    ) -> bool:
        """Atomically commit a GC and move `latest`, or raise, writing nothing.

        `FencedWrite` when the epoch is stale or `owner` no longer owns the task;
        `CommitRefused` when the GC was aborted, the workspace manifest is not hot, or a
        member LC is missing or has another checksum. Committing twice is a no-op.
        With `then`, the same atomic write also begins the next superstep, as
        `begin_attempts(..., prepare=then.prepare)` would, if that would not be refused.
        True when it did; False when it did not (no `then`, a refusal, or a GC committed
        before: the caller begins it apart).
        """

    def confirm_replicas(self, task: str, number: int, replicas: int, timeout_ms: int) -> int:
        """Wait until `replicas` replicas hold committed GC `number` of `task`; say how many do.

        Waits at most `timeout_ms` (> 0) and returns the replicas that hold the GC and every
        write before it: fewer than asked when the time ran out, 0 when this store has no
        such committed GC or no replicas at all.
        """

    def abort_gc(self, entry: GCEntry, owner: int | None = None) -> None:
        """Mark a GC ABORTED and delete the superstep's tentative LCs and votes.

        `CommitRefused` for a committed GC; `FencedWrite` when `owner` no longer owns the
        task.
        """

    def read_gc(self, task: str, number: int) -> bytes | None:
        """Return a GC's sealed bytes, or None when it is not hot."""

    def list_gcs(self, task: str) -> list[GCInfo]:
        """Return the task's hot GCs (every status) in number order."""

    def latest_gc(self, task: str) -> int | None:
        """Return the number of the latest committed GC, or None."""

    def delete_gc(self, task: str, number: int) -> None:
        """Drop a GC record from the hot store (retention)."""

    def put_blob(self, task: str, sha: str, data: bytes) -> None:
        """Store a blob under its address once; every put refreshes its last-written time."""

    def get_blob(self, task: str, sha: str) -> bytes | None:
        """Return a blob's sealed bytes, or None when it is not hot."""

    def get_blobs(self, task: str, shas: Iterable[str]) -> dict[str, bytes]:
        """Return sha → sealed bytes of those of `shas` that are hot, in one round trip."""

    def blob_times(self, task: str) -> dict[str, float]:
        """Return sha → when the blob was last put (Unix seconds) for every hot blob."""

    def delete_blobs(self, task: str, shas: Iterable[str]) -> None:
        """Drop blobs from the hot store (retention)."""


class ColdArchive(Protocol):
    """The archive on disk (or its twin): write-once files, the ground truth once written."""

    def put_blob(self, sha: str, data: bytes) -> None:
        """Store a blob under its address, durable at the next `sync` (a touch if present)."""

    def get_blob(self, sha: str) -> bytes | None:
        """Return a blob's sealed bytes, or None."""

    def has_blob(self, sha: str) -> bool:
        """True when the blob is archived (its time is refreshed, protecting it from sweeps)."""

    def blob_times(self) -> dict[str, float]:
        """Return sha → last-written time (Unix seconds) of every archived blob."""

    def delete_blob(self, sha: str) -> None:
        """Remove an archived blob (sweeping)."""

    def put_lc(self, task: str, agent: str, lc_id: str, data: bytes) -> None:
        """Store an LC, durable at the next `sync` (a no-op if present)."""

    def get_lc(self, task: str, agent: str, lc_id: str) -> bytes | None:
        """Return an archived LC's sealed bytes, or None."""

    def has_lc(self, task: str, agent: str, lc_id: str) -> bool:
        """True when the LC is archived."""

    def list_lcs(self, task: str) -> list[tuple[str, str]]:
        """Return (agent, lc_id) of every archived LC of the task."""

    def delete_lc(self, task: str, agent: str, lc_id: str) -> None:
        """Remove an archived LC (retention)."""

    def sync(self) -> None:
        """Make every put so far durable (puts may defer part of their durability to here)."""

    def put_gc(self, task: str, number: int, data: bytes) -> None:
        """Sync, then store a GC durably: call it once everything the GC names is put.

        Write-once: the same bytes again are a no-op, other bytes under a number already
        archived raise `ArchiveConflict` and leave the archived GC as it was.
        """

    def get_gc(self, task: str, number: int) -> bytes | None:
        """Return an archived GC's sealed bytes, or None."""

    def list_gcs(self, task: str) -> list[int]:
        """Return the archived GC numbers of a task, ascending."""

    def delete_gc(self, task: str, number: int) -> None:
        """Remove an archived GC (retention); what it named is swept separately."""

    def put_doc(self, task: str, name: str, data: bytes) -> None:
        """Store (or replace) a task-level document durably."""

    def get_doc(self, task: str, name: str) -> bytes | None:
        """Return an archived task-level document, or None."""

    def delete_doc(self, task: str, name: str) -> None:
        """Delete an archived task-level document (gone already: nothing to do)."""

    def update_doc(
        self, task: str, name: str, change: Callable[[bytes | None], bytes | None]
    ) -> None:
        """Replace a document by `change(current)` durably (None: leave it as it is).

        Updates of one document are serialized, across processes too: `change` sees what
        the last one wrote, so a read-modify-write (a floor that only rises) loses nothing.
        """

    def tasks(self) -> list[str]:
        """Return every task with something archived."""
