"""A task's verify runs on the workers as a job: never in the coordinator's loop.

Real worker processes on a real redis-server, the coordinator driven by the test.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import cast

import pytest
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer

from cairn.coordinator.coordinator import Coordinator
from cairn.coordinator.jobs import STEPS_QUEUE
from cairn.coordinator.runs import RunState
from cairn.coordinator.spec import Limits, TaskSpec
from cairn.coordinator.verifier import GaveUp, Verifier
from cairn.coordinator.verify import FIELD, JOB, TRIES, VerifyRun
from cairn.storage import keys
from cairn.storage.backends.redis import RedisHotStore, connect
from cairn.testing.redis_server import RedisServer
from tests.cluster import Cluster, team_spec

KEY = "sk-proj-" + "A1b2C3d4E5f6G7h8I9j0" * 2


def with_verify(spec: TaskSpec, command: str) -> TaskSpec:
    """`spec` verified by `command`."""
    return spec.model_copy(update={"verify": command})


def verify_run(cluster: Cluster, task: str) -> VerifyRun | None:
    """The verify in flight, as the run hash notes it."""
    raw = cast(bytes | None, cluster.client.hget(keys.run(task), FIELD))
    return None if raw is None else VerifyRun.load(raw)


def beat_of(task: str, run: VerifyRun) -> str:
    """The heartbeat key of the verify try `run` of `task`."""
    return keys.verify_beat(task, run.epoch, run.gc, run.attempt)


def tick_until_verify_beats(cluster: Cluster, task: str) -> None:
    """Tick until the task's verify try in flight beats (a worker runs it)."""

    def beats() -> bool:
        run = verify_run(cluster, task)
        return run is not None and bool(cluster.client.exists(beat_of(task, run)))

    cluster.tick_until(beats)


def test_a_long_verify_holds_up_no_other_task(cluster: Cluster, tmp_path: Path) -> None:
    """While one task's verify runs for a minute, another task runs from start to end."""
    cluster.start_worker()
    cluster.start_worker()
    slow = cluster.tasks.submit(with_verify(team_spec(tmp_path / "ledger"), "sleep 60"))
    cluster.tick_until(lambda: verify_run(cluster, slow) is not None)
    other = cluster.tasks.submit(team_spec(tmp_path / "ledger"))
    cluster.tick_until(lambda: cluster.tasks.status(other).ended, timeout=40)
    assert "succeeded" == cluster.status(other)["status"]
    assert "running" == cluster.status(slow)["status"]  # its verify still runs, elsewhere
    cluster.tasks.cancel(slow)


def test_the_verify_is_a_job_a_worker_runs(cluster: Cluster, tmp_path: Path) -> None:
    """The verify is an RQ job of Cairn's verify function, run by a worker, not the coordinator.

    With no worker it waits, enqueued; a worker started then runs it and the task ends.
    """
    cluster.start_worker()
    task = cluster.tasks.submit(team_spec(tmp_path / "ledger"))
    cluster.tick_until(lambda: verify_run(cluster, task) is not None)
    for worker in cluster.workers:
        worker.kill()
        worker.wait()
    run = verify_run(cluster, task)
    assert run is not None
    job = Job.fetch(run.job, connection=cluster.client, serializer=JSONSerializer)
    assert JOB == job.func_name
    assert [task, run.gc, run.epoch, run.attempt] == list(job.args)
    cluster.start_worker()
    status = cluster.drive(task)
    assert ("succeeded", "verify passed") == (status["status"], status["reason"])


