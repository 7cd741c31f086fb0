"""A step that keeps failing shows while it fails: in status, trace, timeline and logs.

One private stack serves the module: a redis-server, a `cairn coordinator` and a `cairn
worker` process. The task's writer asks a model at a closed port: each attempt fails
within its one-second timeout, the coordinator retries it, rolls the task back, and at
last fails it. The tests read the task as a person does, with `cairn` processes, while
it is still retrying.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pytest
import structlog

from cairn import Client, StepFailure
from cairn.agents.logs import configure_logging, get_logger
from cairn.agents.logship import LINGER, ship_logs
from cairn.coordinator.failures import KEEP, FailureEvent, read_failures, record_failure
from cairn.coordinator.tasklogs import read_logs
from cairn.storage import keys
from cairn.storage.backends.redis.scripts import source
from cairn.testing.redis_server import free_port
from tests.cli_harness import cairn, private_stack

ROOT = Path(__file__).resolve().parents[1]
UNREACHABLE = """
name: Unreachable
goal: Say hello.
agents:
  - name: writer
    model: openai:gpt-test
    base_url: http://127.0.0.1:PORT/v1
    timeout: 1
    max_retries: 3
  - name: helper
    model: scripted
    script:
      - say: done
"""


@dataclass
class Stack:
    """The module's private Redis, with a coordinator and a worker process on it."""

    url: str
    env: dict[str, str]
    tmp: Path

    def client(self) -> Client:
        """A client of the stack's Redis and archive."""
        return Client(redis_url=self.url, archive_dir=self.tmp / "archive")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A private redis-server, `cairn coordinator` and `cairn worker` for the module."""
    tmp = tmp_path_factory.mktemp("failing")
    with private_stack(tmp, "failing") as (url, env):
        yield Stack(url, env, tmp)


@pytest.fixture(scope="module")
def retrying(stack: Stack) -> str:
    """The task, submitted and seen retrying its writer's step (it has not failed yet)."""
    spec = stack.tmp / "unreachable.yaml"
    spec.write_text(UNREACHABLE.replace("PORT", str(free_port())))
    done = cairn("submit", str(spec), "--json", env=stack.env)
    assert 0 == done.returncode, done.stderr
    task: str = json.loads(done.stdout)["task_id"]
    with stack.client() as client:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            status = client.task(task).status()
            writer = next((a for a in status.agents if a.name == "writer"), None)
            if writer is not None and writer.retries >= 1:
                assert not status.ended, status
                return task
            time.sleep(0.1)
    raise AssertionError(f"task {task} never retried: {status}")


def test_status_shows_an_agents_retries_and_last_error_while_it_retries(
    stack: Stack, retrying: str
) -> None:
    """`cairn status` (table and JSON) names the retries and the last error, with its time."""
    shown = cairn("status", retrying, env={**stack.env, "COLUMNS": "250"})
    assert 0 == shown.returncode, shown.stderr
    assert "running" in shown.stdout
    row = next(line for line in shown.stdout.splitlines() if "writer" in line)
    assert "ModelError: model call failed" in row, shown.stdout
    assert "ConnectionRefusedError" in row, shown.stdout
    assert re.search(r"\d\d-\d\d \d\d:\d\d:\d\d", shown.stdout), shown.stdout
    assert re.search(r"│\s+[1-9]\d*\s+│", row), row  # the retries column
    data = json.loads(cairn("status", retrying, "--json", env=stack.env).stdout)
    assert "running" == data["status"]
    writer = next(a for a in data["agents"] if a["name"] == "writer")
    assert writer["retries"] >= 1
    last = writer["last_error"]
    assert "writer" == last["agent"]
    assert "ConnectionRefusedError" in last["error"]
    assert last["at"].endswith("+00:00")
    helper = next(a for a in data["agents"] if a["name"] == "helper")
    assert "retries" not in helper  # none: left out, as `held` is
    assert "last_error" not in helper


def test_trace_and_timeline_show_the_failed_attempts_while_they_happen(
    stack: Stack, retrying: str
) -> None:
    """`cairn trace` lists the failed attempts; the timeline's summary counts them."""
    shown = cairn("trace", retrying, env={**stack.env, "COLUMNS": "250"})
    assert 0 == shown.returncode, shown.stderr
    assert "failed attempts, retries and rollbacks" in shown.stdout
    assert "ModelError" in shown.stdout
    assert "retried" in shown.stdout
    page = stack.tmp / "timeline.html"
    drawn = cairn("trace", retrying, "--html", str(page), env=stack.env)
    assert 0 == drawn.returncode, drawn.stderr
    html = page.read_text()
    assert '<table id="attempts">' in html
    data = json.loads(html.split('id="cairn-data">')[1].split("</script>")[0])
    assert data["failed"] >= 1
    assert data["retries"] >= 1
    with stack.client() as client:
        timeline = client.task(retrying).timeline()
    assert timeline.retries >= 1
    assert any(e.event is FailureEvent.FAILED for e in timeline.attempts)


