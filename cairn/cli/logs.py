"""`cairn logs TASK`: the task's log lines from every worker and coordinator, in time order.

Read from Redis (`Task.logs`), so the processes may run on other hosts. One line per
event: time, process, agent, level, message, key fields; a traceback only with
`--verbose`. `--follow` prints lines as they arrive until the task ends (or Ctrl-C).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import TYPE_CHECKING

from cairn.cli import render
from cairn.cli.exits import Exit
from cairn.coordinator.tasklogs import LogLine

if TYPE_CHECKING:
    from rich.console import Console

    from cairn.cli.commands import Session

FOLLOW_WAIT = 1.0  # seconds one read of `--follow` waits for a line, between looks at the task
TRAILING_WAIT = 1.0  # seconds `--follow` reads on once the task ended: lines still being shipped


def add_parser(cmd: argparse.ArgumentParser) -> None:
    """The arguments of `cairn logs`."""
    cmd.add_argument("task")
    cmd.add_argument("--agent", help="only this agent's lines")
    cmd.add_argument("--follow", "-f", action="store_true", help="print lines until the task ends")
    cmd.add_argument("--verbose", "-v", action="store_true", help="print tracebacks too")


def logs(args: argparse.Namespace, session: Session) -> int:
    """Print the task's log lines; with --follow, until it ends (Ctrl-C stops, exit 0)."""
    task, console = session.task(args.task), session.console
    try:
        cursor = _print(args, console, task.logs()) or "0-0"
        if not args.follow:
            return Exit.OK
        while not task.status().ended:
            cursor = _print(args, console, task.logs(after=cursor, wait=FOLLOW_WAIT)) or cursor
        deadline = time.monotonic() + TRAILING_WAIT
        while time.monotonic() < deadline:
            lines = task.logs(after=cursor, wait=max(0.0, deadline - time.monotonic()))
            cursor = _print(args, console, lines) or cursor
    except KeyboardInterrupt:  # the person is done reading: not a failure
        return Exit.OK
    return Exit.OK


def _print(args: argparse.Namespace, console: Console, lines: list[LogLine]) -> str | None:
    """Print the lines `args.agent` asks for; return the id to read after (None: no lines)."""
    for line in lines:
        if args.agent is not None and line.agent != args.agent:
            continue
        if args.json:
            shown = line.to_json()
            if not args.verbose:
                shown.pop("exception", None)
            render.emit_line(shown)
            continue
        console.print(format_line(line), markup=False, highlight=False, soft_wrap=True)
        if args.verbose and line.exception:
            console.print(line.exception.rstrip(), markup=False, highlight=False, soft_wrap=True)
    return lines[-1].id if lines else None


def format_line(line: LogLine) -> str:
    """One line: `time process agent level message key=value ...` (`-` for no agent)."""
    fields = " ".join(f"{name}={_value(value)}" for name, value in line.fields.items())
    at = line.at.isoformat(timespec="milliseconds")
    head = f"{at} {line.process} {line.agent or '-'} {line.level.upper()} {line.message}"
    return f"{head} {fields}" if fields else head


def _value(value: object) -> str:
    """A key field's value, kept on the line: strings quoted when they hold a space."""
    text = value if isinstance(value, str) else json.dumps(value)
    text = " ".join(text.split())
    return json.dumps(text) if " " in text or not text else text
