"""Many steps in one worker process (`--concurrency N`).

Each step has its own heartbeat, fencing, attempt and workspace tree; a killed process
retries all of them, a stopped one drains.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import cast

import pytest
import redis
from rq import Queue, Worker
from rq.job import Job, JobStatus
from rq.registry import FinishedJobRegistry, StartedJobRegistry
from rq.serializers import JSONSerializer
from rq.suspension import resume, suspend
from rq.worker import WorkerStatus
from structlog.testing import capture_logs

from cairn.coordinator.jobs import CONTROL_QUEUE, STAGE_JOB, STEP_JOB, STEPS_QUEUE
from cairn.coordinator.spec import TaskSpec
from cairn.coordinator.worker import (
    DRAIN_SECONDS,
    HANDED_BACK,
    SUSPENSION_CHECK_EVERY,
    CairnJob,
    CairnWorker,
)
from cairn.storage import keys
from cairn.storage.backends.redis import connect
from cairn.testing.redis_server import RedisServer, free_port
from tests.cluster import ROOT, Cluster, Outcome, files_and_histories, outcome, team_spec

TASKS = 4
GATE_TOOLS = '''\
"""A tool that waits while a gate file exists: a step slowed from outside."""

import time
from pathlib import Path

from cairn import ToolContext, tool


@tool(effects="workspace")
def wait_gate(ctx: ToolContext, gate: str) -> str:
    """Wait while the file `gate` exists, then write `passed.txt`.

    Args:
        ctx: the call's context
        gate: the gate file's path

    """
    while Path(gate).exists():
        time.sleep(0.02)
    ctx.workspace.resolve("passed.txt").write_text("passed\\n")
    return "passed the gate"
'''


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Outcome]:
    """The team's fault-free outcome, on one worker running one step at a time."""
    tmp = tmp_path_factory.mktemp("reference")
    server = RedisServer(tmp / "redis").start()
    cluster = Cluster(server, tmp)
    try:
        cluster.start_worker()
        ledger = tmp / "ledger"
        task = cluster.tasks.submit(team_spec(ledger))
        assert "succeeded" == cluster.drive(task)["status"]
        yield outcome(cluster, task, ledger)
    finally:
        cluster.close()
        server.kill()


def concurrent_worker(cluster: Cluster, n: int = 8) -> subprocess.Popen[bytes]:
    """Start one worker process running up to `n` steps at once."""
    cluster.env["CAIRN_WORKER_CONCURRENCY"] = str(n)
    return cluster.start_worker()


def drive_all(cluster: Cluster, tasks: list[str], timeout: float = 45.0) -> dict[str, int]:
    """Tick until every task ended; return the most steps seen started at once, and by whom.

    `started`: jobs in RQ's StartedJobRegistry; `executions`: the one worker's own index;
    `pids`: how many processes the running steps' heartbeats named.
    """
    registry = StartedJobRegistry(STEPS_QUEUE, connection=cluster.client)
    seen = {"started": 0, "executions": 0, "pids": 0}
    pids: set[str] = set()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        cluster.coordinator.tick()
        seen["started"] = max(seen["started"], registry.count)
        for worker in Worker.all(connection=cluster.client):
            seen["executions"] = max(seen["executions"], worker.current_execution_count)
        for task in tasks:
            for agent in ("planner", "coder", "reviewer"):
                beat = cluster.store.hot.beating(task, agent)
                if beat is not None:
                    pids.add(beat.split(":")[1])
        if all(cluster.tasks.status(task).ended for task in tasks):
            seen["pids"] = len(pids)
            return seen
        time.sleep(0.02)
    raise AssertionError(f"tasks did not end: {[cluster.status(t) for t in tasks]}")


