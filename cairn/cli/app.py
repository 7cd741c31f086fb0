"""`main`: run one `cairn` command and turn what it raised into one line and an exit code.

See `cairn.cli.exits` for the codes. `--json` prints the shapes scripts rely on (the
models' JSON); without it, people get tables.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Sequence

import redis
from pydantic import ValidationError
from rich.console import Console

from cairn.agents.logs import configure_logging
from cairn.cli.commands import Handler, Session
from cairn.cli.exits import Exit
from cairn.cli.parse import GLOBAL_OPTIONS, UsageError, build_parser
from cairn.cli.render import say
from cairn.coordinator.settings import Settings, load_settings
from cairn.errors import (
    CairnError,
    InvalidName,
    InvalidSpec,
    NotFound,
    RedisServerError,
    Timeout,
    Unavailable,
    one_line,
)

PROCESS_COMMANDS = frozenset({"worker", "coordinator", "up", "demo", "console"})
BAD_INPUT_ERRORS = (InvalidSpec, InvalidName, NotFound, RedisServerError, ValidationError)


def main(argv: Sequence[str] | None = None) -> int:
    """Run `cairn` with `argv` (default: the process's arguments); return the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        say(str(exc))
        return Exit.BAD_INPUT
    except SystemExit as exc:  # --help or --version printed its text
        return exc.code if isinstance(exc.code, int) else Exit.OK
    if args.command is None:  # a bare `cairn`: what it can do
        parser.print_help()
        return Exit.OK
    try:
        return _run(args)
    except KeyboardInterrupt:
        say("interrupted")
        return Exit.FAILED
    except BrokenPipeError:  # `cairn ... | head`: the reader left
        sys.stderr.close()
        return Exit.FAILED


def _run(args: argparse.Namespace) -> int:
    session: Session | None = None
    try:
        settings = settings_from(args)
        configure_logging(
            settings.log_format,
            settings.log_level or ("info" if args.command in PROCESS_COMMANDS else "warning"),
        )
        session = Session(settings, Console(highlight=False, soft_wrap=True))
        handler: Handler = args.handler
        return handler(args, session)
    except BAD_INPUT_ERRORS as exc:
        say(one_line(exc))
        return Exit.BAD_INPUT
    except (Unavailable, redis.ConnectionError, redis.TimeoutError) as exc:
        say(one_line(exc) if str(exc) else "Redis did not answer")
        return Exit.UNAVAILABLE
    except Timeout as exc:
        say(one_line(exc))
        return Exit.TIMED_OUT
    except (CairnError, redis.RedisError, OSError) as exc:
        say(one_line(exc))
        return Exit.FAILED
    except Exception as exc:  # noqa: BLE001 - a bug: still one line, the traceback on demand
        if session is not None and session.settings.log_level == "debug":
            traceback.print_exc()
        say(f"unexpected {type(exc).__name__}: {one_line(exc)} (--log-level debug shows where)")
        return Exit.FAILED
    finally:
        if session is not None:
            session.close()


def settings_from(args: argparse.Namespace) -> Settings:
    """The settings: the environment, overridden by the flags given."""
    return load_settings(**{name: getattr(args, name, None) for name in GLOBAL_OPTIONS})
