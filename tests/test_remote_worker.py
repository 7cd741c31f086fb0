"""A worker on another host, as far as one machine allows: a network namespace of its own.

The worker reaches Redis only over a veth pair (its namespace has no route to the host's
loopback), and shares the archive directory with the coordinator, as workers on other
machines share a network filesystem. Creating namespaces needs root (CI runs as root).
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cairn.coordinator.coordinator import Coordinator
from cairn.coordinator.restore import Restorer
from cairn.coordinator.tasks import Tasks
from cairn.storage.backends.disk import DiskArchive
from cairn.storage.backends.redis import RedisHotStore, connect
from cairn.storage.codec import Codec
from cairn.storage.store import CheckpointStore
from cairn.testing.redis_server import RedisServer
from tests.cluster import ROOT, team_spec

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None,
    reason="network namespaces need root and iproute2 (CI has both)",
)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture
def namespace() -> Iterator[tuple[str, str]]:
    """A network namespace joined to this one by a veth pair: (its name, the host's address)."""
    n = os.getpid() % 250
    name, host_end, far_end = f"cairn-t{os.getpid()}", f"cvh{os.getpid()}", f"cvn{os.getpid()}"
    host, far = f"10.252.{n}.1", f"10.252.{n}.2"
    _ip("netns", "add", name)
    try:
        _ip("link", "add", host_end, "type", "veth", "peer", "name", far_end)
        _ip("link", "set", far_end, "netns", name)
        _ip("addr", "add", f"{host}/30", "dev", host_end)
        _ip("link", "set", host_end, "up")
        _ip("netns", "exec", name, "ip", "addr", "add", f"{far}/30", "dev", far_end)
        _ip("netns", "exec", name, "ip", "link", "set", far_end, "up")
        _ip("netns", "exec", name, "ip", "link", "set", "lo", "up")
        yield name, host
    finally:
        subprocess.run(["ip", "link", "del", host_end], check=False, capture_output=True)
        subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)


def test_a_worker_in_another_network_namespace_runs_and_restores_the_task(
    namespace: tuple[str, str], tmp_path: Path
) -> None:
    """Every step and every restore staging runs in the other namespace, over the veth."""
    name, host = namespace
    # Beyond the loopback, Redis serves only clients that authenticate.
    server = RedisServer(tmp_path / "redis", bind=host, password=secrets.token_hex(16)).start()
    client = connect(server.url)
    worker: subprocess.Popen[bytes] | None = None
    try:
        archive = tmp_path / "archive"  # shared, as a network filesystem would be
        store = CheckpointStore(RedisHotStore(client), DiskArchive(archive), Codec())
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "CAIRN_SANDBOX": "off",  # the team's ledger is outside the workspace (tests/cluster.py)
            "CAIRN_REDIS_URL": server.url,
            "CAIRN_ARCHIVE_DIR": str(archive),
            "CAIRN_CACHE_DIR": str(tmp_path / "far"),
        }
        with (tmp_path / "worker.log").open("wb") as log:
            worker = subprocess.Popen(
                ["ip", "netns", "exec", name, sys.executable, "-m", "cairn.coordinator.worker"],
                env=env, stdout=subprocess.DEVNULL, stderr=log,
            )  # fmt: skip
        ours = Path("/proc/self/ns/net").readlink()
        deadline = time.monotonic() + 10
        while Path(f"/proc/{worker.pid}/ns/net").readlink() == ours:  # `ip` execs the worker
            assert time.monotonic() < deadline, "the worker never entered its namespace"
            time.sleep(0.02)
        coordinator = Coordinator(client, store, heartbeat_grace=2.0)
        tasks = Tasks(client, store)
        task = tasks.submit(team_spec(tmp_path / "ledger"))
        deadline = time.monotonic() + 60
        while not tasks.status(task).ended:
            assert time.monotonic() < deadline, tasks.status(task)
            coordinator.tick()
            time.sleep(0.02)
        assert "succeeded" == tasks.status(task).state, tmp_path / "worker.log"
        assert 1 == (tmp_path / "ledger").read_text().count("coder-ran")
        # A restore staged on the workers: the far worker reads the shared archive's chains.
        restored = Restorer(client, store, workers=True).restore(task, to=1)
        assert 1 == restored.restored_to
        assert worker.poll() is None
    finally:
        if worker is not None:
            worker.kill()
            worker.wait()
        client.close()
        server.stop()
