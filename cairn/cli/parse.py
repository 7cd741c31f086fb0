"""The `cairn` argument parser: global options once, then one subcommand and its own."""

from __future__ import annotations

import argparse
import os
import socket
from importlib.metadata import version
from pathlib import Path
from typing import NoReturn

from cairn.cli import commands
from cairn.cli import logs as task_logs
from cairn.cli.exits import EPILOG
from cairn.coordinator.settings import LOG_FORMATS, LOG_LEVELS

DESCRIPTION = "Crash-safe checkpoints for teams of LLM agents."
GLOBAL_OPTIONS = (
    "redis_url",
    "state_dir",
    "archive_dir",
    "cache_dir",
    "log_format",
    "log_level",
    "metrics_port",
)


class UsageError(Exception):
    """Raised by the parser instead of printing usage and exiting: main says it in one line."""


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, through `main`."""

    def error(self, message: str) -> NoReturn:
        """Raise `UsageError` (argparse would print the whole usage, then exit)."""
        command = self.prog.removeprefix("cairn").strip()
        raise UsageError(f"{command}: {message}" if command else message)


def _global_options(*, shown: bool) -> Parser:
    """Options every command takes, before or after its name (no defaults: env decides).

    Shown once, in `cairn --help`; a subcommand accepts them too, without listing them.
    """
    options = Parser(add_help=False)
    s = argparse.SUPPRESS

    def text(help_text: str) -> str:
        return help_text if shown else s

    options.add_argument("--redis-url", default=s, help=text("Redis URL (CAIRN_REDIS_URL)"))
    options.add_argument("--state-dir", default=s, help=text("state directory (CAIRN_STATE_DIR)"))
    options.add_argument(
        "--archive-dir", default=s, help=text("archive directory (CAIRN_ARCHIVE_DIR)")
    )
    options.add_argument("--cache-dir", default=s, help=text("workspace cache (CAIRN_CACHE_DIR)"))
    options.add_argument(
        "--log-format",
        default=s,
        type=str.lower,
        choices=LOG_FORMATS,
        help=text("console or json (CAIRN_LOG_FORMAT)"),
    )
    options.add_argument(
        "--log-level",
        default=s,
        type=str.lower,
        choices=LOG_LEVELS,
        help=text("log level (CAIRN_LOG_LEVEL)"),
    )
    options.add_argument(
        "--metrics-port", default=s, help=text("metrics port (CAIRN_METRICS_PORT)")
    )
    return options


def _export_options(cmd: argparse.ArgumentParser) -> None:
    """The arguments of `cairn workspace`."""
    cmd.add_argument("task")
    cmd.add_argument("--checkpoint", type=int, help="the checkpoint (default: the latest)")
    cmd.add_argument("--out", type=Path, required=True, help="a new or empty directory")
    cmd.add_argument(
        "--include-git",
        action="store_true",
        help="write .git and bare repositories' HEAD too (git runs what their config names)",
    )


def build_parser() -> Parser:
    """The `cairn` argument parser."""
    hidden = _global_options(shown=False)
    parser = Parser(
        prog="cairn",
        description=DESCRIPTION,
        epilog=EPILOG,
        parents=[_global_options(shown=True)],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"cairn {version('cairn-agents')}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)

    def command(
        name: str, handler: commands.Handler, doc: str, *, json: bool = True
    ) -> argparse.ArgumentParser:
        cmd = sub.add_parser(name, parents=[hidden], help=doc, description=doc)
        cmd.set_defaults(handler=handler)
        if json:
            cmd.add_argument("--json", action="store_true", help="print JSON for scripts")
        return cmd

    cmd = command("submit", commands.submit, "submit a task spec (YAML or JSON)")
    cmd.add_argument("spec", help="the task spec file")
    cmd.add_argument("--wait", action="store_true", help="follow the task to its end")
    cmd.add_argument(
        "--timeout", type=float, help="with --wait: give up after this many s (exit 4)"
    )
    command("list", commands.list_tasks, "every task Redis knows, newest first")
    for name, handler, doc in (
        ("status", commands.status, "a task's status and agents"),
        ("checkpoints", commands.checkpoints, "a task's global checkpoints"),
        ("archive", commands.archive, "archive every committed checkpoint not yet on disk"),
        ("forget", commands.forget, "remove an ended task from Redis (its archive stays)"),
    ):
        command(name, handler, doc).add_argument("task")
    cmd = command("result", commands.result, "a task's result, as its finishing agent gave it")
    cmd.add_argument("task")
    cmd.add_argument("--checkpoint", type=int, help="the checkpoint (default: the latest)")
    cmd = command("checkpoint", commands.checkpoint, "one global checkpoint in detail")
    cmd.add_argument("task")
    cmd.add_argument("number", type=int)
    cmd = command("restore", commands.restore, "restore every agent of a task to a checkpoint")
    cmd.add_argument("task")
    cmd.add_argument("--to", type=int, help="the checkpoint (default: the latest committed)")
    cmd.add_argument(
        "--on-workers",
        action="store_true",
        help="stage the agents on the workers (default: here, so no worker need be up)",
    )
    _lineage_options(
        command("fork", commands.fork, "start a new task from a checkpoint of another"),
        command("diff", commands.diff, "compare two checkpoints: TASK A B, or TASK@A OTHER@B"),
        command("budget", commands.budget, "set a task's budget (then `resume` a paused task)"),
    )
    _trace_options(command("trace", commands.trace, "what the agents did, step by step"))
    task_logs.add_parser(
        command("logs", task_logs.logs, "a task's log lines from every process, in time order")
    )
    command(
        "watch", commands.watch, "follow a task live until it ends (exit 0 if it succeeded)"
    ).add_argument("task")
    _export_options(
        command("workspace", commands.workspace, "write a checkpoint's files into a directory")
    )
    for name, doc in (
        ("approve", "let an agent make a tool call"),
        ("reject", "refuse an agent's tool call"),
    ):
        cmd = command(name, commands.decide, doc)
        cmd.add_argument("task")
        cmd.add_argument("agent")
        cmd.add_argument("call", nargs="?", help="the call's id (default: the one waiting)")
        cmd.add_argument("--reason", required=name == "reject", help="what the model reads")
    for name, doc in (
        ("pause", "start no more supersteps"),
        ("resume", "start them again"),
        ("cancel", "end the task now"),
    ):
        command(name, commands.lifecycle, doc).add_argument("task")
    _worker_options(command("worker", commands.worker, "run worker processes", json=False))
    cmd = command("coordinator", commands.coordinator, "run a coordinator", json=False)
    cmd.add_argument("--name", default=f"{socket.gethostname()}-{os.getpid()}")
    cmd.add_argument("--lease-ms", type=_positive, default=5_000, help=argparse.SUPPRESS)
    cmd = command(
        "demo", commands.demo, "a team fixes a bug through a crash and a rollback", json=False
    )
    cmd.add_argument("--model", help="openai:<name>: the same team on a real model")
    cmd.add_argument("--base-url", help="with --model: an OpenAI-compatible endpoint")
    _people_options(
        command("approvals", commands.approvals, "tool calls waiting for a person"),
        command("console", commands.console, "serve the web console", json=False),
    )
    _up_options(command("up", commands.up, "run Redis, a coordinator and workers here", json=False))
    cmd = command("down", commands.down, "stop the `cairn up` of this directory", json=False)
    cmd.add_argument("--dir", type=Path, help="the directory `cairn up` runs in (default: here)")
    return parser


def _trace_options(trace: argparse.ArgumentParser) -> None:
    """What `cairn trace` shows: one agent's calls, or an HTML timeline of all of them."""
    trace.add_argument("task")
    trace.add_argument("--agent", help="only this agent")
    trace.add_argument("--html", type=Path, help="write a self-contained HTML timeline here")


