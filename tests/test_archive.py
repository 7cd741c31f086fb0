"""The cold archive on a real disk behind real Redis: recovery, corruption, crashes, full disks."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import cast

import pytest
import redis

from cairn.errors import ArchiveError, CorruptCheckpoint, NotCommitted
from cairn.storage.archive import archive_gc
from cairn.storage.backends.disk import DiskArchive
from cairn.storage.backends.memory import MemoryHotStore
from cairn.storage.backends.redis import RedisHotStore, connect
from cairn.storage.codec import Codec
from cairn.storage.store import CheckpointStore
from cairn.testing.redis_server import RedisServer
from tests.factories import make_gc, manifest, new_agent, read_gc_whole, run_task, take_step

TASK = "arch"


def test_flushall_then_everything_reads_from_cold(
    real_store: CheckpointStore, redis_client: redis.Redis
) -> None:
    """Archive every GC, lose all of Redis, and read identical states and files from disk."""
    gcs = run_task(real_store, TASK, supersteps=6)
    for gc in gcs:
        archive_gc(real_store, TASK, gc.number)
    before = {gc.number: read_gc_whole(real_store, TASK, gc.number) for gc in gcs}
    redis_client.flushall()
    assert real_store.hot.latest_gc(TASK) is None
    after = {gc.number: read_gc_whole(real_store, TASK, gc.number) for gc in gcs}
    assert before == after
    latest = real_store.latest_gc(TASK)
    assert latest is not None
    assert 6 == latest.number
    assert [(n, False, True) for n in range(1, 7)] == [
        (s.number, s.hot, s.cold) for s in real_store.list_gcs(TASK)
    ]


def test_archiving_is_idempotent_and_incremental(real_store: CheckpointStore) -> None:
    """Archiving a GC twice writes nothing the second time; the next GC writes only news."""
    gcs = run_task(real_store, TASK, supersteps=3)
    first = archive_gc(real_store, TASK, 1)
    assert first.lcs == 3
    assert first.blobs > 0
    assert (0, 0) == (archive_gc(real_store, TASK, 1).lcs, archive_gc(real_store, TASK, 1).blobs)
    second = archive_gc(real_store, TASK, 2)
    assert 2 == second.lcs  # the reviewer halted: its LC was archived with GC 1
    assert len(gcs) == 3


def test_only_committed_gcs_are_archived(real_store: CheckpointStore) -> None:
    """A PREPARING GC is not archived."""
    state = new_agent(real_store, TASK, "coder")
    take_step(state, 1)
    ref = real_store.write_lc(state, vote=True)
    ws = manifest(real_store, TASK, {"a": b"a"})
    real_store.prepare_gc(make_gc(TASK, 1, 1, 1, {"coder": ref}, ws))
    with pytest.raises(NotCommitted):
        archive_gc(real_store, TASK, 1)
    assert [] == real_store.cold.list_gcs(TASK)


def _read_all(store: CheckpointStore, numbers: list[int]) -> None:
    for number in numbers:
        read_gc_whole(store, TASK, number)


def _archive_all(store: CheckpointStore, numbers: list[int]) -> None:
    for number in numbers:
        archive_gc(store, TASK, number)


def _archived_files(root: Path, kind: str) -> list[Path]:
    pattern = {"gc": "tasks/*/gc/*.rec", "lc": "tasks/*/lc/*/*.rec", "blob": "blobs/sha256/*/*.rec"}
    return sorted(root.glob(pattern[kind]))


@pytest.mark.parametrize("kind", ["gc", "lc", "blob"])
@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_damaged_archive_file_is_detected_and_named(
    real_store: CheckpointStore, redis_client: redis.Redis, tmp_path: Path, kind: str, damage: str
) -> None:
    """A flipped byte or a cut-short file in the archive raises CorruptCheckpoint naming it."""
    gcs = run_task(real_store, TASK, supersteps=2)
    for gc in gcs:
        archive_gc(real_store, TASK, gc.number)
    redis_client.flushall()
    root = tmp_path / "archive"
    victim = random.Random(7).choice(_archived_files(root, kind))
    data = bytearray(victim.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x40
    else:
        del data[len(data) // 2 :]
    victim.write_bytes(bytes(data))
    name = victim.name.removesuffix(".rec")
    if kind == "gc":
        name = f"gc {TASK}/{int(name)}"
    with pytest.raises(CorruptCheckpoint, match=name):
        _read_all(real_store, [gc.number for gc in gcs])


def test_a_corrupt_hot_copy_falls_back_to_the_archive(
    real_store: CheckpointStore, redis_client: redis.Redis
) -> None:
    """A record whose Redis copy fails its checksum is read from the archive instead."""
    gcs = run_task(real_store, TASK, supersteps=2)
    archive_gc(real_store, TASK, 2)
    expected = read_gc_whole(real_store, TASK, 2)
    for key in redis_client.scan_iter(match=f"cairn:{{{TASK}}}:lc:*"):
        data = bytearray(cast(bytes, redis_client.hget(key, "data")))
        data[-1] ^= 0x01
        redis_client.hset(key, "data", bytes(data))
    assert expected == read_gc_whole(real_store, TASK, 2)
    assert len(gcs) == 2


def _file_count(root: Path) -> int:
    return sum(1 for p in root.rglob("*.rec")) if root.exists() else 0


ARCHIVER = """
import sys
from cairn.storage.archive import archive_gc
from cairn.storage.backends.disk import DiskArchive
from cairn.storage.backends.redis import RedisHotStore, connect
from cairn.storage.codec import Codec
from cairn.storage.store import CheckpointStore

