"""The partition, maxmemory and failover faults, each shown survived by a real chaos run.

Every run here is the chaos suite's (`chaos/run.py`): a private redis-server (for the
failover, a primary, two replicas and three Sentinels), two coordinator processes and
real worker processes, the fault injected by the harness, and the seven invariants checked
afterwards against a fault-free run of the same team.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from cairn.testing.redis_server import RedisServer
from chaos.faults import Fault, Plan
from chaos.observe import Observed
from chaos.proxy import DelayProxy
from chaos.run import ChaosRun, RunResult
from tests.cluster import ROOT

pytestmark = pytest.mark.slow
TIMEOUT = 90.0  # seconds a run's task may take: the team takes ~10 s without faults


@pytest.fixture(scope="module")
def chaos_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The module's runs and their shared ledger."""
    return tmp_path_factory.mktemp("chaos")


@pytest.fixture(scope="module")
def fault_free(chaos_dir: Path) -> Observed:
    """What the team ends with when nothing goes wrong."""
    run = ChaosRun(Plan(0, "async", 2), chaos_dir / "fault-free", chaos_dir / "ledger",
                   TIMEOUT, mount=False)  # fmt: skip
    result = run.execute(None)
    assert ([], "succeeded") == (result.violations, result.observed.status)
    return result.observed


def run_with(chaos_dir: Path, reference: Observed, plan: Plan) -> tuple[RunResult, Path]:
    """Run `plan`; return its result and its processes' log directory."""
    directory = chaos_dir / f"seed-{plan.seed}"
    run = ChaosRun(plan, directory, chaos_dir / "ledger", TIMEOUT, mount=False)
    return run.execute(reference), directory / "logs"


