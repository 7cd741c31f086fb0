"""`cairn`: the command line of Cairn, a thin layer over the coordinator and the store.

Exit codes: 0 success; 1 the operation or the task failed; 2 bad input (an invalid spec,
an unknown task, an unreachable Redis, bad arguments). Every failure is one line on
stderr naming the reason, never a traceback. `--json` prints the shapes scripts rely on
(see each command's help); without it, people get tables.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

import redis
from pydantic import ValidationError
from rich.console import Console

from agents.logs import configure_logging
from coordinator.cli_commands import (
    BAD_INPUT,
    FAILED,
    OK,
    Handler,
    cmd_archive,
    cmd_checkpoint,
    cmd_checkpoints,
    cmd_coordinator,
    cmd_decide,
    cmd_demo,
    cmd_lifecycle,
    cmd_restore,
    cmd_status,
    cmd_submit,
    cmd_trace,
    cmd_up,
    cmd_watch,
    cmd_worker,
    cmd_workspace,
)
from coordinator.cli_context import Session
from coordinator.cli_render import say
from coordinator.settings import Settings, load_settings
from storage.errors import CairnError, InvalidName, InvalidSpec
from storage.redis_server import RedisServerError

PROCESS_COMMANDS = frozenset({"worker", "coordinator", "up", "demo"})
DESCRIPTION = "Crash-safe checkpoints for teams of LLM agents."


class UsageError(Exception):
    """Raised by the parser instead of printing usage and exiting: main says it in one line."""


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, through `main`."""

    def error(self, message: str) -> NoReturn:
        """Raise `UsageError` (argparse would print the whole usage, then exit)."""
        command = self.prog.removeprefix("cairn").strip()
        raise UsageError(f"{command}: {message}" if command else message)


# the parser -----------------------------------------------------------------------------
def _common() -> Parser:
    """Options every command takes, before or after its name (no defaults: env decides)."""
    common = Parser(add_help=False)
    s = argparse.SUPPRESS
    common.add_argument("--redis-url", default=s, help="Redis URL (CAIRN_REDIS_URL)")
    common.add_argument("--state-dir", default=s, help="state directory (CAIRN_STATE_DIR)")
    common.add_argument("--archive-dir", default=s, help="archive directory (CAIRN_ARCHIVE_DIR)")
    common.add_argument("--cache-dir", default=s, help="workspace cache (CAIRN_CACHE_DIR)")
    common.add_argument("--log-format", default=s, help="console or json (CAIRN_LOG_FORMAT)")
    common.add_argument("--log-level", default=s, help="log level (CAIRN_LOG_LEVEL)")
    common.add_argument("--metrics-port", default=s, help="metrics port (CAIRN_METRICS_PORT)")
    return common


