"""How the CLI shows things: rich tables for people, plain JSON for scripts."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime
from enum import Enum
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel
from rich.console import Console, Group
from rich.markup import escape
from rich.table import Column, Table
from rich.text import Text

if TYPE_CHECKING:
    from cairn.agents.live import LiveReply

KIB = 1024
JSON = Mapping[str, Any]  # parsed JSON: the views' own shapes
STATUS_STYLE = {
    "running": "cyan",
    "paused": "yellow",
    "waiting_approval": "yellow",
    "succeeded": "green",
    "failed": "red",
    "cancelled": "magenta",
    "unrecoverable": "bold red",
    "COMMITTED": "green",
    "PREPARING": "yellow",
    "ABORTED": "red",
    "damaged": "bold red",
}


def emit_json(data: object) -> None:
    """Print `data` as JSON on stdout: the stable shape scripts rely on."""
    sys.stdout.write(json.dumps(plain(data), indent=2) + "\n")
    sys.stdout.flush()


def emit_text(line: str) -> None:
    """Print one line on stdout as it is (a result a script reads: `T=$(cairn submit ...)`)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def emit_line(data: object) -> None:
    """Print `data` as one line of JSON on stdout (a stream of them: `cairn watch`)."""
    sys.stdout.write(json.dumps(plain(data)) + "\n")
    sys.stdout.flush()


def say(message: str) -> None:
    """Tell the person something on stderr, in one line (stdout is for results)."""
    sys.stderr.write(f"cairn: {message}\n")
    sys.stderr.flush()


def plain(data: object) -> Any:  # noqa: ANN401 - whatever JSON the data makes
    """`data` as JSON would read it back: models their JSON, enums their values."""
    return json.loads(json.dumps(data, default=_json_default))


def _json_default(value: object) -> object:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True)
    return str(value.value) if isinstance(value, Enum) else str(value)


def styled(status: object) -> str:
    """A status word coloured by what it means."""
    text = str(status)
    style = STATUS_STYLE.get(text)
    return f"[{style}]{text}[/]" if style else text


def _when(value: object) -> str:
    if not isinstance(value, str):
        return ""
    return datetime.fromisoformat(value).strftime("%m-%d %H:%M:%S")


def _size(value: object) -> str:
    amount = float(value) if isinstance(value, int | float) else 0.0
    if amount < KIB:
        return f"{amount:.0f} B"
    for unit in ("KiB", "MiB"):
        amount /= KIB
        if amount < KIB:
            return f"{amount:.1f} {unit}"
    return f"{amount / KIB:.1f} GiB"


