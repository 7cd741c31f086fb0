"""A job carries only what Cairn puts there: a worker refuses any other field, unread.

The attacker is a Redis writer: it adds fields to a job shaped like Cairn's own (RQ
callbacks naming an importable function, webhooks, dependencies, repeats, a field of its
own) and a real worker process takes it. The job must not run, nor anything it names.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import cast

import pytest
import redis
from rq import Queue
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from cairn.coordinator.jobs import CONTROL_QUEUE, STAGE_JOB, STEP_JOB, STEPS_QUEUE
from cairn.coordinator.spec import TaskSpec
from cairn.coordinator.worker import CairnJob
from cairn.storage import keys
from cairn.storage.redact import REDACTED
from cairn.testing.redis_server import RedisServer
from tests.cluster import ROOT, Cluster, team_spec

MARKS = "CAIRN_TEST_MARKS"  # where `leave_mark` leaves its marks, in the worker's environment
MARK = f"{__name__}.leave_mark"
EVAL = "builtins.eval"  # not a Cairn job: refused when called
SECRET = "sk-proj-" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4"


def leave_mark(job: Job, *_args: object) -> None:
    """An importable function a hostile job names as a callback: it leaves a file if run."""
    Path(os.environ[MARKS], job.id).touch()


class Hits(BaseHTTPRequestHandler):
    """Records every request a webhook makes (the path) on its server."""

    def _record(self) -> None:
        cast(Hooks, self.server).paths.append(self.path)
        self.send_response(200)
        self.end_headers()

    do_GET = do_POST = _record  # noqa: N815 - http.server's names

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the test reads the hits, not a log."""


class Hooks(ThreadingHTTPServer):
    """A local HTTP server that records the paths requested of it."""

    paths: list[str]


@pytest.fixture
def hooks() -> Iterator[Hooks]:
    """A webhook target on a free local port, serving on a thread of its own."""
    server = Hooks(("127.0.0.1", 0), Hits)
    server.paths = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def enqueue_like_cairn(
    client: redis.Redis, job_id: str, func: str, args: tuple[object, ...]
) -> None:
    """Enqueue a job exactly as the coordinator enqueues a step (`prepare_data`, `enqueue_many`)."""
    queue = Queue(STEPS_QUEUE, connection=client, serializer=JSONSerializer)
    with client.pipeline() as pipe:
        queue.enqueue_many(
            [Queue.prepare_data(func, args=args, job_id=job_id, timeout=120, result_ttl=60,
                                failure_ttl=86_400)],
            pipeline=pipe,
        )  # fmt: skip
        pipe.execute()


def run_burst_worker(url: str, tmp: Path) -> str:
    """Run one worker process until Cairn's queues are empty; return what it logged."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "CAIRN_REDIS_URL": url,
        "CAIRN_ARCHIVE_DIR": str(tmp / "archive"),
        "CAIRN_CACHE_DIR": str(tmp / "cache"),
        "CAIRN_LOG_FORMAT": "json",
        MARKS: str(tmp / "marks"),
    }
    (tmp / "marks").mkdir(exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-m", "cairn.coordinator.worker", "--burst"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert 0 == done.returncode, done.stderr
    return done.stderr


def webhooks(port: int) -> str:
    """RQ's stored form of two webhooks to the local server: on success and on failure."""
    return json.dumps(
        [
            {
                "url": f"http://127.0.0.1:{port}/{status}",
                "job_status": status,
                "method": "POST",
                "headers": None,
                "timeout": 5,
            }
            for status in ("finished", "failed")
        ]
    )


# Each hostile field: a stage job (of no task it finishes, saying "no", so a success
# callback, a repeat or a "finished" webhook would act) or a job naming a function Cairn
# refuses (it fails, so a failure callback would act), and the fields a Redis writer adds.
HOSTILE: dict[str, tuple[str, dict[str, str]]] = {
    "success_callback": (STAGE_JOB, {"success_callback_name": MARK}),
    "failure_callback": (EVAL, {"failure_callback_name": MARK}),
    "stopped_callback": (STAGE_JOB, {"stopped_callback_name": MARK}),
    "webhook": (STAGE_JOB, {"webhooks": "PORT"}),
    "dependency": (
        STAGE_JOB,
        {
            "dependency_ids": json.dumps(["cairn-other"]),
            "dependency_id": "cairn-other",
            "allow_dependency_failures": "1",
        },
    ),
    "repeat": (STAGE_JOB, {"repeats_left": "3", "repeat_intervals": "[0]"}),
    "unknown": (STAGE_JOB, {"priority": "high"}),
    "unreadable": (STAGE_JOB, {"timeout": "forever"}),  # RQ raises on it as it reads the job
}
ARGS = {STAGE_JOB: ("t", "a", 1, 1, "asked"), STEP_JOB: ("t", "a", 1, 1, 1), EVAL: ("1",)}


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_a_job_with_a_field_cairn_does_not_set_is_refused_unrun(
    redis_server: RedisServer, redis_client: redis.Redis, tmp_path: Path, hooks: Hooks, kind: str
) -> None:
    """A Cairn-shaped job with a field Cairn does not set (or RQ cannot read) is refused.

    The worker marks it failed naming the field, logs the refusal once, and nothing runs:
    not the job's function (no outcome recorded), not the callback (no mark), no request
    to the webhook's server. The field is gone from the job, so no later reader acts on it.
    """
    func, fields = HOSTILE[kind]
    job_id = f"cairn-hostile-{kind}"
    enqueue_like_cairn(redis_client, job_id, func, ARGS[func])
    for name, value in fields.items():  # the attacker's writes
        added = webhooks(hooks.server_address[1]) if value == "PORT" else value
        redis_client.hset(Job.key_for(job_id), name, added)

    logged = run_burst_worker(redis_server.url, tmp_path)

    job = Job.fetch(job_id, connection=redis_client, serializer=JSONSerializer)
    assert JobStatus.FAILED == job.get_status()
    result = job.latest_result()
    assert result is not None
    assert "refused" in (result.exc_string or "")
    assert all(field in (result.exc_string or "") for field in fields)
    assert job.started_at is None  # never started
    stage_outcome = keys.outcomes("t", 1, -1)
    step_outcome = keys.outcomes("t", 1, 1)
    assert not redis_client.exists(stage_outcome, step_outcome)  # the function never ran
    assert [] == list((tmp_path / "marks").iterdir())
    assert [] == hooks.paths  # the worker has exited: a request it sent was answered
    assert [] == [f for f in fields if redis_client.hget(job.key, f)]  # gone, or empty
    refusals = [line for line in logged.splitlines() if job_id in line and "refused" in line]
    assert 1 == len(refusals), logged


