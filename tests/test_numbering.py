"""Numbers that must never be handed out twice: GC numbers, epochs, and heartbeat tokens.

Redis can lose its last writes (an AOF fsynced every second, an older RDB, a failover to a
lagging replica) while the archive keeps what it was given. These tests make Redis lose
them for real: every key is DUMPed at one moment and the server is put back to exactly
that later (FLUSHALL, then RESTORE), as a restart from that moment's AOF would.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import cast

import pytest
import redis
import yaml
from structlog.testing import capture_logs

from cairn.agents.heartbeat import Heartbeat, worker_token
from cairn.agents.spec import AgentSpec, TaskRecord
from cairn.agents.task import start_task
from cairn.coordinator.coordinator import HEARTBEAT_GRACE
from cairn.coordinator.jobstate import JobState, step_failure
from cairn.coordinator.numbering import LOST_REASON
from cairn.coordinator.restore import Restorer
from cairn.coordinator.runs import StepRun
from cairn.coordinator.spec import Limits, TaskSpec
from cairn.errors import ArchiveConflict, FencedWrite
from cairn.storage.archive import archive_gc, trim_hot
from cairn.storage.base import ColdArchive
from cairn.storage.codec import Codec
from cairn.storage.store import CheckpointStore
from tests.agent_harness import files_of, record, scripted, superstep
from tests.cluster import Cluster

Snapshot = dict[bytes, tuple[int, bytes]]


def snapshot(client: redis.Redis) -> Snapshot:
    """Every key as DUMP gives it, with its TTL: what Redis's files hold at this moment."""
    names = cast(list[bytes], client.keys("*"))
    dumped = {k: (client.pttl(k), client.dump(k)) for k in names}
    # A key that expired between KEYS and DUMP (an RQ key with a TTL) is not in the files.
    return {k: (ttl, data) for k, (ttl, data) in dumped.items() if data is not None}


def roll_back(client: redis.Redis, snap: Snapshot) -> None:
    """Put Redis back to `snap`: everything written since is lost."""
    client.flushall()
    for name, (ttl, data) in snap.items():
        client.restore(name, max(ttl, 0), data, replace=True)


def writer(task: str, turns: int) -> TaskRecord:
    """One agent that writes `out.txt` once per superstep, `turns` times, then rests."""
    script = [
        {"say": f"turn {n}", "tools": [{"name": "write_file",
                                        "args": {"path": "out.txt", "content": f"{n}\n"}}]}
        for n in range(1, turns + 1)
    ] + [{"say": "done"}]  # fmt: skip
    return record(task, scripted("a", script, tools=["write_file"]))


# GC numbers: the archive -------------------------------------------------------------------
def test_the_archive_never_replaces_a_gc_under_its_number(cold: ColdArchive) -> None:
    """The same bytes again are a no-op; other bytes under that number raise, changing nothing."""
    cold.put_gc("t", 3, b"first")
    cold.put_gc("t", 3, b"first")
    with pytest.raises(ArchiveConflict):
        cold.put_gc("t", 3, b"second")
    assert b"first" == cold.get_gc("t", 3)
    assert [3] == cold.list_gcs("t")


def test_a_gc_number_handed_out_again_is_refused_by_the_archive_and_kept_in_redis(
    redis_client: redis.Redis, real_store: CheckpointStore, tmp_path: Path
) -> None:
    """A second GC 2 is refused by the archive, and trim keeps it in Redis.

    GC 2 is archived, lost by Redis, then numbered again with another history: archiving
    the second GC 2 raises instead of reporting success, the archived one stays as it was,
    and trim keeps the second in Redis (it is not archived), so neither history is lost.
    """
    task = "t-reuse"
    start_task(real_store, writer(task, 5), {"README.md": b"x"})
    superstep(real_store, task, tmp_path / "cache")  # GC 1
    before = snapshot(redis_client)
    superstep(real_store, task, tmp_path / "cache")  # GC 2, first history
    for number in (0, 1, 2):
        archive_gc(real_store, task, number)
    archived = real_store.cold.get_gc(task, 2)
    roll_back(redis_client, before)
    again = superstep(real_store, task, tmp_path / "cache")  # numbered from Redis alone
    assert again is not None
    assert 2 == again.number

    with pytest.raises(ArchiveConflict, match="handed out twice"):
        archive_gc(real_store, task, 2)
    superstep(real_store, task, tmp_path / "cache")  # GC 3
    archive_gc(real_store, task, 3)
    report = trim_hot(real_store, task, hot_keep=1)

    assert archived == real_store.cold.get_gc(task, 2)
    assert [2] == report.unarchived
    assert again.members == real_store.read_gc(task, 2).members


