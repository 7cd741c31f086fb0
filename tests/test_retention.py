"""Retention in both tiers never drops the last copy of anything a committed GC names."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest
import redis

from cairn.storage.archive import archive_gc, sweep_blobs, trim_cold, trim_hot
from cairn.storage.backends.disk import DiskArchive
from cairn.storage.backends.memory import MemoryHotStore
from cairn.storage.codec import Codec
from cairn.storage.records import GCStatus
from cairn.storage.store import CheckpointStore
from tests.factories import read_gc_whole, run_task

TASK = "ret"


def _cold_only(store: CheckpointStore) -> CheckpointStore:
    assert isinstance(store.cold, DiskArchive)
    return CheckpointStore(MemoryHotStore(), DiskArchive(store.cold.root), Codec())


def _short_chains(store: CheckpointStore) -> CheckpointStore:
    """The same stores with a full LC every 3 steps, so old LCs are not all still needed."""
    return CheckpointStore(store.hot, store.cold, Codec(), full_every=3)


def test_unarchived_gcs_stay_hot(real_store: CheckpointStore) -> None:
    """A GC beyond hot_keep that is not yet archived is not dropped from Redis."""
    gcs = run_task(real_store, TASK, supersteps=8)
    for n in (1, 2, 3):
        archive_gc(real_store, TASK, n)
    report = trim_hot(real_store, TASK, hot_keep=2, skew_margin=0)
    assert [1, 2, 3] == report.gcs
    assert [4, 5, 6] == report.unarchived
    assert [4, 5, 6, 7, 8] == [i.number for i in real_store.hot.list_gcs(TASK)]
    for gc in gcs:  # every GC still reads whole, from wherever it is
        read_gc_whole(real_store, TASK, gc.number)


def test_trimmed_hot_keeps_what_kept_gcs_need(
    real_store: CheckpointStore, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """After archive + trim, Redis holds hot_keep GCs, each whole from Redis alone."""
    real_store = _short_chains(real_store)
    gcs = run_task(real_store, TASK, supersteps=9)
    expected = {gc.number: read_gc_whole(real_store, TASK, gc.number) for gc in gcs}
    for gc in gcs[:-2]:
        archive_gc(real_store, TASK, gc.number)
    report = trim_hot(real_store, TASK, hot_keep=2, skew_margin=0)
    assert list(range(1, 8)) == report.gcs
    assert report.lcs > 0
    assert report.blobs > 0
    assert [8, 9] == [i.number for i in real_store.hot.list_gcs(TASK)]
    # Kept GCs read whole with an empty archive: nothing they need left Redis.
    hot_only = CheckpointStore(real_store.hot, DiskArchive(tmp_path / "empty"), Codec())
    for n in (8, 9):
        assert expected[n] == read_gc_whole(hot_only, TASK, n)
    # Dropped GCs read whole from the archive.
    for n in range(1, 8):
        assert expected[n] == read_gc_whole(real_store, TASK, n)
    # The reviewer's LC carried over from an older superstep is still hot.
    assert real_store.hot.lc_link(TASK, real_store.read_gc(TASK, 8).members["reviewer"].id)
    assert redis_client.dbsize() > 0


def test_latest_stays_hot_even_when_old(real_store: CheckpointStore) -> None:
    """The GC `latest` points at is kept however old it is."""
    run_task(real_store, TASK, supersteps=5)
    for n in range(1, 6):
        archive_gc(real_store, TASK, n)
    report = trim_hot(real_store, TASK, hot_keep=1, skew_margin=0)
    assert [1, 2, 3, 4] == report.gcs
    assert [5] == [i.number for i in real_store.hot.list_gcs(TASK)]


def test_blobs_in_use_by_a_running_step_are_not_dropped(real_store: CheckpointStore) -> None:
    """A blob only old GCs named, put again by a step still running, stays hot."""
    run_task(real_store, TASK, supersteps=4)
    for n in range(1, 5):
        archive_gc(real_store, TASK, n)
    old_file = real_store.read_manifest(TASK, real_store.read_gc(TASK, 1).workspace).files
    sha = old_file["src/planner_1.py"]
    content = real_store.get_blob(TASK, sha)
    # a worker writes this content again for a change set not yet committed
    assert sha == real_store.put_blob(TASK, content)
    readme = old_file["README.md"]
    trim_hot(real_store, TASK, hot_keep=1, skew_margin=0)
    assert real_store.hot.get_blob(TASK, sha) is not None
    assert real_store.hot.get_blob(TASK, readme) is not None  # still named by GC 4


def test_blobs_too_young_to_leave_with_their_gc_leave_at_a_later_trim(
    real_store: CheckpointStore,
) -> None:
    """A blob spared by the skew margin when its GC left Redis goes once it is old enough."""
    run_task(real_store, TASK, supersteps=4)
    for n in range(1, 5):
        archive_gc(real_store, TASK, n)
    assert [1, 2, 3] == trim_hot(real_store, TASK, hot_keep=1, skew_margin=3600).gcs
    named = {real_store.read_gc(TASK, 4).workspace}
    named |= set(
        real_store.read_manifest(TASK, real_store.read_gc(TASK, 4).workspace).files.values()
    )
    assert set(real_store.hot.blob_times(TASK)) - named  # spared: too young a moment ago
    report = trim_hot(real_store, TASK, hot_keep=1, skew_margin=0)
    assert [] == report.gcs
    assert named == set(real_store.hot.blob_times(TASK))
    assert report.blobs > 0
    read_gc_whole(real_store, TASK, 4)


def test_trim_cold_then_sweep_keeps_the_kept_whole(real_store: CheckpointStore) -> None:
    """cold_keep bounds the archive; the GCs that stay read whole from disk alone."""
    real_store = _short_chains(real_store)
    gcs = run_task(real_store, TASK, supersteps=8)
    expected = {gc.number: read_gc_whole(real_store, TASK, gc.number) for gc in gcs}
    for gc in gcs:
        archive_gc(real_store, TASK, gc.number)
    trim_hot(real_store, TASK, hot_keep=1, skew_margin=0)
    cold = real_store.cold
    lcs_before = len(cold.list_lcs(TASK))
    blobs_before = len(cold.blob_times())
    assert [1, 2, 3, 4, 5] == trim_cold(real_store, TASK, cold_keep=3)
    assert [6, 7, 8] == cold.list_gcs(TASK)
    assert len(cold.list_lcs(TASK)) < lcs_before
    assert sweep_blobs(real_store, grace=3600) == 0  # too young to sweep
    removed = sweep_blobs(real_store, grace=0)
    assert 0 < removed < blobs_before
    cold_only = _cold_only(real_store)
    for n in (6, 7, 8):
        assert expected[n] == read_gc_whole(cold_only, TASK, n)
        assert GCStatus.COMMITTED == cold_only.read_gc(TASK, n).status


@pytest.mark.parametrize("keep", [0, -1])
def test_retention_bounds_must_be_positive(real_store: CheckpointStore, keep: int) -> None:
    """hot_keep and cold_keep below 1 are refused: they would drop the live state."""
    with pytest.raises(ValueError, match="at least 1"):
        trim_hot(real_store, TASK, keep)
    with pytest.raises(ValueError, match="at least 1"):
        trim_cold(real_store, TASK, keep)


def _walk_link_by_link(store: CheckpointStore, heads: Iterable[str]) -> set[str]:
    """The hot LCs on the chains from `heads`, found one `lc_link` at a time."""
    found: set[str] = set()
    for head in heads:
        current: str | None = head
        while current is not None and current not in found:
            link = store.hot.lc_link(TASK, current)
            if link is None:
                break
            found.add(current)
            current = None if link.full else link.parent_id
    return found


@pytest.mark.parametrize(("archived", "hot_keep"), [(12, 1), (12, 3), (7, 2), (3, 2)])
def test_trim_hot_drops_what_walking_link_by_link_finds(
    store: CheckpointStore, archived: int, hot_keep: int
) -> None:
    """The LCs trim_hot drops are those of dropped GCs' chains no kept GC's chain holds."""
    store = _short_chains(store)
    gcs = run_task(store, TASK, supersteps=12)
    for n in range(1, archived + 1):
        archive_gc(store, TASK, n)
    chains = {
        gc.number: _walk_link_by_link(store, [r.id for r in gc.members.values()]) for gc in gcs
    }
    keep = {gc.number for gc in gcs[-hot_keep:]}
    needed = set().union(*(chains[n] for n in keep))
    expected_gcs = [n for n in range(1, archived + 1) if n not in keep]
    expected_lcs = set().union(*(chains[n] for n in expected_gcs)) - needed
    everything = set().union(*chains.values())
    report = trim_hot(store, TASK, hot_keep=hot_keep, skew_margin=0)
    assert expected_gcs == report.gcs
    assert len(expected_lcs) == report.lcs > 0
    assert everything - expected_lcs == _walk_link_by_link(store, everything)
    assert [n for n in range(archived + 1, 13) if n not in keep] == report.unarchived


def test_trim_hot_walks_chains_in_two_round_trips(
    real_store: CheckpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kept chains in one walk, dropped ones in another, however long they are."""
    gcs = run_task(real_store, TASK, supersteps=10)
    for gc in gcs:
        archive_gc(real_store, TASK, gc.number)
    walks: list[int] = []
    walk = real_store.hot.walk_chains

    def counting(task: str, heads: Iterable[str], known: Iterable[str] = ()) -> set[str]:
        walks.append(1)
        return walk(task, heads, known)

    def refused(task: str, lc_id: str) -> None:
        raise AssertionError("an LC looked up on its own")

    monkeypatch.setattr(real_store.hot, "walk_chains", counting)
    monkeypatch.setattr(real_store.hot, "lc_link", refused)
    assert list(range(1, 8)) == trim_hot(real_store, TASK, hot_keep=3, skew_margin=0).gcs
    assert 2 == len(walks)


