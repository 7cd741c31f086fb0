"""The coordinator with real RQ worker processes on a real redis-server."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from redis.backoff import NoBackoff
from redis.retry import Retry
from rq import Queue, Worker
from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer
from structlog.testing import capture_logs

from cairn.agents.barrier import build_gc
from cairn.agents.spec import FailSpec
from cairn.coordinator.committer import FRESH_LOOK
from cairn.coordinator.coordinator import Coordinator
from cairn.coordinator.jobs import STEP_JOB, STEPS_QUEUE
from cairn.coordinator.runs import Look, StepRun
from cairn.coordinator.spec import TaskSpec
from cairn.coordinator.worker import CairnJob, CairnWorker
from cairn.errors import FencedWrite, InvalidSpec
from cairn.storage import keys
from cairn.storage.backends.redis import connect
from cairn.storage.records import GCStatus, GlobalCheckpoint, LCRef
from cairn.testing.redis_server import RedisServer
from tests.cluster import Cluster, files_and_histories, outcome, run_foreign_job, team_spec
from tests.test_restore import run_until


def test_three_agents_on_two_workers(cluster: Cluster, tmp_path: Path) -> None:
    """A team collaborating through messages ends with the expected files and histories."""
    cluster.start_worker()
    cluster.start_worker()
    ledger = tmp_path / "ledger"
    task = cluster.tasks.submit(team_spec(ledger))
    status = cluster.drive(task)
    assert "succeeded" == status["status"], status
    files, histories, ran = outcome(cluster, task, ledger)
    assert {
        "greet.py": b"print('Hello')\n",
        "PLAN.md": b"1. say Hello\n",
        "REVIEW.md": b"Looks good.\n",
    } == files
    assert 1 == ran
    coder = histories["coder"]
    assert ("user", "Message from planner: Please make it say Hello.", []) in coder
    reviewer = histories["reviewer"]
    assert ("user", "Message from coder: Done, please review.", []) in reviewer
    assert ("tool", "print('Hello')\n", []) in reviewer


def test_a_worker_killed_mid_step_is_detected_and_the_step_retried(
    cluster: Cluster, tmp_path: Path
) -> None:
    """SIGKILL the worker running a slow step: it runs again as attempt 2, same result."""
    reference = tmp_path / "reference.ledger"
    cluster.start_worker()
    cluster.start_worker()
    clean = cluster.tasks.submit(team_spec(reference, slow=0.0))
    assert "succeeded" == cluster.drive(clean)["status"]

    ledger = tmp_path / "ledger"
    task = cluster.tasks.submit(team_spec(ledger, slow=2.0))
    killed = cluster.wait_for_step(task, "coder", superstep=2)
    time.sleep(0.3)  # the coder is inside its slow model turn
    os.kill(killed, signal.SIGKILL)
    status = cluster.drive(task)
    assert "succeeded" == status["status"], status
    assert outcome(cluster, clean, reference) == outcome(cluster, task, ledger)
    beat_owner = [w for w in cluster.workers if w.pid == killed]
    assert [-signal.SIGKILL] == [w.wait() for w in beat_owner]
    # The coder's committed step of superstep 2 is the retry's: attempt 2.
    gc = cluster.store.latest_gc(task)
    assert gc is not None
    chain = cluster.store.load_chain(task, "coder", gc.members["coder"].id)
    attempts = {c.record.superstep: c.record.attempt for c in chain if c.record.superstep <= 2}
    assert {0: 1, 1: 1, 2: 2} == attempts


def test_the_retry_of_a_killed_workers_step_starts_within_seconds_of_the_kill(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A dead worker is seen by its step's heartbeat lapsing, not by the step's timeout.

    The step would run 300 s before timing out; its heartbeat lives 3 s after the last
    beat. The coordinator retries the step because the worker stopped beating, and the
    retry is running on the other worker within 10 s of the kill.
    """
    cluster.start_worker()
    cluster.start_worker()
    spec = team_spec(tmp_path / "ledger", slow=5.0)
    assert 900.0 == spec.step_timeout  # the default: far beyond this test's wait
    task = cluster.tasks.submit(spec)
    killed = cluster.wait_for_step(task, "coder", superstep=2)
    with capture_logs() as logs:
        os.kill(killed, signal.SIGKILL)
        killed_at = time.monotonic()
        retry = cluster.wait_for_step(task, "coder", superstep=2, attempt=2)
        retried_after = time.monotonic() - killed_at
    assert killed != retry
    assert retried_after < 10.0, f"attempt 2 started {retried_after:.1f} s after the kill"
    retries = [(e["agent"], e["attempt"], e["why"]) for e in logs if e["event"] == "step retried"]
    assert [("coder", 2, "its worker stopped beating (dead or stalled)")] == retries


