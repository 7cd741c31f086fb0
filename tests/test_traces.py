"""OpenTelemetry traces of a task, exported over OTLP/HTTP to a real receiver.

Each stack is a private redis-server, a `cairn coordinator` and a `cairn worker` process
exporting to `tests/otlp_receiver.py` (the SDK's OTLP/HTTP wire format, decoded with the
official `opentelemetry-proto` types) in a process of its own. The task's writer fails its
first attempt (a retry), writes a file and halts; once the task succeeded, `cairn restore
--to 1` (a process of its own) takes it back, and it runs its last superstep again (a
replay). The stack is stopped before the spans are read: stopping flushes every process's
spans, so what the tests read is all there is.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cairn import Client, TaskState
from cairn.agents.tracing import step_span_id, superstep_span_id, task_span_id, trace_id_of
from cairn.testing.redis_server import free_port
from tests.cli_harness import cairn, private_stack, wait_until
from tests.otlp_receiver import read_spans

ROOT = Path(__file__).resolve().parents[1]
GOAL = "GOAL-7f3a"  # marks the goal (every agent's first message)
SAID = "SAID-91c2"  # marks what the model said
ARGS = "ARGS-4d1e"  # marks a tool call's argument
SECRET = "sk-proj-ABCDEFGHIJKLMNOPQRSTUVWX0123"  # noqa: S105 - a fake key
SPEC = f"""
name: Traced
goal: "Write the note. {GOAL}"
agents:
  - name: writer
    model: scripted
    script:
      - say: "Writing it. {SAID}"
        fail: {{attempts: [1], message: "injected failure"}}
        tools:
          - name: write_file
            args: {{path: notes.txt, content: "{ARGS} {SECRET}"}}
      - say: "Done."
