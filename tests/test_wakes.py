"""Wake-ups: a coordinator moves a task on the moment it has news, and without them too.

Real parts: a private redis-server, real worker processes, the real coordinator loop
(`Coordinator.run`) on a thread or in a process of its own. Two runs show which path
moved the task: one whose scheduled looks are a minute apart (only wakes can move it
within the test's deadline) and one that drops every wake it takes (only the looks can).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from structlog.testing import capture_logs

from cairn.agents.spec import AgentSpec, TaskRecord
from cairn.agents.task import start_task
from cairn.coordinator.archiver import ArchiveJob, Archiver
from cairn.coordinator.coordinator import Coordinator
from cairn.coordinator.spec import TaskSpec
from cairn.coordinator.wakes import Timers, Wakes, wake
from cairn.errors import FencedWrite
from cairn.storage import keys
from cairn.storage.records import GCStatus, Level
from cairn.storage.store import CheckpointStore
from cairn.testing.coordinator import PoisonedCoordinator, kill_at_commit, lose_wakes
from tests.cluster import Cluster, outcome, team_spec
from tests.factories import new_agent, run_task, take_step

NEVER = 60.0  # seconds between scheduled looks: longer than any test here waits
DEADLINE = 45.0  # seconds a task may take to end


def test_a_wake_names_its_tasks_once_each_in_order(redis_client: redis.Redis) -> None:
    """Every wake waiting is taken in one go, each task once, in the order first woken."""
    redis_client.delete(keys.WAKES)
    wake(redis_client, "b")
    wake(redis_client, "a", "b")
    wake(redis_client)  # nothing to wake: nothing pushed
    assert ["b", "a"] == Wakes(redis_client).wait(1.0)
    assert 0 == redis_client.llen(keys.WAKES)


def test_no_wake_waits_out_its_timeout_and_returns_nothing(redis_client: redis.Redis) -> None:
    """A wait that no wake ends returns [] (a blocking read bounded by its own timeout)."""
    redis_client.delete(keys.WAKES)
    assert [] == Wakes(redis_client).wait(0.05)


def test_wakes_nobody_takes_are_capped(redis_client: redis.Redis) -> None:
    """With no coordinator reading them, wakes cannot fill Redis: the newest CAP are kept."""
    redis_client.delete(keys.WAKES)
    wake(redis_client, *(f"t{n}" for n in range(keys.WAKES_CAP + 50)))
    assert keys.WAKES_CAP == redis_client.llen(keys.WAKES)
    assert b"t50" == redis_client.lindex(keys.WAKES, 0)
    redis_client.delete(keys.WAKES)


def test_a_vote_carries_its_wake_and_a_fenced_vote_is_still_refused(
    real_store: CheckpointStore, redis_client: redis.Redis
) -> None:
    """A vote pushes its task's wake in its own write; a tool-level LC wakes nobody."""
    redis_client.delete(keys.WAKES)
    state = new_agent(real_store, "voter-1", "coder")
    take_step(state, 1)
    real_store.write_lc(state, Level.TOOL)  # a tool-level LC: no vote, no news
    assert 0 == redis_client.llen(keys.WAKES)
    real_store.write_lc(state, vote=True)
    assert [b"voter-1"] == redis_client.lrange(keys.WAKES, 0, -1)
    assert {b"coder"} == set(redis_client.hkeys(keys.votes("voter-1", 1, 1)))
    redis_client.delete(keys.WAKES)
    redis_client.client_kill_filter(_type="normal", skipme=True)  # the held connection too
    real_store.write_lc(state, vote=True)  # the same vote again, on a new connection
    assert [b"voter-1"] == redis_client.lrange(keys.WAKES, 0, -1)
    redis_client.delete(keys.WAKES)
    redis_client.incr(keys.epoch("voter-1"))  # a restore moved on: this attempt is a zombie
    with pytest.raises(FencedWrite):
        real_store.write_lc(state, vote=True)
    redis_client.delete(keys.WAKES)


def test_a_wake_for_a_task_that_is_not_active_is_dropped(redis_client: redis.Redis) -> None:
    """Only active tasks are looked at: a wake for one gone (or garbage) claims nothing."""
    redis_client.sadd(keys.ACTIVE_TASKS, "alive-1")
    try:
        assert ["alive-1"] == Wakes(redis_client).active(["gone-1", "alive-1", "../x"])
    finally:
        redis_client.srem(keys.ACTIVE_TASKS, "alive-1")
    assert not redis_client.exists(keys.owner("gone-1"))