def build_parser() -> Parser:
    """The `cairn` argument parser."""
    common = _common()
    parser = Parser(prog="cairn", description=DESCRIPTION, parents=[common])
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=Parser
    )

    def command(
        name: str, handler: Handler, doc: str, *, json: bool = True
    ) -> argparse.ArgumentParser:
        cmd = sub.add_parser(name, parents=[common], help=doc, description=doc)
        cmd.set_defaults(handler=handler)
        if json:
            cmd.add_argument("--json", action="store_true", help="print JSON for scripts")
        return cmd

    cmd = command("submit", cmd_submit, "submit a task spec (YAML or JSON)")
    cmd.add_argument("spec", help="the task spec file")
    cmd.add_argument("--wait", action="store_true", help="follow the task to its end")
    cmd.add_argument("--timeout", type=float, help="with --wait: give up after this many s")
    for name, handler, doc in (
        ("status", cmd_status, "a task's status and agents"),
        ("checkpoints", cmd_checkpoints, "a task's global checkpoints"),
        ("archive", cmd_archive, "archive every committed checkpoint not yet on disk"),
    ):
        command(name, handler, doc).add_argument("task")
    cmd = command("checkpoint", cmd_checkpoint, "one global checkpoint in detail")
    cmd.add_argument("task")
    cmd.add_argument("number", type=int)
    cmd = command("restore", cmd_restore, "restore every agent of a task to a checkpoint")
    cmd.add_argument("task")
    cmd.add_argument("--to", type=int, help="the checkpoint (default: the latest committed)")
    cmd.add_argument(
        "--on-workers",
        action="store_true",
        help="stage the agents on the workers (default: here, so no worker need be up)",
    )
    cmd = command("trace", cmd_trace, "what the agents did, step by step")
    cmd.add_argument("task")
    cmd.add_argument("--agent", help="only this agent")
    cmd.add_argument("--html", type=Path, help="write a self-contained HTML timeline here")
    cmd = command("watch", cmd_watch, "follow a task live until it ends (exit 0 if it succeeded)")
    cmd.add_argument("task")
    cmd = command("workspace", cmd_workspace, "write a checkpoint's files into a directory")
    cmd.add_argument("task")
    cmd.add_argument("--checkpoint", type=int, help="the checkpoint (default: the latest)")
    cmd.add_argument("--out", type=Path, required=True, help="a new or empty directory")
    for name, doc in (
        ("approve", "let an agent make a tool call"),
        ("reject", "refuse an agent's tool call"),
    ):
        cmd = command(name, cmd_decide, doc)
        cmd.add_argument("task")
        cmd.add_argument("agent")
        cmd.add_argument("call", nargs="?", help="the call's id (default: the one waiting)")
        cmd.add_argument("--reason", required=name == "reject", help="what the model reads")
    for name, doc in (
        ("pause", "start no more supersteps"),
        ("resume", "start them again"),
        ("cancel", "end the task now"),
    ):
        command(name, cmd_lifecycle, doc).add_argument("task")
    cmd = command("worker", cmd_worker, "run worker processes", json=False)
    cmd.add_argument("--count", type=_positive, default=1, help="how many (default 1)")
    cmd = command("coordinator", cmd_coordinator, "run a coordinator", json=False)
    cmd.add_argument("--name", default=f"{socket.gethostname()}-{os.getpid()}")
    cmd.add_argument("--lease-ms", type=_positive, default=5_000, help=argparse.SUPPRESS)
    cmd = command("demo", cmd_demo, "a team fixes a bug through a crash and a rollback", json=False)
    cmd.add_argument("--model", help="openai:<name>: the same team on a real model")
    cmd.add_argument("--base-url", help="with --model: an OpenAI-compatible endpoint")
    cmd = command("up", cmd_up, "run Redis, a coordinator and workers here", json=False)
    cmd.add_argument("--workers", type=_positive, default=2, help="how many (default 2)")
    return parser


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


# running a command ----------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    """Run `cairn` with `argv` (default: the process's arguments); return the exit code."""
    try:
        args = build_parser().parse_args(argv)
    except UsageError as exc:
        say(str(exc))
        return BAD_INPUT
    except SystemExit as exc:  # --help printed its text
        return exc.code if isinstance(exc.code, int) else OK
    try:
        return _run(args)
    except KeyboardInterrupt:
        say("interrupted")
        return FAILED
    except BrokenPipeError:  # `cairn ... | head`: the reader left
        sys.stderr.close()
        return FAILED


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
    except (InvalidSpec, InvalidName, RedisServerError, ValidationError) as exc:
        say(_one_line(exc))
        return BAD_INPUT
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        say(_one_line(exc) if str(exc) else "Redis did not answer")
        return BAD_INPUT
    except (CairnError, redis.RedisError, OSError, TimeoutError) as exc:
        say(_one_line(exc))
        return FAILED
    except Exception as exc:  # noqa: BLE001 - a bug: still one line, the traceback on demand
        if session is not None and session.settings.log_level == "debug":
            traceback.print_exc()
        say(f"unexpected {type(exc).__name__}: {_one_line(exc)} (--log-level debug shows where)")
        return FAILED
    finally:
        if session is not None:
            session.close()


def settings_from(args: argparse.Namespace) -> Settings:
    """The settings: the environment, overridden by the flags given."""
    names = (
        "redis_url",
        "state_dir",
        "archive_dir",
        "cache_dir",
        "log_format",
        "log_level",
        "metrics_port",
    )
    return load_settings(**{name: getattr(args, name, None) for name in names})


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


if __name__ == "__main__":
    sys.exit(main())