def test_logs_print_the_workers_lines_one_each_tracebacks_only_when_verbose(
    stack: Stack, retrying: str
) -> None:
    """`cairn logs` prints the worker's failure, no traceback; `--verbose` adds it."""
    shown = cairn("logs", retrying, env=stack.env)
    assert 0 == shown.returncode, shown.stderr
    failed = [line for line in shown.stdout.splitlines() if " step failed " in line]
    assert failed, shown.stdout
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00 worker@\S+ writer WARNING ",
                    failed[0]), failed[0]  # fmt: skip
    assert "error_class=ModelError" in failed[0]
    assert "Traceback" not in shown.stdout
    assert any("coordinator@" in line and "step retried" in line
               for line in shown.stdout.splitlines())  # fmt: skip
    verbose = cairn("logs", retrying, "--verbose", env=stack.env)
    assert "Traceback (most recent call last)" in verbose.stdout
    helper = cairn("logs", retrying, "--agent", "helper", env=stack.env)
    assert 0 == helper.returncode, helper.stderr
    assert "step failed" not in helper.stdout
    writer = cairn("logs", retrying, "--agent", "writer", "--json", env=stack.env)
    lines = [json.loads(line) for line in writer.stdout.splitlines()]
    assert lines
    assert {"writer"} == {line["agent"] for line in lines}
    assert all("exception" not in line for line in lines)


