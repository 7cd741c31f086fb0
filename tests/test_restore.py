"""Coordinated restore with real workers: all agents to one GC, or none; never mixed."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, cast

import pytest
import redis

from cairn.agents.spec import AgentSpec, TaskRecord
from cairn.agents.task import start_task
from cairn.coordinator import restore as restore_module
from cairn.coordinator import staging
from cairn.coordinator.coordinator import Coordinator
from cairn.coordinator.diff import diff
from cairn.coordinator.jobs import CONTROL_QUEUE
from cairn.coordinator.restore import Restored, Restorer
from cairn.coordinator.spec import LIMITS_DOC
from cairn.errors import CorruptCheckpoint, FencedWrite, RestoreFailed, Unavailable
from cairn.storage import keys
from cairn.storage.records import GCStatus, GlobalCheckpoint, LCRef
from cairn.storage.store import CheckpointStore
from tests.agent_harness import files_of
from tests.cluster import Cluster, outcome, team_spec


def run_until(cluster: Cluster, task: str, superstep: int) -> GlobalCheckpoint:
    """Tick until the task has committed `superstep` and not begun the next; return that GC.

    The coordinator begins the next superstep in the tick that commits one, so the task is
    paused once `superstep` is in flight and resumed after it committed: the task stands
    still between supersteps until the caller's next tick.
    """
    deadline = time.monotonic() + 30
    paused = False
    while True:
        in_flight = int(cluster.client.hget(keys.run(task), "superstep") or 0)
        if not paused and in_flight >= superstep:
            cluster.tasks.pause(task)
            paused = True
        gc = cluster.store.latest_gc(task)
        if gc is not None and gc.superstep >= superstep and not in_flight:
            if paused:
                cluster.tasks.resume(task)
            return gc
        assert time.monotonic() < deadline, "the task did not get there"
        cluster.coordinator.tick()
        time.sleep(0.02)


def states_of(cluster: Cluster, gc: GlobalCheckpoint) -> dict[str, list[tuple[str, str | None]]]:
    """Every agent's history at `gc`, as comparable tuples."""
    return {
        agent: [
            (m.role.value, m.content)
            for m in cluster.store.read_state(gc.task, agent, ref.id, ref.checksum).messages
        ]
        for agent, ref in gc.members.items()
    }