def _lineage_options(
    fork: argparse.ArgumentParser, diff: argparse.ArgumentParser, budget: argparse.ArgumentParser
) -> None:
    """What forks, compares and bounds a task's spend, across its restores and forks."""
    fork.add_argument("task")
    fork.add_argument("--at", type=int, help="the checkpoint (default: the latest committed)")
    fork.add_argument(
        "--spec", type=Path, help="a spec of the same agents: other models, prompts, limits"
    )
    diff.add_argument("sides", nargs="+", metavar="TASK[@A] ...")
    budget.add_argument("task")
    budget.add_argument("--tokens", type=int, help="prompt + completion tokens")
    budget.add_argument("--cost-usd", type=float, help="US dollars, at the task's prices")
    budget.add_argument("--agent", help="a member: the budget of it and the members it spawned")
    budget.add_argument("--steps", type=int, help="steps (a member's budget only)")


def _people_options(approvals: argparse.ArgumentParser, console: argparse.ArgumentParser) -> None:
    """What shows people the approval queue, and the console they steer tasks from."""
    approvals.add_argument("task", nargs="?", help="only this task's (default: every task's)")
    console.add_argument("--host", help="the address to listen on (CAIRN_CONSOLE_HOST, 127.0.0.1)")
    console.add_argument("--port", type=_port, help="the port (CAIRN_CONSOLE_PORT, 8737)")


def _worker_options(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("--count", type=_positive, default=1, help="how many (default 1)")
    _concurrency_option(cmd)
    _tools_option(cmd)
    cmd.add_argument(
        "--mcp-config",
        metavar="FILE",
        help="MCP servers, an mcpServers JSON file (CAIRN_MCP_CONFIG)",
    )


def _up_options(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("--workers", type=_positive, default=2, help="how many (default 2)")
    _concurrency_option(cmd)
    _tools_option(cmd)


def _tools_option(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument(
        "--tools",
        action="append",
        metavar="MODULE",
        help="a module of Python tools and agents to load (repeatable; CAIRN_TOOLS, "
        "comma-separated)",
    )


def _concurrency_option(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument(
        "--concurrency",
        type=_positive,
        metavar="N",
        help="steps each worker process runs at once (CAIRN_WORKER_CONCURRENCY, default 1)",
    )


def _port(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 65_535:  # noqa: PLR2004 - the port numbers TCP has
        raise argparse.ArgumentTypeError(f"must be a port number (1-65535), not {value}")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value