def model_turns(cluster: Cluster, task: str) -> list[tuple[datetime, datetime]]:
    """When each model turn of the task's committed steps started and finished."""
    gc = cluster.store.latest_gc(task)
    assert gc is not None
    return [
        (record.started_at, record.finished_at)
        for agent, ref in gc.members.items()
        for record in cluster.store.read_state(task, agent, ref.id, ref.checksum).trace
        if record.tool is None
    ]


def most_at_once(spans: list[tuple[datetime, datetime]]) -> int:
    """The largest number of spans that overlap at one instant."""
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


def coder_attempt(cluster: Cluster, task: str, superstep: int) -> int:
    """The attempt whose LC the task's latest GC names for the coder's step `superstep`."""
    gc = cluster.store.latest_gc(task)
    assert gc is not None
    chain = cluster.store.load_chain(task, "coder", gc.members["coder"].id)
    return next(c.record.attempt for c in chain if c.record.superstep == superstep)


def test_one_process_runs_the_steps_of_several_tasks_at_once(
    cluster: Cluster, tmp_path: Path, reference: Outcome
) -> None:
    """At concurrency 8 one worker process runs steps of four tasks at once; same results.

    The four coders' one-second model turns overlap in time, RQ's registries show several
    steps started by one worker, and every task ends as the fault-free run.
    """
    worker = concurrent_worker(cluster)
    ledgers = [tmp_path / f"ledger-{n}" for n in range(TASKS)]
    tasks = [cluster.tasks.submit(team_spec(ledger, slow=1.0)) for ledger in ledgers]
    seen = drive_all(cluster, tasks)
    assert [worker] == cluster.workers
    assert 1 == seen["pids"]
    assert 1 == len(Worker.all(connection=cluster.client))
    assert seen["started"] >= TASKS, seen
    assert seen["executions"] >= TASKS, seen
    spans = [span for task in tasks for span in model_turns(cluster, task)]
    assert most_at_once(spans) >= TASKS
    for task, ledger in zip(tasks, ledgers, strict=True):
        assert "succeeded" == cluster.status(task)["status"]
        assert reference == outcome(cluster, task, ledger)


def test_sigkill_of_a_concurrent_worker_retries_every_step_it_ran(
    cluster: Cluster, tmp_path: Path, reference: Outcome
) -> None:
    """SIGKILL a process running four steps: all four are retried, the tasks end as fault-free."""
    worker = concurrent_worker(cluster)
    ledgers = [tmp_path / f"ledger-{n}" for n in range(TASKS)]
    tasks = [cluster.tasks.submit(team_spec(ledger, slow=2.0)) for ledger in ledgers]
    pids = {cluster.wait_for_step(task, "coder", superstep=2) for task in tasks}
    assert {worker.pid} == pids
    time.sleep(0.3)  # every coder is inside its slow model turn
    worker.kill()
    assert -signal.SIGKILL == worker.wait()
    concurrent_worker(cluster)
    drive_all(cluster, tasks)
    for task, ledger in zip(tasks, ledgers, strict=True):
        assert "succeeded" == cluster.status(task)["status"]
        assert reference == outcome(cluster, task, ledger)
        assert 2 == coder_attempt(cluster, task, 2)


def gate_spec(gate: Path, step_timeout: float) -> TaskSpec:
    """A waiter that passes a gate, beside a worker that writes a file, in one superstep."""
    waiter = [
        {"say": "At the gate.", "tools": [{"name": "wait_gate", "args": {"gate": str(gate)}}]},
        {"say": "Through.", "tools": [{"name": "finish", "args": {"summary": "through"}}]},
    ]
    other = [
        {"say": "Writing.", "tools": [
            {"name": "write_file", "args": {"path": "other.txt", "content": "other\n"}}]},
    ]  # fmt: skip
    return TaskSpec.model_validate(
        {
            "name": "gate",
            "goal": "Pass the gate.",
            "step_timeout": step_timeout,
            "agents": [
                {
                    "name": "waiter",
                    "model": "scripted",
                    "tools": ["wait_gate", "finish"],
                    "script": waiter,
                },
                {"name": "other", "model": "scripted", "script": other},
            ],
        }
    )


