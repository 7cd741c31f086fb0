"""Moving committed global checkpoints to disk, and retention in both tiers.

`archive_gc` copies a committed GC and everything it names (every LC of every member's
chain, the manifest, every file blob) to the archive, verifying each record on the way and
writing the GC file last: a GC exists on disk only once all it names is there. LCs go
oldest first, so an archived LC always has its ancestors archived and a chain is read only
back to its first archived LC: archiving GC after GC reads and writes each LC once. It is
idempotent and resumable: a run killed midway is finished by the next one.

`trim_hot` keeps `hot_keep` committed GCs (and the latest) in Redis and drops older ones
only once they are archived. `trim_cold` keeps `cold_keep` GCs on disk; `sweep_blobs`
removes archived blobs that no archived GC names.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from cairn.errors import ArchiveConflict, NotCommitted
from cairn.storage.aborted import note_aborted
from cairn.storage.codec import Codec
from cairn.storage.public import public
from cairn.storage.records import GCStatus, GlobalCheckpoint
from cairn.storage.store import CheckpointStore

# Blob times come from worker clocks and GC times from the coordinator's: allow this much
# skew before believing a blob is unused.
DEFAULT_SKEW_MARGIN = 300.0
# An archived blob written this recently may belong to a GC still being archived.
DEFAULT_SWEEP_GRACE = 3600.0
ARCHIVE_THREADS = 4


@public
@dataclass(frozen=True, slots=True)
class ArchiveReport:
    """What one `archive_gc` call wrote (zero everywhere when it was already archived)."""

    number: int
    lcs: int
    blobs: int
    bytes: int


def archive_gc(store: CheckpointStore, task: str, number: int) -> ArchiveReport:
    """Archive committed GC `number` of `task` and all it names; return what was written.

    Raises `ArchiveConflict` when the archive holds another GC under that number (Redis
    lost writes and the number was handed out again): the archived GC is never replaced.
    """
    cold = store.cold
    archived = cold.get_gc(task, number)
    if archived is not None:
        hot = store.hot.read_gc(task, number)
        if hot is not None and not same_record(hot, archived):
            raise ArchiveConflict(
                f"gc {task}/{number} in Redis has checksum {_digest(hot)}, the archived GC "
                f"{number} has {_digest(archived)}: the number was handed out twice (this "
                "Redis lacks writes the archive had seen: lost with a restart, or made on a "
                "primary since replaced); the archived GC is kept"
            )
        return ArchiveReport(number, 0, 0, 0)
    gc, gc_bytes = store.load_gc(task, number)
    if gc.status is not GCStatus.COMMITTED:
        raise NotCommitted(f"gc {task}/{number} is {gc.status.value}, not COMMITTED")
    lcs = blobs = written = 0
    for agent, chain in store.load_unarchived(task, gc.members).items():
        # Oldest first: an archived LC then always has its ancestors archived, which is
        # what lets the next run stop its walk at the first archived LC.
        for loaded in reversed(chain):
            cold.put_lc(task, agent, loaded.record.id, loaded.data)
            lcs += 1
            written += len(loaded.data)
    manifest = store.read_manifest(task, gc.workspace)

    def archive_blob(sha: str) -> int:
        if cold.has_blob(sha):
            return 0
        data = _verified_blob(store, task, sha)
        cold.put_blob(sha, data)
        return len(data)

    # Each file's fsync waits on the disk, not the GIL: a few at once share journal commits.
    with ThreadPoolExecutor(max_workers=ARCHIVE_THREADS) as pool:
        sizes = list(pool.map(archive_blob, [*sorted(set(manifest.files.values())), gc.workspace]))
    blobs = sum(1 for size in sizes if size)
    written += sum(sizes)
    cold.put_gc(task, number, gc_bytes)
    return ArchiveReport(number, lcs, blobs, written + len(gc_bytes))


def same_record(one: bytes, other: bytes) -> bool:
    """True when two sealed copies name the same checksum (the same record)."""
    digest = Codec.named_digest(one)
    return digest is not None and digest == Codec.named_digest(other)


def _digest(data: bytes) -> str:
    return f"{(Codec.named_digest(data) or 'none')[:12]}…"


def _verified_blob(store: CheckpointStore, task: str, sha: str) -> bytes:
    """Return a hot blob's sealed bytes after checking them against their address."""
    data = store.hot.get_blob(task, sha)
    if data is None:
        # Already gone from Redis: it must then come from the archive, which has it only
        # if some archived GC named it; reading verifies, and re-sealing gives the bytes.
        return store.codec.seal(store.get_blob(task, sha), keyed=False).data
    store.codec.open(data, f"blob {sha}", expect_digest=sha)
    return data


@dataclass(frozen=True, slots=True)
class TrimReport:
    """What `trim_hot` dropped, and which old GCs it kept because they are not archived."""

    gcs: list[int]
    lcs: int
    blobs: int
    unarchived: list[int]


