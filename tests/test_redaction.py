"""A secret a provider or a failure quotes is kept nowhere: not in Redis, the API or a log.

The provider is a real HTTP server on 127.0.0.1 (`tests.test_openai_model`'s), answering
200 with a body that is no JSON and quotes a bearer token, as a misconfigured proxy does.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import io
import subprocess
import sys
import textwrap
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
import redis
import structlog
import zstandard

from cairn import Client
from cairn.agents.logs import configure_logging, get_logger
from cairn.agents.logship import ship_logs
from cairn.agents.models.anthropic import AnthropicModel
from cairn.agents.models.openai import OpenAIModel
from cairn.coordinator.failures import FailureEvent, read_failures, record_failure
from cairn.coordinator.jobs import record_outcome
from cairn.coordinator.runs import RunState, TaskState, read_run
from cairn.coordinator.spec import TaskSpec
from cairn.coordinator.tasklogs import read_logs
from cairn.errors import ModelError
from cairn.storage import keys
from cairn.storage.backends.redis import RedisHotStore
from cairn.storage.redact import REDACTED
from tests.cluster import ROOT, Cluster
from tests.test_openai_model import Scripted, ScriptedServer, ask, serve_scripted

LEAK = "sk-proj-LEAKEDkey0123456789abcdefghij"  # a key in no worker's environment
WORKER_KEY = "sk-worker-0123456789abcdefghijklmn"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
BODY = f"<html>bad gateway; you sent Authorization: Bearer {LEAK}</html>".encode()


@pytest.fixture
def provider(monkeypatch: pytest.MonkeyPatch) -> Iterator[ScriptedServer]:
    """A chat-completions server answering every call 200 with `BODY`."""
    for server in serve_scripted(monkeypatch):
        server.script = [Scripted(200, BODY) for _ in range(200)]
        yield server


def readings(value: bytes) -> list[bytes]:
    """`value`, and what it holds compressed, inflated.

    RQ's zlib (a job's `exc_info`; a result's `exc_string`, in base64) and Cairn's zstd.
    """
    found = [value]
    with contextlib.suppress(zlib.error):
        found.append(zlib.decompress(value))
    with contextlib.suppress(zlib.error, binascii.Error):
        found.append(zlib.decompress(base64.b64decode(value, validate=True)))
    at = value.find(ZSTD_MAGIC)
    if at >= 0:
        with contextlib.suppress(zstandard.ZstdError):
            inflate = zstandard.ZstdDecompressor().decompress
            found.append(inflate(value[at:], max_output_size=64 * 1024 * 1024))
    return found


def everything_in(client: redis.Redis) -> bytes:
    """Every key and value of every type in the Redis of `client`, inflated, joined."""
    found: list[bytes] = []
    for key in client.scan_iter(count=1_000):
        kind = client.type(key)
        found.append(key)
        if kind == b"string":
            found.append(cast(bytes, client.get(key)))
        elif kind == b"hash":
            for field, value in cast(dict[bytes, bytes], client.hgetall(key)).items():
                found += [field, value]
        elif kind == b"list":
            found += cast(list[bytes], client.lrange(key, 0, -1))
        elif kind == b"set":
            found += cast(set[bytes], client.smembers(key))
        elif kind == b"zset":
            found += cast(list[bytes], client.zrange(key, 0, -1))
        elif kind == b"stream":
            for _id, fields in cast(list[tuple[bytes, dict[bytes, bytes]]], client.xrange(key)):
                found += [*fields, *fields.values()]
    return b"\n".join(reading for value in found for reading in readings(value))


def test_a_key_a_provider_quotes_is_kept_nowhere(
    cluster: Cluster, provider: ScriptedServer
) -> None:
    """A 2xx body quoting `Bearer sk-...` fails the task; the key is in no record of it.

    Not in the run state or its reason, the outcomes, the RQ jobs (any key of Redis),
    the checkpoints, trace or timeline the client reads, nor the worker's log.
    """
    spec = TaskSpec.model_validate(
        {
            "name": "leaky provider",
            "goal": "Say hello.",
            "agents": [
                {
                    "name": "a",
                    "model": "openai:gpt-test",
                    "base_url": provider.base_url,
                    "max_retries": 0,
                    "timeout": 30,
                }
            ],
        }
    )
    cluster.env["OPENAI_API_KEY"] = WORKER_KEY
    task = cluster.tasks.submit(spec)
    cluster.start_worker()
    cluster.wait_for_workers(1)
    status = cluster.drive(task, timeout=90)
    assert provider.received, "the worker never asked the provider"
    assert TaskState.FAILED.value == status["status"]
    reason = str(status["reason"])
    assert "malformed response" in reason  # the provider's answer is quoted, redacted
    assert REDACTED in reason
    secret = LEAK.encode()
    stored = everything_in(cluster.client)
    assert b"malformed response" in stored
    assert b"Traceback (most recent call last)" in stored  # a failed job's, inflated
    assert secret not in stored
    with Client(cluster.server.url, cluster.tmp / "archive") as client:
        handle = client.task(task)
        seen = [
            handle.status().to_json(),
            [c.model_dump() for c in handle.checkpoints()],
            [entry.to_json() for entry in handle.trace()],
            dataclasses.asdict(handle.timeline()),
        ]
    assert LEAK not in repr(seen)
    log = (cluster.tmp / "worker-0.log").read_text(errors="replace")
    assert "malformed response" in log  # RQ's line for the failed job
    assert LEAK not in log
    assert WORKER_KEY not in log + repr(seen) + stored.decode(errors="replace")


@pytest.mark.parametrize("build", [OpenAIModel, AnthropicModel])
def test_a_model_error_quoting_a_secret_is_redacted_when_built(
    provider: ScriptedServer, build: type[OpenAIModel | AnthropicModel]
) -> None:
    """A malformed 2xx body and a 4xx error body: their `ModelError` holds no secret."""
    base = provider.base_url if build is OpenAIModel else provider.root_url
    model = build("m", base, api_key=WORKER_KEY, max_retries=0)
    with pytest.raises(ModelError, match="malformed response") as malformed:
        model.complete(ask())
    provider.script = [Scripted(400, b'{"error": {"message": "bad key Bearer ' + LEAK.encode()
                                + b'"}}')]  # fmt: skip
    with pytest.raises(ModelError, match="HTTP 400") as refused:
        model.complete(ask())
    for caught in (malformed, refused):
        assert LEAK not in str(caught.value)
        assert REDACTED in str(caught.value)


def test_a_failure_reason_is_stored_redacted(redis_client: redis.Redis) -> None:
    """A reason or verify output the coordinator writes is stored redacted."""
    runs = RunState(redis_client, RedisHotStore(redis_client))
    runs.write(
        "t-1",
        {
            "status": TaskState.FAILED,
            "reason": f"agent a: ModelError: upstream said Bearer {LEAK}",
            "verify_output": f"exit code 1\nOPENAI_API_KEY={LEAK}\n",
        },
    )
    run = read_run(redis_client, "t-1")
    assert f"agent a: ModelError: upstream said Bearer {REDACTED}" == run["reason"]
    assert LEAK not in run["verify_output"]
    assert "failed" == run["status"]


def test_a_step_failure_is_recorded_redacted(redis_client: redis.Redis) -> None:
    """The message of a failed step, as its job records it, holds no secret."""
    record_outcome(redis_client, "t-1", "a", 1, 0, 1, "fatal", f"ToolError: key {LEAK} refused")
    raw = cast(bytes, redis_client.hget(keys.outcomes("t-1", 0, 1), "a"))
    assert LEAK.encode() not in raw
    assert REDACTED.encode() in raw


def test_a_failure_event_and_a_shipped_log_line_are_redacted(redis_client: redis.Redis) -> None:
    """What `status`, `trace` and `cairn logs` show of a failed step holds no secret."""
    redis_client.delete(keys.failures("t-1"), keys.logs("t-1"))
    redis_client.hset(keys.run("t-1"), "status", "running")  # lines ship while a task runs
    record_failure(redis_client, "t-1", "a", 1, 0, 1, FailureEvent.FAILED,
                   f"upstream said Bearer {LEAK}", error_class="ModelError")  # fmt: skip
    [event] = read_failures(redis_client, "t-1")
    assert f"upstream said Bearer {REDACTED}" == event.error
    saved = structlog.get_config()
    try:
        configure_logging("json", "info", stream=io.StringIO())
        ship_logs(redis_client, "worker")
        get_logger("test").warning("step failed", task="t-1", agent="a", error=f"key {LEAK}")
        deadline = time.monotonic() + 10
        while not redis_client.xlen(keys.logs("t-1")) and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        structlog.configure(**saved)
    [line] = read_logs(redis_client, "t-1")
    assert ("a", "step failed") == (line.agent, line.message)
    assert LEAK not in line.model_dump_json()
    assert REDACTED in str(line.fields["error"])


RQ_LOGS = f"""
import logging
from cairn.agents.logs import configure_logging
from rq.logutils import setup_loghandlers

configure_logging("json", "info")
setup_loghandlers("WARNING", name="rq.worker")  # as RQ's Worker.bootstrap does
log = logging.getLogger("rq.worker")
try:
    raise RuntimeError("upstream said Bearer {LEAK}")
except RuntimeError:
    log.error("job failed: %s", "api_key={LEAK}", exc_info=True)
log.warning("moved to FailedJobRegistry: {LEAK}")
"""


def test_rq_log_lines_are_redacted(tmp_path: Path) -> None:
    """RQ's own logger, in a process Cairn configured: its lines and tracebacks are redacted."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(RQ_LOGS)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    output = done.stdout + done.stderr
    assert "job failed" in output
    assert "moved to FailedJobRegistry" in output
    assert "RuntimeError: upstream said Bearer" in output  # the traceback is kept
    assert LEAK not in output
    assert 3 == output.count(REDACTED)