def test_a_zombie_step_in_a_live_process_is_fenced(cluster: Cluster, tmp_path: Path) -> None:
    """A step held past `step_timeout` is retried in the same live process, in another tree.

    The retry (attempt 2) runs beside the held attempt 1 in one process; once the gate
    opens both finish, the zombie's write is refused (`fenced`), and the task ends as the
    fault-free run.
    """
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "cairn_gate_tools.py").write_text(GATE_TOOLS)
    cluster.env.update(
        {
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(modules)]),
            "CAIRN_TOOLS": "cairn_gate_tools",
        }
    )
    worker = concurrent_worker(cluster)
    gate = tmp_path / "gate"
    clean = cluster.tasks.submit(gate_spec(gate, step_timeout=2.0))
    assert "succeeded" == cluster.drive(clean)["status"]

    gate.touch()
    task = cluster.tasks.submit(gate_spec(gate, step_timeout=2.0))
    held = cluster.wait_for_step(task, "waiter", superstep=1)
    retry = cluster.wait_for_step(task, "waiter", superstep=1, attempt=2)  # after the timeout
    assert worker.pid == held == retry
    gate.unlink()
    assert "succeeded" == cluster.drive(task)["status"]
    deadline = time.monotonic() + 15
    while b'"fenced"' not in (cluster.client.hget(keys.outcomes(task, 1, 1), "waiter") or b""):
        assert time.monotonic() < deadline, "the zombie never reported"
        time.sleep(0.05)
    assert files_and_histories(cluster, clean) == files_and_histories(cluster, task)
    first = cluster.store.read_gc(task, 1)
    assert 2 == cluster.store.read_lc(task, "waiter", first.members["waiter"].id).attempt
    assert worker.poll() is None  # one process all along


def test_sigterm_drains_finishing_or_handing_back_the_steps_it_holds(
    cluster: Cluster, tmp_path: Path, reference: Outcome
) -> None:
    """SIGTERM drains: no new step is taken, the steps held finish or are handed back.

    A step ending within the drain finishes; a longer one is handed back (its job
    `stopped`, retried at once); the process exits within the bound.
    """
    worker = concurrent_worker(cluster)
    short_ledger = tmp_path / "short.ledger"
    short = cluster.tasks.submit(team_spec(short_ledger, slow=3.0))
    long = cluster.tasks.submit(team_spec(tmp_path / "long.ledger", slow=60.0))
    cluster.wait_for_step(short, "coder", superstep=2)
    cluster.wait_for_step(long, "coder", superstep=2)
    time.sleep(0.5)  # the other agents' quick steps of superstep 2 are done
    with capture_logs() as logs:
        worker.send_signal(signal.SIGTERM)
        stopped_at = time.monotonic()
        while worker.poll() is None:  # the coordinator goes on: it commits the short one
            assert time.monotonic() - stopped_at < 10.0, "the worker did not exit within 10 s"
            cluster.coordinator.tick()
            time.sleep(0.02)
        exited_after = time.monotonic() - stopped_at
        for _ in range(20):  # the coordinator's next looks for dead steps
            cluster.coordinator.tick()
            time.sleep(0.02)
    assert 0 == worker.returncode
    assert exited_after < DRAIN_SECONDS + 1.5
    # The short coder finished on the stopping worker; no step of superstep 3 was taken.
    assert 1 == coder_attempt(cluster, short, 2)
    run = cast(dict[bytes, bytes], cluster.client.hgetall(keys.run(short)))
    assert b"3" == run[b"superstep"]
    queued = Job.fetch(f"cairn-{short}-1-3-coder-1", cluster.client, serializer=JSONSerializer)
    assert "queued" == queued.get_status()
    # The long coder was handed back, its job stopped: the coordinator retried it at once.
    held = Job.fetch(f"cairn-{long}-1-2-coder-1", cluster.client, serializer=JSONSerializer)
    result = held.latest_result()
    assert result is not None
    assert HANDED_BACK == result.exc_string
    retries = [(e["task"], e["agent"], e["attempt"], e["why"]) for e in logs
               if e["event"] == "step retried"]  # fmt: skip
    assert [(long, "coder", 2, "its job stopped")] == retries
    assert 0 == StartedJobRegistry(STEPS_QUEUE, connection=cluster.client).count
    cluster.tasks.cancel(long)
    concurrent_worker(cluster)
    drive_all(cluster, [short])
    assert "succeeded" == cluster.status(short)["status"]
    assert reference == outcome(cluster, short, short_ledger)


