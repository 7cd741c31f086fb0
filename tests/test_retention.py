"""Retention in both tiers never drops the last copy of anything a committed GC names."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from storage.archive import archive_gc, sweep_blobs, trim_cold, trim_hot
from storage.backends.disk import DiskArchive
from storage.backends.memory import MemoryHotStore
from storage.codec import Codec
from storage.records import GCStatus
from storage.store import CheckpointStore
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
