"""A task's log lines from every process, as `cairn logs` and `Task.logs` read them.

Workers and coordinators ship their task-scoped lines into the task's capped stream
(`cairn.agents.logship`); this reads them back in the order they arrived, each once: a
line a retried write stored twice is shown once.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, cast

import redis
from pydantic import BaseModel, ConfigDict, JsonValue

from cairn.coordinator.viewbase import IsoTime
from cairn.storage import keys
from cairn.storage.public import public

MAX_WAIT = 2.0  # seconds one blocking read waits at most: well inside the socket's timeout
PAGE = 1_000  # lines read in one round trip

Entry = tuple[bytes, dict[bytes, bytes]]


@public
class LogLine(BaseModel):
    """One log line of a task: when, which process, which agent, how grave, what it said."""

    model_config = ConfigDict(frozen=True)

    id: str  # its place in the task's log: pass the last one read as `after` for the next
    at: IsoTime
    process: str  # `worker@host:pid` or `coordinator@host:pid`
    agent: str | None
    level: str
    message: str
    fields: dict[str, JsonValue]  # the event's other key fields (superstep, attempt, error, ...)
    exception: str | None = None  # the traceback, when the event carried one

    def to_json(self) -> dict[str, Any]:
        """The JSON object scripts read (`--json`)."""
        return self.model_dump(mode="json")


def read_logs(
    client: redis.Redis,
    task: str,
    agent: str | None = None,
    after: str | None = None,
    wait: float = 0.0,
) -> list[LogLine]:
    """The task's lines (of `agent`, or every one) after line `after`, as they reached Redis.

    That is time order, to within the moment a process takes to ship a line; the last
    line's `id` is what to read after next.

    With `wait`, a read that finds none new waits up to that many seconds (at most
    `MAX_WAIT`) for the next to arrive.
    """
    stream = keys.logs(task)
    entries = _after(client, stream, after, wait) if after is not None else _all(client, stream)
    if not entries and after is None and wait > 0:
        entries = _after(client, stream, "0-0", wait)
    return [line for line in _lines(entries) if agent is None or line.agent == agent]


def _all(client: redis.Redis, stream: str) -> list[Entry]:
    """Every entry of the stream, a page per round trip."""
    entries: list[Entry] = []
    start = "-"
    while True:
        page = cast(list[Entry], client.xrange(stream, min=start, count=PAGE))
        entries += page
        if len(page) < PAGE:
            return entries
        start = f"({page[-1][0].decode()}"


def _after(client: redis.Redis, stream: str, after: str, wait: float) -> list[Entry]:
    """Entries after `after`: those there now, else (with `wait`) the next to arrive."""
    # At least a millisecond: Redis reads BLOCK 0 as "for ever", and a follower's last
    # wait can be a fraction of one.
    block = max(1, round(min(wait, MAX_WAIT) * 1000)) if wait > 0 else None
    # RESP2's reply: [[stream, entries]], or None when the wait ran out
    answer = cast(list[tuple[bytes, list[Entry]]] | None,
                  client.xread({stream: after}, count=PAGE, block=block))  # fmt: skip
    return answer[0][1] if answer else []


def _lines(entries: list[Entry]) -> list[LogLine]:
    seen: set[str] = set()
    lines: list[LogLine] = []
    for entry_id, raw in entries:
        fields = {name.decode(): value.decode(errors="replace") for name, value in raw.items()}
        mark = fields.get("id", entry_id.decode())
        if mark in seen:  # a write sent again after its reply was lost
            continue
        seen.add(mark)
        lines.append(_line(entry_id.decode(), fields))
    return lines


def _line(entry_id: str, fields: dict[str, str]) -> LogLine:
    """One stream entry as a line; what is missing or damaged is left empty, never fatal."""
    try:
        at = datetime.fromisoformat(fields.get("at", ""))
    except ValueError:
        at = datetime.fromtimestamp(int(entry_id.split("-", maxsplit=1)[0]) / 1000, tz=UTC)
    try:
        extra = json.loads(fields.get("fields", "{}"))
    except json.JSONDecodeError:
        extra = {}
    return LogLine(
        id=entry_id,
        at=at if at.tzinfo else at.replace(tzinfo=UTC),
        process=fields.get("process", ""),
        agent=fields.get("agent") or None,
        level=fields.get("level", ""),
        message=fields.get("message", ""),
        fields=extra if isinstance(extra, dict) else {},
        exception=fields.get("exception") or None,
    )
