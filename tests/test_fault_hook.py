"""Fault injection is a hook the tests install: a production worker never kills itself.

A scripted turn's `crash` arms a fault point of its step (`cairn.agents.faults`). On a
worker started as users start one (`python -m cairn.coordinator.worker`) nothing is
installed at that point: the crash is logged and ignored, and the step goes on. On
`python -m cairn.testing.worker` the hook SIGKILLs the process there.
"""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path
from typing import TypeGuard

import yaml

from cairn.coordinator.spec import TaskSpec
from cairn.testing.redis_server import RedisServer
from tests.cluster import Cluster

ROOT = Path(__file__).resolve().parent.parent
SPEC = """
name: Crashy
goal: Write one note; the first attempt's worker is scripted to die.
agents:
  - name: writer
    model: scripted
    script:
      - say: Writing.
        crash: {after_tools: 0, attempts: [1]}
        tools: [{name: write_file, args: {path: a.txt, content: "a"}}]
      - say: Done.
        tools: [{name: finish, args: {summary: done}}]
"""


def run(cluster: Cluster, worker: subprocess.Popen[bytes]) -> tuple[dict[str, object], str]:
    """Submit the crashy team, drive it to its end; its status and `worker`'s log."""
    task = cluster.tasks.submit(TaskSpec.model_validate(yaml.safe_load(SPEC)))
    status = cluster.drive(task, timeout=90)
    log = (cluster.tmp / "worker-0.log").read_text()
    assert worker is cluster.workers[0]
    return status, log


def test_a_production_worker_logs_an_armed_crash_and_goes_on(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """The step passes its armed point alive: one attempt, the task succeeds."""
    cluster = Cluster(redis_server, tmp_path)
    try:
        worker = cluster.start_worker(module="cairn.coordinator.worker")
        status, log = run(cluster, worker)
        assert "succeeded" == status["status"], status
        assert worker.poll() is None  # alive
        assert "scripted crash ignored: this worker installs no fault hook" in log
        assert "retried" not in log
    finally:
        cluster.close()


def test_the_testing_worker_dies_at_the_armed_point(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """`cairn.testing.worker` is SIGKILLed at the crash; a new worker finishes the task."""
    cluster = Cluster(redis_server, tmp_path)
    try:
        worker = cluster.start_worker()
        task = cluster.tasks.submit(TaskSpec.model_validate(yaml.safe_load(SPEC)))
        cluster.tick_until(lambda: worker.poll() is not None, timeout=60)
        assert -9 == worker.returncode
        cluster.start_worker()
        status = cluster.drive(task, timeout=90)
        assert "succeeded" == status["status"], status
    finally:
        cluster.close()


def kills_itself(node: ast.AST) -> TypeGuard[ast.Call]:
    """True for a call like `os.kill(os.getpid(), ...)` or `os._exit` of its own pid."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in {"kill", "killpg", "abort", "_exit"}
            and "getpid" in ast.unparse(node))  # fmt: skip


def test_no_layer_has_a_code_path_that_kills_its_own_process() -> None:
    """Nothing under coordinator/, agents/, storage/ signals its own pid (only cairn.testing)."""
    found = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for layer in ("coordinator", "agents", "storage")
        for path in sorted((ROOT / layer).rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if kills_itself(node)
    ]
    assert [] == found
