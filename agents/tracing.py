"""OpenTelemetry traces of tasks: one trace per task, whichever processes ran it.

Off unless the process's settings turn it on (`cairn.coordinator.settings`: the standard
`OTEL_*` variables), and a no-op without the `otel` extra (`pip install
'cairn-agents[otel]'`); the SDK is imported only once a process traces
(`cairn.agents.otel_sdk`). Cairn keeps a tracer provider of its own, never the global one:
a framework an adapter wraps keeps its own instrumentation, and what Cairn exports is only
what this module writes. Spans go through a `BatchSpanProcessor`: an export runs on its
thread, and its failures are the SDK's to log, never a step's.

One task is one trace without any state kept for it: its trace id, and the span ids of
its task, superstep and step spans, are derived from the task id (a SHA-256), so any
coordinator, worker or client parents its spans correctly on its own. A step job carries
its superstep span's context as W3C `traceparent` (and `tracestate`, which says whether
the superstep replays work a restore discarded) all the same; a worker takes it only when
it is well formed and of the task's trace (`parent_of`).

The spans of a step and of its model and tool calls are `cairn.agents.spans`'; the
coordinator's (task, supersteps, restores) `cairn.coordinator.tracing`'s.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal

from cairn.agents.logs import get_logger

if TYPE_CHECKING:  # the `otel` extra's, loaded only once a process traces (`otel_sdk`)
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer


def _installed() -> bool:
    """Whether the `otel` extra is installed: looked up, never imported.

    No process pays for importing the SDK unless it traces.
    """
    if importlib.util.find_spec("opentelemetry") is None:
        return False
    try:
        for name in ("opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-http"):
            importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


INSTALLED = _installed()  # without the extra every function here does nothing
log = get_logger(__name__)
Exporter = Literal["otlp", "console"]
REPLAYED_STATE = "replayed"  # the `cairn` member of `tracestate` of a superstep that replays
TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
MAX_TRACESTATE = 512  # W3C: a vendor may drop a longer `tracestate`


@dataclass(frozen=True, slots=True)
class TraceConfig:
    """How a process traces: where spans go (None: nowhere), and whether content goes too.

    `endpoint` is the OTLP/HTTP traces URL (None: the exporter's default); `service` the
    resource's `service.name`.
    """

    exporter: Exporter | None = None
    endpoint: str | None = None
    content: bool = False
    service: str = "cairn"


@dataclass(slots=True)
class _Tracing:
    tracer: Tracer | None = None
    provider: TracerProvider | None = None
    sdk: ModuleType | None = None  # `cairn.agents.otel_sdk`, once tracing started
    content: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


_state = _Tracing()


def start_tracing(config: TraceConfig) -> bool:
    """Make this process trace as `config` says, once; True when spans are exported.

    Without the `otel` extra, or with no exporter configured, nothing is exported, and
    a later call may still turn tracing on.
    """
    if config.exporter is None:
        return False
    if not INSTALLED:
        log.warning("traces not exported: the otel extra is not installed",
                    hint="pip install 'cairn-agents[otel]'")  # fmt: skip
        return False
    with _state.lock:
        if _state.tracer is not None:
            return True
        sdk = importlib.import_module("cairn.agents.otel_sdk")
        provider = sdk.provider(config.service, config.exporter, config.endpoint)
        _state.provider, _state.sdk, _state.content = provider, sdk, config.content
        _state.tracer = provider.get_tracer("cairn")
    atexit.register(stop_tracing)
    log.info("traces exported", exporter=config.exporter, content=config.content)
    return True


def stop_tracing(timeout_ms: int = 3_000) -> None:
    """Export the spans still queued, then stop tracing; back within about `timeout_ms`.

    A collector out of reach loses them: a process stopping never waits on it longer.
    """
    with _state.lock:
        provider, _state.provider, _state.tracer = _state.provider, None, None
    if provider is None:
        return
    stopping = threading.Thread(target=_shut, args=(provider, timeout_ms), daemon=True,
                                name="cairn-traces-stop")  # fmt: skip
    stopping.start()
    stopping.join(timeout_ms / 1000 + 0.5)  # the exporter's own retries may outlast it


def _shut(provider: TracerProvider, timeout_ms: int) -> None:
    with contextlib.suppress(Exception):  # spans lost, never the process's stop
        provider.force_flush(timeout_ms)
        provider.shutdown()


def tracing() -> bool:
    """Whether this process exports spans."""
    return _state.tracer is not None


def content() -> bool:
    """Whether spans may hold message text, tool arguments and results."""
    return _state.tracer is not None and _state.content


# ids ---------------------------------------------------------------------------------------
def trace_id_of(task: str) -> int:
    """The trace id of task `task`: the same in every process."""
    return _derived(16, "trace", task)


def span_id_of(*parts: object) -> int:
    """A span id derived from `parts` (the task's id first): the same in every process."""
    return _derived(8, "span", *parts)


def _derived(size: int, *parts: object) -> int:
    digest = hashlib.sha256(json.dumps([str(p) for p in parts]).encode()).digest()
    return int.from_bytes(digest[:size], "big") or 1  # zero is no id


def task_span_id(task: str) -> int:
    """The span id of task `task`'s own span (the root of its trace)."""
    return span_id_of(task, "task")


def superstep_span_id(task: str, epoch: int, superstep: int) -> int:
    """The span id of superstep `superstep` of `task` run under `epoch`."""
    return span_id_of(task, "superstep", epoch, superstep)


def step_span_id(task: str, agent: str, epoch: int, superstep: int, attempt: int) -> int:
    """The span id of attempt `attempt` of `agent`'s step of `superstep` under `epoch`."""
    return span_id_of(task, "step", agent, epoch, superstep, attempt)


def remote(task: str, span: int, *, replayed: bool = False) -> Context | None:
    """A context whose parent is span `span` of `task`'s trace (None when not tracing)."""
    sdk = _state.sdk
    if _state.tracer is None or sdk is None:
        return None
    context: Context = sdk.remote(trace_id_of(task), span, replayed=replayed,
                                  member=REPLAYED_STATE)  # fmt: skip
    return context


def start_span(
    name: str,
    parent: Context | None,
    attributes: Mapping[str, Any],
    *,
    ids: tuple[int, int] | None = None,
    kind: Literal["internal", "client"] = "internal",
    start_time: int | None = None,
    links: Sequence[tuple[str, int]] = (),
) -> Span | None:
    """Start a span (None when not tracing); `ids` fixes its (trace id, span id).

    `parent` None: the current span's child, or a root. `links` are (task, span id)
    pairs of spans this one follows from.
    """
    tracer, sdk = _state.tracer, _state.sdk
    if tracer is None or sdk is None:
        return None
    try:
        span: Span = sdk.begin(
            tracer, name, parent, {k: v for k, v in attributes.items() if v is not None},
            ids=ids, client=kind == "client", start_time=start_time,
            links=[(trace_id_of(task), s) for task, s in links],
        )  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - a span never fails what it traces
        log.warning("span not started", span=name, error=str(exc))
        return None
    return span


def end_span(span: Span | None, error: BaseException | str | None = None) -> None:
    """End `span` (a no-op for None), its status an error when `error` says one."""
    if span is None or _state.sdk is None:
        return
    with contextlib.suppress(Exception):  # a span never fails what it traces
        if error is not None:
            why = type(error).__qualname__ if isinstance(error, BaseException) else error
            _state.sdk.fail(span, why)
        span.end()


@contextlib.contextmanager
def current(span: Span | None) -> Iterator[Span | None]:
    """Run the block with `span` as the current span (its children's parent), and end it.

    An exception leaving the block ends it as an error, and goes on.
    """
    sdk = _state.sdk
    if span is None or sdk is None:
        yield None
        return
    try:
        with sdk.used(span):
            yield span
    except BaseException as exc:
        end_span(span, exc)
        raise
    end_span(span)


def set_attributes(span: Span | None, attributes: Mapping[str, Any]) -> None:
    """Set `attributes` (those not None) on `span`, if there is one."""
    if span is not None:
        with contextlib.suppress(Exception):
            span.set_attributes({k: v for k, v in attributes.items() if v is not None})


def add_event(span: Span | None, name: str, attributes: Mapping[str, Any]) -> None:
    """Add event `name` to `span`, if there is one."""
    if span is not None:
        with contextlib.suppress(Exception):
            span.add_event(name, {k: v for k, v in attributes.items() if v is not None})


# the trace context a step job carries ------------------------------------------------------
def carrier(task: str, epoch: int, superstep: int, *, replayed: bool) -> dict[str, str]:
    """The W3C trace context of a superstep's span, as its step jobs carry it."""
    span = superstep_span_id(task, epoch, superstep)
    parent = {"traceparent": f"00-{trace_id_of(task):032x}-{span:016x}-01"}
    return parent | ({"tracestate": f"cairn={REPLAYED_STATE}"} if replayed else {})


@dataclass(frozen=True, slots=True)
class Parent:
    """Where a step's span hangs in its task's trace, as its job said (or as derived)."""

    span: int
    replayed: bool


def parent_of(task: str, epoch: int, superstep: int, carried: object) -> Parent:
    """The parent a step job's `carried` trace context names, if it is valid for `task`.

    Valid: a mapping of `traceparent` (W3C, version 00, the task's trace id) and optionally
    `tracestate` (at most 512 characters), nothing else. Anything else is ignored, said in
    one warning: the step's span hangs under the superstep's span as derived here.
    """
    derived = Parent(superstep_span_id(task, epoch, superstep), replayed=False)
    if carried is None:
        return derived
    why = _invalid(task, carried)
    if why is not None:
        log.warning("trace context ignored", task=task, reason=why)
        return derived
    assert isinstance(carried, dict)
    found = TRACEPARENT.match(carried["traceparent"])
    assert found is not None
    states = [part.strip() for part in carried.get("tracestate", "").split(",")]
    return Parent(int(found[2], 16), replayed=f"cairn={REPLAYED_STATE}" in states)


def _invalid(task: str, carried: object) -> str | None:
    """Why `carried` is not a trace context of `task`'s trace, or None."""
    if not isinstance(carried, dict) or not carried.keys() <= {"traceparent", "tracestate"}:
        return "not a mapping of traceparent and tracestate"
    if not all(isinstance(value, str) for value in carried.values()):
        return "a value that is not a string"
    found = TRACEPARENT.match(carried.get("traceparent", ""))
    if found is None or int(found[2], 16) == 0:
        return "traceparent is not W3C trace context (version 00)"
    if int(found[1], 16) != trace_id_of(task):
        return "traceparent names another trace than the task's"
    if len(carried.get("tracestate", "")) > MAX_TRACESTATE:
        return f"tracestate longer than {MAX_TRACESTATE} characters"
    return None