# GC numbers: the coordinator ---------------------------------------------------------------
SYNC_WRITER = """
name: Count
goal: Write the count.
agents:
  - name: a
    model: scripted
    tools: [write_file]
    script:
"""


def test_a_coordinator_whose_redis_lost_archived_gcs_restores_them_from_the_archive(
    cluster: Cluster,
) -> None:
    """Redis behind the archive: the coordinator restores from the archive, reusing no number.

    Under `durability: sync`, GC 2 is on disk when Redis loses it. The coordinator does
    not number a new GC 2: it restores the task from the archive's GC 2 under a number
    above it, and the task ends with the work GC 2 held; no number names two GCs.
    """
    turns = "".join(
        f"      - {{say: t{n}, tools: [{{name: write_file, args: {{path: out.txt, "
        f"content: '{n}'}}}}]}}\n"
        for n in range(1, 5)
    )
    spec = yaml.safe_load(SYNC_WRITER + turns + "      - {say: done}\n")
    spec["checkpoints"] = {"durability": "sync", "hot_keep": 1}
    cluster.start_worker()
    store, client = cluster.store, cluster.client
    task = cluster.tasks.submit(TaskSpec.model_validate(spec))
    deadline = time.monotonic() + 60
    while (store.hot.latest_gc(task) or 0) < 1:
        assert time.monotonic() < deadline
        cluster.coordinator.tick()
        time.sleep(0.01)
    before = snapshot(client)
    while (store.hot.latest_gc(task) or 0) < 2:  # committed, and on disk (sync)
        assert time.monotonic() < deadline
        cluster.coordinator.tick()
        time.sleep(0.01)
    archived = store.cold.get_gc(task, 2)
    assert archived is not None
    roll_back(client, before)

    with capture_logs() as logs:
        status = cluster.drive(task)

    assert "succeeded" == status["status"], status
    restored = [e for e in logs if e["event"] == "task restored"]
    assert [(2, 3)] == [(e["to"], e["gc"]) for e in restored]
    assert archived == store.cold.get_gc(task, 2)
    for number in store.cold.list_gcs(task):  # each number names one GC in both tiers
        hot = store.hot.read_gc(task, number)
        cold = store.cold.get_gc(task, number)
        assert hot is None or Codec.named_digest(hot) == Codec.named_digest(cast(bytes, cold))
    latest = store.latest_gc(task)
    assert latest is not None
    assert b"4" == files_of(store, latest)["out.txt"]
    summary = store.read_state(task, "a", latest.members["a"].id).messages
    assert any(LOST_REASON in (m.content or "") for m in summary)


# epochs ------------------------------------------------------------------------------------
def test_a_refused_raise_epoch_leaves_the_archive_floor_as_it_was(
    real_store: CheckpointStore,
) -> None:
    """A coordinator that lost the task asks for a lower epoch: refused, floor untouched."""
    start_task(
        real_store,
        TaskRecord(task="t", goal="g", agents=[AgentSpec(name="a", model="scripted")]),
        {},
    )
    real_store.hot.claim("t", 7)
    assert 5 == real_store.raise_epoch("t", 5, owner=7)
    with pytest.raises(FencedWrite):
        real_store.raise_epoch("t", 3, owner=6)
    assert 5 == real_store.epoch_floor("t")
    assert 5 == real_store.hot.get_epoch("t")


