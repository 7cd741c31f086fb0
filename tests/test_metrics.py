"""Prometheus metrics: a coordinator and a worker process serve them on CAIRN_METRICS_PORT."""

from __future__ import annotations

import socket
import time
import urllib.request
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from cairn.storage.records import GCStatus
from tests.cluster import Cluster, team_spec

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def free_port_pair() -> int:
    """A port P such that P and P + 1 are both free now (coordinator and worker slot 0)."""
    for _ in range(50):
        with closing(socket.socket()) as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if port >= 65_000:
            continue
        with closing(socket.socket()) as first, closing(socket.socket()) as second:
            try:
                first.bind(("0.0.0.0", port))  # noqa: S104 - where the endpoint binds
                second.bind(("0.0.0.0", port + 1))  # noqa: S104
            except OSError:
                continue
        return port
    raise AssertionError("no two adjacent free ports")


@contextmanager
def taken(*ports: int) -> Iterator[None]:
    """Hold `ports` with listening sockets, as another program would."""
    held = []
    try:
        for port in ports:
            sock = socket.socket()
            held.append(sock)
            sock.bind(("0.0.0.0", port))  # noqa: S104 - where the endpoint would bind
            sock.listen()
        yield
    finally:
        for sock in held:
            sock.close()


def scrape(port: int) -> Samples:
    """Every sample served at http://127.0.0.1:`port`/metrics, by name and labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def run_to_end(cluster: Cluster, tmp_path: Path) -> str:
    """Submit the small team, let a coordinator process drive it; return the task id."""
    cluster.start_worker()
    task = cluster.tasks.submit(team_spec(tmp_path / "ledger"))  # commits GC 0 here
    cluster.start_coordinator("metered")
    deadline = time.monotonic() + 25
    while cluster.status(task)["status"] == "running":
        assert time.monotonic() < deadline, cluster.status(task)
        time.sleep(0.05)
    assert "succeeded" == cluster.status(task)["status"]
    return task


def test_coordinator_and_worker_serve_their_metrics(cluster: Cluster, tmp_path: Path) -> None:
    """After a team's run, the coordinator's and the worker's endpoints show what happened.

    The coordinator (on the port) counted every GC it committed; GC 0 was committed by
    this process, which submitted. The worker (port + 1: slot 0) observed LC writes.
    """
    port = free_port_pair()
    cluster.env["CAIRN_METRICS_PORT"] = str(port)
    submitted_before = REGISTRY.get_sample_value("cairn_gc_commits_total") or 0.0
    task = run_to_end(cluster, tmp_path)
    submitted = (REGISTRY.get_sample_value("cairn_gc_commits_total") or 0.0) - submitted_before
    assert 1 == submitted

    served = scrape(port)
    committed = [g for g in cluster.store.list_gcs(task) if g.status is GCStatus.COMMITTED]
    assert len(committed) >= 3
    assert served[("cairn_gc_commits_total", ())] + submitted >= len(committed)
    assert served[("cairn_gc_aborts_total", ())] == 0
    assert served[("cairn_step_retries_total", ())] == 0
    assert served[("cairn_live_workers", ())] >= 1
    assert ("cairn_queue_depth", (("queue", "cairn-steps"),)) in served
    assert ("cairn_queue_depth", (("queue", "cairn-control"),)) in served

    worker = scrape(port + 1)
    step = (("level", "step"),)
    assert worker[("cairn_lc_write_seconds_count", step)] > 0
    assert worker[("cairn_lc_write_seconds_sum", step)] > 0
    assert worker[("cairn_lc_write_bytes_count", step)] > 0
    assert worker[("cairn_lc_write_bytes_sum", step)] > 0
    assert ("cairn_queue_depth", (("queue", "cairn-steps"),)) not in worker  # coordinator's
    status = cluster.tasks.status(task)  # the worker ran every step: its counters are all
    assert status.usage.prompt_tokens > 0
    for kind in ("prompt", "completion", "cached"):
        counted = worker[("cairn_model_tokens_total", (("kind", kind),))]
        assert getattr(status.usage, f"{kind}_tokens") == counted
    assert status.usage.cost_usd == worker[("cairn_model_cost_usd_total", ())] == 0.0  # unpriced


def test_a_taken_port_is_a_warning_not_a_crash(cluster: Cluster, tmp_path: Path) -> None:
    """With both ports held by another program, the processes log why and run the task."""
    port = free_port_pair()
    cluster.env["CAIRN_METRICS_PORT"] = str(port)
    with taken(port, port + 1):
        run_to_end(cluster, tmp_path)
        assert all(p.poll() is None for p in cluster.processes)
    for log in ("coordinator-metered.log", "worker-0.log"):
        text = (tmp_path / log).read_text()
        assert 1 == text.count("metrics not served: port unavailable"), text
