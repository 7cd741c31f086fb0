"""The `cairn` commands: each calls `cairn.Client` (or runs processes) and renders the result.

A handler returns the exit code; an error it raises is turned into one line and an exit
code by `cairn.cli.app.main`. `--json` prints the models' JSON, tables otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.live import Live

from cairn.agents.accounting import Budget, MemberBudget
from cairn.agents.mcp.config import load_mcp_config
from cairn.agents.toolkit import load_tools
from cairn.cli import render
from cairn.cli.demo import run_demo
from cairn.cli.exits import Exit
from cairn.cli.processes import run_coordinator, run_workers
from cairn.cli.timeline_page import render as render_timeline
from cairn.cli.up import run_down, run_up
from cairn.client import Client, Task
from cairn.console.launch import run_console  # Starlette and uvicorn only once it serves
from cairn.coordinator.runs import TaskState
from cairn.coordinator.settings import Settings
from cairn.coordinator.spec import load_spec
from cairn.coordinator.views import TaskStatus
from cairn.errors import InvalidSpec, Unavailable

if TYPE_CHECKING:
    from cairn.agents.live import LiveReply

WATCH_POLL = 0.5  # seconds between refreshes of `cairn watch`


@dataclass(slots=True)
class Session:
    """One run of a command: its settings, its console, and a `Client` opened on first use."""

    settings: Settings
    console: Console
    _client: Client | None = None

    @property
    def client(self) -> Client:
        """The client (Redis pinged once, when first asked for)."""
        if self._client is None:
            self._client = Client(settings=self.settings)
        return self._client

    def task(self, task_id: str) -> Task:
        """The handle of a task Cairn knows (`TaskNotFound` otherwise)."""
        return self.client.task(task_id)

    def close(self) -> None:
        """Close the client, if one was opened."""
        if self._client is not None:
            self._client.close()


Handler = Callable[[argparse.Namespace, Session], int]


def _show(args: argparse.Namespace, console: Console, data: Any, table: Callable[..., None]) -> int:  # noqa: ANN401 - a model or JSON
    """Print `data` as JSON with `--json`, else as `table` draws it for people."""
    if args.json:
        render.emit_json(data)
    else:
        table(console, data)
    return Exit.OK


def _ended(task: str, status: TaskStatus) -> int:
    """Exit 0 for a task that succeeded, else say how it ended and exit 1."""
    if status.state is TaskState.SUCCEEDED:
        return Exit.OK
    render.say(f"task {task} {status.state.value}: {status.reason or 'no reason given'}")
    return Exit.FAILED


def submit(args: argparse.Namespace, session: Session) -> int:
    """Store a task and queue it; with --wait, follow it to its end."""
    spec = load_spec(args.spec)  # before Redis: a bad spec is reported wherever one runs it
    console = session.console
    task = session.client.submit(spec, base=Path(args.spec).parent)
    if not session.client.has_coordinator():
        render.say(
            "no coordinator is running: the task waits for `cairn coordinator` or `cairn up`"
        )
    if not args.wait:
        if args.json:
            render.emit_json({"task_id": task.id})
        else:
            render.emit_text(task.id)  # the id alone: `T=$(cairn submit SPEC)` holds it
        return Exit.OK
    shown: list[str] = []
    follow = console.is_terminal and not args.json

    def progress(status: TaskStatus) -> None:
        line = f"{task.id}: {status.state.value}, {render.describe_progress(status)}"
        if status.state is TaskState.WAITING_APPROVAL:
            line += f" (decide with `cairn approve|reject {task.id} AGENT`)"
        if follow and shown[-1:] != [line]:
            console.log(line)
            shown.append(line)

    with console.status(f"{task.id}: submitted") if follow else contextlib.nullcontext():
        status = task.wait(args.timeout, on_status=progress)
    _show(args, console, status, render.show_status)
    return _ended(task.id, status)


def list_tasks(args: argparse.Namespace, session: Session) -> int:
    """Every task Redis knows, newest first."""
    return _show(args, session.console, session.client.tasks(), render.show_tasks)


def status(args: argparse.Namespace, session: Session) -> int:
    """The task's status and its agents."""
    return _show(args, session.console, session.task(args.task).status(), render.show_status)