def test_a_wake_that_fails_to_be_pushed_raises_nothing() -> None:
    """A wake is a hint: one Redis refuses is lost, never an error for the step that sent it."""
    dead = redis.Redis(port=1, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    wake(dead, "t-1")  # no Redis listens on port 1


@contextmanager
def running(coordinator: Coordinator, every: float) -> Iterator[None]:
    """`coordinator.run` on a thread, stopped (and joined) on leaving."""
    stop = threading.Event()
    thread = threading.Thread(
        target=coordinator.run, args=(stop,), kwargs={"every": every}, daemon=True
    )
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)
        assert not thread.is_alive()


def ended(cluster: Cluster, task: str) -> dict[str, object]:
    """Wait (not tick: a coordinator runs) until `task` ends; return its status as JSON."""
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        status = cluster.tasks.status(task)
        if status.ended:
            return status.to_json()
        time.sleep(0.05)
    raise AssertionError(
        f"task {task} did not end: {cluster.status(task)}\n{cluster.worker_logs()}"
    )


def test_wakes_alone_move_a_task_through_every_superstep(cluster: Cluster, tmp_path: Path) -> None:
    """Looks a minute apart: the submit's wake and each superstep's votes move the task."""
    cluster.start_worker()
    cluster.start_worker()
    cluster.wait_for_workers(2)
    ledger = tmp_path / "ledger"
    with running(cluster.coordinator, every=NEVER):
        time.sleep(0.3)  # past its first look, which finds nothing: the next is a minute away
        task = cluster.tasks.submit(team_spec(ledger))
        status = ended(cluster, task)
    assert "succeeded" == status["status"], status
    files, _, ran = outcome(cluster, task, ledger)
    assert b"Looks good.\n" == files["REVIEW.md"]
    assert 1 == ran


