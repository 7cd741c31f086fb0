"""`cairn demo` end to end: real redis-server, real worker processes, a real kill."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from cairn.cli.demo import Workers, run_demo
from cairn.testing.redis_server import RedisServer
from tests.cli_harness import cmdline


@pytest.fixture
def logging_restored() -> Iterator[None]:
    """The demo configures structlog for its log file; give the next tests theirs back."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


@pytest.mark.usefixtures("logging_restored")
def test_the_demo_survives_a_killed_worker_and_a_rollback_and_passes_verify(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The story the demo tells happened: kill, retry, restore, success, all archived."""
    monkeypatch.delenv("CAIRN_REDIS_URL", raising=False)  # its own private redis-server
    lines: list[str] = []
    assert 0 == run_demo(tmp_path / "state", say=lines.append)
    story = "\n".join(lines)
    for step in ("SIGKILL to worker pid", "step retried as attempt 2", "rolls the task back",
                 "restored: GC 1's agents and files", "task succeeded: verify passed",
                 "all 3 tests passed"):  # fmt: skip
        assert step in story, story
    order = [story.index(s) for s in ("SIGKILL", "attempt 2", "rolls", "succeeded")]
    assert order == sorted(order), story
    task = next(line.split()[2].rstrip(":") for line in lines if "submitted" in line)
    archived = tmp_path / "state" / "archive" / "tasks" / task / "gc"
    assert len(list(archived.iterdir())) >= 7, "GCs 0-6 are on disk at the end"


def test_the_demos_workers_get_their_redis_url_from_the_environment(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """The URL (and its password) is in a worker's environment, not on its command line."""
    workers = Workers(redis_server.url, tmp_path)
    try:
        process = workers.start()
        for _ in range(1000):  # until it has exec'd: before that /proc shows nothing
            if "worker" in cmdline(process.pid):
                break
            time.sleep(0.01)
        assert redis_server.url not in cmdline(process.pid)
        environ = Path(f"/proc/{process.pid}/environ").read_bytes().split(b"\0")
        assert f"CAIRN_REDIS_URL={redis_server.url}".encode() in environ
    finally:
        workers.stop()