def result(args: argparse.Namespace, session: Session) -> int:
    """The task's result: its value as JSON (`--json`: that alone, for scripts)."""
    found = session.task(args.task).result(checkpoint=args.checkpoint)
    if args.json:
        render.emit_json(found)
    else:
        render.show_result(session.console, found)
    return Exit.OK


def checkpoints(args: argparse.Namespace, session: Session) -> int:
    """Every global checkpoint of the task."""
    rows = session.task(args.task).checkpoints()
    return _show(args, session.console, rows, render.show_checkpoints)


def checkpoint(args: argparse.Namespace, session: Session) -> int:
    """One global checkpoint in detail."""
    detail = session.task(args.task).checkpoint(args.number)
    return _show(args, session.console, detail, render.show_checkpoint)


def trace(args: argparse.Namespace, session: Session) -> int:
    """The trace records of the latest checkpoint's agents, in order (or the HTML timeline)."""
    task, console = session.task(args.task), session.console
    if args.html is not None:
        args.html.write_text(render_timeline(task.timeline()), encoding="utf-8")
        if args.json:
            render.emit_json({"task_id": task.id, "html": str(args.html)})
        else:
            console.print(f"wrote the timeline of {task.id} to {args.html}")
        return Exit.OK
    if args.json:
        render.emit_json(task.trace(args.agent))
        return Exit.OK
    render.show_trace(console, render.plain(task.trace(args.agent)))
    failures = task.failures(args.agent)
    if failures:  # a step that keeps failing shows here before its task fails
        console.print("failed attempts, retries and rollbacks (newest last):")
        render.show_failures(console, render.plain(failures))
    return Exit.OK


def watch(args: argparse.Namespace, session: Session) -> int:
    """Follow a task until it ends: a live view, or one JSON line per change."""
    task, console = session.task(args.task), session.console
    live = console.is_terminal and not args.json
    shown: dict[str, object] | None = None
    with Live(console=console, auto_refresh=False) if live else contextlib.nullcontext() as view:

        def show(now: TaskStatus) -> None:
            nonlocal shown
            live = _live_replies(task, now)
            line = render.watch_line(now, live)
            if line != shown:
                if isinstance(view, Live):
                    view.update(render.live_view(now, live), refresh=True)
                else:
                    render.emit_line(line)
                shown = line

        final = task.wait(poll=WATCH_POLL, on_status=show)  # waits out a Redis failover too
    return _ended(task.id, final)


def _live_replies(task: Task, status: TaskStatus) -> dict[str, LiveReply]:
    """The replies `status`'s agents are streaming; none once the task ended or Redis is away.

    A Redis that stops answering is `wait`'s to wait out, at its next read of the status.
    """
    if status.ended:
        return {}
    try:
        return task.live_replies([agent.name for agent in status.agents])
    except Unavailable:
        return {}


def workspace(args: argparse.Namespace, session: Session) -> int:
    """Write the files of the latest (or one) checkpoint into a directory."""
    done = session.task(args.task).export(args.out, args.checkpoint, include_git=args.include_git)
    if args.json:
        render.emit_json(done)
    else:
        left = len(done.left_out)
        unsaid = f"; left out {left} file(s) of git repositories (--include-git)" if left else ""
        session.console.print(
            f"wrote {len(done.files)} file(s) of checkpoint {done.checkpoint} to {args.out}{unsaid}"
        )
    return Exit.OK


