"""Redis with replicas behind Sentinel: real primaries, replicas, Sentinels and workers.

Every process reaches Redis by a `redis+sentinel://` URL; a failover SIGKILLs the primary
and Sentinel promotes a replica; `durability: replicated` acknowledges a GC only once a
replica holds it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
import redis
import yaml
from langgraph.checkpoint.base import empty_checkpoint
from redis.sentinel import SentinelConnectionPool

from cairn import Client
from cairn.coordinator.replication import REPLICATION_REASON
from cairn.coordinator.settings import display_url
from cairn.coordinator.spec import TaskSpec
from cairn.langgraph import CairnSaver
from cairn.storage import keys
from cairn.storage.backends.redis import connect
from cairn.storage.backends.sentinel import _Pool
from cairn.testing.redis_server import free_port
from cairn.testing.replicas import ReplicaSet
from tests.cli_harness import children, cli_runner, cmdline, spawn, stop, wait_until
from tests.cluster import Cluster, team_spec

PASSWORD = "s3cret-pw"  # noqa: S105 - the test server's own


def replicated(spec: TaskSpec, timeout: float = 1.0) -> TaskSpec:
    """`spec` under `durability: replicated`, waiting `timeout` s for a replica."""
    policy = spec.checkpoints.model_copy(
        update={"durability": "replicated", "replica_timeout": timeout}
    )
    return spec.model_copy(update={"checkpoints": policy})


def synced(spec: TaskSpec) -> TaskSpec:
    """`spec` under `durability: sync`: a GC is acknowledged once on disk."""
    policy = spec.checkpoints.model_copy(update={"durability": "sync"})
    return spec.model_copy(update={"checkpoints": policy})


def run_field(cluster: Cluster, task: str, name: str) -> str | None:
    """One field of the task's run state."""
    value = cluster.client.hget(f"cairn:{{{task}}}:run", name)
    return None if value is None else bytes(value).decode()  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReplicaSet]:
    """A password-protected primary with one replica and three Sentinels, for this module."""
    with ReplicaSet(tmp_path_factory.mktemp("guarded"), replicas=1, password=PASSWORD) as rs:
        yield rs


@contextlib.contextmanager
def working(tmp_path: Path, replicas: int) -> Iterator[tuple[ReplicaSet, Cluster]]:
    """A primary with `replicas` replicas and three Sentinels, and two worker processes."""
    with ReplicaSet(tmp_path / "redis", replicas=replicas) as rs:
        cluster = Cluster(rs, tmp_path)
        try:
            for _ in range(2):
                cluster.start_worker()
            cluster.wait_for_workers(2)  # both up before any fault: none starts during one
            yield rs, cluster
        finally:
            cluster.close()


def test_no_acknowledged_gc_is_lost_across_a_failover(tmp_path: Path) -> None:
    """A task on a Sentinel URL survives a SIGKILLed primary, losing no acknowledged GC.

    Every GC acknowledged under `replicated` before the kill reads back whole after it,
    and the task succeeds.
    """
    with working(tmp_path, replicas=2) as (rs, cluster):
        task = cluster.tasks.submit(replicated(team_spec(tmp_path / "ledger", slow=1.0)))
        cluster.tick_until(lambda: int(run_field(cluster, task, "replicated") or -1) >= 1)
        acknowledged = int(run_field(cluster, task, "replicated") or -1)
        before = {n: cluster.store.read_gc(task, n) for n in range(acknowledged + 1)}
        old = rs.primary()
        new = rs.failover()
        assert old is not new
        cluster.tick_until(lambda: cluster.tasks.status(task).ended, timeout=90)
        assert "succeeded" == cluster.status(task)["status"]
        for number, gc in before.items():  # hot, else from the archive: checked either way
            assert gc.checksum == cluster.store.read_gc(task, number).checksum
        assert int(run_field(cluster, task, "replicated") or -1) > acknowledged