def test_the_archive_floor_never_falls_even_when_redis_lost_its_epoch(
    redis_client: redis.Redis, real_store: CheckpointStore
) -> None:
    """Unfenced callers asking for less than the floor (Redis lost its counter) keep it."""
    start_task(
        real_store,
        TaskRecord(task="t", goal="g", agents=[AgentSpec(name="a", model="scripted")]),
        {},
    )
    real_store.raise_epoch("t", 9)
    redis_client.flushall()
    real_store.raise_epoch("t", 4)
    assert 9 == real_store.epoch_floor("t")


def test_concurrent_raises_leave_the_highest_floor(real_store: CheckpointStore) -> None:
    """Racing read-modify-writes of the floor lose none of the raises."""
    real_store.hot.init_task("t")
    wanted = list(range(2, 42))
    barrier = threading.Barrier(len(wanted))

    def raise_to(epoch: int) -> None:
        barrier.wait()
        real_store.cold.update_doc("t", "epoch", lambda _: None)  # contend for the lock too
        real_store.raise_epoch("t", epoch)

    threads = [threading.Thread(target=raise_to, args=(e,)) for e in reversed(wanted)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert max(wanted) == real_store.epoch_floor("t")


def test_after_a_flushall_a_restore_never_reuses_an_epoch(
    redis_client: redis.Redis, real_store: CheckpointStore
) -> None:
    """After FLUSHALL a restore picks an epoch above every one handed out before.

    Epoch 5 was handed out, then a stale raise to 3 was refused, then Redis lost it all.
    """
    task = "t"
    start_task(
        real_store,
        TaskRecord(task=task, goal="g", agents=[AgentSpec(name="a", model="scripted")]),
        {},
    )
    archive_gc(real_store, task, 0)
    real_store.hot.claim(task, 7)
    real_store.raise_epoch(task, 5, owner=7)
    with pytest.raises(FencedWrite):
        real_store.raise_epoch(task, 3, owner=6)
    redis_client.flushall()
    assert 6 == Restorer(redis_client, real_store, workers=False).restore(task).epoch


# heartbeats --------------------------------------------------------------------------------
def test_a_zombie_of_an_old_epoch_does_not_pass_for_the_step_it_was_restored_into() -> None:
    """Same superstep and attempt, older epoch: the step's worker counts as not beating."""
    now = time.time()
    job = JobState("started", started_at=now - 10 * HEARTBEAT_GRACE)
    zombie = f"host:1:{1}:{3}:{1}"
    live = f"host:2:{2}:{3}:{1}"
    step, limits = StepRun(1, "job"), Limits()
    assert step_failure(step, 2, 3, None, job, zombie, limits, HEARTBEAT_GRACE, now) is not None
    assert step_failure(step, 2, 3, None, job, live, limits, HEARTBEAT_GRACE, now) is None


def test_a_zombie_heartbeat_stops_once_another_attempt_is_current(
    real_store: CheckpointStore,
) -> None:
    """A zombie's beats are refused once a restore begins its step anew under a new epoch.

    The key lapses instead of keeping (or overwriting) the new attempt's.
    """
    hot = real_store.hot
    hot.init_task("t")
    hot.begin_attempt("t", "a", 1, 1)
    old = worker_token(1, 1, 1)
    with Heartbeat(hot, "t", "a", old, interval_ms=50):
        assert old == hot.beating("t", "a")
        real_store.raise_epoch("t", 2)
        hot.begin_attempt("t", "a", 1, 1, epoch=2)
        time.sleep(0.4)  # past the last accepted beat's TTL (3 intervals)
        assert hot.beating("t", "a") is None
        new = worker_token(2, 1, 1)
        assert hot.beat("t", "a", new, 1_000)
        time.sleep(0.15)
        assert new == hot.beating("t", "a")