def test_logs_follow_ends_when_the_task_ends(stack: Stack, retrying: str) -> None:
    """`cairn logs --follow` prints lines as they come and exits 0 once the task has ended."""
    follow = subprocess.Popen(
        [sys.executable, "-m", "cairn.cli", "logs", retrying, "--follow"],
        env=stack.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = follow.communicate(timeout=120)
    finally:
        if follow.poll() is None:
            follow.kill()
    assert 0 == follow.returncode, err
    with stack.client() as client:
        status = client.task(retrying).status()
        assert "failed" == status.state.value
        events = client.task(retrying).failures("writer")
    assert "task ended" in out
    assert "rollbacks did not help" in (status.reason or "")
    assert FailureEvent.GAVE_UP == events[-1].event
    assert {FailureEvent.FAILED, FailureEvent.RETRIED, FailureEvent.ROLLED_BACK} <= {
        e.event for e in events
    }
    assert all(isinstance(e, StepFailure) for e in events)


def test_an_unknown_task_has_no_logs(stack: Stack) -> None:
    """`cairn logs` of a task Cairn does not know: exit 2, one line."""
    done = cairn("logs", "no-such-task", env=stack.env)
    assert done.returncode != 0
    assert 1 == len(done.stderr.splitlines()), done.stderr
    assert "Traceback" not in done.stderr


def test_failures_are_bounded_and_a_repeated_write_adds_nothing(stack: Stack) -> None:
    """At most `KEEP` events are kept, the newest; the same event written twice is kept once."""
    with stack.client() as client:
        redis_client = client._redis
        task = "bounded"
        redis_client.delete(keys.failures(task))
        for attempt in range(KEEP + 5):
            record_failure(redis_client, task, "a", 1, 1, attempt, FailureEvent.FAILED, "boom")
        events = read_failures(redis_client, task)
        assert KEEP == len(events)
        assert 5 == events[0].attempt
        found = redis_client.zrange(keys.failures(task), -1, -1, withscores=True)
        member, score = cast(list[tuple[bytes, float]], found)[0]
        redis_client.zadd(keys.failures(task), {member: score})  # a retried write
        assert KEEP == redis_client.zcard(keys.failures(task))


def test_a_shipper_on_a_redis_that_lost_its_script_ships_each_line_once(stack: Stack) -> None:
    """Lines go as bare EVALSHAs: after SCRIPT FLUSH (a restarted Redis) the script is sent."""
    saved = structlog.get_config()
    with stack.client() as client:
        redis_client = client._redis
        redis_client.hset(keys.run("flushed"), "status", "running")

        def shipped(count: int) -> list[str]:
            deadline = time.monotonic() + 10
            while len(lines := read_logs(redis_client, "flushed")) < count:
                assert time.monotonic() < deadline, f"{count} lines never shipped"
                time.sleep(0.02)
            return [line.message for line in lines]

        try:
            configure_logging("json", "info", stream=io.StringIO())
            ship_logs(redis_client, "worker")
            get_logger("test").info("first", task="flushed", agent="a")
            assert ["first"] == shipped(1)
            redis_client.script_flush()
            get_logger("test").info("second", task="flushed", agent="a")
            assert ["first", "second"] == shipped(2)
        finally:
            structlog.configure(**saved)
        time.sleep(0.2)  # nothing more arrives: no line went twice
        assert ["first", "second"] == [line.message for line in read_logs(redis_client, "flushed")]


EXITING = """
import io, sys
from cairn.agents.logs import configure_logging, get_logger
from cairn.agents.logship import ship_logs
from cairn.storage.backends.redis import connect
configure_logging("json", "info", stream=io.StringIO())
ship_logs(connect(sys.argv[1]), "worker")
for n in range(3):
    get_logger("test").info(f"line {n}", task="exiting", agent="a")
"""


def test_a_process_ships_its_last_lines_as_it_exits(stack: Stack) -> None:
    """Lines logged just before a normal exit are shipped: the batch does not linger then."""
    with stack.client() as client:
        redis_client = client._redis
        redis_client.hset(keys.run("exiting"), "status", "running")
        done = subprocess.run(
            [sys.executable, "-c", EXITING, stack.url],
            env=stack.env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert 0 == done.returncode, done.stderr
        shipped = [line.message for line in read_logs(redis_client, "exiting")]
        assert ["line 0", "line 1", "line 2"] == shipped


def test_lines_logged_together_are_shipped_in_one_round_trip(stack: Stack) -> None:
    """A batch waits `LINGER` for the lines after its first: a step's lines go together."""
    saved = structlog.get_config()
    with stack.client() as client:
        redis_client = client._redis
        redis_client.hset(keys.run("together"), "status", "running")
        redis_client.script_load(source("ship_log"))  # no batch is sent again for NOSCRIPT
        try:
            configure_logging("json", "info", stream=io.StringIO())
            shipper = ship_logs(redis_client, "worker")
            assert shipper is not None
            sent: list[int] = []
            send = shipper._send

            def counted(commands: list[tuple[object, ...]]) -> list[tuple[object, ...]]:
                sent.append(len(commands))
                return send(commands)

            shipper._send = counted  # type: ignore[method-assign]
            get_logger("test").info("line 0", task="together", agent="a")
            time.sleep(LINGER / 5)  # the shipper woke for the first line meanwhile
            for n in range(1, 5):
                get_logger("test").info(f"line {n}", task="together", agent="a")
            assert shipper.flush()
        finally:
            structlog.configure(**saved)
        assert [5] == sent
        assert 5 == len(read_logs(redis_client, "together"))


def test_a_wait_under_a_millisecond_for_a_line_ends(stack: Stack) -> None:
    """A follower's last wait, a fraction of a millisecond, is not Redis's BLOCK 0 (for ever)."""
    with stack.client() as client:
        redis_client = client._redis
        redis_client.hset(keys.run("quiet"), "status", "running")
        found: list[object] = []
        reader = threading.Thread(
            target=lambda: found.append(read_logs(redis_client, "quiet", after="0-0", wait=0.0004)),
            daemon=True,
        )
        reader.start()
        reader.join(30)
        assert [[]] == found, "the read was still waiting after 30 s"


def test_a_line_logged_after_forget_brings_no_key_of_the_task_back(stack: Stack) -> None:
    """A process's late line for a forgotten task (no run state) is dropped, not stored."""
    saved = structlog.get_config()
    with stack.client() as client:
        redis_client = client._redis
        redis_client.hset(keys.run("live"), "status", "running")
        try:
            configure_logging("json", "info", stream=io.StringIO())
            ship_logs(redis_client, "worker")
            get_logger("test").info("late line", task="forgotten", agent="a")
            get_logger("test").info("a line", task="live", agent="a")
            deadline = time.monotonic() + 10
            while not redis_client.exists(keys.logs("live")) and time.monotonic() < deadline:
                time.sleep(0.02)
        finally:
            structlog.configure(**saved)
        assert ["a line"] == [line.message for line in read_logs(redis_client, "live")]
        assert not redis_client.exists(keys.logs("forgotten"))  # shipped before "live"'s
