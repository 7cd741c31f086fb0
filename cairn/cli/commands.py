"""The `cairn` commands, each a thin layer over what the packages already do.

The coordinator's API, the restorer, the archive, the views in `cli_views` and the
processes in `cli_processes`; each prints tables for people or `--json` for scripts.

A handler returns the exit code; an error it raises is turned into one line and an exit
code by `coordinator.cli.main`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from rich.console import Console
from rich.live import Live

from coordinator import cli_render as render
from coordinator import cli_views as views
from coordinator.cli_context import Context, Session
from coordinator.cli_processes import run_coordinator, run_up, run_workers
from coordinator.coordinator import TERMINAL, Coordinator
from coordinator.demo import run_demo
from coordinator.restore import RestoreFailed, Restorer
from coordinator.spec import load_spec
from coordinator.timeline import gather, live_view, watch_line
from coordinator.timeline_page import render as render_timeline
from storage import keys
from storage.archive import archive_gc
from storage.errors import CairnError, InvalidSpec
from storage.records import GCStatus

T = TypeVar("T")
OK, FAILED, BAD_INPUT = 0, 1, 2  # success; the operation or task failed; bad input
WAIT_POLL = 0.2  # seconds between looks at a task `submit --wait` follows
WATCH_POLL = 0.5  # seconds between refreshes of `cairn watch`

Handler = Callable[[argparse.Namespace, Session], int]


def _coordinator(ctx: Context) -> Coordinator:
    """A coordinator object for the API calls (submit, status, pause...); it does not lead."""
    return Coordinator(ctx.client, ctx.store, ctx.settings.cache / "cli")


def _task(ctx: Context, task: str) -> str:
    views.require_task(ctx.client, ctx.store, task)
    return task


def cmd_submit(args: argparse.Namespace, session: Session) -> int:
    """Store a task and queue it; with --wait, follow it to its end."""
    spec = load_spec(args.spec)  # before Redis: a bad spec is reported wherever one runs it
    ctx, console = session.ctx, session.console
    coordinator = _coordinator(ctx)
    task = coordinator.submit(spec, Path(args.spec).parent)
    if ctx.client.get(keys.LEASE) is None:
        render.say(
            "no coordinator is running: the task waits for `cairn coordinator` or `cairn up`"
        )
    if not args.wait:
        if args.json:
            render.emit_json({"task_id": task})
        else:
            console.print(f"submitted [bold]{task}[/]")
        return OK
    status = _follow(coordinator, task, args.timeout, console, quiet=args.json)
    if args.json:
        render.emit_json(status)
    else:
        render.show_status(console, status)
    if status["status"] == "succeeded":
        return OK
    render.say(f"task {task} {status['status']}: {status.get('reason') or 'no reason given'}")
    return FAILED


def _follow(
    coordinator: Coordinator, task: str, timeout: float | None, console: Console, *, quiet: bool
) -> dict[str, object]:
    """Poll the task's status until it ends (or `timeout` passes); return the last one."""
    deadline = None if timeout is None else time.monotonic() + timeout
    shown = None
    with (
        console.status(f"{task}: submitted")
        if console.is_terminal and not quiet
        else contextlib.nullcontext()
    ):
        while True:
            status = _status(coordinator, task)
            line = f"{task}: {status['status']}, superstep {status['superstep']}"
            if status["status"] == "waiting_approval":
                line += f" (decide with `cairn approve|reject {task} AGENT`)"
            if line != shown and console.is_terminal and not quiet:
                console.log(line)
                shown = line
            if status["status"] in TERMINAL:
                return status
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"task {task} is still {status['status']} after {timeout:g} s")
            time.sleep(WAIT_POLL)


def _status(coordinator: Coordinator, task: str) -> dict[str, object]:
    """The coordinator's status of the task; without the steps when a member LC is unreadable.

    A task that became unrecoverable may have lost its checkpoints: its status still shows.
    """
    try:
        return coordinator.status(task)
    except CairnError as exc:
        return views.status_without_steps(coordinator.redis, coordinator.store, task, str(exc))


