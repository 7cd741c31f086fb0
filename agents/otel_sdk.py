"""What of the OpenTelemetry SDK Cairn's tracing uses: imported only once a process traces.

`cairn.agents.tracing` imports this module when tracing starts, so a process that does
not trace never loads the SDK (about 50 ms at import), and one without the `otel` extra
never needs it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from typing import Any, Literal

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.trace import (
    Link,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    Tracer,
    TraceState,
)

# The ids the next span started on this thread takes (trace id, span id), else random ones.
FIXED: ContextVar[tuple[int, int] | None] = ContextVar("cairn_fixed_span_ids", default=None)


class FixableIds(IdGenerator):
    """Random ids, except those `FIXED` names for the span being started."""

    def __init__(self) -> None:
        self._random = RandomIdGenerator()

    def generate_span_id(self) -> int:
        """The fixed span id, else a random one."""
        fixed = FIXED.get()
        return fixed[1] if fixed is not None else self._random.generate_span_id()

    def generate_trace_id(self) -> int:
        """The fixed trace id (for a root span), else a random one."""
        fixed = FIXED.get()
        return fixed[0] if fixed is not None else self._random.generate_trace_id()


def provider(
    service: str, exporter: Literal["otlp", "console"], endpoint: str | None
) -> TracerProvider:
    """A tracer provider of Cairn's own, exporting in batches as asked."""
    made = TracerProvider(
        resource=Resource.create({"service.name": service}),
        id_generator=FixableIds(),
        shutdown_on_exit=False,  # `stop_tracing` at exit, bounded: the SDK's may wait long
    )
    made.add_span_processor(BatchSpanProcessor(_exporter(exporter, endpoint)))
    return made


def _exporter(exporter: Literal["otlp", "console"], endpoint: str | None) -> SpanExporter:
    if exporter == "console":
        return ConsoleSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415 - requests with it
        OTLPSpanExporter,
    )

    return OTLPSpanExporter(endpoint=endpoint)


def remote(trace_id: int, span_id: int, *, replayed: bool, member: str) -> Context:
    """A context whose parent is a span of another process (sampled), `member` its state."""
    state = TraceState([("cairn", member)]) if replayed else TraceState()
    parent = SpanContext(trace_id, span_id, is_remote=True,
                         trace_flags=TraceFlags(TraceFlags.SAMPLED), trace_state=state)  # fmt: skip
    return trace.set_span_in_context(trace.NonRecordingSpan(parent))


def begin(
    tracer: Tracer,
    name: str,
    parent: Context | None,
    attributes: Mapping[str, Any],
    *,
    ids: tuple[int, int] | None,
    client: bool,
    start_time: int | None,
    links: Sequence[tuple[int, int]],
) -> Span:
    """Start a span, `ids` fixing its (trace id, span id); `links` as (trace id, span id)."""
    token = FIXED.set(ids)
    try:
        return tracer.start_span(
            name, parent, SpanKind.CLIENT if client else SpanKind.INTERNAL,
            attributes=dict(attributes),
            links=[Link(SpanContext(t, s, is_remote=True)) for t, s in links],
            start_time=start_time,
        )  # fmt: skip
    finally:
        FIXED.reset(token)


def fail(span: Span, why: str) -> None:
    """Mark `span` an error, `why` its `error.type` and its status's description."""
    span.set_attribute("error.type", why)
    span.set_status(Status(StatusCode.ERROR, why))


@contextlib.contextmanager
def used(span: Span) -> Iterator[None]:
    """Make `span` the current span (its children's parent) for the block, without ending it."""
    with trace.use_span(span, end_on_exit=False, record_exception=False,
                        set_status_on_exception=False):  # fmt: skip
        yield