def test_a_retry_whose_backoff_ends_is_launched_by_a_timer(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Looks a minute apart: a failed step's retry launches when its backoff ends.

    The failure's wake brings the retry; no wake announces its backoff's end, so only
    the coordinator's timer can launch it within the test's deadline.
    """
    cluster.start_worker()
    cluster.wait_for_workers(1)
    data = team_spec(tmp_path / "ledger").model_dump()
    data["agents"][0]["script"][0]["fail"] = {"attempts": [1], "error": "retryable"}
    with capture_logs() as logs, running(cluster.coordinator, every=NEVER):
        time.sleep(0.3)  # past its first look: the next is a minute away
        task = cluster.tasks.submit(TaskSpec.model_validate(data))
        status = ended(cluster, task)
    assert "succeeded" == status["status"], status
    assert any(e["event"] == "step retried" and e["attempt"] == 2 for e in logs)


def test_lost_wakes_cost_latency_never_progress(cluster: Cluster, tmp_path: Path) -> None:
    """A coordinator that drops every wake it takes still ends the task, by its looks."""
    cluster.start_worker()
    cluster.wait_for_workers(1)
    ledger = tmp_path / "ledger"
    losing = PoisonedCoordinator(cluster.client, cluster.store, heartbeat_grace=1.0)
    lose_wakes(cluster.client, 300.0)
    with capture_logs() as logs, running(losing, every=0.5):
        task = cluster.tasks.submit(team_spec(ledger))
        status = ended(cluster, task)
    assert "succeeded" == status["status"], status
    assert any(entry["event"] == "wakes lost on purpose" for entry in logs)
    assert 1 == outcome(cluster, task, ledger)[2]


def test_a_leader_killed_between_the_last_vote_and_the_commit_loses_nothing(
    cluster: Cluster, tmp_path: Path
) -> None:
    """SIGKILL the leader as it begins a commit, woken by the last vote: nothing is lost.

    A standby commits that superstep from the votes in Redis, and the task ends as an
    undisturbed run does.
    """
    cluster.start_worker()
    cluster.start_worker()
    cluster.wait_for_workers(2)
    reference_ledger = tmp_path / "reference"
    with running(cluster.coordinator, every=0.5):
        reference = cluster.tasks.submit(team_spec(reference_ledger))
        assert "succeeded" == ended(cluster, reference)["status"]
    cluster.client.delete(keys.LEASE)  # the thread released it; any rest of it goes too
    first = cluster.start_coordinator("first", module="cairn.testing.coordinator")
    deadline = time.monotonic() + DEADLINE
    while cluster.client.get(keys.LEASE) is None:  # the first takes the lease: it leads
        assert time.monotonic() < deadline, "the first coordinator never led"
        time.sleep(0.05)
    cluster.start_coordinator("standby", module="cairn.testing.coordinator")
    kill_at_commit(cluster.client)
    ledger = tmp_path / "ledger"
    task = cluster.tasks.submit(team_spec(ledger))
    status = ended(cluster, task)
    assert first.wait(timeout=DEADLINE) == -9  # SIGKILLed, at its first commit
    assert not cluster.client.exists("cairn:testing:kill-at-commit")
    assert "succeeded" == status["status"], status
    assert outcome(cluster, task, ledger) == outcome(cluster, reference, reference_ledger)
    statuses = [gc.status for gc in cluster.store.list_gcs(task)]
    assert GCStatus.ABORTED not in statuses  # the commit was made, not given up


def test_an_ending_task_waits_for_its_own_archive_not_the_loop(
    real_store: CheckpointStore, redis_client: redis.Redis
) -> None:
    """The end of a task asks the archiver for its last GC and goes on, never waiting.

    Once archived, the archiver says so (the coordinator's wake), and the end may be
    written: tasks ending at once never wait for one another's archives.
    """
    task = f"ending-{time.monotonic_ns()}"
    agent = AgentSpec(name="a", model="scripted")
    start_task(real_store, TaskRecord(task=task, goal="g", agents=[agent]), {"f": b"x"})
    told: list[str] = []
    archiver = Archiver(real_store, lambda t, n: None, told.append)
    job = ArchiveJob(task, 0, hot_keep=2, cold_keep=5)
    assert not archiver.last(job)  # queued: not archived yet, the caller goes on
    deadline = time.monotonic() + 30
    while not archiver.last(job):
        assert time.monotonic() < deadline, "the archive never came"
        time.sleep(0.01)
    assert [task] == told
    assert 0 in real_store.cold.list_gcs(task)
    archiver.forget(task)
    assert not archiver.last(job)  # forgotten: a new ending asks again
    assert archiver.drain()


def test_a_task_is_archived_once_a_pace_its_newest_gc_taking_the_rest_along(
    real_store: CheckpointStore,
) -> None:
    """Its first GC goes at once; the next ones wait out the pace and go together.

    A drain, or the task's end, does not wait for the pace.
    """
    task = f"paced-{time.monotonic_ns()}"
    run_task(real_store, task, supersteps=4)
    acknowledged: list[int] = []
    archiver = Archiver(real_store, lambda t, n: acknowledged.append(n), pace=3600.0)
    archiver.submit(ArchiveJob(task, 1, hot_keep=10, cold_keep=50))
    deadline = time.monotonic() + 30
    while acknowledged != [1]:
        assert time.monotonic() < deadline, "the first GC was not archived at once"
        time.sleep(0.01)
    archiver.submit(ArchiveJob(task, 2, hot_keep=10, cold_keep=50))
    archiver.submit(ArchiveJob(task, 3, hot_keep=10, cold_keep=50))
    time.sleep(0.3)
    assert [1] == acknowledged  # held for the pace
    assert [1] == real_store.cold.list_gcs(task)
    assert archiver.drain()
    assert [1, 3] == acknowledged  # one archive: the newest, GC 2 along with it
    assert [1, 2, 3] == real_store.cold.list_gcs(task)
    ending = ArchiveJob(task, 4, hot_keep=10, cold_keep=50)
    assert not archiver.last(ending)
    while not archiver.last(ending):  # within the pace: an end does not wait for it
        assert time.monotonic() < deadline, "the last GC waited for the pace"
        time.sleep(0.01)
    assert [1, 3, 4] == acknowledged


def test_timers_say_when_a_look_is_due_earliest_first() -> None:
    """A retry's backoff ending is a look due at that time, the earliest asked for a task."""
    timers = Timers()
    timers.at("a", 20.0)
    timers.at("a", 10.0)
    timers.at("b", 15.0)
    assert 10.0 == timers.next()
    assert [] == timers.due(9.0)
    assert ["a"] == timers.due(12.0)
    assert 15.0 == timers.next()
    timers.forget("b")
    assert timers.next() is None