def trim_hot(
    store: CheckpointStore,
    task: str,
    hot_keep: int,
    *,
    skew_margin: float = DEFAULT_SKEW_MARGIN,
) -> TrimReport:
    """Drop from Redis the GCs older than the newest `hot_keep` committed ones.

    The latest GC and every GC not yet decided stay. A GC leaves only once it is in the
    archive, and with it go the LCs that no kept GC needs and every blob of the task that
    no GC staying names; a blob put after the oldest kept GC committed (less
    `skew_margin`: by a step still running) is never dropped.
    """
    if hot_keep < 1:
        raise ValueError("hot_keep must be at least 1")
    hot = store.hot
    infos = hot.list_gcs(task)
    committed = [i.number for i in infos if i.status is GCStatus.COMMITTED]
    keep = set(committed[-hot_keep:])
    latest = hot.latest_gc(task)
    if latest is not None:
        keep.add(latest)
    if not keep:
        return TrimReport([], 0, 0, [])
    oldest_kept = min(keep)
    droppable = [
        i.number
        for i in infos
        if i.number not in keep
        and (
            i.status is GCStatus.COMMITTED
            or (i.status is GCStatus.ABORTED and i.number < oldest_kept)
        )
    ]
    on_disk = set(store.cold.list_gcs(task))
    # Archived means this very GC is on disk, not just a GC of that number (see archive_gc).
    archived = {n for n in droppable if n in on_disk and _archived_alike(store, task, n)}
    unarchived = [n for n in droppable if n not in archived and n in committed]
    dropping = [n for n in droppable if n not in unarchived]
    kept_gcs = [store.read_gc(task, n) for n in sorted(keep)]
    needed_lcs = hot.walk_chains(task, _heads(kept_gcs))
    # The committed GCs that stay in Redis unarchived need their blobs there too.
    staying = [store.read_gc(task, n) for n in unarchived if n not in keep]
    needed_blobs = _blobs_of(store, task, [*kept_gcs, *staying])
    read = [store.read_gc(task, n) for n in dropping]
    dropped_gcs = [gc for gc in read if gc.status is GCStatus.COMMITTED]
    # Never archived, an aborted GC leaves a note there first: its number is no bare gap.
    note_aborted(store, task, (gc for gc in read if gc.status is GCStatus.ABORTED))
    # The kept chains are closed under "parent of": a walk from a dropped GC that reaches
    # one of their LCs would find only kept LCs beyond it, so it stops there.
    lcs_out = hot.walk_chains(task, _heads(dropped_gcs), known=needed_lcs)
    # Blobs put after this moment may belong to a change set not yet committed.
    cutoff = min(gc.committed_at or gc.created_at for gc in kept_gcs).timestamp() - skew_margin
    # Every blob of the task older than that and named by no GC that stays goes, not only
    # the dropped GCs' own: one too young to leave with its GC (supersteps shorter than the
    # margin) would otherwise stay until the task leaves Redis. A blob no GC names is not
    # in the archive either: nothing reads it once its superstep is over.
    times = hot.blob_times(task)
    blobs_out = {s for s, written in times.items() if written < cutoff and s not in needed_blobs}
    hot.delete_lcs(task, lcs_out)
    hot.delete_blobs(task, blobs_out)
    for n in dropping:
        hot.delete_gc(task, n)
    return TrimReport(sorted(dropping), len(lcs_out), len(blobs_out), unarchived)


def _archived_alike(store: CheckpointStore, task: str, number: int) -> bool:
    """True when the archive's GC `number` has the checksum of the one in Redis."""
    hot, cold = store.hot.read_gc(task, number), store.cold.get_gc(task, number)
    return hot is None or (cold is not None and same_record(hot, cold))


def _heads(gcs: Iterable[GlobalCheckpoint]) -> list[str]:
    """Return the member LC ids of the GCs, each once."""
    return list(dict.fromkeys(ref.id for gc in gcs for ref in gc.members.values()))


def _blobs_of(store: CheckpointStore, task: str, gcs: Iterable[GlobalCheckpoint]) -> set[str]:
    """Return the manifest and file blobs the GCs name."""
    shas: set[str] = set()
    for gc in gcs:
        shas.add(gc.workspace)
        shas |= set(store.read_manifest(task, gc.workspace).files.values())
    return shas


def trim_cold(store: CheckpointStore, task: str, cold_keep: int) -> list[int]:
    """Delete archived GCs of `task` beyond the newest `cold_keep` (the latest always stays).

    GC files go first, so no listed GC ever names a deleted LC; then the LCs no remaining
    archived GC needs. Blobs are shared across tasks: `sweep_blobs` removes them. Do not run
    it while `archive_gc` runs for the same task (the coordinator serializes them).
    """
    if cold_keep < 1:
        raise ValueError("cold_keep must be at least 1")
    cold = store.cold
    numbers = cold.list_gcs(task)
    keep = set(numbers[-cold_keep:])
    latest = store.hot.latest_gc(task)
    if latest is not None and latest in numbers:
        keep.add(latest)
    dropped = [n for n in numbers if n not in keep]
    if not dropped:
        return []  # nothing leaves, so no LC can become unneeded: skip reading the chains
    for n in dropped:
        cold.delete_gc(task, n)
    kept = [store.read_gc(task, n) for n in sorted(keep)]
    needed = store.list_chain_ids(task, [(a, ref) for gc in kept for a, ref in gc.members.items()])
    # Newest first (ids sort by time): a run killed midway leaves no archived LC whose
    # parent it deleted, which `archive_gc`, stopping at the first archived LC, relies on.
    for agent, lc_id in sorted(cold.list_lcs(task), reverse=True):
        if lc_id not in needed:
            cold.delete_lc(task, agent, lc_id)
    return dropped


def sweep_blobs(store: CheckpointStore, *, grace: float = DEFAULT_SWEEP_GRACE) -> int:
    """Delete archived blobs that no archived GC of any task names; return how many.

    Blobs written within `grace` seconds are spared: their GC may still be on its way.
    """
    cold = store.cold
    named: set[str] = set()
    for task in cold.tasks():
        named |= _blobs_of(store, task, (store.read_gc(task, n) for n in cold.list_gcs(task)))
    horizon = time.time() - grace
    removed = 0
    for sha, written in cold.blob_times().items():
        if sha not in named and written < horizon:
            cold.delete_blob(sha)
            removed += 1
    return removed
