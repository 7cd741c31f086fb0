"""Job names across the upgrade to one namespace: a step queued under its old name.

Before Cairn installed one top-level package, its step job was `coordinator.jobs.step_job`;
it is `cairn.coordinator.jobs.step_job` now, and a worker runs only the names in
`ALLOWED_JOBS`. A task whose steps were queued before the upgrade must still end: the
upgraded worker refuses each old job unrun, and the coordinator sees the try fail and runs
the step again under its new name (CHANGELOG.md says so to users).
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import cast

import redis
from rq import Queue
from rq.serializers import JSONSerializer

from cairn.coordinator.jobs import ALLOWED_JOBS, STEP_JOB, STEPS_QUEUE
from cairn.testing.redis_server import RedisServer
from tests.cluster import Cluster, team_spec

OLD_STEP_JOB = "coordinator.jobs.step_job"


def rename_queued(client: redis.Redis, old: str) -> int:
    """Rename the function of every job on the steps queue to `old`; return how many."""
    queue = Queue(STEPS_QUEUE, connection=client, serializer=JSONSerializer)
    renamed = 0
    for job_id in queue.job_ids:
        key = f"rq:job:{job_id}"
        call = json.loads(zlib.decompress(cast(bytes, client.hget(key, "data"))))
        assert STEP_JOB == call[0]
        call[0] = old
        client.hset(key, "data", zlib.compress(json.dumps(call).encode()))
        renamed += 1
    return renamed


def test_every_allowed_job_is_in_the_cairn_namespace() -> None:
    """No name outside `cairn.` is run: the old names are refused like a stranger's."""
    assert ALLOWED_JOBS
    assert all(name.startswith("cairn.") for name in ALLOWED_JOBS)
    assert OLD_STEP_JOB not in ALLOWED_JOBS


def test_a_task_whose_steps_were_queued_under_the_old_name_ends(
    redis_server: RedisServer, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """The old jobs fail unrun, each step runs again under its new name, the task succeeds."""
    ledger = tmp_path / "ledger"
    ledger.touch()
    cluster = Cluster(redis_server, tmp_path)
    try:
        task = cluster.tasks.submit(team_spec(ledger))
        cluster.start_superstep(task)  # the first superstep's steps queued; no worker yet
        assert 3 == rename_queued(redis_client, OLD_STEP_JOB)
        cluster.start_worker()
        final = cluster.drive(task, timeout=90)
        assert "succeeded" == final["status"], final
        log = (tmp_path / "worker-0.log").read_text()
        # each old job refused unrun, once: the coordinator's retries carry the new name
        assert 3 == log.count(f"refusing job function {OLD_STEP_JOB!r}: not a Cairn job")
        assert 1 == ledger.read_text().count("coder-ran")
    finally:
        cluster.close()
