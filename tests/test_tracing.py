"""Tracing's parts without a collector: its settings, its ids, a job's trace context, no extra.

What a traced task exports is tests/test_traces.py's (a real receiver, real processes).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from cairn.agents.tracing import (
    TraceConfig,
    carrier,
    parent_of,
    span_id_of,
    step_span_id,
    superstep_span_id,
    task_span_id,
    trace_id_of,
)
from cairn.coordinator.settings import load_settings
from cairn.errors import InvalidSpec

ROOT = Path(__file__).resolve().parents[1]
OTEL = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_TRACES_EXPORTER",
    "OTEL_SDK_DISABLED",
    "OTEL_SERVICE_NAME",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT",
    "CAIRN_OTEL_CONTENT",
)


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The process environment with no OpenTelemetry variable set."""
    for name in OTEL:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_traces_are_off_unless_an_otel_variable_asks(env: pytest.MonkeyPatch) -> None:
    """No endpoint and no exporter named: nothing is exported, nothing is content."""
    assert TraceConfig(service="cairn-worker") == load_settings().traces("worker")


def test_an_otlp_endpoint_turns_traces_on(env: pytest.MonkeyPatch) -> None:
    """OTEL_EXPORTER_OTLP_ENDPOINT is joined with /v1/traces; the traces' own one is as given."""
    env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")
    config = load_settings().traces("coordinator")
    assert TraceConfig("otlp", "http://collector:4318/v1/traces", service="cairn-coordinator") == (
        config
    )
    env.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://jaeger:4318/v1/traces")
    env.setenv("OTEL_SERVICE_NAME", "cairn-prod")
    assert TraceConfig("otlp", "http://jaeger:4318/v1/traces", service="cairn-prod") == (
        load_settings().traces("coordinator")
    )


def test_the_exporter_variable_chooses_or_turns_off(env: pytest.MonkeyPatch) -> None:
    """OTEL_TRACES_EXPORTER: otlp (default endpoint), console, none; the SDK's off switch."""
    env.setenv("OTEL_TRACES_EXPORTER", "otlp")
    assert "otlp" == load_settings().traces("worker").exporter
    env.setenv("OTEL_TRACES_EXPORTER", "console")
    assert "console" == load_settings().traces("worker").exporter
    env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    env.setenv("OTEL_TRACES_EXPORTER", "none")
    assert load_settings().traces("worker").exporter is None
    env.setenv("OTEL_TRACES_EXPORTER", "otlp")
    env.setenv("OTEL_SDK_DISABLED", "true")
    assert load_settings().traces("worker").exporter is None


def test_an_exporter_or_protocol_cairn_lacks_is_one_line(env: pytest.MonkeyPatch) -> None:
    """Zipkin, or OTLP over gRPC, is refused naming the variable."""
    env.setenv("OTEL_TRACES_EXPORTER", "zipkin")
    with pytest.raises(InvalidSpec, match=r"^invalid setting OTEL_TRACES_EXPORTER: .*'zipkin'$"):
        load_settings().traces("worker")
    env.setenv("OTEL_TRACES_EXPORTER", "otlp")
    env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    with pytest.raises(InvalidSpec, match=r"OTEL_EXPORTER_OTLP_PROTOCOL: .*'grpc'$"):
        load_settings().traces("worker")


def test_content_is_on_by_cairns_switch_or_the_conventions(env: pytest.MonkeyPatch) -> None:
    """CAIRN_OTEL_CONTENT=1, or OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true."""
    env.setenv("OTEL_TRACES_EXPORTER", "otlp")
    assert not load_settings().traces("worker").content
    env.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    assert load_settings().traces("worker").content
    env.delenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT")
    env.setenv("CAIRN_OTEL_CONTENT", "1")
    assert load_settings().traces("worker").content


def test_ids_are_derived_from_the_task_alone() -> None:
    """The same task, superstep and attempt give the same ids in any process; others differ."""
    assert trace_id_of("t-1") == trace_id_of("t-1")
    assert trace_id_of("t-1") != trace_id_of("t-2")
    assert 0 < trace_id_of("t-1") < 2**128
    ids = {
        task_span_id("t-1"),
        superstep_span_id("t-1", 1, 1),
        superstep_span_id("t-1", 2, 1),
        step_span_id("t-1", "a", 1, 1, 1),
        step_span_id("t-1", "a", 1, 1, 2),
        step_span_id("t-1", "b", 1, 1, 1),
    }
    assert 6 == len(ids)
    assert all(0 < span < 2**64 for span in ids)
    assert span_id_of("t-1", "x") == span_id_of("t-1", "x")


def test_a_job_carries_its_supersteps_w3c_context() -> None:
    """`carrier` is W3C trace context; `parent_of` reads back its span and replay mark."""
    carried = carrier("t-1", 3, 5, replayed=True)
    span = superstep_span_id("t-1", 3, 5)
    assert f"00-{trace_id_of('t-1'):032x}-{span:016x}-01" == carried["traceparent"]
    found = parent_of("t-1", 3, 5, carried)
    assert (span, True) == (found.span, found.replayed)
    assert not parent_of("t-1", 3, 5, carrier("t-1", 3, 5, replayed=False)).replayed
    assert (span, False) == (parent_of("t-1", 3, 5, None).span, False)


@pytest.mark.parametrize(
    ("carried", "why"),
    [
        ("00-abc", "not a mapping"),
        ({"traceparent": "00-abc", "baggage": "x"}, "not a mapping"),
        ({"traceparent": 7}, "not a string"),
        ({"traceparent": "01-" + "1" * 32 + "-" + "2" * 16 + "-01"}, "not W3C"),
        ({"traceparent": "00-" + "1" * 32 + "-" + "0" * 16 + "-01"}, "not W3C"),
        ({"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}, "another trace"),
    ],
)
def test_a_trace_context_not_of_the_task_is_ignored(carried: object, why: str) -> None:
    """Anything but the task's own W3C context: the derived parent, and one warning."""
    with capture_logs() as logs:
        found = parent_of("t-1", 3, 5, carried)
    assert (superstep_span_id("t-1", 3, 5), False) == (found.span, found.replayed)
    (warning,) = logs
    assert "trace context ignored" == warning["event"]
    assert why in warning["reason"]


def test_a_long_tracestate_is_ignored() -> None:
    """A tracestate past W3C's 512 characters is not taken."""
    carried = carrier("t-1", 3, 5, replayed=False) | {"tracestate": "x=" + "y" * 600}
    with capture_logs() as logs:
        parent_of("t-1", 3, 5, carried)
    assert ["trace context ignored"] == [log["event"] for log in logs]


def test_without_the_extra_every_span_is_a_no_op() -> None:
    """With opentelemetry not importable, tracing asked for exports nothing and fails nothing."""
    script = """
import sys
sys.modules["opentelemetry"] = None  # as if the `otel` extra were not installed
from cairn.agents import spans, tracing
from cairn.coordinator import tracing as coordinated
import cairn.coordinator.worker, cairn.cli
assert not tracing.INSTALLED
assert not tracing.start_tracing(tracing.TraceConfig("otlp"))
assert not tracing.tracing()
with spans.step_span(spans.StepAt("t", "a", 1, 1, 1, "w"), None) as span:
    assert span is None
assert coordinated.superstep_began("t", 1, 1, 1, ["a"], replayed=False) is None
with coordinated.restore_span("t", None, "restore") as restoring:
    restoring.restored(1, 2, 3)
tracing.stop_tracing()
print("no-op")
"""
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert 0 == done.returncode, done.stderr
    assert "no-op" == done.stdout.strip()