def cmd_status(args: argparse.Namespace, session: Session) -> int:
    """The task's status and its agents."""
    ctx, console = session.ctx, session.console
    status = _status(_coordinator(ctx), _task(ctx, args.task))
    return _show(args, console, status, render.show_status)


def _show(
    args: argparse.Namespace, console: Console, data: T, table: Callable[[Console, T], None]
) -> int:
    """Print `data` as JSON with `--json`, else as `table` draws it for people."""
    if args.json:
        render.emit_json(data)
    else:
        table(console, data)
    return OK


def cmd_checkpoints(args: argparse.Namespace, session: Session) -> int:
    """Every global checkpoint of the task."""
    ctx, console = session.ctx, session.console
    rows = views.checkpoints(ctx.store, _task(ctx, args.task))
    return _show(args, console, rows, render.show_checkpoints)


def cmd_checkpoint(args: argparse.Namespace, session: Session) -> int:
    """One global checkpoint in detail."""
    ctx, console = session.ctx, session.console
    detail = views.checkpoint(ctx.store, _task(ctx, args.task), args.number)
    return _show(args, console, detail, render.show_checkpoint)


def cmd_trace(args: argparse.Namespace, session: Session) -> int:
    """The trace records of the latest checkpoint's agents, in order."""
    ctx, console = session.ctx, session.console
    if args.html is not None:
        page = render_timeline(gather(ctx.client, ctx.store, args.task))
        args.html.write_text(page, encoding="utf-8")
        if args.json:
            render.emit_json({"task_id": args.task, "html": str(args.html)})
        else:
            console.print(f"wrote the timeline of {args.task} to {args.html}")
        return OK
    rows = views.trace(ctx.store, _task(ctx, args.task), args.agent)
    return _show(args, console, rows, render.show_trace)


def cmd_watch(args: argparse.Namespace, session: Session) -> int:
    """Follow a task until it ends: a live view, or one JSON line per change."""
    ctx, console = session.ctx, session.console
    coordinator = _coordinator(ctx)
    task = _task(ctx, args.task)
    live = console.is_terminal and not args.json
    shown: dict[str, object] | None = None
    with Live(console=console, auto_refresh=False) if live else contextlib.nullcontext() as view:
        while True:
            status = _status(coordinator, task)
            line = watch_line(status)
            if line != shown:
                if isinstance(view, Live):
                    view.update(live_view(status), refresh=True)
                else:
                    sys.stdout.write(json.dumps(line, default=str) + "\n")
                    sys.stdout.flush()
                shown = line
            if status["status"] in TERMINAL:
                break
            time.sleep(WATCH_POLL)
    if status["status"] == "succeeded":
        return OK
    render.say(f"task {task} {status['status']}: {status.get('reason') or 'no reason given'}")
    return FAILED


def cmd_workspace(args: argparse.Namespace, session: Session) -> int:
    """Write the files of the latest (or one) checkpoint into a directory."""
    ctx, console = session.ctx, session.console
    done = views.export_workspace(ctx.store, _task(ctx, args.task), args.checkpoint, args.out)
    if args.json:
        render.emit_json(done)
    else:
        files = done["files"]
        assert isinstance(files, list)
        console.print(
            f"wrote {len(files)} file(s) of checkpoint {done['checkpoint']} to {args.out}"
        )
    return OK