def test_a_workers_own_redis_calls_wait_out_redis_out_of_reach(tmp_path: Path) -> None:
    """Each Redis call of a worker's own outside RQ's wait for a job survives Redis gone.

    Stock RQ quits on an error there: a job taken just before a failover killed the
    worker that took it. With Redis SIGKILLed, the suspension check, RQ's registry
    sweep, the liveness beat and starting a job just taken all return; the job is left
    for the coordinator's retry (no lane runs it). The wait is logged once, and its end
    once Redis answers again; the worker's end is then recorded.
    """
    # Its data kept across the kill: the worker's end is recorded after the restart.
    server = RedisServer(tmp_path / "redis", appendonly=True, fsync="always").start()
    # No retries of redis-py's own: what is tested is what follows them.
    client = connect(server.url, retry=Retry(NoBackoff(), 0))
    queue = Queue(STEPS_QUEUE, connection=client, serializer=JSONSerializer)
    worker = CairnWorker([queue], connection=client, serializer=JSONSerializer, job_class=CairnJob)
    try:
        worker.register_birth()
        assert 1 == Worker.count(connection=client)
        queue.enqueue_call(STEP_JOB, args=("t", "a", 1, 1, 1), job_id="taken")
        taken = Queue.dequeue_any([queue], None, connection=client, job_class=CairnJob,
                                  serializer=JSONSerializer)  # fmt: skip
        assert taken is not None
        server.kill()
        with capture_logs() as logs:
            worker.check_for_suspension(burst=False)
            worker.run_maintenance_tasks()
            worker.last_heartbeat = None  # due
            worker.heartbeat()
            worker.execute_job(*taken)
            assert "taken" not in worker._running  # not started: left for a retry
            assert worker._lane_threads == 0  # no lane was given it
            server.start()
            worker.last_heartbeat = None
            worker.heartbeat()
            worker.teardown()
        said = [(e["event"], e.get("meanwhile")) for e in logs if "Redis" in e["event"]]
        assert [
            ("worker waits for Redis", "suspension not checked"),
            ("worker reaches Redis again", None),
        ] == said
        assert 0 == Worker.count(connection=client)  # the end, recorded once Redis was back
    finally:
        client.close()
        server.kill()


def test_a_zombie_worker_writes_nothing_that_is_accepted(cluster: Cluster, tmp_path: Path) -> None:
    """A worker stopped past the heartbeat's life is replaced; woken up, it is fenced."""
    reference = tmp_path / "reference.ledger"
    cluster.start_worker()
    cluster.start_worker()
    clean = cluster.tasks.submit(team_spec(reference))
    assert "succeeded" == cluster.drive(clean)["status"]
    ledger = tmp_path / "ledger"
    task = cluster.tasks.submit(team_spec(ledger, slow=2.0))
    frozen = cluster.wait_for_step(task, "coder", superstep=2)
    os.kill(frozen, signal.SIGSTOP)
    deadline = time.monotonic() + 60
    try:
        # Wait until the retry (attempt 2, on the other worker) has voted. The commit drops
        # the superstep's votes, so a committed superstep 2 also means the retry voted.
        while not cluster.store.hot.get_votes(task, 1, 2).get("coder"):
            if (cluster.store.hot.latest_gc(task) or 0) >= 2:
                break
            assert time.monotonic() < deadline, "the retry never voted"
            cluster.coordinator.tick()
            time.sleep(0.02)
    finally:
        os.kill(frozen, signal.SIGCONT)
    status = cluster.drive(task)
    assert "succeeded" == status["status"], status
    # The zombie woke, finished its model turn, and was refused at its first write.
    deadline = time.monotonic() + 15
    while b'"fenced"' not in (cluster.client.hget(keys.outcomes(task, 1, 2), "coder") or b""):
        assert time.monotonic() < deadline, "the zombie never reported"
        time.sleep(0.05)
    assert outcome(cluster, clean, reference) == outcome(cluster, task, ledger)