url, root, task, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
store = CheckpointStore(RedisHotStore(connect(url)), DiskArchive(root), Codec())
for number in range(1, count + 1):
    archive_gc(store, task, number)
print("done", flush=True)
"""


def test_sigkill_mid_archive_leaves_only_whole_gcs(own_redis: RedisServer, tmp_path: Path) -> None:
    """An archiver killed at random moments leaves every listed GC whole; a rerun finishes."""
    root = tmp_path / "archive"
    client = connect(own_redis.url)
    store = CheckpointStore(RedisHotStore(client), DiskArchive(root), Codec(), full_every=4)
    count = 12
    gcs = run_task(store, TASK, supersteps=count, message_size=20_000)
    expected = {gc.number: read_gc_whole(store, TASK, gc.number) for gc in gcs}
    rng = random.Random(2026)
    kills = 0
    progress = []
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    for _ in range(8):
        child = subprocess.Popen(
            [sys.executable, "-c", ARCHIVER, own_redis.url, str(root), TASK, str(count)],
            stdout=subprocess.DEVNULL,
            env=env,
        )
        # Kill once a random number of further files has landed: mid-archive, mid-GC.
        target = _file_count(root) + rng.randint(1, 25)
        deadline = time.monotonic() + 30
        while child.poll() is None and _file_count(root) < target and time.monotonic() < deadline:
            time.sleep(0.001)
        if child.poll() is None:
            child.send_signal(signal.SIGKILL)
            kills += 1
        child.wait()
        cold_only = CheckpointStore(MemoryHotStore(), DiskArchive(root), Codec())
        listed = cold_only.cold.list_gcs(TASK)
        progress.append(len(listed))
        for number in listed:
            assert expected[number] == read_gc_whole(cold_only, TASK, number)
    # The kills landed while archiving was under way, not only before or after it.
    assert kills > 0
    assert any(0 < n < count for n in progress), progress
    finish = subprocess.run(
        [sys.executable, "-c", ARCHIVER, own_redis.url, str(root), TASK, str(count)],
        capture_output=True,
        env=env,
        check=True,
    )
    assert b"done" in finish.stdout
    cold_only = CheckpointStore(MemoryHotStore(), DiskArchive(root), Codec())
    assert list(range(1, count + 1)) == cold_only.cold.list_gcs(TASK)
    assert expected == {n: read_gc_whole(cold_only, TASK, n) for n in range(1, count + 1)}
    client.close()


@pytest.fixture
def small_disk(tmp_path: Path) -> object:
    """A 400 KiB tmpfs mounted for the test (needs root, which CI has)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root; CI runs as root")
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


def test_full_disk_is_a_clear_error_and_damages_nothing(
    redis_client: redis.Redis, small_disk: Path
) -> None:
    """Archiving onto a full disk raises ArchiveError; what was archived stays whole."""
    store = CheckpointStore(RedisHotStore(redis_client), DiskArchive(small_disk), Codec())
    gcs = run_task(store, TASK, supersteps=30, message_size=3_000)
    expected = {gc.number: read_gc_whole(store, TASK, gc.number) for gc in gcs}
    with pytest.raises(ArchiveError, match="disk full"):
        _archive_all(store, [gc.number for gc in gcs])
    archived = store.cold.list_gcs(TASK)
    assert 0 < len(archived) < len(gcs)
    assert [] == list(small_disk.rglob(".tmp-*"))
    cold_only = CheckpointStore(MemoryHotStore(), DiskArchive(small_disk), Codec())
    for number in archived:
        assert expected[number] == read_gc_whole(cold_only, TASK, number)
    # Redis still has everything the archive could not take.
    assert expected == {gc.number: read_gc_whole(store, TASK, gc.number) for gc in gcs}


