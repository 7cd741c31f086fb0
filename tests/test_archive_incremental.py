"""Archiving a GC reads and writes only the LCs the archive lacks, and verifies each one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from cairn.errors import ArchiveError, CorruptCheckpoint, RecordNotFound
from cairn.storage import keys
from cairn.storage.archive import archive_gc
from cairn.storage.backends.disk import DiskArchive
from cairn.storage.backends.memory import MemoryHotStore
from cairn.storage.backends.redis import RedisHotStore
from cairn.storage.base import LCEntry
from cairn.storage.chain import cut_lc
from cairn.storage.codec import Codec
from cairn.storage.records import GlobalCheckpoint, LCRef, Level, LocalCheckpoint, Record
from cairn.storage.store import CheckpointStore
from tests.factories import new_agent, read_gc_whole, run_task, take_step

TASK = "inc"
AGENTS = ("planner", "coder", "reviewer")


def _store(redis_client: redis.Redis, root: Path, full_every: int = 20) -> CheckpointStore:
    return CheckpointStore(RedisHotStore(redis_client), DiskArchive(root), Codec(), full_every)


def _cold_only(store: CheckpointStore) -> CheckpointStore:
    """The same archive behind an empty hot store: what is left after losing Redis."""
    assert isinstance(store.cold, DiskArchive)
    return CheckpointStore(MemoryHotStore(), DiskArchive(store.cold.root), Codec())


def _stepped(gcs: list[GlobalCheckpoint], number: int) -> int:
    """How many members of GC `number` are LCs the GC before it did not name."""
    before = {} if number == 1 else gcs[number - 2].members
    return sum(1 for a, ref in gcs[number - 1].members.items() if before.get(a) != ref)


@pytest.fixture
def lc_decodes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the id of every LC any codec decodes (read and verified)."""
    decoded: list[str] = []
    decode = Codec.decode_keeping  # what `decode` calls too

    def recording(
        self: Codec, data: bytes, model: type[Record], name: str, **kw: str | None
    ) -> tuple[Record, bytes]:
        record, payload = decode(self, data, model, name, **kw)
        if isinstance(record, LocalCheckpoint):
            decoded.append(record.id)
        return record, payload

    monkeypatch.setattr(Codec, "decode_keeping", recording)
    return decoded