def cmd_restore(args: argparse.Namespace, session: Session) -> int:
    """Put every agent back to a committed checkpoint, or none of them."""
    ctx, console = session.ctx, session.console
    task = _task(ctx, args.task)
    if args.to is not None:
        views.checkpoint_at(ctx.store, task, args.to)  # an unknown number is bad input
    restorer = Restorer(ctx.client, ctx.store, workers=args.on_workers)
    busy = console.is_terminal and not args.json
    with console.status(f"restoring {task}…") if busy else contextlib.nullcontext():
        try:
            restored = restorer.restore(task, args.to)
        except RestoreFailed as exc:
            render.say(str(exc))
            return FAILED
    if args.json:
        render.emit_json(
            {
                "restored_to": restored.restored_to,
                "epoch": restored.epoch,
                "checkpoint": restored.number,
            }
        )
    else:
        console.print(
            f"{task} restored to checkpoint {restored.restored_to} "
            f"(recorded as checkpoint {restored.number}, epoch {restored.epoch})"
        )
    return OK


def cmd_decide(args: argparse.Namespace, session: Session) -> int:
    """Approve or reject an agent's tool call that waits for a person."""
    ctx, console = session.ctx, session.console
    approved = args.command == "approve"
    decision = views.record_decision(
        ctx.store,
        _task(ctx, args.task),
        args.agent,
        args.call,
        approved=approved,
        reason=args.reason or "",
    )
    if args.json:
        render.emit_json(decision)
    else:
        verb = "approved" if approved else "rejected"
        console.print(f"{verb} {decision['tool']} ({decision['call']}) of {args.agent}")
    return OK


def cmd_lifecycle(args: argparse.Namespace, session: Session) -> int:
    """Pause, resume or cancel a task."""
    ctx, console = session.ctx, session.console
    task = _task(ctx, args.task)
    coordinator = _coordinator(ctx)
    current = _status(coordinator, task)["status"]
    if args.command == "cancel" and current in TERMINAL:
        raise InvalidSpec(f"task {task} is {current} already")
    {"pause": coordinator.pause, "resume": coordinator.resume, "cancel": coordinator.cancel}[
        args.command
    ](task)
    status = _status(coordinator, task)["status"]
    if args.json:
        render.emit_json({"task_id": task, "status": status})
    else:
        console.print(f"{task}: {render.styled(status)}")
    return OK


def cmd_archive(args: argparse.Namespace, session: Session) -> int:
    """Archive every committed GC still only in Redis, oldest first."""
    ctx, console = session.ctx, session.console
    task = _task(ctx, args.task)
    on_disk = set(ctx.store.cold.list_gcs(task))
    due = [
        info.number
        for info in ctx.store.hot.list_gcs(task)
        if info.status is GCStatus.COMMITTED and info.number not in on_disk
    ]
    reports = []
    busy = console.is_terminal and not args.json
    with (
        console.status(f"archiving {len(due)} checkpoint(s)…") if busy else contextlib.nullcontext()
    ):
        for number in due:
            report = archive_gc(ctx.store, task, number)
            reports.append(
                {"number": number, "lcs": report.lcs, "blobs": report.blobs, "bytes": report.bytes}
            )
    if args.json:
        render.emit_json(reports)
    else:
        render.show_archived(console, reports)
    return OK


def cmd_worker(args: argparse.Namespace, session: Session) -> int:
    """Run worker processes in the foreground."""
    ctx = session.ctx
    return run_workers(ctx.settings, ctx.url, args.count, session.console)


def cmd_coordinator(args: argparse.Namespace, session: Session) -> int:
    """Run a coordinator in the foreground (a standby while another leads)."""
    ctx = session.ctx
    return run_coordinator(ctx.settings, ctx.url, args.name, args.lease_ms)


def cmd_demo(args: argparse.Namespace, session: Session) -> int:
    """Run the demo: on the configured Redis, or a private one in the state directory."""
    settings = session.settings
    return run_demo(
        settings.state_dir / "demo",
        say=print,
        model=args.model,
        url=settings.redis_url,
        base_url=args.base_url,
    )


def cmd_up(args: argparse.Namespace, session: Session) -> int:
    """Run Redis (a private one unless configured), a coordinator and workers here."""
    return run_up(session.settings, args.workers, session.console)