def test_a_worker_killed_in_a_verify_is_seen_and_the_verify_tried_again(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A verify whose worker dies is tried again within seconds, on a live worker."""
    cluster.start_worker()
    cluster.start_worker()
    task = cluster.tasks.submit(with_verify(team_spec(tmp_path / "ledger"), "sleep 2 && true"))

    tick_until_verify_beats(cluster, task)
    run = verify_run(cluster, task)
    assert run is not None
    beat = cast(bytes, cluster.client.get(beat_of(task, run))).decode()
    os.kill(int(beat.split(":")[1]), signal.SIGKILL)
    status = cluster.drive(task)
    assert ("succeeded", "verify passed") == (status["status"], status["reason"])
    run = verify_run(cluster, task)
    assert run is not None
    assert 2 == run.attempt


def test_what_a_verify_prints_is_stored_redacted(cluster: Cluster, tmp_path: Path) -> None:
    """A secret a verify command prints is in neither its verdict nor the task's status."""
    cluster.start_worker()
    spec = with_verify(team_spec(tmp_path / "ledger"), f"echo 'key: {KEY}'")
    task = cluster.tasks.submit(spec)
    status = cluster.drive(task)
    assert "succeeded" == status["status"]
    assert "key: [REDACTED]" in str(status["verify_output"])
    stored = b"".join(v for k in cluster.client.scan_iter(f"*{task}*verdict*")
                      for v in [cast(bytes, cluster.client.get(k))])  # fmt: skip
    assert stored
    assert KEY.encode() not in stored


def test_a_verify_whose_every_try_vanishes_gives_up(own_redis: RedisServer) -> None:
    """After `TRIES` tries whose job vanished, the answer is `GaveUp`, with the reason."""
    client = connect(own_redis.url)
    queue = Queue(STEPS_QUEUE, connection=client, serializer=JSONSerializer)
    verifier = Verifier(client, queue, RunState(client, RedisHotStore(client)), grace=1.0)
    limits = Limits(verify="true")
    now = time.time()
    answers = []
    for _ in range(20):
        answer = verifier.poll("t", 3, 1, limits, now)
        answers.append(answer)
        run = VerifyRun.load(cast(bytes, client.hget(keys.run("t"), FIELD)))
        client.delete(Job.key_for(run.job))  # no worker will ever answer it
        now += 10.0
        if isinstance(answer, GaveUp):
            break
    last = answers[-1]
    assert isinstance(last, GaveUp), answers
    assert f"{TRIES} tries" in last.reason
    assert "its job vanished" in last.reason
    assert TRIES == VerifyRun.load(cast(bytes, client.hget(keys.run("t"), FIELD))).attempt


@pytest.mark.parametrize("verdict", [b"{not json", b'{"passed": "yes"}'])
def test_a_garbled_verdict_pauses_its_task_alone(
    cluster: Cluster, tmp_path: Path, verdict: bytes
) -> None:
    """A verdict that is not one (a hostile Redis writer) pauses that task; others go on."""
    cluster.coordinator = Coordinator(
        cluster.client, cluster.store, heartbeat_grace=1.0, pause_after=0.5
    )
    cluster.start_worker()
    cluster.start_worker()  # one for the other task while the victim's verify holds one
    # Its verify runs on, so no real verdict comes to replace the garbled one.
    victim = cluster.tasks.submit(with_verify(team_spec(tmp_path / "ledger"), "sleep 60"))
    cluster.tick_until(lambda: verify_run(cluster, victim) is not None)
    run = verify_run(cluster, victim)
    assert run is not None
    cluster.client.set(keys.verdict(victim, run.epoch, run.gc), verdict)
    other = cluster.tasks.submit(team_spec(tmp_path / "ledger"))
    cluster.tick_until(
        lambda: cluster.tasks.status(other).ended and cluster.status(victim)["status"] == "paused",
        timeout=60,
    )
    assert "succeeded" == cluster.status(other)["status"]
    assert "(verify," in str(cluster.status(victim)["reason"])
    cluster.tasks.cancel(victim)


def test_a_verify_left_running_by_a_restore_does_not_pass_for_the_next_one(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A restore during a verify: the old try beats on beside the new one, each on its own.

    The old try's beat must neither make the new try look alive nor dead: the new one is
    judged by its own beat, runs to its verdict, and is never tried again.
    """
    cluster.start_worker()
    cluster.start_worker()
    task = cluster.tasks.submit(with_verify(team_spec(tmp_path / "ledger"), "sleep 4 && true"))

    tick_until_verify_beats(cluster, task)
    old = verify_run(cluster, task)
    assert old is not None
    cluster.coordinator.restorer.restore(task, reason="a person goes back")
    status = cluster.drive(task)
    assert ("succeeded", "verify passed") == (status["status"], status["reason"])
    new = verify_run(cluster, task)
    assert new is not None
    assert new.epoch > old.epoch
    assert 1 == new.attempt  # judged by its own beat: never taken for dead