def test_rq_sees_each_finished_step_as_its_own_worker_would_record_it(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A step's success, written in one round trip: status, result, registries, counts.

    On a worker of three lanes, which takes a superstep's jobs together and marks them
    started in one round trip.
    """
    concurrent_worker(cluster, 3)
    task = cluster.tasks.submit(team_spec(tmp_path / "ledger"))
    assert "succeeded" == cluster.drive(task)["status"]
    finished = FinishedJobRegistry(STEPS_QUEUE, connection=cluster.client)
    ids = [i for i in finished.get_job_ids() if i.startswith(f"cairn-{task}-")]
    assert ids
    for job in Job.fetch_many(ids, connection=cluster.client, serializer=JSONSerializer):
        assert job is not None
        assert JobStatus.FINISHED == job.get_status(refresh=False)
        assert job.return_value() in {"active", "halted", "finished", "passed"}  # a verify too
        assert job.started_at is not None
        assert job.ended_at is not None
        assert job.ended_at >= job.started_at
    assert 0 == StartedJobRegistry(STEPS_QUEUE, connection=cluster.client).count
    (worker,) = Worker.all(connection=cluster.client)
    assert worker.successful_job_count >= len(ids)
    assert 0 == worker.current_execution_count


def test_free_lanes_take_the_waiting_jobs_in_one_go_control_first(tmp_path: Path) -> None:
    """Beside the job just taken, a worker takes as many waiting jobs as it has free lanes.

    The control queue's first, then the steps'; a job whose hash is gone is skipped and
    not counted; the rest stay queued. A worker told to stop after `max_jobs`, or all of
    whose other lanes are busy, takes none.
    """
    server = RedisServer(tmp_path / "redis").start()
    try:
        client = connect(server.url)
        control, steps = (
            Queue(name, connection=client, serializer=JSONSerializer, job_class=CairnJob)
            for name in (CONTROL_QUEUE, STEPS_QUEUE)
        )
        worker = CairnWorker([control, steps], connection=client, serializer=JSONSerializer,
                             job_class=CairnJob, concurrency=4)  # fmt: skip
        gone = steps.enqueue_call(STEP_JOB, args=("t", "a", 1, 1, 0), job_id="gone")
        client.delete(gone.key)
        for i in range(4):
            steps.enqueue_call(STEP_JOB, args=("t", "a", 1, 1, i), job_id=f"step-{i}")
        control.enqueue_call(STAGE_JOB, args=("t",), job_id="control")
        taken = worker._take_more()  # 4 lanes, one for the job just taken: 3 free
        assert [("control", CONTROL_QUEUE), ("step-0", STEPS_QUEUE), ("step-1", STEPS_QUEUE)] == [
            (job.id, queue.name) for job, queue in taken
        ]
        assert [STAGE_JOB, STEP_JOB, STEP_JOB] == [job.func_name for job, _ in taken]
        assert ["t", "a", 1, 1, 0] == list(taken[1][0].args)
        assert ["step-2", "step-3"] == steps.get_job_ids()
        assert [] == control.get_job_ids()
        worker._running = {"busy-1": taken[0], "busy-2": taken[1]}  # type: ignore[dict-item]
        assert ["step-2"] == [job.id for job, _ in worker._take_more()]
        worker._running = {}
        client.delete(steps.key)  # nothing waits: the run below takes no job
        assert not worker.work(burst=True, max_jobs=5, logging_level="WARNING")
        assert not worker._batching  # told `max_jobs`: one job at a time, as RQ counts them
        client.rpush(steps.key, "step-2", "step-3")
        assert [] == worker._take_more()
        assert ["step-2", "step-3"] == steps.get_job_ids()
    finally:
        server.kill()


def test_a_suspended_worker_takes_no_step_until_resumed(cluster: Cluster, tmp_path: Path) -> None:
    """`rq suspend` holds a Cairn worker's jobs, `rq resume` frees them.

    Suspended before it starts, the worker says so and takes none of a task's steps; they
    wait in the queue until the resume (looked for at most a second apart).
    """
    suspend(cluster.client)
    cluster.start_worker()
    cluster.wait_for_offers()
    deadline = time.monotonic() + 30
    while [WorkerStatus.SUSPENDED] != [w.get_state() for w in Worker.all(cluster.client)]:
        assert time.monotonic() < deadline, f"never said suspended\n{cluster.worker_logs(40)}"
        time.sleep(0.02)
    task = cluster.tasks.submit(team_spec(tmp_path / "ledger"))
    held_until = time.monotonic() + 2 * SUSPENSION_CHECK_EVERY
    while time.monotonic() < held_until:
        cluster.coordinator.tick()
        time.sleep(0.02)
    assert 0 == StartedJobRegistry(STEPS_QUEUE, connection=cluster.client).count
    assert 0 < Queue(STEPS_QUEUE, connection=cluster.client).count  # enqueued, not taken
    resume(cluster.client)
    assert "succeeded" == cluster.drive(task)["status"]


def test_the_worker_command_refuses_a_concurrency_below_one() -> None:
    """`python -m cairn.coordinator.worker --concurrency 0` is refused in one line."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "cairn.coordinator.worker",
            "redis://127.0.0.1:1/0",
            "--concurrency",
            "0",
        ],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert 2 == done.returncode
    assert "--concurrency: must be at least 1, not 0" in done.stderr


