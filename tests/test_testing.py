"""`cairn.testing`'s `LocalCairn`: what it starts, and that it leaves nothing behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cairn.testing import LocalCairn
from tests.cli_harness import children, cmdline, wait_until


@pytest.mark.slow
def test_local_cairn_runs_redis_a_coordinator_and_its_workers_and_stops_them(
    tmp_path: Path,
) -> None:
    """Redis (with a password), one coordinator, N workers while it runs; none after."""
    with LocalCairn(tmp_path, workers=2) as cairn:
        assert cairn.server.password is not None
        assert cairn.server.password in cairn.url
        assert cairn.client.url == cairn.url
        started = {
            "coordinator": children(os.getpid(), "cairn.coordinator --name local"),
            "workers": children(os.getpid(), "cairn.testing.worker"),
            # Its own: the session's shared redis-server is a child of this process too.
            "redis": children(os.getpid(), f"redis-server 127.0.0.1:{cairn.server.port}"),
        }
        assert [1, 2, 1] == [len(pids) for pids in started.values()]
        # No child learns the Redis password from its command line, which `ps` shows.
        assert all(cairn.server.password not in cmdline(p) for p in started["workers"])
        wait_until(cairn.client.has_coordinator)
    assert not children(os.getpid(), "cairn.coordinator")
    assert not children(os.getpid(), f"redis-server 127.0.0.1:{cairn.server.port}")
    assert {"redis", "logs"} <= {p.name for p in tmp_path.iterdir()}