def restore(args: argparse.Namespace, session: Session) -> int:
    """Put every agent back to a committed checkpoint, or none of them."""
    task, console = session.task(args.task), session.console
    busy = console.is_terminal and not args.json
    with console.status(f"restoring {task.id}…") if busy else contextlib.nullcontext():
        restored = task.restore(args.to, on_workers=args.on_workers)
    if args.json:
        render.emit_json(restored)
    else:
        console.print(
            f"{task.id} restored to checkpoint {restored.restored_to} "
            f"(recorded as checkpoint {restored.checkpoint}, epoch {restored.epoch})"
        )
    return Exit.OK


def fork(args: argparse.Namespace, session: Session) -> int:
    """Start a new task from a checkpoint of another; the source is untouched."""
    new = session.task(args.task).fork(args.at, args.spec)
    lineage = new.status().forked_from
    if args.json:
        render.emit_json({"task_id": new.id, "forked_from": lineage})
    else:
        at = "?" if lineage is None else lineage.checkpoint
        session.console.print(f"{new.id} forked from {args.task} at checkpoint {at}")
    return Exit.OK


def diff(args: argparse.Namespace, session: Session) -> int:
    """Compare two checkpoints: of one task (TASK A B), or across tasks (TASK@A OTHER@B)."""
    (task_a, a), (task_b, b) = diff_sides(args.sides)
    found = session.task(task_a).diff(a, b, other=session.task(task_b))
    return _show(args, session.console, found, render.show_diff)


def diff_sides(sides: list[str]) -> tuple[tuple[str, int], tuple[str, int]]:
    """`TASK A B` or `TASK@A OTHER@B` as ((task, checkpoint), (task, checkpoint))."""
    match sides:
        case [task, a, b] if "@" not in task:
            return (task, _number(a)), (task, _number(b))
        case [first, second] if first.count("@") == second.count("@") == 1:
            (task_a, a), (task_b, b) = first.split("@"), second.split("@")
            return (task_a, _number(a)), (task_b, _number(b))
    raise InvalidSpec("diff takes TASK A B or TASK@A OTHER@B (A and B: checkpoint numbers)")


def _number(text: str) -> int:
    if not text.isdigit():
        raise InvalidSpec(f"diff: {text!r} is not a checkpoint number")
    return int(text)


def approvals(args: argparse.Namespace, session: Session) -> int:
    """The tool calls waiting for a person: of one task, or of every task not ended."""
    waiting = session.task(args.task).approvals() if args.task else session.client.approvals()
    return _show(args, session.console, waiting, render.show_approvals)


def decide(args: argparse.Namespace, session: Session) -> int:
    """Approve or reject an agent's tool call that waits for a person."""
    task = session.task(args.task)
    if args.command == "approve":
        decision = task.approve(args.agent, args.call)
    else:
        decision = task.reject(args.agent, args.call, reason=args.reason)
    if args.json:
        render.emit_json(decision)
    else:
        verb = "approved" if decision.approved else "rejected"
        session.console.print(f"{verb} {decision.tool} ({decision.call}) of {args.agent}")
    return Exit.OK


def lifecycle(args: argparse.Namespace, session: Session) -> int:
    """Pause, resume or cancel a task."""
    task = session.task(args.task)
    if args.command == "cancel" and (current := task.status()).ended:
        raise InvalidSpec(f"task {task.id} is {current.state.value} already")
    after = {"pause": task.pause, "resume": task.resume, "cancel": task.cancel}[args.command]()
    if args.json:
        render.emit_json({"task_id": task.id, "status": after.state})
    else:
        session.console.print(f"{task.id}: {render.styled(after.state.value)}")
    return Exit.OK


