"""structlog set-up: console in a terminal, JSON otherwise; context bound per step."""

from __future__ import annotations

import logging
import os
import sys
from typing import TextIO

import structlog
from structlog.typing import EventDict, WrappedLogger

from storage.redact import redact


def redact_event(_logger: WrappedLogger, _method: str, event: EventDict) -> EventDict:
    """A structlog processor: secrets of known shapes in string values become [REDACTED]."""
    for name, value in event.items():
        if isinstance(value, str):
            event[name] = redact(value)
    return event


def configure_logging(
    fmt: str | None = None, level: str | None = None, stream: TextIO | None = None
) -> None:
    """Configure structlog from arguments, else `CAIRN_LOG_FORMAT` and `CAIRN_LOG_LEVEL`.

    `fmt` is `console` or `json` (default: console when stderr is a terminal). Context
    bound with `structlog.contextvars` (task, agent, superstep, epoch, attempt) is merged
    into every event. Events go to `stream`, by default stderr.
    """
    fmt = (
        fmt or os.environ.get("CAIRN_LOG_FORMAT") or ("console" if sys.stderr.isatty() else "json")
    )
    name = (level or os.environ.get("CAIRN_LOG_LEVEL") or "info").upper()
    numeric = logging.getLevelNamesMapping().get(name)
    if numeric is None:
        raise ValueError(f"unknown log level {name!r}")
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer() if fmt == "console" else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            redact_event,  # last before rendering: nothing is added after it
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(stream or sys.stderr),
        cache_logger_on_first_use=False,
    )
