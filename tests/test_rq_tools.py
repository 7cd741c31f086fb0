"""Stock RQ tools on Cairn's queues: `rq info` reads them, `rq worker` runs Cairn's steps.

Real processes: RQ's own command line, started with Cairn's worker and job classes and
the JSON serializer, against a private redis-server and a coordinator the test drives.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster import ROOT, Cluster, team_spec

RQ = str(Path(sys.executable).parent / "rq")
CAIRN_CLASSES = [
    "-w",
    "cairn.coordinator.worker.CairnWorker",
    "-j",
    "cairn.coordinator.worker.CairnJob",
]
JSON_JOBS = ["-S", "rq.serializers.JSONSerializer"]
QUEUES = ["cairn-control", "cairn-steps"]


def rq_env(cluster: Cluster) -> dict[str, str]:
    """What a Cairn worker reads (`CAIRN_*`), and RQ's own `RQ_REDIS_URL`: no URL in argv."""
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "RQ_REDIS_URL": cluster.server.url,
        "CAIRN_REDIS_URL": cluster.server.url,
        "CAIRN_ARCHIVE_DIR": str(cluster.tmp / "archive"),
        "CAIRN_CACHE_DIR": str(cluster.tmp / "rq-cache"),
        "CAIRN_LOG_FORMAT": "json",
        "CAIRN_LOG_LEVEL": "info",
    }


@pytest.mark.parametrize(
    "command", [["worker"], ["worker-pool", "-n", "2"]], ids=["worker", "worker-pool"]
)
def test_rq_worker_with_cairns_classes_runs_a_task_and_logs_as_cairn(
    cluster: Cluster, tmp_path: Path, command: list[str]
) -> None:
    """`rq worker -w CairnWorker -j CairnJob -S JSONSerializer` runs every step of a task.

    Its steps log through Cairn's structlog set-up (JSON lines with the step's context),
    and `rq info -S JSONSerializer` lists Cairn's queues and the worker.
    """
    log = tmp_path / "rq.log"
    with log.open("wb") as sink:
        worker = subprocess.Popen(
            [RQ, *command, *CAIRN_CLASSES, *JSON_JOBS, *QUEUES],
            env=rq_env(cluster),
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        task = cluster.tasks.submit(team_spec(tmp_path / "ledger"))
        assert "succeeded" == cluster.drive(task)["status"], log.read_text()
        info = subprocess.run(
            [RQ, "info", *JSON_JOBS, "-u", cluster.server.url],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    assert 0 == info.returncode, info.stderr
    for queue in QUEUES:
        assert queue in info.stdout
    assert "worker" in info.stdout  # "N workers, M queues"
    events = []
    for line in log.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:  # RQ's own log lines
            continue
    done = [e for e in events if e.get("event") == "step done"]
    assert done, log.read_text()
    assert {"task", "agent", "superstep", "epoch", "attempt", "tokens"} <= done[0].keys()
    assert task == done[0]["task"]