def _short(value: object, width: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _id_column(header: str, ids: Sequence[str]) -> Column:
    """A column of names a person copies into the next command: never cut, never split.

    The other columns of a narrow terminal's table fold instead (rich cuts by default).
    """
    return Column(header, no_wrap=True, min_width=max([len(header), *map(len, ids)]))


def show_status(console: Console, status: JSON) -> None:
    """The task's status line and a table of its agents."""
    status = plain(status)
    head = f"[bold]{status['task_id']}[/]  {styled(status['status'])}"
    console.print(f"{head}  {describe_progress(status)}")
    table = Table("agent", "status", "step", "tokens", "replayed", "retries", "last error")
    for agent in status.get("agents", []):
        step = "" if agent["step"] is None else str(agent["step"])
        usage = agent.get("usage") or {}
        name = agent["name"]
        if agent.get("spawned_by"):
            name += f" (spawned by {agent['spawned_by']})"
        state = styled(agent["status"]) + (" (held: budget)" if agent.get("held") else "")
        table.add_row(name, state, step, _spent(usage),
                      _spent(usage.get("replayed") or {}), str(agent.get("retries", 0)),
                      _last_error(agent.get("last_error")))  # fmt: skip
    console.print(table)
    usage = status.get("usage") or {}
    console.print(f"spent: {_spent(usage)}; replayed: {_spent(usage.get('replayed') or {})}")
    if status.get("budget"):
        limits = status["budget"]
        shown = [f"{limits['tokens']} tokens" if limits.get("tokens") else "",
                 f"${limits['cost_usd']:g}" if limits.get("cost_usd") else ""]  # fmt: skip
        console.print(f"budget: {' and '.join(p for p in shown if p)}")
    if status.get("reason"):
        console.print(f"reason: {status['reason']}")
    if status.get("forked_from"):
        source = status["forked_from"]
        console.print(f"forked from {source['task_id']} at checkpoint {source['checkpoint']}")
    if status.get("error"):
        console.print(f"[red]steps unknown: {status['error']}[/]")
    if status.get("result"):
        given = status["result"]
        console.print(f"result: given by {given['agent']} in superstep {given['superstep']} "
                      f"(`cairn result {status['task_id']}`)", markup=False)  # fmt: skip


def _last_error(last: JSON | None) -> str:
    """An agent's latest failure: when, which attempt, what (`StepFailure`'s JSON)."""
    if not last:
        return ""
    what = last["error_class"] + ": " if last.get("error_class") else ""
    said = _short(last["error"], 100)
    return escape(f"{_when(last['at'])} attempt {last['attempt']}: {what}{said}")


def show_failures(console: Console, events: Sequence[JSON]) -> None:
    """The failed attempts and what the coordinator made of them, oldest first."""
    table = Table("at", "superstep", "epoch", "agent", "attempt", "what", "error")
    for event in plain(events):
        what = event["error_class"] + ": " if event.get("error_class") else ""
        table.add_row(_when(event["at"]), str(event["superstep"]), str(event["epoch"]),
                      escape(event["agent"]), str(event["attempt"]),
                      event["event"].replace("_", " "),
                      escape(what + _short(event["error"], 120)))  # fmt: skip
    console.print(table)


def show_result(console: Console, value: object) -> None:
    """A task's result, as indented JSON."""
    console.print(json.dumps(value, indent=2, ensure_ascii=False), markup=False, highlight=False)


def describe_progress(status: object) -> str:
    """Where a task is: the superstep running now, if one is, and the last GC committed.

    A GC is committed at its superstep's end, so while one runs both are named.
    """
    shape = plain(status)
    running, gc = shape.get("running_superstep"), shape["latest_checkpoint"]
    epoch, superstep = shape["epoch"], shape["superstep"]
    if running is None:
        return f"superstep {superstep}  epoch {epoch}  checkpoint {gc}"
    committed = "none" if gc is None else f"{gc} at superstep {superstep}"
    return f"running superstep {running}  epoch {epoch}  (last checkpoint {committed})"


def _spent(usage: JSON) -> str:
    """Tokens (prompt + completion) and, when priced, dollars: `1,234 ($0.0123)`."""
    tokens = int(usage.get("prompt_tokens", 0)) + int(usage.get("completion_tokens", 0))
    cost = float(usage.get("cost_usd", 0.0))
    return f"{tokens:,}" + (f" (${cost:.4f})" if cost else "")


def show_diff(console: Console, found: JSON) -> None:
    """Per agent the messages and tool calls added; who joined or left; the files changed."""
    found = plain(found)
    a, b = found["a"], found["b"]
    console.print(
        f"[bold]{a['task_id']}[/] checkpoint {a['checkpoint']} → "
        f"[bold]{b['task_id']}[/] checkpoint {b['checkpoint']}"
    )
    table = Table("agent", "messages added", "tool calls added")
    for name, agent in found["agents"].items():
        calls = ", ".join(str(c["tool"]) for c in agent["tool_calls_added"])
        table.add_row(name, str(len(agent["messages_added"])), calls)
    console.print(table)
    members = found.get("members") or {}
    for name, parent in (members.get("joined") or {}).items():
        by = f" (spawned by {parent})" if parent else ""
        console.print(f"joined: {name}{by}", markup=False, highlight=False)
    for name in members.get("left") or []:
        console.print(f"left: {name}", markup=False, highlight=False)
    files = found["files"]
    for mark, paths in (("+", files["added"]), ("-", files["removed"])):
        for path in paths:
            console.print(f"{mark} {path}", markup=False, highlight=False)
    for path, change in files["changed"].items():
        console.print(f"~ {path}", markup=False, highlight=False)
        console.print(change, end="", markup=False, highlight=False)


def show_checkpoints(console: Console, rows: Sequence[JSON]) -> None:
    """One line per global checkpoint: state, epoch, members, origin, tiers, when written.

    Then why each damaged one is, and what an aborted one is (its number stays taken).
    Sized to fit 80 columns: sizes are in `--json`; the time drops its date when every
    GC listed was written on one day.
    """
    table = Table("GC", "status", "superstep", "epoch", "members", "origin", "where",
                  "written", collapse_padding=True, pad_edge=False)  # fmt: skip
    notes, rows = [], plain(rows)
    days = {str(row["created_at"])[:10] for row in rows if row["created_at"]}
    for row in rows:
        if row.get("damaged"):
            notes.append(f"GC {row['number']} is damaged: {row.get('error')}")
        written = _when(row["created_at"])
        table.add_row(
            str(row["number"]),
            styled("damaged" if row.get("damaged") else row["status"]),
            "" if row["superstep"] is None else str(row["superstep"]),
            "" if row.get("epoch") is None else str(row["epoch"]),
            "" if row.get("dropped") else str(len(row["members"])),
            origin_of(row),
            "+".join(tier for tier in ("hot", "cold") if row[tier]),
            written[6:] if len(days) == 1 else written,
        )
    console.print(table)
    if len(days) == 1:
        console.print(f"written on {days.pop()} (UTC)", markup=False, highlight=False)
    for line in notes:
        console.print(line, style="red", markup=False, highlight=False)
    if any(row["status"] == "ABORTED" for row in rows):
        console.print(
            "ABORTED: committed nothing (a superstep given up, a restore's fallback); "
            "its number is never used again",
            markup=False,
            highlight=False,
        )


def origin_of(row: JSON) -> str:
    """What wrote a GC, as a person reads it: `restore of 3`, `fork of T@1`; `-`: unknown."""
    origin, source = row.get("origin"), row.get("source")
    if origin is None:
        return "-"  # a record of schema 6 or older: it did not say
    if source is None:
        return str(origin)
    if origin == "fork":
        return f"fork of {row.get('source_task')}@{source}"
    return f"{origin} {'to' if origin == 'rollback' else 'of'} {source}"


def show_checkpoint(console: Console, gc: JSON) -> None:
    """One global checkpoint: its members and its files."""
    gc = plain(gc)
    tiers = " + ".join(t for t in ("hot", "cold") if gc[t]) or "nowhere"
    console.print(
        f"[bold]{gc['name']}[/]  {styled(gc['status'])}  superstep {gc['superstep']}  "
        f"epoch {gc['epoch']}  {tiers}  {_size(gc['size_bytes'])}  "
        f"written {_when(gc['created_at'])}  origin {origin_of(gc)}"
    )
    members = Table("agent", "status", "step", "local checkpoint")
    for agent in gc["agents"]:
        step = "" if agent["step"] is None else str(agent["step"])
        name = agent["name"]
        if agent.get("spawned_by"):
            name += f" (spawned by {agent['spawned_by']})"
        members.add_row(name, styled(agent["status"]), step, agent["lc_id"])
    console.print(members)
    files = Table("file", "sha256")
    for path, sha in gc["files"].items():
        files.add_row(path, sha[:16])
    console.print(files)
    if gc["inbox"]:
        console.print(f"{len(gc['inbox'])} message(s) delivered, not yet read")


def show_trace(console: Console, rows: Sequence[JSON]) -> None:
    """One line per model turn or tool call, in order."""
    table = Table("superstep", "agent", "step", "call", "ms", "result")
    for row in plain(rows):
        call = row["tool"] or "model"
        if call in ("spawn_agent", "spawn") and isinstance(row["arguments"].get("name"), str):
            call = f"{call} {row['arguments']['name']}"  # who it spawned
        if row.get("compacted") is not None:  # a compaction's summary (or its marker)
            call = f"compaction ({row['compacted']} messages)"
        outcome = f"[red]{_short(row['error'])}[/]" if row["error"] else _short(row["result"])
        table.add_row(
            str(row["superstep"]),
            str(row["agent"]),
            str(row["step"]),
            str(call) + (" *" if row["side_effect"] else ""),
            f"{row['duration_ms']:.0f}",
            outcome,
        )
    console.print(table)
    console.print("* changes the world (a tool-level checkpoint was taken before it)")


def show_archived(console: Console, reports: Sequence[JSON]) -> None:
    """What `cairn archive` wrote."""
    if not reports:
        console.print("every committed checkpoint is on disk already")
        return
    table = Table("GC", "local checkpoints", "blobs", "written")
    for report in plain(reports):
        table.add_row(
            str(report["number"]),
            str(report["lcs"]),
            str(report["blobs"]),
            _size(report["bytes"]),
        )
    console.print(table)


def show_tasks(console: Console, statuses: Sequence[JSON]) -> None:
    """One line per task, the most recently submitted first."""
    if not statuses:
        console.print("no tasks")
        return
    shown = plain(statuses)
    rest = ("status", "superstep", "epoch", "checkpoint", "agents")
    ids = [status["task_id"] for status in shown]
    table = Table(_id_column("task", ids), *(Column(name, overflow="fold") for name in rest))
    for status in shown:
        table.add_row(
            status["task_id"],
            styled(status["status"]),
            str(status["superstep"]),
            str(status["epoch"]),
            "" if status["latest_checkpoint"] is None else str(status["latest_checkpoint"]),
            str(len(status["agents"])),
        )
    console.print(table)


def show_approvals(console: Console, calls: Sequence[JSON]) -> None:
    """Each tool call waiting for a person: the names that decide it, then the call itself.

    The call goes on a line of its own under the task's id, so the three names a decision
    takes fit whole on one line of an 80-column terminal.
    """
    if not calls:
        console.print("no tool call waits for a person")
        return
    shown = plain(calls)
    names = (("task", "task_id"), ("agent", "agent"), ("call", "call"))
    table = Table(*(_id_column(name, [call[key] for call in shown]) for name, key in names))
    # The call's line may fold (the id's width is kept as the column's least).
    table.columns[0].no_wrap, table.columns[0].overflow = False, "fold"
    for call in shown:
        table.add_row(call["task_id"], call["agent"], call["call"])
        # Text, not markup: the arguments are the model's, brackets and all.
        table.add_row(Text(f"  {call['tool']} {_short(call['arguments'])}"), end_section=True)
    console.print(table)
    console.print("decide with `cairn approve|reject TASK AGENT CALL`")


# `cairn watch` ---------------------------------------------------------------------------
WATCHED = ("task_id", "status", "superstep", "epoch", "latest_checkpoint", "running_superstep",
           "agents", "reason")  # fmt: skip


LIVE_WIDTH = 100  # characters of a streaming reply's last line `cairn watch` shows


def watch_line(status: object, live: Mapping[str, LiveReply] | None = None) -> dict[str, Any]:
    """The part of a status `cairn watch --json` prints (one line each time it changes).

    `live` (agent → the reply its model is streaming) adds `live`: agent → that reply's
    last line so far.
    """
    shape = plain(status)
    line = {name: shape.get(name) for name in WATCHED}
    line["live"] = {agent: reply.last_line(LIVE_WIDTH) for agent, reply in (live or {}).items()}
    return line


def live_view(status: object, live: Mapping[str, LiveReply] | None = None) -> Group:
    """A rich view of a task's status: one line, then a table of its agents.

    An agent whose model is streaming its reply shows the reply's last line so far.
    """
    line = watch_line(status, live)
    where = describe_progress(line)
    head = Text.from_markup(f"[bold]{line['task_id']}[/]  {styled(line['status'])}  {where}")
    table = Table("agent", "status", "step", "replying", "retries", "last error", box=None)
    for agent in line["agents"]:
        # The model's text as it is, never markup: rich reads a Text as plain characters.
        said = Text(line["live"].get(agent["name"], ""), style="italic")
        failed = Text.from_markup(_last_error(agent.get("last_error")), style="red")
        table.add_row(agent["name"], agent["status"], str(agent["step"]), said,
                      str(agent.get("retries", 0)), failed)  # fmt: skip
    return Group(head, table)