def test_restore_mid_run_puts_every_agent_and_file_back_then_finishes(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Restore to GC 1 while the task runs on: agents and files as at GC 1; it still succeeds."""
    cluster.start_worker()
    cluster.start_worker()
    reference = tmp_path / "reference"
    clean = cluster.tasks.submit(team_spec(reference))
    assert "succeeded" == cluster.drive(clean)["status"]

    task = cluster.tasks.submit(team_spec(tmp_path / "ledger"))
    run_until(cluster, task, 2)
    gc1 = cluster.store.read_gc(task, 1)
    restored = cluster.coordinator.restorer.restore(task, to=1)
    assert Restored(1, restored.number, 2) == restored
    now = cluster.store.latest_gc(task)
    assert now is not None
    assert (restored.number, gc1.superstep, gc1.workspace) == (
        now.number,
        now.superstep,
        now.workspace,
    )
    before, after = states_of(cluster, gc1), states_of(cluster, now)
    for agent, history in before.items():
        assert history == after[agent][: len(history)]  # the same history...
        assert 1 == len(after[agent]) - len(history)  # ...plus its context summary
        assert "restored you to checkpoint 1" in str(after[agent][-1][1])
    assert files_of(cluster.store, gc1) == files_of(cluster.store, now)
    assert "succeeded" == cluster.drive(task)["status"]
    assert outcome(cluster, clean, reference)[0] == outcome(cluster, task, tmp_path / "ledger")[0]


def test_a_corrupt_lc_makes_the_restore_fall_back_for_every_agent(
    cluster: Cluster, tmp_path: Path
) -> None:
    """One agent's LC of the latest GC is damaged everywhere: all agents go back one GC."""
    cluster.start_worker()
    task = cluster.tasks.submit(team_spec(tmp_path / "ledger"))
    latest = run_until(cluster, task, 2)
    assert cluster.coordinator.archiver.drain()  # no copy lands on disk after the damage
    ref = latest.members["coder"]
    data = bytearray(cast(bytes, cluster.client.hget(keys.lc(task, ref.id), "data")))
    data[-1] ^= 1
    cluster.client.hset(keys.lc(task, ref.id), "data", bytes(data))
    archived = tmp_path / "archive" / "tasks" / task / "lc" / "coder" / f"{ref.id}.rec"
    if archived.exists():
        archived.write_bytes(bytes(data))
    restored = cluster.coordinator.restorer.restore(task)
    older = cluster.store.read_gc(task, restored.restored_to)
    assert restored.restored_to < latest.number
    now = cluster.store.latest_gc(task)
    assert now is not None
    for agent, history in states_of(cluster, older).items():
        assert history == states_of(cluster, now)[agent][: len(history)]
    aborted = [g for g in cluster.store.list_gcs(task) if g.status is GCStatus.ABORTED]
    assert aborted, "the failed attempt at the latest GC was aborted"


def test_an_inline_restore_with_one_corrupt_agent_of_three_falls_back_for_every_agent(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Staged in the caller's process (the CLI's default), one bad agent of three is enough.

    The coder, second of three, cannot be staged from the latest GC: the planner already
    staged is dropped too, and every agent goes back to the same older GC. The task then
    runs on to the end.
    """
    cluster.start_worker()
    task = cluster.tasks.submit(team_spec(tmp_path / "ledger"))
    latest = run_until(cluster, task, 2)
    assert {"planner", "coder", "reviewer"} == set(latest.members)
    assert cluster.coordinator.archiver.drain()  # no copy lands on disk after the damage
    ref = latest.members["coder"]
    data = bytearray(cast(bytes, cluster.client.hget(keys.lc(task, ref.id), "data")))
    data[-1] ^= 1
    cluster.client.hset(keys.lc(task, ref.id), "data", bytes(data))
    archived = tmp_path / "archive" / "tasks" / task / "lc" / "coder" / f"{ref.id}.rec"
    archived.write_bytes(bytes(data))  # damaged on both tiers
    restored = Restorer(cluster.client, cluster.store, workers=False).restore(task)
    assert latest.number - 1 == restored.restored_to
    older = cluster.store.read_gc(task, restored.restored_to)
    now = cluster.store.latest_gc(task)
    assert now is not None
    assert (restored.number, older.superstep, older.workspace) == (
        now.number,
        now.superstep,
        now.workspace,
    )
    assert set(older.members) == set(now.members)
    before, after = states_of(cluster, older), states_of(cluster, now)
    for agent, history in before.items():
        assert history == after[agent][: len(history)]
        assert 1 == len(after[agent]) - len(history)  # plus its context summary
    statuses = {g.number: g.status for g in cluster.store.list_gcs(task)}
    assert GCStatus.ABORTED == statuses[restored.number - 1]  # the try at the latest GC
    assert "succeeded" == cluster.drive(task)["status"]


def test_a_damaged_workspace_file_makes_the_restore_fall_back_for_every_agent(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A file only the latest GC names, damaged in Redis and on disk: one GC back, together.

    Found by `make chaos` (a corrupted archive, then FLUSHALL): the restore stopped at the
    damaged file and left the task `restoring` instead of trying an older GC.
    """
    cluster.start_worker()
    task = cluster.tasks.submit(team_spec(tmp_path / "ledger"))
    latest = run_until(cluster, task, 2)
    assert cluster.coordinator.archiver.drain()  # no copy lands on disk after the damage
    before = cluster.store.read_gc(task, latest.number - 1)
    files = cluster.store.read_manifest(task, latest.workspace).files
    older = set(cluster.store.read_manifest(task, before.workspace).files.values())
    sha = next(sha for sha in files.values() if sha not in older)
    data = bytearray(cast(bytes, cluster.client.get(keys.blob(task, sha))))
    data[-1] ^= 1
    cluster.client.set(keys.blob(task, sha), bytes(data))
    archived = tmp_path / "archive" / "blobs" / "sha256" / sha[:2] / f"{sha}.rec"
    if archived.exists():
        archived.write_bytes(bytes(data))
    restored = Restorer(cluster.client, cluster.store, workers=False).restore(task)
    assert before.number == restored.restored_to
    now = cluster.store.latest_gc(task)
    assert now is not None
    assert before.workspace == now.workspace
    statuses = {g.number: g.status for g in cluster.store.list_gcs(task)}
    assert GCStatus.ABORTED == statuses[restored.number - 1]  # the try at the latest GC


def test_sync_durability_survives_a_flushall(cluster: Cluster, tmp_path: Path) -> None:
    """With durability sync, a GC acknowledged is on disk: FLUSHALL, restore, and it is back."""
    cluster.start_worker()
    spec = team_spec(tmp_path / "ledger")
    spec.checkpoints.durability = "sync"
    task = cluster.tasks.submit(spec)
    gc = run_until(cluster, task, 2)
    assert gc.number <= int(cluster.client.hget(keys.run(task), "archived") or -1)
    expected = states_of(cluster, gc), files_of(cluster.store, gc)
    cluster.client.flushall()
    restored = cluster.coordinator.restorer.restore(task)
    assert gc.number == restored.restored_to
    now = cluster.store.latest_gc(task)
    assert now is not None
    got = states_of(cluster, now)
    for agent, history in expected[0].items():
        assert history == got[agent][: len(history)]
    assert expected[1] == files_of(cluster.store, now)
    assert "succeeded" == cluster.drive(task)["status"]


def test_the_latest_gc_after_a_restore_needs_no_lc_from_before_it(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Restored from the archive, then run to its end: the LCs it restored from can go bad.

    Staging writes each agent a full LC, so the chains of every later GC stop there: the
    archive's older records (the only copy once Redis lost them) are not among them, and
    damage to them leaves the task's latest GC whole.
    """
    cluster.start_worker()
    spec = team_spec(tmp_path / "ledger")
    spec.checkpoints.durability = "sync"
    task = cluster.tasks.submit(spec)
    run_until(cluster, task, 2)
    lcs = tmp_path / "archive" / "tasks" / task / "lc"
    before = sorted(lcs.glob("*/*.rec"))
    cluster.client.flushall()
    cluster.coordinator.restorer.restore(task)
    assert "succeeded" == cluster.drive(task)["status"]
    for path in before:
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    latest = cluster.store.latest_gc(task)
    assert latest is not None
    for agent, ref in latest.members.items():
        chain = cluster.store.load_chain(task, agent, ref.id, ref.checksum)
        assert not {f"{loaded.record.id}.rec" for loaded in chain} & {p.name for p in before}
    assert set(latest.members) == set(states_of(cluster, latest))


def test_a_diff_across_a_restore_counts_each_message_once(cluster: Cluster, tmp_path: Path) -> None:
    """A diff through the staged LC agrees with comparing the whole histories.

    The staged LC is full and names its parent: walking the chains, each LC adds its own
    messages only, not the whole history a full LC holds.
    """
    cluster.start_worker()
    task = cluster.tasks.submit(team_spec(tmp_path / "ledger"))
    run_until(cluster, task, 2)
    cluster.coordinator.restorer.restore(task, to=1)
    assert "succeeded" == cluster.drive(task)["status"]
    latest = cluster.store.latest_gc(task)
    assert latest is not None
    found = diff(cluster.store, task, 0, task, latest.number)
    before = cluster.store.read_gc(task, 0)
    for agent, ref in latest.members.items():
        old = before.members[agent]
        a = cluster.store.read_state(task, agent, old.id, old.checksum).messages
        b = cluster.store.read_state(task, agent, ref.id, ref.checksum).messages
        assert b[: len(a)] == a
        want = [m.model_dump(mode="json", exclude_defaults=True) for m in b[len(a) :]]
        assert want == found.agents[agent].messages_added, agent


def test_a_restore_after_a_flushall_never_reuses_an_epoch(cluster: Cluster, tmp_path: Path) -> None:
    """Redis lost its epoch counter: the archive's record keeps the next epoch above it.

    The restore to GC 1 handed out epoch 2, but under `async` its GC was not archived yet;
    the newest archived GC says epoch 1. Reusing epoch 2 would let a zombie of it write.
    """
    cluster.start_worker()
    task = cluster.tasks.submit(team_spec(tmp_path / "ledger"))
    run_until(cluster, task, 2)
    assert cluster.coordinator.archiver.drain()
    first = cluster.coordinator.restorer.restore(task, to=1)
    assert 2 == first.epoch
    assert first.number not in cluster.store.cold.list_gcs(task)
    assert 1 == cluster.store.read_gc(task, cluster.store.cold.list_gcs(task)[-1]).epoch
    cluster.client.flushall()
    second = cluster.coordinator.restorer.restore(task)
    assert 3 == second.epoch
    assert 3 == cluster.store.hot.get_epoch(task) == cluster.store.epoch_floor(task)


def test_a_restore_under_sync_durability_is_on_disk_when_it_returns(
    cluster: Cluster, tmp_path: Path
) -> None:
    """As every GC under `sync`: acknowledged means archived, so a FLUSHALL cannot take it."""
    cluster.start_worker()
    spec = team_spec(tmp_path / "ledger")
    spec.checkpoints.durability = "sync"
    task = cluster.tasks.submit(spec)
    run_until(cluster, task, 2)
    restored = cluster.coordinator.restorer.restore(task, to=1)
    assert restored.number in cluster.store.cold.list_gcs(task)
    assert restored.number == int(cluster.client.hget(keys.run(task), "archived") or -1)
    cluster.client.flushall()
    again = cluster.coordinator.restorer.restore(task)
    assert (restored.number, restored.number + 1) == (again.restored_to, again.number)


def test_a_task_submitted_under_sync_durability_survives_a_flushall_at_once(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Its task id is the acknowledgement of GC 0: it is on disk before submit returns."""
    spec = team_spec(tmp_path / "ledger")
    spec.checkpoints.durability = "sync"
    task = cluster.tasks.submit(spec)
    assert [0] == cluster.store.cold.list_gcs(task)
    cluster.client.flushall()
    cluster.start_worker()  # it stages the restore
    assert 0 == cluster.coordinator.restorer.restore(task).restored_to
    assert "succeeded" == cluster.drive(task)["status"]


def bare_task(store: CheckpointStore, task: str) -> None:
    """A task as `cairn.agents.task.start_task` leaves: spec and GC 0, no coordinator's limits."""
    record = TaskRecord(
        task=task,
        goal="g",
        agents=[AgentSpec(name="a", model="scripted"), AgentSpec(name="b", model="scripted")],
    )
    start_task(store, record, {"README.md": b"x"})


def test_a_task_started_without_a_coordinator_restores_under_the_default_policy(
    real_store: CheckpointStore, redis_client: redis.Redis
) -> None:
    """No limits document (none was submitted): the restore applies the default policy.

    It used to read the limits after committing its GC and raise `RecordNotFound`, leaving
    the task `restoring` and inactive for good (`make bench` died on it).
    """
    bare_task(real_store, "bare")
    restored = Restorer(redis_client, real_store, workers=False).restore("bare", to=0)
    assert Restored(0, 1, 2) == restored
    assert b"running" == redis_client.hget(keys.run("bare"), "status")
    assert redis_client.sismember(keys.ACTIVE_TASKS, "bare")
    assert [] == real_store.cold.list_gcs("bare")  # async, the default: not archived by it


def test_damaged_limits_make_the_restore_fail_before_it_touches_anything(
    real_store: CheckpointStore, redis_client: redis.Redis
) -> None:
    """Limits unreadable on both tiers: refused with the reason, the task as it was."""
    bare_task(real_store, "hurt")
    real_store.hot.put_doc("hurt", LIMITS_DOC, b"not a record")
    real_store.cold.put_doc("hurt", LIMITS_DOC, b"not a record")
    with pytest.raises(CorruptCheckpoint, match="limits"):
        Restorer(redis_client, real_store, workers=False).restore("hurt", to=0)
    assert 1 == real_store.hot.get_epoch("hurt")
    assert [0] == [g.number for g in real_store.list_gcs("hurt")]
    assert not redis_client.exists(keys.run("hurt"))


def test_two_restores_at_once_are_serialized(cluster: Cluster, tmp_path: Path) -> None:
    """Two concurrent restores both finish, one after the other, leaving one consistent state."""
    cluster.start_worker()
    cluster.start_worker()
    task = cluster.tasks.submit(team_spec(tmp_path / "ledger"))
    run_until(cluster, task, 2)
    results: list[Restored] = []
    threads = [
        threading.Thread(
            target=lambda n=n: results.append(cluster.coordinator.restorer.restore(task, to=n))
        )
        for n in (1, 2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert 2 == len(results)
    assert sorted(r.epoch for r in results) == [2, 3]
    last = max(results, key=lambda r: r.epoch)
    now = cluster.store.latest_gc(task)
    assert now is not None
    assert (last.number, last.epoch) == (now.number, now.epoch)
    epochs = {cluster.store.read_lc(task, a, ref.id).epoch for a, ref in now.members.items()}
    assert {last.epoch} == epochs


def _no_worker_after_two(cluster: Cluster, tmp_path: Path) -> tuple[str, GlobalCheckpoint]:
    """A team task committed up to superstep 2 (its GC returned), and no worker left."""
    worker = cluster.start_worker()
    task = cluster.tasks.submit(team_spec(tmp_path / "ledger"))
    latest = run_until(cluster, task, 2)
    worker.kill()
    worker.wait()
    return task, latest


def _given_up(cluster: Cluster, task: str, latest: GlobalCheckpoint) -> None:
    """The restore gave up: the task is `restoring`, and nothing older than `latest` tried."""
    run = cast(dict[bytes, bytes], cluster.client.hgetall(keys.run(task)))
    assert b"restoring" == run[b"status"]
    assert latest.number == cluster.store.hot.latest_gc(task)
    tried = [g for g in cluster.store.list_gcs(task) if g.number > latest.number]
    assert [GCStatus.ABORTED] == [g.status for g in tried]  # this try alone, its staging gone


def test_a_restore_no_worker_stages_gives_up_and_the_coordinator_restores_again(
    cluster: Cluster, tmp_path: Path
) -> None:
    """No worker stages in time: no older GC is tried; the coordinator restores it later."""
    task, latest = _no_worker_after_two(cluster, tmp_path)
    with pytest.raises(RestoreFailed, match="not restored: no vote from every agent within 1 s"):
        cluster.coordinator.restorer.restore(task, wait=1.0)
    _given_up(cluster, task, latest)
    cluster.start_worker()
    assert "succeeded" == cluster.drive(task)["status"]
    restores = [g for g in cluster.store.list_gcs(task) if g.number > latest.number]
    assert GCStatus.COMMITTED is restores[1].status  # the coordinator's restore
    assert latest.superstep == cluster.store.read_gc(task, restores[1].number).superstep


def test_a_staging_job_that_fails_ends_the_restore_at_once_without_falling_back(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A staging job raising (here: its epoch moved on) is no verdict on the target GC."""
    task, latest = _no_worker_after_two(cluster, tmp_path)
    failed: list[BaseException] = []

    def restore() -> None:
        try:
            cluster.coordinator.restorer.restore(task, wait=30.0)
        except RestoreFailed as exc:
            failed.append(exc)

    thread = threading.Thread(target=restore)
    thread.start()
    deadline = time.monotonic() + 10
    while not cluster.client.llen(f"rq:queue:{CONTROL_QUEUE}"):  # staging enqueued
        assert time.monotonic() < deadline, "no staging job was enqueued"
        time.sleep(0.01)
    epoch = cluster.store.hot.get_epoch(task)
    cluster.store.raise_epoch(task, epoch + 1)  # every staging write is now fenced
    cluster.start_worker()
    thread.join(60)
    assert not thread.is_alive()
    assert 1 == len(failed)
    assert "failed: FencedWrite: stale epoch" in str(failed[0])
    _given_up(cluster, task, latest)


@pytest.mark.parametrize(
    ("error", "falls_back"), [(ValueError("a bug"), True), (FencedWrite("stale epoch"), False)]
)
def test_what_stops_staging_decides_whether_the_restore_falls_back(
    cluster: Cluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    error: Exception,
    falls_back: bool,
) -> None:
    """Staging the latest GC raises: a failure that passes ends the restore, any other refuses.

    Refused, that GC is left for an older one, restored instead.
    """
    task, latest = _no_worker_after_two(cluster, tmp_path)
    real = staging.stage

    def stage(store: CheckpointStore, task: str, agent: str, target: int, *rest: Any) -> LCRef:
        if target == latest.number and agent == "coder":
            raise error
        return real(store, task, agent, target, *rest)

    monkeypatch.setattr(restore_module, "stage", stage)
    restorer = Restorer(cluster.client, cluster.store, workers=False)
    if falls_back:
        assert latest.number > restorer.restore(task).restored_to
    else:
        with pytest.raises(type(error)):
            restorer.restore(task)
        assert latest.number == cluster.store.hot.latest_gc(task)
        older = [g for g in cluster.store.list_gcs(task) if g.number < latest.number]
        assert all(g.status is GCStatus.COMMITTED for g in older)  # none tried


def test_restoring_a_checkpoint_that_does_not_exist_is_refused(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Asking for a GC the task never committed says so and changes nothing."""
    task = cluster.tasks.submit(team_spec(tmp_path / "ledger"))
    with pytest.raises(RestoreFailed, match="no committed checkpoint 7"):
        cluster.coordinator.restorer.restore(task, to=7)
    assert 1 == cluster.store.hot.get_epoch(task)


def test_a_finished_task_has_every_gc_on_disk_whatever_archive_every_says(
    cluster: Cluster, tmp_path: Path
) -> None:
    """GCs skipped by `archive_every` are archived with a later one; the end archives the last."""
    cluster.start_worker()
    spec = team_spec(tmp_path / "ledger")
    spec.checkpoints.archive_every = 100  # never due while the task runs
    task = cluster.tasks.submit(spec)
    assert "succeeded" == cluster.drive(task)["status"]
    committed = [g.number for g in cluster.store.list_gcs(task) if g.status is GCStatus.COMMITTED]
    assert len(committed) >= 4
    assert committed == cluster.store.cold.list_gcs(task)
    assert committed[-1] == int(cluster.client.hget(keys.run(task), "archived") or -1)
    # Every archived GC reads whole from the disk alone.
    cluster.client.flushall()
    for number in committed:
        gc = cluster.store.read_gc(task, number)
        for agent, ref in gc.members.items():
            cluster.store.read_state(task, agent, ref.id, ref.checksum)
        assert files_of(cluster.store, gc)


def test_a_restore_that_keeps_failing_is_tried_again_ever_more_slowly(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While staging fails in passing, the coordinator tries the restore with a backoff.

    Each try raises the epoch (and leaves an aborted GC): 2.5 s of ticking makes a few
    tries (0.25 s after a failure, then 0.5 s, 1 s, ...), not one a tick. Once staging
    works again the next try restores the task, and it succeeds.
    """
    task, latest = _no_worker_after_two(cluster, tmp_path)
    real, broken = staging.stage, [True]

    def stage(store: CheckpointStore, task: str, agent: str, *rest: Any) -> LCRef:
        if broken[0]:
            raise Unavailable("the archive's disk is away")
        return real(store, task, agent, *rest)

    monkeypatch.setattr(restore_module, "stage", stage)
    cluster.coordinator = Coordinator(
        cluster.client, cluster.store, heartbeat_grace=1.0, restore_on_workers=False
    )
    with pytest.raises(Unavailable):
        cluster.coordinator.restorer.restore(task)
    assert b"restoring" == cluster.client.hget(keys.run(task), "status")
    epoch = cluster.store.hot.get_epoch(task)
    deadline = time.monotonic() + 2.5
    while time.monotonic() < deadline:
        cluster.coordinator.tick()  # logs each failed try, raises none
        time.sleep(0.01)
    tries = cluster.store.hot.get_epoch(task) - epoch
    assert 2 <= tries <= 4, f"{tries} tries in 2.5 s"
    assert latest.number == cluster.store.hot.latest_gc(task)
    broken[0] = False
    cluster.start_worker()
    assert "succeeded" == cluster.drive(task)["status"]


@pytest.mark.parametrize("fails", ["_stop_superstep", "raise_epoch"])
def test_a_restore_that_fails_half_way_is_finished_by_a_coordinator(
    fails: str, cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restore that fails once begun leaves its task `restoring`; a coordinator finishes it.

    As under `maxmemory` or a full disk. Past the epoch's raise (`_stop_superstep`): were
    the run left naming the old epoch, every retry the coordinator launched would be
    fenced, for ever. Before it (`raise_epoch`), of a task that had ended: were it left
    `restoring` but not active, no coordinator would look at it again. Either way the task
    is restored again, and ends as it would have.
    """
    cluster.start_worker()
    reference = tmp_path / "reference"
    clean = cluster.tasks.submit(team_spec(reference))
    assert "succeeded" == cluster.drive(clean)["status"]
    task = cluster.tasks.submit(team_spec(tmp_path / "ledger"))
    if fails == "raise_epoch":
        assert "succeeded" == cluster.drive(task)["status"]
    else:
        run_until(cluster, task, 2)

    def refused(*args: object, **kwargs: object) -> None:
        raise redis.OutOfMemoryError("command not allowed when used memory > 'maxmemory'.")

    person = Restorer(cluster.client, cluster.store, workers=False)
    target = Restorer if fails == "_stop_superstep" else type(cluster.store)
    monkeypatch.setattr(target, fails, refused)
    with pytest.raises(redis.OutOfMemoryError):
        person.restore(task)
    monkeypatch.undo()
    assert b"restoring" == cluster.client.hget(keys.run(task), "status")
    assert cluster.client.sismember(keys.ACTIVE_TASKS, task)
    assert "succeeded" == cluster.drive(task)["status"]
    assert outcome(cluster, clean, reference)[0] == outcome(cluster, task, tmp_path / "ledger")[0]