def test_a_held_connection_leaves_a_primary_the_sentinels_replaced_while_it_answers(
    tmp_path: Path,
) -> None:
    """A connection kept open follows the Sentinels to a new primary though the old lives on.

    The old primary neither closes the connection nor answers READONLY (the Sentinels
    never reached it to demote it): the connection moves within seconds of their naming
    another, and writes nothing more to the old one.
    """
    with ReplicaSet(tmp_path / "redis", replicas=1) as rs:
        client = connect(rs.url)
        held = redis.Redis(connection_pool=client.connection_pool, single_connection_client=True)
        try:
            held.set("k", "before")
            old, new = rs.split()
            on_old, on_new = rs.client(old), rs.client(new)
            deadline, n = time.monotonic() + 10, 0
            while on_new.get("k") != f"write {n}".encode():
                assert time.monotonic() < deadline, "the connection stayed on the old primary"
                n += 1
                held.set("k", f"write {n}")
                time.sleep(0.05)
            left_at = on_old.get("k")
            for m in range(n + 1, n + 20):
                held.set("k", f"write {m}")
            assert (f"write {n + 19}".encode(), left_at) == (on_new.get("k"), on_old.get("k"))
            on_old.close()
            on_new.close()
        finally:
            held.close()
            client.close()


def test_every_client_of_a_process_leaves_an_old_primary_when_one_of_them_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two clients on one URL (a worker's queues and its store) follow one answer.

    The second client's own looks never run here: once the first client's look names the
    new primary after a split, the second client's next write lands there too, not on
    the old primary that still answers.
    """
    with ReplicaSet(tmp_path / "redis", replicas=1) as rs:
        queues, store = connect(rs.url), connect(rs.url)
        monkeypatch.setattr(store.connection_pool, "look", lambda: None)
        try:
            queues.set("q", "before")
            store.set("s", "before")
            old, new = rs.split()
            on_old, on_new = rs.client(old), rs.client(new)
            deadline = time.monotonic() + 10
            while on_new.get("q") != b"moved":
                assert time.monotonic() < deadline, "the first client stayed on the old primary"
                queues.set("q", "moved")
                time.sleep(0.05)
            store.set("s", "after")
            assert (b"after", b"before") == (on_new.get("s"), on_old.get("s"))
            on_old.close()
            on_new.close()
        finally:
            queues.close()
            store.close()


def test_the_looks_for_the_primary_go_on_after_one_that_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A look that raised, whatever it raised, ends no looks.

    redis-py raises TypeError when a Sentinel connection closes under a look (the pool
    closed it): the pool's next look still runs a second later.
    """
    with ReplicaSet(tmp_path / "redis", replicas=1) as rs:
        client = connect(rs.url)
        pool = cast(SentinelConnectionPool, client.connection_pool)
        real, looks = pool.get_master_address, list[float]()

        def flaky() -> tuple[str, int]:
            looks.append(time.monotonic())
            if len(looks) == 1:
                raise TypeError("argument must be an int, or have a fileno() method.")
            return real()  # type: ignore[no-untyped-call,no-any-return]

        monkeypatch.setattr(pool, "get_master_address", flaky)
        try:
            client.set("k", "v")
            client.get("k")  # a connection's command starts the looks
            deadline = time.monotonic() + 10
            while len(looks) < 2:
                assert time.monotonic() < deadline, "the looks ended with the one that raised"
                time.sleep(0.05)
        finally:
            client.close()


def test_a_replica_promoted_by_hand_leads_and_a_client_follows(tmp_path: Path) -> None:
    """With the primary dead and the Sentinels not acting, `promote` makes a replica lead.

    It is the replica furthest along (the other was cut off before the last write); the
    Sentinels name it, the other replica follows it, and a client on the URL reads what
    the old primary had and writes to the new.
    """
    with ReplicaSet(tmp_path / "redis", replicas=2, down_after_ms=600_000) as rs:
        client = connect(rs.url)
        old, lagging, ahead = rs.servers
        try:
            client.set("k", "before")
            assert 2 == client.wait(2, 5_000)
            cut = rs.client(lagging)
            try:
                cut.replicaof("127.0.0.1", free_port())  # a primary that never answers
            finally:
                cut.close()
            client.set("k", "last")
            assert 1 == client.wait(1, 5_000)
            old.kill()
            assert ahead is rs.promote(old)
            assert ahead is rs.primary()
            wait_until(lambda: client.get("k") == b"last", timeout=30)
            client.set("k", "after")
            on_other = rs.client(lagging)
            try:
                wait_until(lambda: on_other.get("k") == b"after", timeout=30)
            finally:
                on_other.close()
        finally:
            client.close()


def test_a_task_goes_on_from_the_primary_the_sentinels_name_after_a_split(
    tmp_path: Path,
) -> None:
    """Coordinator and workers leave an old primary that lives on as one; nothing is lost.

    Under `sync`, what the coordinator committed and archived on the old primary before it
    moved is acknowledged: the new primary is behind the archive, the task is restored
    from it and succeeds there, every acknowledged GC reads back, and no process writes to
    the old primary once it has moved.
    """
    with working(tmp_path, replicas=1) as (rs, cluster):
        task = cluster.tasks.submit(synced(team_spec(tmp_path / "ledger", slow=0.5)))
        cluster.tick_until(lambda: (cluster.store.hot.latest_gc(task) or 0) >= 1)
        old, _new = rs.split()
        cluster.tick_until(lambda: cluster.tasks.status(task).ended, timeout=120)
        assert "succeeded" == cluster.status(task)["status"]
        archived = cluster.store.cold.list_gcs(task)
        assert archived, "nothing archived"
        for number in archived:
            on_disk = cluster.store.cold.get_gc(task, number)
            assert on_disk is not None
            assert cluster.store.codec.named_digest(on_disk) == (
                cluster.store.read_gc(task, number).checksum
            )
        on_old = rs.client(old)
        try:
            seen = _snapshot(on_old, task)
            time.sleep(3)
            again = _snapshot(on_old, task)
        finally:
            on_old.close()
        # Keys only expire there (a heartbeat's TTL runs out): none is new, rewritten
        # or given a longer life.
        assert [] == [k for k in again if k not in seen], "a process writes to the old primary"
        changed = [k for k, (data, ttl) in again.items()
                   if data != seen[k][0] or ttl > seen[k][1] >= 0]  # fmt: skip
        assert [] == changed, "a process still writes to the old primary"


LAST_WORD = """
name: Last word
goal: Write DONE, then finish.
verify: sleep 3 && test -f DONE
agents:
  - name: solo
    model: scripted
    script:
      - say: Writing.
        latency: 0.3
        tools: [{name: write_file, args: {path: DONE, content: "done\\n"}}]
      - say: Finished.
        latency: 0.3
        tools: [{name: finish, args: {summary: done}}]
"""


def test_a_task_ends_only_on_a_primary_that_holds_its_last_gc(tmp_path: Path) -> None:
    """A task's end is not written on a new primary that never had the last GC.

    The coordinator commits the last superstep on the old primary of a split (its look
    for the primary lags) and moves during the three-second verify. Its end is
    refused on the new primary, which lacks the GC it stands on; the task goes on there
    from what that primary holds (or the archive: the old one's last GC went there) and
    succeeds with every agent's whole history.
    """
    with working(tmp_path, replicas=1) as (rs, cluster):
        task = cluster.tasks.submit(TaskSpec.model_validate(yaml.safe_load(LAST_WORD)))
        cluster.tick_until(lambda: run_field(cluster, task, "superstep") == "2")
        epoch = int(run_field(cluster, task, "epoch") or 0)
        wait_until(lambda: "solo" in cluster.store.hot.get_votes(task, epoch, 2), 30)
        old, _new = rs.split()
        # As a process whose look for the primary is slow: it names the old one 1.5 s more.
        pool = cast(_Pool, cluster.client.connection_pool)
        pool.named("127.0.0.1", old.port, time.monotonic() + 1.5)
        cluster.coordinator.tick()  # commits GC 2 on the old primary, verifies, moves
        on_old = rs.client(old)
        try:
            assert b"COMMITTED" == on_old.hget(keys.gc(task, 2), "status")
        finally:
            on_old.close()
        cluster.tick_until(lambda: cluster.tasks.status(task).ended, timeout=90)
        assert "succeeded" == cluster.status(task)["status"]
        gc = cluster.store.latest_gc(task)
        assert gc is not None
        assert gc.superstep == 2
        state = cluster.store.read_state(task, "solo", gc.members["solo"].id)
        said = [m.content for m in state.messages if m.role.value == "assistant"]
        assert ["Writing.", "Finished."] == said


def _snapshot(client: redis.Redis, task: str) -> dict[bytes, tuple[bytes | None, int]]:
    """Every key of `task` on one server: its DUMP and its PTTL (-1: no TTL)."""
    found: dict[bytes, tuple[bytes | None, int]] = {}
    for key in client.scan_iter(keys.task_prefix(task) + "*"):
        data, ttl = client.dump(key), client.pttl(key)
        if data is not None:  # it did not expire between the two reads
            found[bytes(key)] = (data, int(ttl))
    return found


def test_a_gc_no_replica_holds_pauses_the_task_until_one_does(
    guarded: ReplicaSet, tmp_path: Path
) -> None:
    """With its replica gone, a `replicated` GC is not acknowledged and the task pauses.

    Its reason is `replication`; once the replica is back and in sync, the task goes on
    and succeeds.
    """
    cluster = Cluster(guarded, tmp_path)
    replica = guarded.servers[1]
    try:
        cluster.start_worker()
        task = cluster.tasks.submit(replicated(team_spec(tmp_path / "ledger"), timeout=0.3))
        assert "0" == run_field(cluster, task, "replicated")  # GC 0, before submit returned
        replica.kill()
        cluster.tick_until(lambda: cluster.status(task)["status"] == "paused")
        reason = str(cluster.status(task)["reason"])
        assert reason.startswith(REPLICATION_REASON), reason
        assert "0" == run_field(cluster, task, "replicated")  # committed, not acknowledged
        latest = cluster.store.hot.latest_gc(task)
        assert latest is not None
        assert latest >= 1
        replica.start()
        guarded.wait_in_sync(replica)
        cluster.tick_until(lambda: cluster.tasks.status(task).ended)
        assert "succeeded" == cluster.status(task)["status"]
        assert int(run_field(cluster, task, "replicated") or -1) >= latest
    finally:
        if replica.process is None:
            replica.start()
        cluster.close()


def test_cli_client_and_saver_work_on_a_sentinel_url(
    guarded: ReplicaSet,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`cairn list`/`status`, `cairn.Client` and the LangGraph saver take a Sentinel URL."""
    env = {"CAIRN_REDIS_URL": guarded.url, "CAIRN_ARCHIVE_DIR": str(tmp_path / "archive")}
    with Client(redis_url=guarded.url, archive_dir=tmp_path / "archive") as client:
        task = client.submit(team_spec(tmp_path / "ledger"))
        assert "running" == task.status().state.value
        assert task.id in [t.task_id for t in client.tasks()]
    with cli_runner(env, monkeypatch, capsys) as run:
        code, out, err = run("status", task.id, "--json")
        assert 0 == code, err
        assert task.id in out
        code, out, err = run("list", "--json")
        assert (0, True) == (code, task.id in out), err
    saver = CairnSaver(guarded.url, tmp_path / "saver")
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    checkpoint = empty_checkpoint()
    stored = saver.put(config, checkpoint, {"source": "input", "step": -1}, {})  # type: ignore[arg-type]
    found = saver.get_tuple(stored)
    assert found is not None
    assert checkpoint["id"] == found.checkpoint["id"]


def test_the_password_of_a_sentinel_url_is_never_shown(guarded: ReplicaSet, tmp_path: Path) -> None:
    """A Sentinel URL's passwords are masked and kept off command lines.

    `display_url` masks both; workers the CLI starts get the URL in their environment.
    """
    url = guarded.url + "&" if "?" in guarded.url else guarded.url + "?"
    url += "sentinel_password=other-secret"
    shown = display_url(url)
    assert PASSWORD not in shown
    assert "other-secret" not in shown
    assert shown.startswith("redis+sentinel://:***@")
    assert repr(Client(redis_url=guarded.url)).count("***") == 1
    env = {**os.environ, "CAIRN_REDIS_URL": guarded.url,
           "CAIRN_STATE_DIR": str(tmp_path / "state")}  # fmt: skip
    supervisor = spawn(["worker", "--count", "1"], env, tmp_path / "workers.log")
    try:
        wait_until(lambda: 1 == len(children(supervisor.pid, "cairn.coordinator.worker")))
        pids = [supervisor.pid, *children(supervisor.pid, "cairn.coordinator.worker")]
        assert [] == [cmdline(pid) for pid in pids if PASSWORD in cmdline(pid)]
    finally:
        stop(supervisor)