def test_a_new_coordinator_finishes_what_a_dead_one_started(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The coordinator dies with a superstep prepared but not committed; another carries on."""
    cluster.start_worker()
    task = cluster.tasks.submit(team_spec(tmp_path / "ledger"))
    cluster.start_superstep(task)
    assert [GCStatus.COMMITTED, GCStatus.PREPARING] == [
        g.status for g in cluster.store.list_gcs(task)
    ]
    # The first coordinator is gone: a second one, sharing nothing but Redis, takes over.
    successor = Coordinator(cluster.client, cluster.store, name="standby")
    stop = threading.Event()
    thread = threading.Thread(target=successor.run, args=(stop,))
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while cluster.status(task)["status"] == "running":
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        stop.set()
        thread.join()
    assert "succeeded" == cluster.status(task)["status"]
    listed = cluster.store.list_gcs(task)
    assert all(g.status is GCStatus.COMMITTED for g in listed)
    assert list(range(len(listed))) == [g.number for g in listed]


def test_pause_resume_and_cancel(cluster: Cluster, tmp_path: Path) -> None:
    """A paused task starts no superstep; resumed it goes on; cancelled it ends and is fenced."""
    cluster.start_worker()
    task = cluster.tasks.submit(team_spec(tmp_path / "ledger"))
    cluster.tasks.pause(task)
    for _ in range(20):
        cluster.coordinator.tick()
    assert 0 == cluster.status(task)["superstep"]
    cluster.tasks.resume(task)
    while cluster.status(task)["superstep"] == 0:
        cluster.coordinator.tick()
        time.sleep(0.02)
    epoch = cluster.store.hot.get_epoch(task)
    cluster.tasks.cancel(task)
    assert "cancelled" == cluster.status(task)["status"]
    assert epoch + 1 == cluster.store.hot.get_epoch(task)
    with pytest.raises(InvalidSpec, match="is cancelled"):
        cluster.tasks.resume(task)


def test_workers_refuse_functions_that_are_not_cairn_jobs(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """A job naming any other function fails without that function running."""
    marker = tmp_path / "pwned"
    job = run_foreign_job(redis_server.url, "os.system", f"touch {marker}")
    assert JobStatus.FAILED == job.get_status()
    assert "not a Cairn job" in (job.latest_result().exc_string or "")  # type: ignore[union-attr]
    assert not marker.exists()


def test_exhausted_retries_roll_back_then_fail(cluster: Cluster, tmp_path: Path) -> None:
    """A step failing every attempt aborts its superstep and rolls the task back, then fails it."""
    cluster.start_worker()
    spec = team_spec(tmp_path / "ledger")
    coder = spec.agents[1]
    coder.max_retries = 1
    coder.script[1].fail = FailSpec(attempts=[1, 2], error="retryable", message="model down")
    task = cluster.tasks.submit(spec)
    status = cluster.drive(task, timeout=120)
    assert "failed" == status["status"]
    assert "model down" in str(status["reason"])
    assert "rollbacks did not help" in str(status["reason"])
    listed = cluster.store.list_gcs(task)
    assert any(g.status is GCStatus.ABORTED for g in listed)
    latest = cluster.store.latest_gc(task)
    assert latest is not None
    assert 1 == latest.superstep  # rolled back to the last good barrier, every agent at it


def test_a_fatal_model_error_is_not_retried(cluster: Cluster, tmp_path: Path) -> None:
    """A fatal error (bad credentials) aborts at once instead of paying for retries."""
    cluster.start_worker()
    spec = team_spec(tmp_path / "ledger")
    spec.agents[0].script[0].fail = FailSpec(attempts=[1], error="fatal", message="401 bad key")
    task = cluster.tasks.submit(spec)
    cluster.drive(task, timeout=60)
    outcomes = cluster.client.hgetall(keys.outcomes(task, 1, 1))
    assert b"fatal" in outcomes[b"planner"]
    with pytest.raises(NoSuchJobError):  # no second attempt in that epoch
        Job.fetch(
            f"cairn-{task}-1-1-planner-2", connection=cluster.client, serializer=JSONSerializer
        )
    assert "401 bad key" in str(cluster.status(task)["reason"])


def test_many_tasks_share_one_pool_of_workers(cluster: Cluster, tmp_path: Path) -> None:
    """Three tasks at once on two workers all succeed with their own files."""
    cluster.start_worker()
    cluster.start_worker()
    tasks = [cluster.tasks.submit(team_spec(tmp_path / f"ledger-{i}")) for i in range(3)]
    deadline = time.monotonic() + 90
    while any(cluster.status(t)["status"] == "running" for t in tasks):
        assert time.monotonic() < deadline
        cluster.coordinator.tick()
        time.sleep(0.02)
    assert ["succeeded"] * 3 == [cluster.status(t)["status"] for t in tasks]
    for i, task in enumerate(tasks):
        assert (
            b"print('Hello')\n" == outcome(cluster, task, tmp_path / f"ledger-{i}")[0]["greet.py"]
        )


def test_a_commit_made_by_a_coordinator_that_then_died_is_taken_as_done(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The GC of the superstep in flight is already committed: the coordinator moves on."""
    cluster.start_worker()
    task = cluster.tasks.submit(team_spec(tmp_path / "ledger"))
    cluster.start_superstep(task)
    deadline = time.monotonic() + 30
    while len(cluster.store.hot.get_votes(task, 1, 1)) < 3:  # every step voted
        assert time.monotonic() < deadline
        time.sleep(0.02)
    # Another coordinator commits, then dies before writing down that it did.
    gc0 = cluster.store.read_gc(task, 0)
    votes = cluster.store.hot.get_votes(task, 1, 1)
    barrier = build_gc(
        cluster.store, gc0, votes, ["planner", "coder", "reviewer"], number=1, superstep=1, epoch=1
    )
    cluster.store.commit_gc(barrier.gc)
    # The run state still says superstep 1 is in flight: the coordinator must see it is done.
    assert b"1" == cluster.client.hget(keys.run(task), "superstep")
    assert "succeeded" == cluster.drive(task)["status"]
    assert all(g.status is GCStatus.COMMITTED for g in cluster.store.list_gcs(task))
    # ...and moved on: no step of superstep 1 was retried, nothing was rolled back.
    assert cluster.client.hget(keys.run(task), "rollbacks") is None
    assert {} == cluster.client.hgetall(keys.outcomes(task, 1, 1))


def test_a_coordinator_past_its_lease_is_fenced(cluster: Cluster, tmp_path: Path) -> None:
    """Once a newer leader has claimed a task, the old one's writes are refused."""
    task = cluster.tasks.submit(team_spec(tmp_path / "ledger"))
    old = Coordinator(cluster.client, cluster.store, name="old", lease_ttl_ms=200)
    assert old.lease.acquire()
    old.advance(task)  # claims the task and starts superstep 1
    time.sleep(0.4)  # ...then stalls past its lease
    new = Coordinator(cluster.client, cluster.store, name="new")
    assert new.lease.acquire()
    assert new.lease.token is not None
    assert old.lease.token is not None
    assert new.lease.token > old.lease.token
    new.advance(task)
    with pytest.raises(FencedWrite, match="owned by coordinator token"):
        old.advance(task)
    with pytest.raises(FencedWrite, match="no longer owns"):
        old.runs.write(task, {"status": "failed", "reason": "stale"})
    assert "running" == cluster.status(task)["status"]


def test_a_leader_whose_token_redis_set_back_outranks_the_tasks_owner(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A task owned by a token above every token drawn since still runs to its end.

    Redis lost the token counter's writes but not the owner's (a lagging replica promoted,
    or a stale coordinator claiming after a FLUSHALL). The leader raises the counter past
    the owner and leads again with a token above it, instead of being refused for ever.
    """
    cluster.start_worker()
    task = cluster.tasks.submit(team_spec(tmp_path / "ledger"))
    cluster.client.set(keys.owner(task), 1000)
    cluster.client.set(keys.LEASE_TOKEN, 5)
    coordinator = cluster.start_coordinator("set-back")
    deadline = time.monotonic() + 60
    while cluster.status(task)["status"] == "running":
        assert time.monotonic() < deadline, cluster.status(task)
        assert coordinator.poll() is None
        time.sleep(0.05)
    assert "succeeded" == cluster.status(task)["status"]
    assert int(cast(bytes, cluster.client.get(keys.owner(task)))) > 1000
    leader = cast(bytes, cluster.client.get(keys.LEASE)).decode()
    assert leader.startswith("set-back:")
    assert int(leader.split(":")[1]) > 1000


def test_a_task_a_restore_left_restoring_is_restored_again_and_runs_to_its_end(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A restorer that stopped half-way (killed, or fenced) leaves the task `restoring`.

    With no restore holding the task's lock, the leader restores it to its latest
    committed GC and the task goes on; while the lock is held it waits.
    """
    cluster.start_worker()
    task = cluster.tasks.submit(team_spec(tmp_path / "ledger"))
    cluster.client.hset(keys.run(task), "status", "restoring")
    cluster.client.set(keys.restore_lock(task), "a live restorer", px=1_500)
    coordinator = cluster.start_coordinator("after-a-restore")
    time.sleep(1.0)  # the lock holds: nothing is done
    assert "running" == cluster.status(task)["status"]
    assert cluster.status(task)["restoring"]
    assert 1 == cluster.status(task)["epoch"]
    deadline = time.monotonic() + 60
    while cluster.status(task)["status"] == "running":
        assert time.monotonic() < deadline, cluster.status(task)
        assert coordinator.poll() is None
        time.sleep(0.05)
    final = cluster.status(task)
    assert ("succeeded", 2) == (final["status"], final["epoch"])  # restored once, then ran


def test_a_standby_coordinator_process_takes_over_from_a_killed_one(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Two coordinator processes; the leader is SIGKILLed mid-superstep; the standby finishes."""
    cluster.start_worker()
    cluster.start_worker()
    task = cluster.tasks.submit(team_spec(tmp_path / "ledger", slow=1.5))
    first = cluster.start_coordinator("first")
    deadline = time.monotonic() + 60
    while not cast(bytes, cluster.client.get(keys.LEASE) or b"").startswith(b"first:"):
        assert time.monotonic() < deadline, "the first coordinator never took the lease"
        time.sleep(0.02)
    second = cluster.start_coordinator("second")  # a standby: the lease is taken
    while int(cluster.client.hget(keys.run(task), "superstep") or 0) != 2:
        assert time.monotonic() < deadline, "superstep 2 never started"
        time.sleep(0.02)
    assert GCStatus.PREPARING == cluster.store.list_gcs(task)[-1].status  # prepared, not committed
    leader = cast(bytes, cluster.client.get(keys.LEASE)).decode().split(":")[0]
    assert "first" == leader
    first.send_signal(signal.SIGKILL)
    first.wait()
    while cluster.status(task)["status"] == "running":
        assert time.monotonic() < deadline, cluster.status(task)
        time.sleep(0.05)
    assert "succeeded" == cluster.status(task)["status"]
    assert cast(bytes, cluster.client.get(keys.LEASE)).decode().startswith("second:")
    assert all(g.status is GCStatus.COMMITTED for g in cluster.store.list_gcs(task))
    assert second.poll() is None  # the standby is still running, now as the leader


def test_a_job_taken_by_a_worker_that_died_before_starting_it_is_retried(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A worker moved a step's job out of the queue, then died before starting it.

    The job stays `queued` in no queue (RQ's sweep finds such jobs only minutes later):
    the coordinator sees it and retries the step as attempt 2.
    """
    task = cluster.tasks.submit(team_spec(tmp_path / "ledger"))
    cluster.start_superstep(task)
    queue = f"rq:queue:{STEPS_QUEUE}"
    job = cast(bytes, cluster.client.lindex(queue, 0)).decode()
    cluster.client.lmove(queue, f"{queue}:intermediate")  # as RQ's dequeue does
    assert "queued" == Job.fetch(job, connection=cluster.client, serializer=JSONSerializer
                                 ).get_status()  # fmt: skip
    cluster.start_worker()
    assert "succeeded" == cluster.drive(task)["status"]
    agent = job.split("-")[-2]
    first = cluster.store.read_gc(task, 1)
    assert 2 == cluster.store.read_lc(task, agent, first.members[agent].id).attempt


def test_a_retry_of_a_step_whose_job_was_canceled_already_goes_on(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A coordinator died between canceling a failed step's job and recording the retry.

    Its successor finds the job canceled and retries the step; canceling it again must
    not raise (it did, and the coordinator died on it, again and again).
    """
    task = cluster.tasks.submit(team_spec(tmp_path / "ledger"))
    cluster.start_superstep(task)
    job = cast(bytes, cluster.client.lindex(f"rq:queue:{STEPS_QUEUE}", 0)).decode()
    Job.fetch(job, connection=cluster.client, serializer=JSONSerializer).cancel()
    cluster.start_worker()
    assert "succeeded" == cluster.drive(task)["status"]
    agent = job.split("-")[-2]
    first = cluster.store.read_gc(task, 1)
    assert 2 == cluster.store.read_lc(task, agent, first.members[agent].id).attempt


def test_a_job_a_worker_took_a_moment_ago_is_not_taken_for_dead(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A job taken from its queue and not started yet waits a grace before it counts as lost.

    Under load a worker may take a while between taking a job and marking it started; a
    look in between, past the grace since the job's enqueue, sees it in neither state. It
    is retried only if a grace later it is still so; started meanwhile, it runs as attempt 1.
    """
    task = cluster.tasks.submit(team_spec(tmp_path / "ledger"))
    cluster.start_superstep(task)
    queue = f"rq:queue:{STEPS_QUEUE}"
    job = cast(bytes, cluster.client.lindex(queue, 0)).decode()
    cluster.client.lmove(queue, f"{queue}:intermediate")  # a worker took it
    time.sleep(cluster.coordinator.heartbeat_grace + 0.1)  # older than the grace
    for _ in range(3):  # first found taken, then looked at again within the grace
        cluster.coordinator.tick()
        time.sleep(0.25)
    agent = job.split("-")[-2]
    steps = cluster.client.hgetall(keys.steps(task))
    assert 1 == json.loads(steps[agent.encode()])["attempt"]
    cluster.client.lmove(f"{queue}:intermediate", queue)  # it starts after all
    cluster.start_worker()
    assert "succeeded" == cluster.drive(task)["status"]
    first = cluster.store.read_gc(task, 1)
    assert 1 == cluster.store.read_lc(task, agent, first.members[agent].id).attempt


@pytest.mark.parametrize("durability", ["async", "sync"])
def test_a_superstep_begins_after_its_predecessor_is_acknowledged(
    cluster: Cluster, tmp_path: Path, durability: str
) -> None:
    """A superstep's steps launch only once the GC before it is acknowledged.

    That is once it committed, and under `sync` once it is on disk too; under `async` the
    commit's own write begins the next superstep, with nothing refused on the way.
    """
    spec = team_spec(tmp_path / "ledger")
    spec = spec.model_copy(
        update={"checkpoints": spec.checkpoints.model_copy(update={"durability": durability})}
    )
    cluster.start_worker()
    task = cluster.tasks.submit(spec)
    with capture_logs() as logs:
        assert "succeeded" == cluster.drive(task)["status"]
    events = [e for e in logs if e.get("task") == task]
    at = {(e["event"], e.get("superstep")): n for n, e in reversed(list(enumerate(events)))}
    for n, event in enumerate(events):
        if event["event"] != "steps launched" or event["superstep"] == 1:
            continue
        committed = at[("superstep committed", event["superstep"] - 1)]
        assert committed < n
        if durability == "sync":
            archived = [k for k, e in enumerate(events) if e["event"] == "checkpoints archived"
                        and e["through"] >= event["superstep"] - 1]  # fmt: skip
            assert archived, f"GC of superstep {event['superstep'] - 1} never archived"
            assert archived[0] < n
    assert [] == [e for e in events if e["event"] == "next superstep not begun with the commit"]


def test_a_superstep_whose_voted_lc_is_gone_rolls_back_and_the_task_goes_on(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A superstep whose voted LC Redis no longer holds is a failed superstep.

    It rolls back to the latest committed GC, as an exhausted step does, and the task
    goes on to its end instead of being refused at every tick.
    """
    task, votes = voted_superstep(cluster, tmp_path)
    lost = sorted(votes)[0]
    cluster.client.delete(keys.lc(task, votes[lost].id))  # gone with the Redis that held it
    with capture_logs() as logs:
        assert "succeeded" == cluster.drive(task)["status"]
    aborted = [e["reason"] for e in logs if e["event"] == "superstep aborted; rolling back"]
    assert 1 == len(aborted), aborted
    assert "superstep 1 cannot be committed" in aborted[0]
    committed = [(g.number, g.superstep) for g in cluster.store.list_gcs(task)
                 if g.status is GCStatus.COMMITTED]  # fmt: skip
    assert [(0, 0), (2, 0)] == committed[:2]  # GC 1 never committed; the restore's is GC 2


def voted_superstep(cluster: Cluster, tmp_path: Path) -> tuple[str, dict[str, LCRef]]:
    """A team task whose first superstep every step voted on, not yet committed."""
    cluster.start_worker()
    task = cluster.tasks.submit(team_spec(tmp_path / "ledger"))
    cluster.start_superstep(task)
    agents = {bytes(a).decode() for a in cast(list[bytes], cluster.client.hkeys(keys.steps(task)))}
    deadline = time.monotonic() + 30
    while (votes := cluster.store.hot.get_votes(task, 1, 1)).keys() != agents:
        assert time.monotonic() < deadline, "the steps never voted"
        time.sleep(0.05)
    return task, votes


WRITER = """
  - name: {name}
    model: scripted
    script:
      - say: Writing.
        tools:
          - {{name: write_file, args: {{path: {name}.md, content: {name}}}}}
          - {{name: finish, args: {{summary: done}}}}"""
TWO_WRITERS = "name: Two writers\ngoal: Write a file each.\nagents:" + "".join(
    WRITER.format(name=name) for name in ("one", "two")
)


@pytest.mark.parametrize("refusals", [1, 2])
def test_a_commit_refused_once_is_tried_again_before_the_superstep_rolls_back(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refusals: int
) -> None:
    """A refusal the next tick heals costs a tick, not a rollback; a second rolls back.

    Two agents write a file each: the merged manifest is the barrier's own. It is gone
    when the commit arrives (it went to a primary replaced since): the next tick stores
    it again and commits. Gone again then, the superstep rolls back and the task goes on.
    """
    store = cluster.coordinator.store
    lost: list[int] = []
    for name in ("commit_gc", "commit_and_begin"):
        real = getattr(store, name)

        def losing(gc: GlobalCheckpoint, *args: object, _real: Any = real) -> object:
            if len(lost) < refusals and gc.superstep:  # not the submit's GC 0
                lost.append(gc.number)
                cluster.client.delete(keys.blob(gc.task, gc.workspace))
            return _real(gc, *args)

        monkeypatch.setattr(store, name, losing)
    cluster.start_worker()
    task = cluster.tasks.submit(TaskSpec.model_validate(yaml.safe_load(TWO_WRITERS)))
    with capture_logs() as logs:
        assert "succeeded" == cluster.drive(task)["status"]
    events = [e["event"] for e in logs]
    assert [1] * refusals == lost
    assert {"one.md", "two.md"} <= files_and_histories(cluster, task)[0].keys()
    assert 1 == events.count("commit refused; tried again")
    gcs = cluster.store.list_gcs(task)
    if refusals == 1:
        assert "superstep aborted; rolling back" not in events
        assert all(g.status is GCStatus.COMMITTED for g in gcs)
        assert list(range(len(gcs))) == [g.superstep for g in gcs]  # none lost or redone
    else:
        assert 1 == events.count("superstep aborted; rolling back")
        assert GCStatus.ABORTED is gcs[1].status  # the superstep refused twice


def test_a_pause_set_while_the_tick_was_busy_elsewhere_stops_the_next_superstep(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A look older than the commit's begin is read again: a pause set since is obeyed."""
    task, _ = voted_superstep(cluster, tmp_path)
    seen = cluster.coordinator.runs.look([task])[task]
    assert isinstance(seen, Look)
    cluster.tasks.pause(task)
    cluster.coordinator.advance(task, replace(seen, taken=seen.taken - 2 * FRESH_LOOK))
    latest = cluster.store.latest_gc(task)
    assert latest is not None
    assert 1 == latest.superstep  # the superstep in flight committed
    run = cluster.client.hgetall(keys.run(task))
    assert (b"0", b"paused") == (run[b"superstep"], run[b"status"])  # and none began


def test_the_tick_that_commits_a_superstep_begins_the_next(
    cluster: Cluster, tmp_path: Path
) -> None:
    """No tick passes between a commit and the next superstep's launch."""
    cluster.start_worker()
    task = cluster.tasks.submit(team_spec(tmp_path / "ledger"))
    deadline = time.monotonic() + 30
    while (latest := cluster.store.latest_gc(task)) is None or latest.superstep < 1:
        assert time.monotonic() < deadline, "superstep 1 never committed"
        cluster.coordinator.tick()
        time.sleep(0.02)
    run = cluster.client.hgetall(keys.run(task))
    assert (b"2", b"running") == (run[b"superstep"], run[b"status"])  # launched already
    assert cluster.coordinator.archiver.drain()  # nothing left running past the test


def test_no_superstep_begins_while_a_restore_that_raised_the_epoch_leads(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A restore that raised the epoch leads until it commits: no superstep begins.

    A restorer that died leaves its lock to lapse; the task then goes on under its epoch.
    """
    cluster.start_worker()
    task = cluster.tasks.submit(team_spec(tmp_path / "ledger"))
    gc1 = run_until(cluster, task, 1)  # between supersteps 1 and 2, running
    cluster.client.set(keys.restore_lock(task), "someone", px=60_000)
    raised = cluster.store.raise_epoch(task, gc1.epoch + 1)
    for _ in range(5):
        cluster.coordinator.tick()
    assert b"0" == cluster.client.hget(keys.run(task), "superstep")
    assert gc1.number == cast(GlobalCheckpoint, cluster.store.latest_gc(task)).number
    cluster.client.delete(keys.restore_lock(task))  # the restorer died before committing
    cluster.coordinator.tick()
    assert str(raised).encode() == cluster.client.hget(keys.run(task), "epoch")
    assert "succeeded" == cluster.drive(task)["status"]


def test_a_step_that_voted_after_the_look_is_not_taken_for_failed(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A job seen ended whose vote landed after the look read the votes is no failure.

    A look woken by one step's vote often reads the votes just before a teammate votes
    and its job ends; the failure check then reads that job ended. Judged on the look's
    votes alone it would be "finished without a vote" and retried, its good vote thrown
    away. The check reads the votes again after the jobs.
    """
    task, votes = voted_superstep(cluster, tmp_path)
    kept = cast(dict[bytes, bytes], cluster.client.hgetall(keys.steps(task)))
    steps = {agent.decode(): StepRun.load(raw) for agent, raw in kept.items()}
    deadline = time.monotonic() + 30
    for step in steps.values():  # every job ended, after its vote
        job = Job.fetch(step.job, connection=cluster.client, serializer=JSONSerializer)
        while job.get_status(refresh=True) is not JobStatus.FINISHED:
            assert time.monotonic() < deadline, f"job {step.job} never finished"
            time.sleep(0.05)
    seen = cluster.coordinator.runs.look([task])[task]
    assert isinstance(seen, Look)
    assert seen.votes.keys() == votes.keys()
    stale = replace(seen, votes={})  # as a look that read the votes before any came
    with capture_logs() as logs:
        cluster.coordinator.watcher.watch(task, stale)
    assert [] == [e for e in logs if e["event"] == "step retried"]
    after = cast(dict[bytes, bytes], cluster.client.hgetall(keys.steps(task)))
    attempts = {agent.decode(): StepRun.load(raw).attempt for agent, raw in after.items()}
    assert dict.fromkeys(steps, 1) == attempts
    assert "succeeded" == cluster.drive(task)["status"]
