"""Cairn's logging: the loggers of its modules, and the set-up its processes run.

Cairn logs with structlog. A process (the `cairn` CLI, a coordinator, a worker) calls
`configure_logging` once: console in a terminal, JSON otherwise, context bound per step,
secrets of known shapes redacted; the records of libraries that log through the standard
library (RQ's among them) are rendered and redacted the same way.
Used as a library (`cairn.Client` in someone's program), Cairn configures nothing: until
structlog is configured, its loggers hand their events to the standard library's
`logging`, under the module's name, where they stay quiet unless that program asks for
them (as httpx's and redis-py's do).
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any, TextIO

import orjson
import structlog
from structlog.typing import EventDict, WrappedLogger

from cairn.storage.redact import redact


def redact_event(_logger: WrappedLogger, _method: str, event: EventDict) -> EventDict:
    """A structlog processor: secrets of known shapes in string values become [REDACTED].

    Strings inside lists, tuples and dicts too; other values are kept as they are.
    """
    for name, value in event.items():
        event[name] = _redacted(value)
    return event


def _redacted(value: object) -> object:
    """`value` with every string in it redacted (its lists, tuples and dicts as new ones)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {key: _redacted(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_redacted(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_redacted(item) for item in value)
    return value


def render_message(_logger: WrappedLogger, _method: str, event: EventDict) -> str:
    """A structlog processor: the event as one line, `event key=value ...`."""
    text = str(event.pop("event", ""))
    return " ".join([text, *(f"{name}={value!r}" for name, value in event.items())])


def _json_line(event: EventDict, **options: Any) -> str:  # noqa: ANN401 - json.dumps's options
    """Return one event as JSON: orjson's, else the stdlib's (an integer beyond 64 bits).

    orjson takes a third of the stdlib's time, and a step logs twice. `options` are the
    stdlib's, among them the fallback for values JSON has no form for (`default`).
    """
    try:
        return orjson.dumps(
            event, default=options.get("default"), option=orjson.OPT_NON_STR_KEYS
        ).decode()
    except TypeError:
        return json.dumps(event, **options)


class CairnLogger:
    """A logger of one Cairn module: structlog as the process configured it, else `logging`.

    The choice is made at each call, so a process that configures logging after
    importing Cairn gets every event from then on. The logger bound to a configuration is
    kept while that configuration stands: structlog's own proxy, not caching (a test's
    `capture_logs` configures anew), binds one anew at each call, about as costly as
    logging the event.
    """

    def __init__(self, name: str) -> None:
        self._configured = structlog.get_logger(name)
        self._bound: tuple[list[object], Any] | None = None  # (the processors, bound to them)
        self._library = structlog.wrap_logger(
            logging.getLogger(name),
            processors=[
                structlog.stdlib.filter_by_level,  # first: a quiet level costs nothing more
                structlog.contextvars.merge_contextvars,
                structlog.processors.format_exc_info,
                redact_event,
                render_message,
            ],
            wrapper_class=structlog.stdlib.BoundLogger,
        )

    def __getattr__(self, method: str) -> Any:  # noqa: ANN401 - structlog's loggers are untyped
        if not structlog.is_configured():
            return getattr(self._library, method)
        # `configure` replaces the processors list, so the same list is the same config; the
        # list is held here, so its identity is never another's.
        processors = structlog.get_config()["processors"]
        bound = self._bound
        if bound is None or bound[0] is not processors:
            bound = self._bound = (processors, self._configured.bind())
        return getattr(bound[1], method)


def get_logger(name: str) -> CairnLogger:
    """The logger of the Cairn module `name` (quiet until a process configures logging)."""
    return CairnLogger(name)


def configure_logging(
    fmt: str | None = None, level: str | None = None, stream: TextIO | None = None
) -> None:
    """Configure structlog for a Cairn process (its settings' `log_format`, `log_level`).

    `fmt` is `console` or `json` (default: console when stderr is a terminal); `level`
    defaults to `info`. Context bound with `structlog.contextvars` (task, agent,
    superstep, epoch, attempt) is merged into every event. Events go to `stream`, by
    default stderr, and so do the standard library's records (RQ's, redis-py's), rendered
    the same way through a handler on the root logger; every string is redacted.
    """
    fmt = fmt or ("console" if sys.stderr.isatty() else "json")
    name = (level or "info").upper()
    numeric = logging.getLevelNamesMapping().get(name)
    if numeric is None:
        raise ValueError(f"unknown log level {name!r}")
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer()
        if fmt == "console"
        else structlog.processors.JSONRenderer(serializer=_json_line)
    )
    stamp = structlog.processors.TimeStamper(fmt="iso", utc=True)
    # Redaction is last before rendering, so nothing is added after it; a traceback is made
    # text before it, as an exception's message may quote a secret.
    last: list[structlog.typing.Processor] = [structlog.processors.format_exc_info, redact_event]
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            stamp,
            *last,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(stream or sys.stderr),
        cache_logger_on_first_use=False,
    )
    # Other libraries log through the standard library, RQ among them (a failed job's
    # traceback, the text of its exception): their records are rendered, and redacted, as
    # Cairn's own events are. RQ adds no handler of its own when the root logger has one.
    handler = RecordHandler(stream or sys.stderr)
    handler.setLevel(numeric)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[
                structlog.contextvars.merge_contextvars,
                structlog.stdlib.add_log_level,
                structlog.stdlib.add_logger_name,
                stamp,
                *last,
            ],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, RecordHandler)]:
        root.removeHandler(old)  # configured anew: the last configuration's handler goes
    root.addHandler(handler)


class RecordHandler(logging.StreamHandler[TextIO]):
    """The root logger's handler that `configure_logging` adds (told apart by its class)."""