"""
Span = dict[str, Any]


@dataclass
class Traced:
    """A task run to its end (and, unless `content`, restored and run to its end again)."""

    task: str
    spans: list[Span]

    def named(self, name: str) -> list[Span]:
        """The spans called `name`."""
        return [span for span in self.spans if span["name"] == name]

    def children(self, parent: Span, name: str | None = None) -> list[Span]:
        """The spans whose parent is `parent` (called `name`, if given)."""
        return [s for s in self.spans if s["parent_span_id"] == parent["span_id"]
                and (name is None or s["name"] == name)]  # fmt: skip


def _receiver(port: int, out: Path, log: Path) -> subprocess.Popen[bytes]:
    """Start the OTLP/HTTP receiver on `port`; return once it takes connections."""
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.otlp_receiver", str(port), str(out)],
            cwd=ROOT, stdout=sink, stderr=sink,
        )  # fmt: skip

    def listening() -> bool:
        assert process.poll() is None, log.read_text()
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", port)) == 0

    wait_until(listening)
    return process


def _run(tmp: Path, *, content: bool) -> Traced:
    """Run the task on a private stack exporting to a receiver; the spans it received."""
    port, out = free_port(), tmp / "spans.jsonl"
    receiver = _receiver(port, out, tmp / "receiver.log")
    endpoint = f"http://127.0.0.1:{port}"
    spec = tmp / "traced.yaml"
    spec.write_text(SPEC)
    try:
        with private_stack(
            tmp,
            "traces",
            OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
            OTEL_BSP_SCHEDULE_DELAY="100",  # ms between exports (the SDK's default: 5 s)
            CAIRN_OTEL_CONTENT="1" if content else "0",
        ) as (url, env):
            done = cairn("submit", str(spec), "--json", env=env)
            assert 0 == done.returncode, done.stderr
            task: str = json.loads(done.stdout)["task_id"]
            with Client(redis_url=url, archive_dir=tmp / "archive") as client:
                assert TaskState.SUCCEEDED == client.task(task).wait(60).state
                if not content:
                    back = cairn("restore", task, "--to", "1", "--json", env=env)
                    assert 0 == back.returncode, back.stderr
                    _wait_for_end_after(client, task, json.loads(back.stdout)["checkpoint"])
        return Traced(task, read_spans(out))
    finally:
        receiver.terminate()
        receiver.wait(10)


def _wait_for_end_after(client: Client, task: str, number: int) -> None:
    """Wait until `task` ended again on a GC after GC `number` (its restore's)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status = client.task(task).status()
        if status.ended and (status.latest_checkpoint or 0) > number:
            assert TaskState.SUCCEEDED == status.state
            return
        time.sleep(0.1)
    raise AssertionError(f"task {task} did not end after its restore: {status}")


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Traced:
    """The task with a retry and a restore, traced without content."""
    return _run(tmp_path_factory.mktemp("traces"), content=False)


@pytest.fixture(scope="module")
def with_content(tmp_path_factory: pytest.TempPathFactory) -> Traced:
    """The task traced with `CAIRN_OTEL_CONTENT=1`."""
    return _run(tmp_path_factory.mktemp("content"), content=True)


def test_one_task_is_one_trace_under_its_task_span(traced: Traced) -> None:
    """Every span of every process has the task's trace id; the root is the task span."""
    assert {f"{trace_id_of(traced.task):032x}"} == {s["trace_id"] for s in traced.spans}
    (root,) = [s for s in traced.spans if s["parent_span_id"] == ""]
    assert f"task {traced.task}" == root["name"]
    assert f"{task_span_id(traced.task):016x}" == root["span_id"]
    assert "succeeded" == root["attributes"]["cairn.task.status"]
    assert {"cairn-coordinator", "cairn-worker", "cairn-client"} == {
        s["service"] for s in traced.spans
    }
    (again,) = traced.named(f"task {traced.task} ended again")  # the run after the restore
    assert root["span_id"] == again["parent_span_id"]


def test_supersteps_hang_under_the_task_with_their_gc_and_epoch(traced: Traced) -> None:
    """A span per superstep run, under the task span, with its GC number and epoch."""
    (root,) = traced.named(f"task {traced.task}")
    supersteps = traced.children(root)
    supersteps = [s for s in supersteps if s["name"].startswith("superstep ")]
    seen = sorted((s["attributes"]["cairn.epoch"], s["attributes"]["cairn.superstep"],
                   s["attributes"]["cairn.gc.number"]) for s in supersteps)  # fmt: skip
    (first, _second, again) = seen  # supersteps 1 and 2, then 2 again after the restore
    assert (1, 1) == first[1:]
    assert again[0] > first[0]  # the restore raised the epoch
    assert 2 == again[1]
    for span in supersteps:
        attributes = span["attributes"]
        derived = superstep_span_id(traced.task, attributes["cairn.epoch"],
                                    attributes["cairn.superstep"])  # fmt: skip
        assert f"{derived:016x}" == span["span_id"]
        assert "committed" == attributes["cairn.superstep.outcome"]


def test_steps_hang_under_their_superstep_with_agent_attempt_and_worker(traced: Traced) -> None:
    """A step span per attempt under its superstep: agent, attempt, worker; a retry links."""
    (one,) = traced.named("superstep 1")
    attempts = sorted(traced.children(one, "invoke_agent writer"),
                      key=lambda s: s["attributes"]["cairn.attempt"])  # fmt: skip
    assert [1, 2] == [s["attributes"]["cairn.attempt"] for s in attempts]
    failed, retried = attempts
    for span in attempts:
        assert "writer" == span["attributes"]["gen_ai.agent.name"]
        assert "invoke_agent" == span["attributes"]["gen_ai.operation.name"]
        assert span["attributes"]["cairn.worker"].startswith("worker@")
    assert 2 == failed["status"]["code"]  # ERROR
    assert "ModelError" == failed["attributes"]["error.type"]
    before = step_span_id(traced.task, "writer", failed["attributes"]["cairn.epoch"], 1, 1)
    assert [f"{before:016x}"] == [link["span_id"] for link in retried["links"]]
    assert "active" == retried["attributes"]["cairn.step.status"]
    events = [e for e in one["events"] if e["name"] == "step retried"]
    assert [{"cairn.agent": "writer", "cairn.attempt": 2}] == [e["attributes"] for e in events]


def test_model_and_tool_calls_follow_the_genai_conventions(traced: Traced) -> None:
    """Model calls are `chat` spans with usage; tool calls `execute_tool` spans."""
    (one,) = traced.named("superstep 1")
    steps = {s["attributes"]["cairn.attempt"]: s for s in traced.children(one)}
    (failed_call,) = traced.children(steps[1], "chat scripted")
    assert 2 == failed_call["status"]["code"]
    (call,) = traced.children(steps[2], "chat scripted")
    attributes = call["attributes"]
    assert "chat" == attributes["gen_ai.operation.name"]
    assert "scripted" == attributes["gen_ai.provider.name"]
    assert "scripted" == attributes["gen_ai.request.model"]
    assert attributes["gen_ai.usage.input_tokens"] > 0
    assert attributes["gen_ai.usage.output_tokens"] > 0
    assert ["tool_calls"] == attributes["gen_ai.response.finish_reasons"]
    assert 3 == call["kind"]  # CLIENT
    (tool,) = traced.children(steps[2], "execute_tool write_file")
    assert "execute_tool" == tool["attributes"]["gen_ai.operation.name"]
    assert "write_file" == tool["attributes"]["gen_ai.tool.name"]
    assert "call_0_0" == tool["attributes"]["gen_ai.tool.call.id"]
    assert "workspace" == tool["attributes"]["cairn.tool.effects"]


def test_a_restore_is_a_span_and_the_work_it_discarded_runs_replayed(traced: Traced) -> None:
    """The restore's span is under the task's; calls of the superstep it reran say replayed."""
    (root,) = traced.named(f"task {traced.task}")
    (restore,) = traced.named(f"restore {traced.task}")
    assert root["span_id"] == restore["parent_span_id"]
    assert "cairn-client" == restore["service"]
    assert 1 == restore["attributes"]["cairn.restore.to"]
    assert "restore" == restore["attributes"]["cairn.restore.origin"]
    twos = sorted(traced.named("superstep 2"), key=lambda s: s["attributes"]["cairn.epoch"])
    assert [False, True] == [s["attributes"]["cairn.replayed"] for s in twos]
    calls = [c for s in twos for step in traced.children(s) for c in traced.children(step)]
    assert [False, True] == [c["attributes"]["cairn.replayed"] for c in calls]
    assert restore["end"] <= twos[1]["start"]


def test_spans_hold_no_content_unless_asked(traced: Traced, with_content: Traced) -> None:
    """No message, tool argument or secret in spans; with content on, all but the secret."""
    plain = json.dumps(traced.spans)
    for marker in (GOAL, SAID, ARGS, SECRET):
        assert marker not in plain
    told = json.dumps(with_content.spans)
    for marker in (GOAL, SAID, ARGS):
        assert marker in told
    assert SECRET not in told  # redacted, as in checkpoints
    (call,) = [s for s in with_content.spans if s["name"] == "chat scripted"
               and s["attributes"]["cairn.attempt"] == 2
               and s["attributes"]["gen_ai.usage.output_tokens"] > 1]  # fmt: skip
    said = json.loads(call["attributes"]["gen_ai.output.messages"])
    assert SAID in said[0]["parts"][0]["content"]
    (tool,) = [s for s in with_content.spans if s["name"] == "execute_tool write_file"]
    assert ARGS in json.loads(tool["attributes"]["gen_ai.tool.call.arguments"])["content"]