@pytest.mark.parametrize("cold_keep", [1, 4, 9])
def test_trim_cold_keeps_exactly_the_kept_gcs_chains(
    store: CheckpointStore, cold_keep: int
) -> None:
    """The archived LCs left are those on the chains of the GCs left, read link by link."""
    store = _short_chains(store)
    gcs = run_task(store, TASK, supersteps=12)
    for gc in gcs:
        archive_gc(store, TASK, gc.number)
    trim_hot(store, TASK, hot_keep=1, skew_margin=0)  # most chains now read from disk
    expected = {
        loaded.record.id
        for gc in gcs[-cold_keep:]
        for agent, ref in gc.members.items()
        for loaded in store.load_chain(TASK, agent, ref.id, ref.checksum)
    }
    assert list(range(1, 13 - cold_keep)) == trim_cold(store, TASK, cold_keep)
    assert expected == {lc_id for _, lc_id in store.cold.list_lcs(TASK)}


def test_trim_cold_deletes_each_agents_newest_lcs_first(
    real_store: CheckpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed midway, trim_cold leaves no archived LC whose parent it already deleted."""
    real_store = _short_chains(real_store)
    for gc in run_task(real_store, TASK, supersteps=9):
        archive_gc(real_store, TASK, gc.number)
    deleted: list[tuple[str, str]] = []
    delete_lc = real_store.cold.delete_lc

    def recording(task: str, agent: str, lc_id: str) -> None:
        deleted.append((agent, lc_id))
        delete_lc(task, agent, lc_id)

    monkeypatch.setattr(real_store.cold, "delete_lc", recording)
    trim_cold(real_store, TASK, cold_keep=1)
    for agent in ("planner", "coder", "reviewer"):
        ids = [lc_id for a, lc_id in deleted if a == agent]
        assert len(ids) > 1
        assert sorted(ids, reverse=True) == ids
