"""`cairn demo` end to end: real redis-server, real worker processes, a real kill."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from coordinator.demo import run_demo


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