def test_read_only_disk_is_a_clear_error(redis_client: redis.Redis, small_disk: Path) -> None:
    """A read-only archive refuses writes with ArchiveError and keeps what it holds."""
    store = CheckpointStore(RedisHotStore(redis_client), DiskArchive(small_disk), Codec())
    gcs = run_task(store, TASK, supersteps=2)
    archive_gc(store, TASK, 1)
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    with pytest.raises(ArchiveError, match="Read-only"):
        archive_gc(store, TASK, 2)
    assert [1] == store.cold.list_gcs(TASK)
    cold_only = CheckpointStore(MemoryHotStore(), DiskArchive(small_disk), Codec())
    assert read_gc_whole(store, TASK, 1) == read_gc_whole(cold_only, TASK, 1)
    assert len(gcs) == 2


def test_unusable_archive_directory_is_a_clear_error(tmp_path: Path) -> None:
    """An archive root that is a file gives ArchiveError, not a traceback from deep inside."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ArchiveError, match="cannot use archive directory"):
        DiskArchive(blocker / "archive")


def test_stale_temporary_files_are_cleared_and_live_ones_kept(tmp_path: Path) -> None:
    """Leftovers of a killed writer go; a temporary file being written right now stays."""
    archive = DiskArchive(tmp_path / "archive")
    old = tmp_path / "archive" / ".tmp-000000000001.rec.1.1"
    live = tmp_path / "archive" / ".tmp-000000000002.rec.2.2"
    old.write_bytes(b"half")
    live.write_bytes(b"half")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    assert 1 == archive.remove_temporaries(older_than=3600)
    assert [live] == sorted((tmp_path / "archive").glob(".tmp-*"))


class DiskCalls:
    """The archive's durable-write calls, in the order they returned, made for real.

    Each entry is (call, path, source): `fsync` of the path an fd names, `place` of a file
    under its final name (a rename or a hard link of the temporary file `source`), `mkdir`
    of a new directory.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, str, str]] = []
        fsync, replace, link, mkdir = os.fsync, os.replace, os.link, os.mkdir

        def record_fsync(fd: int) -> None:
            path = str(Path(f"/proc/self/fd/{fd}").readlink())
            fsync(fd)
            self.calls.append(("fsync", path, ""))

        def record_replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
            replace(src, dst)
            self.calls.append(("place", os.fspath(dst), os.fspath(src)))

        def record_link(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
            link(src, dst)
            self.calls.append(("place", os.fspath(dst), os.fspath(src)))

        def record_mkdir(path: str | os.PathLike[str], mode: int = 0o777) -> None:
            mkdir(path, mode)
            self.calls.append(("mkdir", os.fspath(path), ""))

        monkeypatch.setattr(os, "fsync", record_fsync)
        monkeypatch.setattr(os, "replace", record_replace)
        monkeypatch.setattr(os, "link", record_link)
        monkeypatch.setattr(os, "mkdir", record_mkdir)

    def index(self, call: str, path: Path) -> int:
        """Where `call` of `path` returned (the first time)."""
        return self.calls.index(next(c for c in self.calls if c[:2] == (call, str(path))))

    def synced_between(self, directory: Path, start: int, end: int) -> bool:
        """True when `directory` was fsynced after call `start` returned and before `end`."""
        return ("fsync", str(directory), "") in self.calls[start + 1 : end]


def test_a_gc_file_appears_only_once_everything_it_names_is_durable(
    real_store: CheckpointStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every file a GC names is fsynced, put in place, its directory fsynced, before the GC.

    So a power loss at any moment cannot leave a GC file on disk whose LCs, manifest or
    blobs are not: each new directory entry (file or directory) is made durable by an
    fsync of its directory, and all of those come before the GC file is put in place.
    """
    run_task(real_store, TASK, supersteps=2)
    disk = DiskCalls(monkeypatch)
    report = archive_gc(real_store, TASK, 2)
    gc_file = tmp_path / "archive" / "tasks" / TASK / "gc" / f"{2:012d}.rec"
    gc_at = disk.index("place", gc_file)
    named = [(n, c) for n, c in enumerate(disk.calls[:gc_at]) if c[0] == "place"]
    assert report.lcs + report.blobs == len(named)  # every file written before the GC file
    for n, (_, path, tmp) in named:
        assert n > disk.index("fsync", Path(tmp)), f"{path} placed before its data was synced"
    not_synced = [
        path
        for n, (call, path, _) in enumerate(disk.calls[:gc_at])
        if call in ("place", "mkdir")
        and Path(path) != gc_file.parent  # the GC's own directory: part of writing the GC
        and not disk.synced_between(Path(path).parent, n, gc_at)
    ]
    assert [] == not_synced
    assert disk.synced_between(gc_file.parent, gc_at, len(disk.calls))  # the GC is durable too