def events(logs: Path, name: str) -> list[dict[str, object]]:
    """Every JSON log line named `name`, of every process of the run."""
    found = []
    for path in sorted(logs.glob("*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("{") and f'"{name}"' in line:
                event = json.loads(line)
                if event.get("event") == name:
                    found.append(event)
    return found


def test_a_cut_link_stalls_its_client_without_closing_and_delivers_late(tmp_path: Path) -> None:
    """While cut, a command gets no reply and no close; once mended, the reply comes."""
    server = RedisServer(tmp_path / "redis").start()
    link = DelayProxy(server.port).start()
    try:
        with socket.create_connection(("127.0.0.1", link.port), timeout=2) as sock:
            sock.sendall(b"PING\r\n")
            assert b"+PONG\r\n" == sock.recv(64)
            link.cut()
            sock.sendall(b"SET late yes\r\n")
            sock.settimeout(0.5)
            with pytest.raises(TimeoutError):
                sock.recv(64)  # a stall: no reply, and no end of stream either
            assert redis.Redis(port=server.port).get("late") is None  # not delivered yet
            link.mend()
            sock.settimeout(2)
            assert b"+OK\r\n" == sock.recv(64)
            assert b"yes" == redis.Redis(port=server.port).get("late")
    finally:
        link.close()
        server.kill()


def test_a_partitioned_worker_is_fenced_and_its_step_retried_elsewhere(
    chaos_dir: Path, fault_free: Observed
) -> None:
    """A worker cut off Redis in a step is fenced; its step is retried on another worker.

    Cut for 8 s, past the heartbeat's grace: what it sends once the link is back is
    refused, and the task ends as it does without the fault. Which way the cut worker
    learns it lost the step depends on where the cut caught it: a write sent after the
    link is back is refused ("attempt fenced"); one sent into the cut times out first
    (redis-py's socket timeout, 5 s), and what reaches Redis late is refused unseen. The
    checker's `fenced_write` holds either way: no write of the cut attempt was accepted.
    """
    plan = Plan(1, "async", 2, [Fault("partition_worker", 2.0, 8.0)])
    result, logs = run_with(chaos_dir, fault_free, plan)
    assert ([], [], "succeeded") == (result.skipped, result.violations, result.observed.status)
    assert 1 == result.history.faults["partition_worker"]
    # Cut mid-step, its heartbeat stops; cut as it took a job, the step never starts.
    lost = ("stopped beating", "took its job and died before starting it")
    retried = [e for e in events(logs, "step retried") if any(w in str(e["why"]) for w in lost)]
    assert retried, "the partitioned worker's step was not retried elsewhere"
    timed_out = any(
        "redis.exceptions.TimeoutError" in log.read_text(errors="replace")
        for log in logs.glob("worker-*.log")
    )
    assert result.history.fenced >= 1 or timed_out, "the cut worker never learnt it lost"


def test_redis_at_maxmemory_is_survived(chaos_dir: Path, fault_free: Observed) -> None:
    """Redis refusing writes (OOM) for 4 s is survived, and no process quits over it.

    The steps it failed are retried, every committed GC stays restorable, and the task
    ends as it does without the fault.
    """
    plan = Plan(2, "sync", 2, [Fault("maxmemory", 2.0, 4.0)], concurrency=2)
    result, logs = run_with(chaos_dir, fault_free, plan)
    assert ([], [], "succeeded") == (result.skipped, result.violations, result.observed.status)
    assert 1 == result.history.faults["maxmemory"]
    refused = [p for p in logs.glob("*.log") if "used memory > 'maxmemory'" in p.read_text()]
    assert refused, "no process saw Redis refuse a write"
    started = sorted(p.name for p in logs.glob("*.log") if not p.name.startswith("cli-"))
    assert ["coordinator-1.log", "coordinator-2.log", "worker-3.log", "worker-4.log"] == started


def test_a_command_refused_for_memory_says_so_in_one_line(tmp_path: Path) -> None:
    """`cairn submit` against a Redis at maxmemory: one line naming the limit, exit 1."""
    server = RedisServer(tmp_path / "redis").start()
    try:
        client = redis.Redis(port=server.port)
        client.config_set("maxmemory", 1)  # below what any Redis uses: every write refused
        spec = tmp_path / "team.yaml"
        spec.write_text(
            "name: t\ngoal: g\nagents:\n  - {name: a, model: scripted, script: [{say: hi}]}\n"
        )
        env = {"PYTHONPATH": str(ROOT), "CAIRN_REDIS_URL": server.url, "PATH": "/usr/bin:/bin",
               "CAIRN_ARCHIVE_DIR": str(tmp_path / "archive")}  # fmt: skip
        done = subprocess.run([sys.executable, "-m", "cairn.cli", "submit", str(spec)], env=env,
                              capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
        assert 1 == done.returncode
        assert 1 == len(done.stderr.strip().splitlines()), done.stderr
        assert "maxmemory" in done.stderr
        assert [] == client.keys("*")  # nothing half-submitted
    finally:
        server.kill()


def test_a_failover_under_replicated_loses_no_acknowledged_gc(
    chaos_dir: Path, fault_free: Observed
) -> None:
    """The primary SIGKILLed mid-task: a replica is promoted and every process follows.

    Under `replicated`, every GC acknowledged before the kill still reads back with its
    epoch (the checker's `lost_commit`), and the task ends as it does without the fault.
    """
    plan = Plan(3, "replicated", 2, [Fault("failover", 3.0)])
    result, logs = run_with(chaos_dir, fault_free, plan)
    assert ([], [], "succeeded") == (result.skipped, result.violations, result.observed.status)
    assert 1 == result.history.faults["failover"]
    injected = [json.loads(line) for line in (logs / "harness.jsonl").read_text().splitlines()]
    failover = next(e for e in injected if e.get("fault") == "failover")
    assert failover["old_port"] != failover["new_port"], "no replica was promoted"
    promoted = str(failover["promoted_at"])
    acknowledged = [n for at, n in result.history.replicated if at < promoted]
    assert acknowledged, "no GC was acknowledged before the failover: it proved nothing"
    assert any(at > promoted for at, _ in result.history.replicated), "none after it"