def test_an_abandoned_job_in_rqs_started_registry_runs_no_callback(
    redis_server: RedisServer, redis_client: redis.Redis, tmp_path: Path, hooks: Hooks
) -> None:
    """RQ's sweep of a job left `started` by a dead worker calls no callback or webhook it names."""
    job_id = "cairn-abandoned"
    enqueue_like_cairn(redis_client, job_id, STAGE_JOB, ARGS[STAGE_JOB])
    redis_client.lrem(f"rq:queue:{STEPS_QUEUE}", 0, job_id)  # taken by a worker that died
    redis_client.hset(
        Job.key_for(job_id),
        mapping={"status": "started", "failure_callback_name": MARK,
                 "webhooks": webhooks(hooks.server_address[1])},
    )  # fmt: skip
    redis_client.zadd(f"rq:wip:{STEPS_QUEUE}", {f"{job_id}:dead-execution": 1})

    run_burst_worker(redis_server.url, tmp_path)

    assert not redis_client.zscore(f"rq:wip:{STEPS_QUEUE}", f"{job_id}:dead-execution")  # swept
    assert [] == list((tmp_path / "marks").iterdir())
    assert [] == hooks.paths


def test_the_fields_of_cairns_own_jobs_pass(redis_client: redis.Redis) -> None:
    """A job as the coordinator and the restorer enqueue it, and as RQ leaves it run, is Cairn's."""
    enqueue_like_cairn(redis_client, "cairn-t-1-1-a-1", STEP_JOB, ARGS[STEP_JOB])
    control = Queue(CONTROL_QUEUE, connection=redis_client, serializer=JSONSerializer)
    control.enqueue_call(  # as the restorer stages an agent
        STAGE_JOB, args=ARGS[STAGE_JOB], job_id="cairn-restore-t-1-1-a", result_ttl=3_600,
        failure_ttl=86_400,
    )  # fmt: skip
    ran: dict[str, str | bytes] = {  # what RQ writes as a worker runs and ends a job
        "status": "failed", "started_at": "2026-01-01T00:00:00.000000Z",
        "ended_at": "2026-01-01T00:00:01.000000Z", "last_heartbeat": "2026-01-01T00:00:01.0Z",
        "worker_name": "w", "exc_info": zlib.compress(b"Traceback ..."),
    }  # fmt: skip
    for name, value in ran.items():
        redis_client.hset(Job.key_for("cairn-t-1-1-a-1"), name, value)
    for job_id in ("cairn-t-1-1-a-1", "cairn-restore-t-1-1-a"):
        job = CairnJob(job_id, connection=redis_client, serializer=JSONSerializer)
        job.restore(cast(dict[bytes | str, object], redis_client.hgetall(job.key)))
        assert job.refusal is None, job.refusal


def test_a_failed_jobs_traceback_is_stored_and_logged_redacted(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A step whose model error holds an API key: RQ's stored failure and its log hold no key."""
    spec = team_spec(tmp_path / "ledger").model_dump(mode="json", exclude_none=True)
    spec["agents"] = [
        {"name": "solo", "model": "scripted", "script": [{"say": "x", "fail": {
            "attempts": [1], "error": "fatal",
            "message": f"HTTP 401: Incorrect API key provided: {SECRET}"}}]},
    ]  # fmt: skip
    spec.pop("verify", None)
    cluster.start_worker()
    task = cluster.tasks.submit(TaskSpec.model_validate(spec))
    assert "failed" == cluster.drive(task)["status"]

    job_ids = [k.decode()[7:] for k in cluster.client.scan_iter("rq:job:*") if b":" not in k[7:]]
    jobs = [Job.fetch(j, connection=cluster.client, serializer=JSONSerializer) for j in job_ids]
    failures = [
        result.exc_string or ""
        for job in jobs
        for result in job.results()
        if result.type == result.Type.FAILED
    ]
    assert failures  # the step failed, and so did its retries after each rollback
    for text in failures:
        assert "ModelError: HTTP 401: Incorrect API key provided" in text
        assert REDACTED in text
        assert SECRET not in text
    for job_id in job_ids:
        stored = cast(dict[bytes, bytes], cluster.client.hgetall(Job.key_for(job_id)))
        exc_info = zlib.decompress(stored[b"exc_info"]) if b"exc_info" in stored else b""
        assert SECRET.encode() not in exc_info + b"".join(stored.values())
    log = (tmp_path / "worker-0.log").read_text()  # stderr: written line by line
    assert "Incorrect API key provided" in log  # RQ logged the failure...
    assert SECRET not in log  # ...without the key
