"""One damaged archived GC: listed as damaged, and every other GC still restorable.

A task that lives only in the archive (Redis flushed) with one GC file damaged on disk:
`cairn checkpoints` lists every GC and marks that one, `cairn restore --to N` restores
each sound N, and `cairn restore` falls back past the damaged one to the newest sound GC.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from cairn.storage import keys
from cairn.storage.records import GCStatus
from tests.cli_harness import Run, cli_runner
from tests.cluster import Cluster, team_spec


@pytest.fixture
def run(
    cluster: Cluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> Iterator[Run]:
    """`cairn` in this process, on the cluster's Redis and archive; (code, out, err)."""
    env = {"CAIRN_REDIS_URL": cluster.server.url, "CAIRN_ARCHIVE_DIR": str(tmp_path / "archive")}
    with cli_runner(env, monkeypatch, capsys) as call:
        yield call


def listed(run: Run, task: str) -> list[dict[str, Any]]:
    """`cairn checkpoints TASK --json`, which must succeed."""
    code, out, err = run("checkpoints", task, "--json")
    assert 0 == code, err
    rows: list[dict[str, Any]] = json.loads(out)
    return rows


@pytest.mark.parametrize("which", ["newest", "middle"])
def test_a_damaged_archived_gc_is_marked_and_every_other_gc_restores(
    cluster: Cluster, run: Run, tmp_path: Path, which: str
) -> None:
    """A flipped byte in one archived GC of a task only the archive holds.

    The listing (JSON and table) marks that GC damaged and no other; a restore to each
    sound GC restores it, files and all; a restore to the latest falls back past the
    damaged GC to the newest sound one.
    """
    cluster.start_worker()
    task = cluster.tasks.submit(team_spec(tmp_path / "ledger"))
    assert "succeeded" == cluster.drive(task)["status"]
    numbers = cluster.store.cold.list_gcs(task)  # a finished task has every GC on disk
    assert len(numbers) >= 4
    workspaces = {n: cluster.store.read_gc(task, n).workspace for n in numbers}
    cluster.client.flushall()
    damaged = numbers[-1] if which == "newest" else numbers[len(numbers) // 2]
    path = tmp_path / "archive" / "tasks" / task / "gc" / f"{damaged:012d}.rec"
    assert path.exists()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))

    rows = listed(run, task)
    assert numbers == [row["number"] for row in rows]
    assert [damaged] == [row["number"] for row in rows if row["damaged"]]
    mark = next(row for row in rows if row["number"] == damaged)
    assert f"gc {task}/{damaged}" in mark["error"]
    assert all(row["status"] == GCStatus.COMMITTED for row in rows)
    code, table, err = run("checkpoints", task)
    assert 0 == code, err
    cells = [line.split("│")[1:-1] for line in table.splitlines() if line.startswith("│")]
    statuses = {int(row[0]): row[1].strip() for row in cells}
    assert "damaged" == statuses[damaged]
    assert {"damaged"} == set(statuses.values()) - {"COMMITTED", "committed"}
    assert f"GC {damaged} is damaged: corrupt record gc {task}/{damaged}" in table

    sound = [n for n in numbers if n != damaged]
    for number in sound:
        cluster.client.flushall()  # only the archive holds the task, before each restore
        code, out, err = run("restore", task, "--to", str(number), "--json")
        assert 0 == code, err
        assert number == json.loads(out)["restored_to"]
        latest = cluster.store.latest_gc(task)
        assert latest is not None
        assert workspaces[number] == latest.workspace

    cluster.client.flushall()
    code, out, err = run("restore", task, "--json")
    assert 0 == code, err
    assert max(sound) == json.loads(out)["restored_to"]
    assert [damaged] == [row["number"] for row in listed(run, task) if row["damaged"]]


def test_a_restore_falls_back_when_the_latest_gc_is_damaged_in_redis_and_on_disk(
    cluster: Cluster, run: Run, tmp_path: Path
) -> None:
    """The GC Redis names as the latest, damaged in both tiers: a restore takes the one before.

    Reading the latest GC (to abort a superstep in flight) must not stop the restore
    that falls back past it.
    """
    cluster.start_worker()
    task = cluster.tasks.submit(team_spec(tmp_path / "ledger"))
    assert "succeeded" == cluster.drive(task)["status"]
    latest = cluster.store.hot.latest_gc(task)
    assert latest is not None
    before = cluster.store.read_gc(task, latest - 1).workspace
    key = keys.gc(task, latest)
    stored = bytearray(cast(bytes, cluster.client.hget(key, "data")))
    stored[len(stored) // 2] ^= 0x40
    cluster.client.hset(key, "data", bytes(stored))
    path = tmp_path / "archive" / "tasks" / task / "gc" / f"{latest:012d}.rec"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))

    code, out, err = run("restore", task, "--json")
    assert 0 == code, err
    assert latest - 1 == json.loads(out)["restored_to"]
    restored = cluster.store.latest_gc(task)
    assert restored is not None
    assert before == restored.workspace


def test_a_superstep_in_flight_is_aborted_though_the_latest_gc_is_damaged(
    cluster: Cluster, run: Run, tmp_path: Path
) -> None:
    """A restore while a superstep runs, the latest GC damaged: the superstep's GC is aborted.

    Its prepared record gives the shape of what to abort, so no GC stays PREPARING for good.
    """
    cluster.start_worker()
    task = cluster.tasks.submit(team_spec(tmp_path / "ledger", slow=2.0))
    cluster.tick_until(lambda: (cluster.store.hot.latest_gc(task) or 0) >= 1)
    cluster.start_superstep(task)
    latest = cluster.store.hot.latest_gc(task)
    assert latest is not None
    in_flight = int(cast(bytes, cluster.client.hget(keys.run(task), "number")))
    assert in_flight == latest + 1
    # Archives are paced: the latest GC goes to disk now, not while the restore runs (it
    # would find it damaged, and its warning would land in the command's output).
    assert cluster.coordinator.archiver.drain()
    key = keys.gc(task, latest)
    stored = bytearray(cast(bytes, cluster.client.hget(key, "data")))
    stored[len(stored) // 2] ^= 0x40
    cluster.client.hset(key, "data", bytes(stored))
    archived = tmp_path / "archive" / "tasks" / task / "gc" / f"{latest:012d}.rec"
    data = bytearray(archived.read_bytes())
    data[len(data) // 2] ^= 0x40
    archived.write_bytes(bytes(data))

    code, out, err = run("restore", task, "--json")
    assert 0 == code, err
    assert latest - 1 == json.loads(out)["restored_to"]
    statuses = {g.number: g.status for g in cluster.store.list_gcs(task)}
    assert GCStatus.ABORTED == statuses[in_flight]
