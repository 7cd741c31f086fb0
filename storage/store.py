"""`CheckpointStore`: the one door to checkpoints, hot first and cold behind it.

It turns records into sealed bytes and back, cuts incremental LCs, rebuilds agent states
from their chains and reads transparently from Redis, then the archive. Callers never see
bytes, and never see a record that failed verification.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Generic, TypeVar

from pydantic import ConfigDict

from cairn.errors import CorruptCheckpoint, RecordNotFound
from cairn.storage.base import ColdArchive, GCEntry, HotStore, LCEntry, NextSuperstep
from cairn.storage.chain import (
    DEFAULT_FULL_EVERY,
    UnbuiltLC,
    WorkingState,
    base_after_write,
    check_link,
    cut_lc,
    rebuild_unbuilt,
)
from cairn.storage.codec import GC_ZSTD_LEVEL, Codec, Place, canonical_bytes, parse
from cairn.storage.keys import EPOCH_DOC
from cairn.storage.records import (
    EpochFloor,
    GCOrigin,
    GCStatus,
    GlobalCheckpoint,
    LCRef,
    Level,
    LocalCheckpoint,
    Record,
    WorkspaceManifest,
    utcnow,
)

MAX_CHAIN = 10_000  # guards a read against a cycle; real chains are at most full_every long

T = TypeVar("T")
R = TypeVar("R", bound=Record)
# An LC: whole, whole but its trace (counted, not built), or just its place in a chain.
P = TypeVar("P", "_ChainLink", LocalCheckpoint, UnbuiltLC)
Source = Callable[[], bytes | None]


def first_sound(name: str, sources: Iterable[Source], verify: Callable[[bytes], T]) -> T:
    """Return `verify` of the first source holding sound bytes (hot first, then cold).

    A copy that fails verification is skipped for the next one; when none is sound the
    first failure is raised, and when none has the record, `RecordNotFound`.
    """
    failure: CorruptCheckpoint | None = None
    for source in sources:
        data = source()
        if data is None:
            continue
        try:
            return verify(data)
        except CorruptCheckpoint as exc:
            failure = failure or exc
    if failure is not None:
        raise failure
    raise RecordNotFound(f"{name} is neither in Redis nor in the archive")


def _check_parent(parent: LocalCheckpoint, child: LocalCheckpoint) -> None:
    """Raise `CorruptCheckpoint` unless `child` continues `parent` as `rebuild` requires."""
    # A full LC holds the whole history; a delta ends where its base plus its own part do.
    start = (0, 0) if parent.full else (parent.message_base, parent.trace_base)
    messages, trace = start[0] + len(parent.messages), start[1] + len(parent.trace)
    check_link(parent, child, messages, trace)


@dataclass(frozen=True, slots=True)
class GCSummary:
    """A global checkpoint as listed: where it lives and how big it is.

    `damaged` says why an archived GC, in the archive only, cannot be read: its status is
    then `committed` (the archive holds no other), its superstep unknown (None) and its
    size the damaged file's.
    """

    number: int
    status: GCStatus
    superstep: int | None
    hot: bool
    cold: bool
    size: int
    damaged: str | None = None


class _ChainLink(Record):
    """The fields of an LC that place it in its chain (the rest is verified, not parsed)."""

    model_config = ConfigDict(extra="ignore")

    id: str
    task: str
    agent: str
    parent_id: str | None = None
    parent_checksum: str | None = None
    full: bool = True


@dataclass(frozen=True, slots=True)
class LoadedLC:
    """A verified local checkpoint together with the exact bytes it was read from."""

    record: LocalCheckpoint
    data: bytes


@dataclass(frozen=True, slots=True)
class _Verified(Generic[P]):
    """An LC parsed into a view, with the bytes it was read from and their verified JSON."""

    record: P
    data: bytes
    payload: bytes


class CheckpointStore:
    """Reads and writes checkpoints, blobs and manifests over a hot store and an archive."""

    def __init__(
        self,
        hot: HotStore,
        cold: ColdArchive,
        codec: Codec | None = None,
        full_every: int = DEFAULT_FULL_EVERY,
    ) -> None:
        if full_every < 1:
            raise ValueError("full_every must be at least 1")
        self.hot = hot
        self.cold = cold
        self.codec = codec or Codec()
        self.full_every = full_every

    # local checkpoints -------------------------------------------------------------------
    def write_lc(
        self,
        state: WorkingState,
        level: Level = Level.STEP,
        *,
        vote: bool = False,
        blobs: Iterable[bytes] = (),
        full: bool = False,
    ) -> LCRef:
        """Store the LC of `state` (fenced by its epoch and attempt), optionally voting with it.

        `blobs` (file contents, manifests: what the LC's change set names) are stored in the
        same write, as `put_blob` stores them; a refused write stores none. A step-level
        write moves `state.base` to the new LC, so the next delta starts there; a tool-level
        write leaves it, so a tool LC never becomes a parent. `full` writes the whole history
        off the `full_every` cadence (a read of this LC's descendants stops there). Raises
        `FencedWrite` when the state's epoch or attempt is no longer current.
        """
        lc = cut_lc(state, level, self.full_every, full=full)
        sealed = self.codec.encode(lc, Place.lc(lc.task, lc.agent, lc.id))
        puts = (self.codec.seal(content, keyed=False) for content in blobs)
        self.hot.write_lc(LCEntry(lc, sealed, {s.checksum: s.data for s in puts}), vote=vote)
        lc.checksum = sealed.checksum
        if level is Level.STEP:
            state.base = base_after_write(lc, state)
        return LCRef(id=lc.id, checksum=sealed.checksum)

    def write_first_lcs(
        self, states: Iterable[WorkingState], spawner: tuple[str, int] | None = None
    ) -> list[LCRef]:
        """Store the first step-level LC of each new member's `state`, in one round trip.

        Written by the step that spawned them, `spawner` (its agent and attempt): fenced by
        that attempt (`HotStore.write_spawned_lcs`). Else by a barrier: each state's attempt
        is begun and its LC written as `write_lc` writes it (`HotStore.write_first_lcs`).
        Returns their refs in order; raises `FencedWrite` as `write_lc` does.
        """
        states = list(states)
        lcs = [cut_lc(state, Level.STEP, self.full_every) for state in states]
        sealed = [self.codec.encode(lc, Place.lc(lc.task, lc.agent, lc.id)) for lc in lcs]
        entries = [LCEntry(lc, s) for lc, s in zip(lcs, sealed, strict=True)]
        if spawner is None:
            self.hot.write_first_lcs(entries)
        else:
            self.hot.write_spawned_lcs(entries, *spawner)
        refs = []
        for state, lc, s in zip(states, lcs, sealed, strict=True):
            lc.checksum = s.checksum
            state.base = base_after_write(lc, state)
            refs.append(LCRef(id=lc.id, checksum=s.checksum))
        return refs

    def load_chain(
        self, task: str, agent: str, lc_id: str, checksum: str | None = None
    ) -> list[LoadedLC]:
        """Return the verified chain from `lc_id` back to a full LC, newest first.

        Each record comes from Redis when it is there and sound, else from the archive.
        `checksum`, when given, is what the newest record must carry (as a GC names it).
        """
        chain = self._walk_chain(LocalCheckpoint, task, agent, lc_id, checksum)
        return [LoadedLC(loaded.record, loaded.data) for loaded in chain]

    def _walk_chain(
        self, view: type[P], task: str, agent: str, lc_id: str, checksum: str | None
    ) -> list[_Verified[P]]:
        """`load_chain`, each record parsed into `view`."""
        hot_bytes = self.hot.read_chain(task, lc_id, MAX_CHAIN)
        chain: list[_Verified[P]] = []
        wanted: str | None = lc_id
        expect = checksum
        while wanted is not None:
            if len(chain) >= MAX_CHAIN:
                raise CorruptCheckpoint(lc_id, "chain does not end (a cycle?)")
            hot_data = hot_bytes[len(chain)] if len(chain) < len(hot_bytes) else None
            loaded = self._load_as(view, task, agent, wanted, expect, hot_data)
            chain.append(loaded)
            lc = loaded.record
            if lc.full:
                break
            wanted, expect = lc.parent_id, lc.parent_checksum
        return chain

    def load_unarchived(self, task: str, heads: dict[str, LCRef]) -> dict[str, list[LoadedLC]]:
        """Return agent → the verified LCs of its chain that are not archived, newest first.

        Each chain runs from the agent's head (which must carry the checksum its ref names)
        back to a full LC or to the newest LC already archived, which is left out: the
        archive holds an LC only once it holds its ancestors. Every link read is checked as
        `rebuild` checks it (parent id and checksum, agent, depth, where the delta starts).
        The chains are read a generation at a time, all agents' in one round trip.
        """
        chains: dict[str, list[LoadedLC]] = {agent: [] for agent in heads}
        wanted: dict[str, tuple[str, str | None]] = {
            agent: (ref.id, ref.checksum) for agent, ref in heads.items()
        }
        while wanted:
            wanted = {a: w for a, w in wanted.items() if not self.cold.has_lc(task, a, w[0])}
            if not wanted:
                break
            hot = self.hot.read_lcs(task, [lc_id for lc_id, _ in wanted.values()])
            parents: dict[str, tuple[str, str | None]] = {}
            for agent, (lc_id, expect) in wanted.items():
                chain = chains[agent]
                if len(chain) >= MAX_CHAIN:
                    raise CorruptCheckpoint(chain[0].record.id, "chain does not end (a cycle?)")
                loaded = self._load_one(task, agent, lc_id, expect, hot.get(lc_id))
                if chain:
                    _check_parent(loaded.record, chain[-1].record)
                chain.append(loaded)
                lc = loaded.record
                if not lc.full and lc.parent_id is not None:
                    parents[agent] = (lc.parent_id, lc.parent_checksum)
            wanted = parents
        return chains

    def list_chain_ids(self, task: str, heads: Iterable[tuple[str, LCRef]]) -> set[str]:
        """Return the ids of every LC on the chains from `heads` (agent, ref) back to a full LC.

        An LC on many chains is read once, hot first, else from the archive, and verified
        against the checksum its first reader names (the head's ref or its child's parent
        checksum); only the fields placing it in its chain are parsed. A generation of
        every chain is read per round trip. Raises as `load_chain` does for an LC sound
        nowhere.
        """
        wanted: dict[str, tuple[str, str | None]] = {}  # lc id → (agent, expected checksum)
        for agent, ref in heads:
            wanted.setdefault(ref.id, (agent, ref.checksum))
        seen: set[str] = set()
        while wanted:  # every round adds ids to `seen` and asks for none of them again
            seen |= wanted.keys()
            hot = self.hot.read_lcs(task, wanted)
            parents: dict[str, tuple[str, str | None]] = {}
            for lc_id, (agent, expect) in wanted.items():
                link = self._load_link(task, agent, lc_id, expect, hot.get(lc_id))
                if not link.full and link.parent_id is not None and link.parent_id not in seen:
                    parents.setdefault(link.parent_id, (agent, link.parent_checksum))
            wanted = parents
        return seen

    def _load_link(
        self, task: str, agent: str, lc_id: str, expect: str | None, hot_data: bytes | None
    ) -> _ChainLink:
        """Verify one LC as `_load_one` does, parsing only where it sits in its chain."""
        return self._load_as(_ChainLink, task, agent, lc_id, expect, hot_data).record

    def _load_one(
        self, task: str, agent: str, lc_id: str, expect: str | None, hot_data: bytes | None
    ) -> LoadedLC:
        """Verify one LC from its hot bytes, falling back to the archive if absent or bad."""
        loaded = self._load_as(LocalCheckpoint, task, agent, lc_id, expect, hot_data)
        return LoadedLC(loaded.record, loaded.data)

    def _load_as(
        self,
        view: type[P],
        task: str,
        agent: str,
        lc_id: str,
        expect: str | None,
        hot_data: bytes | None,
    ) -> _Verified[P]:
        """Verify one LC (hot bytes, else the archive's) and parse it into `view`."""
        place = Place.lc(task, agent, lc_id)

        def verify(data: bytes) -> _Verified[P]:
            record, payload = self.codec.decode_keeping(data, view, place, expect_digest=expect)
            if (record.id, record.task, record.agent) != (lc_id, task, agent):
                raise CorruptCheckpoint(place.name, "record is not the one its key names")
            return _Verified(record, data, payload)

        return first_sound(
            place.name, (lambda: hot_data, lambda: self.cold.get_lc(task, agent, lc_id)), verify
        )

    def read_lc(self, task: str, agent: str, lc_id: str) -> LocalCheckpoint:
        """Return one verified LC as stored (a delta unless full)."""
        return self._load_one(task, agent, lc_id, None, self._hot_lc(task, lc_id)).record

    def read_lc_fields(self, task: str, agent: str, ref: LCRef, view: type[R]) -> R:
        """Return some fields of a verified LC, parsed into `view` (a model ignoring the rest).

        The whole record is still verified; only the history is not built, which is what
        makes a full LC of a long conversation cheap to look into.
        """
        return self._open_lc_fields(task, agent, ref, view, lambda: self._hot_lc(task, ref.id))

    def read_lcs_fields(self, task: str, refs: dict[str, LCRef], view: type[R]) -> dict[str, R]:
        """Return agent → `read_lc_fields` of its LC, for many agents, the hot LCs read at once.

        Every LC is verified against the checksum its ref names, as `read_lc_fields` does;
        one missing or unsound in Redis is read from the archive on its own. Raises as
        `read_lc_fields` does for the first LC sound nowhere.
        """
        hot = self.hot.read_lcs(task, [ref.id for ref in refs.values()])
        return {
            agent: self._open_lc_fields(task, agent, ref, view, partial(hot.get, ref.id))
            for agent, ref in refs.items()
        }

    def _open_lc_fields(self, task: str, agent: str, ref: LCRef, view: type[R], hot: Source) -> R:
        """Parse `view` from the first sound copy of an LC: `hot`, then the archive."""
        place = Place.lc(task, agent, ref.id)
        return first_sound(
            place.name,
            (hot, lambda: self.cold.get_lc(task, agent, ref.id)),
            lambda data: self.codec.decode(data, view, place, expect_digest=ref.checksum),
        )

    def _hot_lc(self, task: str, lc_id: str) -> bytes | None:
        found = self.hot.read_chain(task, lc_id, 1)
        return found[0] if found else None

    def read_state(
        self, task: str, agent: str, lc_id: str, checksum: str | None = None
    ) -> WorkingState:
        """Rebuild an agent's full state at `lc_id`, verifying every link of its chain.

        Every record is verified and parsed, but for its trace records: those are counted,
        and built from the verified JSON when the state's `trace` is first read.
        """
        chain = self._walk_chain(UnbuiltLC, task, agent, lc_id, checksum)
        return rebuild_unbuilt([(loaded.record, loaded.payload) for loaded in chain])

    # blobs and manifests -----------------------------------------------------------------
    def put_blob(self, task: str, content: bytes) -> str:
        """Store a file's content once per task; return its sha256 address.

        Call it for every blob a change set uses, even one already stored: each put marks
        the blob as in use, which keeps retention off it until its GC commits.
        """
        sealed = self.codec.seal(content, keyed=False)
        self.hot.put_blob(task, sealed.checksum, sealed.data)
        return sealed.checksum

    def get_blob(self, task: str, sha: str) -> bytes:
        """Return a blob's verified content, from Redis or else the archive."""
        return self._open_blob(sha, lambda: self.hot.get_blob(task, sha))

    def get_blobs(self, task: str, shas: Iterable[str]) -> dict[str, bytes]:
        """Return sha → `get_blob` of it, for many blobs, the hot ones read in one round trip.

        Each blob is verified against its address, as `get_blob` does; one missing or
        unsound in Redis is read from the archive on its own. Raises as `get_blob` does for
        the first blob sound nowhere.
        """
        wanted = list(dict.fromkeys(shas))
        hot = self.hot.get_blobs(task, wanted)
        return {sha: self._open_blob(sha, partial(hot.get, sha)) for sha in wanted}

    def _open_blob(self, sha: str, hot: Source) -> bytes:
        """Return the content of the first sound copy of a blob: `hot`, then the archive."""
        name = f"blob {sha}"
        return first_sound(
            name,
            (hot, lambda: self.cold.get_blob(sha)),
            lambda data: self.codec.open(data, name, expect_digest=sha),
        )

    def put_manifest(self, task: str, manifest: WorkspaceManifest) -> str:
        """Store a workspace manifest as a blob; return its id (the sha256 of its bytes)."""
        return self.put_blob(task, canonical_bytes(manifest))

    def read_manifest(self, task: str, manifest_id: str) -> WorkspaceManifest:
        """Return a verified workspace manifest."""
        return parse(WorkspaceManifest, self.get_blob(task, manifest_id), f"manifest {manifest_id}")

    # task documents ----------------------------------------------------------------------
    def put_doc(self, task: str, name: str, record: Record) -> None:
        """Store a task-level document in Redis and, durably, in the archive."""
        sealed = self.codec.encode(record, Place.doc(task, name))
        self.cold.put_doc(task, name, sealed.data)
        self.hot.put_doc(task, name, sealed.data)

    def delete_doc(self, task: str, name: str) -> None:
        """Delete a task-level document from the archive, then from Redis."""
        self.cold.delete_doc(task, name)
        self.hot.delete_doc(task, name)

    def raise_epoch(self, task: str, to: int, owner: int | None = None) -> int:
        """Raise the task's epoch to at least `to` (as `HotStore.raise_epoch`); return it.

        The archive's floor is raised to `to` first, durably: Redis may lose its counter
        (a FLUSHALL, a lost AOF), and a restore after that must still pick an epoch above
        every one handed out, or a zombie of a reused epoch could write again. A crash
        between the two writes leaves the floor above Redis, which only skips epochs. The
        floor never falls: it keeps the highest `to` any caller asked for, and a caller
        whose `owner` token no longer owns the task is refused (`FencedWrite`) before the
        archive is touched. Raises `ArchiveError` (and raises nothing) when the archive
        cannot record it.
        """
        if owner is not None:
            self.hot.claim(task, owner)  # a stale coordinator stops here, as Redis would stop it
        if to > self.hot.get_epoch(task):  # else nothing new is handed out: the floor has it
            self.cold.update_doc(task, EPOCH_DOC, partial(self._raised_floor, task, to))
        return self.hot.raise_epoch(task, to, owner)

    def _raised_floor(self, task: str, to: int, current: bytes | None) -> bytes | None:
        """The floor document raised to `to`, or None when it is that high already."""
        place = Place.doc(task, EPOCH_DOC)
        if current is not None:
            floor = self.codec.decode(current, EpochFloor, place).epoch
            if floor >= to:
                return None
        return self.codec.encode(EpochFloor(epoch=to), place).data

    def epoch_floor(self, task: str) -> int:
        """The highest epoch the archive recorded as handed out for `task` (0: none)."""
        data = self.cold.get_doc(task, EPOCH_DOC)
        if data is None:
            return 0
        return self.codec.decode(data, EpochFloor, Place.doc(task, EPOCH_DOC)).epoch

    def read_doc(self, task: str, name: str, model: type[R]) -> R:
        """Return a verified task-level document, from Redis or else the archive."""
        place = Place.doc(task, name)
        return first_sound(
            place.name,
            (lambda: self.hot.get_doc(task, name), lambda: self.cold.get_doc(task, name)),
            lambda data: self.codec.decode(data, model, place),
        )

    # global checkpoints ------------------------------------------------------------------
    def seal_gc(self, gc: GlobalCheckpoint) -> GCEntry:
        """Seal `gc` into the entry a hot store commits; set its checksum and size."""
        sealed = self.codec.encode(gc, Place.gc(gc.task, gc.number), level=GC_ZSTD_LEVEL)
        gc.checksum, gc.size = sealed.checksum, sealed.size
        return GCEntry(gc, sealed)

    def prepare_gc(self, gc: GlobalCheckpoint, owner: int | None = None) -> GlobalCheckpoint:
        """Record `gc` as PREPARING; return the record as stored.

        `owner`, a coordinator's lease token, makes the write conditional on it still
        owning the task (see `HotStore.claim`).
        """
        prepared = _preparing(gc)
        self.hot.prepare_gc(self.seal_gc(prepared), owner)
        return prepared

    def begin_superstep(
        self, intent: GlobalCheckpoint, attempts: Mapping[str, int], owner: int | None = None
    ) -> GlobalCheckpoint:
        """`prepare_gc(intent)` and each agent's attempt of its superstep begun, at once.

        The attempts are fenced in the intent's epoch (`HotStore.begin_attempts`); the first
        refusal is raised. Returns the prepared record.
        """
        prepared = _preparing(intent)
        self.hot.begin_attempts(intent.task, attempts, intent.superstep, epoch=intent.epoch,
                                prepare=self.seal_gc(prepared), owner=owner)  # fmt: skip
        return prepared

    def commit_gc(self, gc: GlobalCheckpoint, owner: int | None = None) -> GlobalCheckpoint:
        """Commit `gc` in one atomic write (the commit point); return the committed record.

        Raises `CommitRefused`, having written nothing, when a member LC is missing or has
        another checksum, the manifest is not stored, the epoch is stale or the GC aborted.
        """
        committed = gc.model_copy(update={"status": GCStatus.COMMITTED, "committed_at": utcnow()})
        self.hot.commit_gc(self.seal_gc(committed), owner)
        return committed

    def commit_and_begin(
        self, gc: GlobalCheckpoint, attempts: Mapping[str, int], owner: int | None = None
    ) -> tuple[GlobalCheckpoint, GlobalCheckpoint | None]:
        """`commit_gc(gc)`, and the superstep after it begun in the same atomic write.

        The next superstep is what `begin_superstep` would begin: GC `gc.number + 1` of
        superstep `gc.superstep + 1`, PREPARING, with `attempts` fenced in `gc`'s epoch.
        Returns the committed record and the prepared one, or None in its place when the
        next superstep was not begun (`gc` was committed before, or beginning it would be
        refused): the caller begins it with `begin_superstep`. Raises as `commit_gc` does.
        """
        committed = gc.model_copy(update={"status": GCStatus.COMMITTED, "committed_at": utcnow()})
        intent = _preparing(
            committed.written(GCOrigin.SUPERSTEP, number=gc.number + 1, superstep=gc.superstep + 1)
        )
        then = NextSuperstep(self.seal_gc(intent), attempts)
        began = self.hot.commit_gc(self.seal_gc(committed), owner, then)
        return committed, intent if began else None

    def abort_gc(self, gc: GlobalCheckpoint, owner: int | None = None) -> GlobalCheckpoint:
        """Mark `gc` ABORTED and drop its superstep's tentative LCs; return the record."""
        aborted = gc.model_copy(update={"status": GCStatus.ABORTED, "committed_at": None})
        self.hot.abort_gc(self.seal_gc(aborted), owner)
        return aborted

    def read_gc(self, task: str, number: int) -> GlobalCheckpoint:
        """Return a verified GC from Redis, or else from the archive."""
        return self.load_gc(task, number)[0]

    def load_gc(self, task: str, number: int) -> tuple[GlobalCheckpoint, bytes]:
        """Return a verified GC with the exact bytes it was read from."""
        place = Place.gc(task, number)

        def verify(data: bytes) -> tuple[GlobalCheckpoint, bytes]:
            gc = self.codec.decode(data, GlobalCheckpoint, place)
            if (gc.task, gc.number) != (task, number):
                raise CorruptCheckpoint(place.name, "record is not the one its key names")
            return gc, data

        return first_sound(
            place.name,
            (lambda: self.hot.read_gc(task, number), lambda: self.cold.get_gc(task, number)),
            verify,
        )

    def latest_gc(self, task: str) -> GlobalCheckpoint | None:
        """Return the latest committed GC named by Redis, else the newest sound archived one."""
        number = self.hot.latest_gc(task)
        if number is not None:
            return self.read_gc(task, number)
        for n in reversed(self.cold.list_gcs(task)):
            try:
                gc = self.read_gc(task, n)
            except (CorruptCheckpoint, RecordNotFound):  # damaged, or trimmed meanwhile
                continue
            if gc.status is GCStatus.COMMITTED:
                return gc
        return None

    def list_gcs(self, task: str) -> list[GCSummary]:
        """List every GC of a task, hot or cold, in number order.

        An archived GC whose record is damaged is listed, marked `damaged`; one trimmed
        from the archive while it was listed is not.
        """
        hot = {info.number: info for info in self.hot.list_gcs(task)}
        cold = set(self.cold.list_gcs(task))
        out = []
        for n in sorted(hot.keys() | cold):
            info = hot.get(n)
            if info is not None:
                out.append(GCSummary(n, info.status, info.superstep, True, n in cold, info.size))
                continue
            try:
                gc = self.read_gc(task, n)
            except RecordNotFound:
                continue
            except CorruptCheckpoint as exc:
                size = len(self.cold.get_gc(task, n) or b"")
                out.append(GCSummary(n, GCStatus.COMMITTED, None, False, True, size, str(exc)))
                continue
            out.append(GCSummary(n, gc.status, gc.superstep, False, True, gc.size))
        return out


def _preparing(gc: GlobalCheckpoint) -> GlobalCheckpoint:
    """`gc` as a PREPARING record."""
    return gc.model_copy(update={"status": GCStatus.PREPARING, "committed_at": None})