def started_worker(url: str, code: int = 3) -> str:
    """Run `python -m cairn.coordinator.worker URL`, which must exit `code`; return its one line."""
    done = subprocess.run(
        [sys.executable, "-m", "cairn.coordinator.worker", url],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert code == done.returncode, done.stderr
    lines = done.stderr.splitlines()
    assert 1 == len(lines), done.stderr
    return lines[0]


def test_a_worker_started_without_redis_says_so_in_one_line(tmp_path: Path) -> None:
    """A worker started on a Redis that does not answer, or refuses writes: one line, exit 3.

    3 is `cairn`'s exit code for a Redis that does not answer; a supervisor starts it
    again. Once working, a worker waits both out instead. Credentials Redis refuses are
    a setting to fix: one line, exit 2.
    """
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    assert started_worker(url).startswith(f"worker.py: error: Redis at {url} does not answer: ")
    server = RedisServer(tmp_path / "redis").start()
    try:
        redis.Redis(port=server.port).config_set("maxmemory", 1)  # every write refused
        said = started_worker(server.url)
        assert said.startswith(f"worker.py: error: Redis at {server.url} refuses writes: ")
        assert "maxmemory" in said
    finally:
        server.kill()
    guarded = RedisServer(tmp_path / "guarded", password="right").start()  # noqa: S106 - a test server's
    try:
        wrong = guarded.url.replace(":right@", ":wrong@")
        said = started_worker(wrong, code=2)
        shown = wrong.replace(":wrong@", ":***@")
        assert said.startswith(f"worker.py: error: Redis at {shown} refused the credentials: ")
    finally:
        guarded.kill()