@pytest.fixture
def lc_reads(real_store: CheckpointStore, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the batched hot LC reads (`read_lcs` calls, one round trip each)."""
    calls = [0]
    read_lcs = real_store.hot.read_lcs

    def counting(task: str, lc_ids: object) -> dict[str, bytes]:
        calls[0] += 1
        return read_lcs(task, lc_ids)  # type: ignore[arg-type]

    monkeypatch.setattr(real_store.hot, "read_lcs", counting)
    return calls


def test_each_gc_archives_only_its_new_lcs(
    real_store: CheckpointStore, lc_decodes: list[str], lc_reads: list[int]
) -> None:
    """Archiving GC n+1 after GC n reads, verifies and writes only the LCs GC n lacked."""
    gcs = run_task(real_store, TASK, supersteps=8)
    for gc in gcs:
        lc_decodes.clear()
        lc_reads[0] = 0
        report = archive_gc(real_store, TASK, gc.number)
        assert _stepped(gcs, gc.number) == report.lcs
        assert report.lcs == len(lc_decodes)  # nothing already archived is read again
        assert 1 == lc_reads[0]  # every agent's new LC in one round trip


def test_a_gap_archives_whole_chains_and_older_gcs_then_need_nothing(
    real_store: CheckpointStore, lc_reads: list[int]
) -> None:
    """Archiving GC 6 first writes its chains whole; GCs 1-5, their ancestors, add no LC."""
    gcs = run_task(real_store, TASK, supersteps=6)
    report = archive_gc(real_store, TASK, 6)
    assert 6 + 6 + 3 == report.lcs  # the reviewer halts every other superstep
    assert 6 == lc_reads[0]  # a generation of every chain per round trip
    for number in range(1, 6):
        assert 0 == archive_gc(real_store, TASK, number).lcs
    cold_only = _cold_only(real_store)
    for gc in gcs:
        assert read_gc_whole(real_store, TASK, gc.number) == read_gc_whole(
            cold_only, TASK, gc.number
        )


def test_lcs_are_written_oldest_first(real_store: CheckpointStore) -> None:
    """Within a chain every LC is put after its parent, so an archived LC has its ancestors."""
    run_task(real_store, TASK, supersteps=5)
    put: list[tuple[str, str]] = []
    put_lc = real_store.cold.put_lc

    def recording(task: str, agent: str, lc_id: str, data: bytes) -> None:
        put.append((agent, lc_id))
        put_lc(task, agent, lc_id, data)

    real_store.cold.put_lc = recording  # type: ignore[method-assign]
    archive_gc(real_store, TASK, 5)
    for agent in AGENTS:
        ids = [lc_id for a, lc_id in put if a == agent]
        depths = [real_store.read_lc(TASK, agent, lc_id).depth for lc_id in ids]
        assert sorted(depths) == depths
        assert 0 == depths[0]


def test_archived_chains_read_back_from_disk_alone_after_flushall(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    """GCs archived one by one over chains that restart at full LCs read whole without Redis."""
    store = _store(redis_client, tmp_path / "archive", full_every=4)
    gcs = run_task(store, TASK, supersteps=11)
    expected = {gc.number: read_gc_whole(store, TASK, gc.number) for gc in gcs}
    for gc in gcs:
        archive_gc(store, TASK, gc.number)
    redis_client.flushall()
    assert expected == {n: read_gc_whole(store, TASK, n) for n in expected}
    assert expected == {n: read_gc_whole(_cold_only(store), TASK, n) for n in expected}


def _damage(redis_client: redis.Redis, lc_id: str) -> None:
    """Flip the last byte of an LC's bytes in Redis: its CRC then refuses it."""
    key = keys.lc(TASK, lc_id)
    data = redis_client.hget(key, "data")
    assert isinstance(data, bytes)
    redis_client.hset(key, "data", data[:-1] + bytes([data[-1] ^ 1]))


def _raised(call: Callable[[], object]) -> tuple[type[BaseException], str]:
    with pytest.raises((CorruptCheckpoint, RecordNotFound)) as caught:
        call()
    return type(caught.value), str(caught.value)


@pytest.mark.parametrize("which", ["member", "parent"])
def test_a_corrupt_new_lc_fails_the_archive_and_writes_no_gc(
    real_store: CheckpointStore, redis_client: redis.Redis, which: str
) -> None:
    """A damaged LC among the new ones raises what reading its chain raises; no GC file."""
    gcs = run_task(real_store, TASK, supersteps=4)
    archive_gc(real_store, TASK, 1)
    # GC 3's coder LC is new since GC 1, and so is its parent, GC 2's.
    victim = gcs[2 if which == "member" else 1].members["coder"].id
    _damage(redis_client, victim)
    head = gcs[2].members["coder"]
    expected = _raised(lambda: real_store.load_chain(TASK, "coder", head.id, head.checksum))
    assert victim in expected[1]
    assert expected == _raised(lambda: archive_gc(real_store, TASK, 3))
    assert [1] == real_store.cold.list_gcs(TASK)


@pytest.mark.parametrize("damage", ["flip", "stand-in"])
def test_a_damaged_hot_blob_fails_the_archive_and_writes_no_gc(
    real_store: CheckpointStore, redis_client: redis.Redis, damage: str
) -> None:
    """A file blob whose Redis copy does not match its address is refused: no GC on disk.

    A flipped byte fails the blob's own checks; another blob's sound bytes under its key
    pass those and fail only the address. Either way the archive raises, naming the blob,
    and writes neither the blob nor the GC, which would then name a file never readable.
    """
    gcs = run_task(real_store, TASK, supersteps=2)
    archive_gc(real_store, TASK, 1)
    files = real_store.read_manifest(TASK, gcs[1].workspace).files
    victim, other = files["src/coder_2.py"], files["src/planner_2.py"]
    data = redis_client.get(keys.blob(TASK, victim if damage == "flip" else other))
    assert isinstance(data, bytes)
    if damage == "flip":
        data = data[:-1] + bytes([data[-1] ^ 1])
    redis_client.set(keys.blob(TASK, victim), data)
    with pytest.raises(CorruptCheckpoint, match=f"blob {victim}"):
        archive_gc(real_store, TASK, 2)
    assert [1] == real_store.cold.list_gcs(TASK)
    assert not real_store.cold.has_blob(victim)


def test_an_lc_missing_everywhere_fails_the_archive(real_store: CheckpointStore) -> None:
    """A new LC gone from Redis (and never archived) raises `RecordNotFound`; no GC file."""
    gcs = run_task(real_store, TASK, supersteps=3)
    archive_gc(real_store, TASK, 1)
    real_store.hot.delete_lcs(TASK, [gcs[1].members["planner"].id])
    with pytest.raises(RecordNotFound, match=gcs[1].members["planner"].id):
        archive_gc(real_store, TASK, 3)
    assert [1] == real_store.cold.list_gcs(TASK)


def test_another_lcs_sound_bytes_under_a_parents_key_are_refused(
    real_store: CheckpointStore, redis_client: redis.Redis
) -> None:
    """An older LC's bytes standing in for a new parent's: each sound, the link is not."""
    gcs = run_task(real_store, TASK, supersteps=3)
    parent, other = gcs[1].members["planner"].id, gcs[0].members["planner"].id
    stand_in = redis_client.hget(keys.lc(TASK, other), "data")
    assert isinstance(stand_in, bytes)
    redis_client.hset(keys.lc(TASK, parent), "data", stand_in)
    with pytest.raises(CorruptCheckpoint, match=parent):
        archive_gc(real_store, TASK, 3)
    assert [] == real_store.cold.list_gcs(TASK)


@pytest.mark.parametrize(
    ("field", "reason"),
    [("depth", "depth 5 after 0"), ("message_base", "delta does not start where its parent ends")],
)
def test_a_child_that_does_not_continue_its_parent_is_refused(
    store: CheckpointStore, field: str, reason: str
) -> None:
    """A sound child naming its parent rightly but at the wrong depth or offset is refused."""
    state = new_agent(store, TASK, "coder")
    take_step(state, 1)
    store.write_lc(state)
    take_step(state, 2)
    child = cut_lc(state, Level.STEP, store.full_every)
    child = child.model_copy(update={field: 5})
    sealed = store.codec.encode(child)
    store.hot.write_lc(LCEntry(child, sealed))
    with pytest.raises(CorruptCheckpoint, match=reason):
        store.load_unarchived(TASK, {"coder": LCRef(id=child.id, checksum=sealed.checksum)})


class _DyingArchive(DiskArchive):
    """A disk archive whose writer dies (raises) after a set number of LC writes."""

    def __init__(self, root: Path, lives: int) -> None:
        super().__init__(root)
        self.lives = lives

    def put_lc(self, task: str, agent: str, lc_id: str, data: bytes) -> None:
        if self.lives == 0:
            raise ArchiveError("killed")
        self.lives -= 1
        super().put_lc(task, agent, lc_id, data)


@pytest.mark.parametrize("lives", [1, 3, 6])  # of the 7 LCs GC 5 needs
def test_a_run_killed_midway_is_finished_by_the_next(
    redis_client: redis.Redis, tmp_path: Path, lives: int
) -> None:
    """After an archive dies midway through the LCs, the next run writes exactly the rest."""
    root = tmp_path / "archive"
    dying = CheckpointStore(RedisHotStore(redis_client), _DyingArchive(root, lives), Codec(), 3)
    gcs = run_task(dying, TASK, supersteps=5)
    expected = {gc.number: read_gc_whole(dying, TASK, gc.number) for gc in gcs}
    with pytest.raises(ArchiveError):
        archive_gc(dying, TASK, 5)
    assert [] == dying.cold.list_gcs(TASK)
    store = _store(redis_client, root, full_every=3)
    total = lives + archive_gc(store, TASK, 5).lcs
    assert total == len(store.cold.list_lcs(TASK))
    for gc in gcs:
        archive_gc(store, TASK, gc.number)
    redis_client.flushall()
    assert expected == {n: read_gc_whole(_cold_only(store), TASK, n) for n in expected}