def budget(args: argparse.Namespace, session: Session) -> int:
    """Set a task's budget (tokens, US dollars); a task paused for it goes on once resumed."""
    task = session.task(args.task)
    if args.agent is None and args.steps is not None:
        raise InvalidSpec("--steps is a member's budget: name the member with --agent")
    limit: Budget | MemberBudget
    if args.agent is None:
        limit = task.budget(tokens=args.tokens, cost_usd=args.cost_usd)
    else:
        limit = task.member_budget(args.agent, tokens=args.tokens, cost_usd=args.cost_usd,
                                   steps=args.steps)  # fmt: skip
    if args.json:
        shown = {"task_id": task.id, "budget": limit}
        render.emit_json(shown if args.agent is None else {**shown, "agent": args.agent})
    else:
        steps = getattr(limit, "steps", None)
        parts = [f"{limit.tokens} tokens" if limit.tokens is not None else "",
                 f"${limit.cost_usd:g}" if limit.cost_usd is not None else "",
                 f"{steps} steps" if steps is not None else ""]  # fmt: skip
        whose = task.id if args.agent is None else f"{task.id} {args.agent}'s subtree"
        session.console.print(f"{whose}: budget {' and '.join(p for p in parts if p)}")
    return Exit.OK


def archive(args: argparse.Namespace, session: Session) -> int:
    """Archive every committed GC still only in Redis, oldest first."""
    task, console = session.task(args.task), session.console
    busy = console.is_terminal and not args.json
    with console.status("archiving…") if busy else contextlib.nullcontext():
        reports = task.archive()
    return _show(args, console, reports, render.show_archived)


def forget(args: argparse.Namespace, session: Session) -> int:
    """Remove an ended task from Redis once everything it committed is in the archive."""
    task = session.task(args.task)
    removed = task.forget()
    if args.json:
        render.emit_json({"task_id": task.id, "keys_removed": removed})
    else:
        session.console.print(f"{task.id}: {removed} keys removed from Redis; its archive stays")
    return Exit.OK


def worker(args: argparse.Namespace, session: Session) -> int:
    """Run worker processes in the foreground, with the tools and MCP servers asked for.

    Both are checked here first, so a bad module or file is one line, not workers that
    die as they start.
    """
    settings = session.settings
    extra: dict[str, object] = {}
    if args.tools:
        extra["tools"] = (*settings.tools, *args.tools)
    if args.mcp_config:
        extra["mcp_config"] = Path(args.mcp_config)
    if args.concurrency:
        extra["worker_concurrency"] = args.concurrency
    settings = settings.model_copy(update=extra)
    load_tools(settings.tools)
    if settings.mcp_config is not None:
        load_mcp_config(settings.mcp_config, settings.environ)
    return run_workers(session.client, args.count, session.console, settings)


def coordinator(args: argparse.Namespace, session: Session) -> int:
    """Run a coordinator in the foreground (a standby while another leads)."""
    return run_coordinator(session.settings, args.name, args.lease_ms)


def demo(args: argparse.Namespace, session: Session) -> int:
    """Run the demo: on the configured Redis, or a private one in the state directory."""
    settings = session.settings
    return run_demo(
        settings.state_dir / "demo",
        say=print,
        model=args.model,
        base_url=args.base_url,
        settings=settings,
    )


def console(args: argparse.Namespace, session: Session) -> int:
    """Serve the web console until interrupted (see docs/console.md)."""

    def say(line: str) -> None:
        session.console.print(line, markup=False, highlight=False)

    return run_console(session.settings, args.host, args.port, lambda: session.client, say)


def up(args: argparse.Namespace, session: Session) -> int:
    """Run Redis (a private one unless configured), a coordinator and workers here."""
    settings = session.settings
    if args.concurrency:
        settings = settings.model_copy(update={"worker_concurrency": args.concurrency})
    if args.tools:  # checked here, as `worker` does: one line, not workers dying as they start
        settings = settings.model_copy(update={"tools": (*settings.tools, *args.tools)})
        load_tools(settings.tools)
    return run_up(settings, args.workers, session.console)


def down(args: argparse.Namespace, session: Session) -> int:
    """Stop the `cairn up` of this directory (or of `--dir`) and wait until all it ran is gone."""
    state = session.settings.state_dir
    return run_down(state if args.dir is None else args.dir / state, session.console)
