"""A ticket tracker as Python tools: the tools examples/tools/team.yaml's agents call.

A worker loads them when told to (`CAIRN_TOOLS=ticket_tools`, with examples/tools on its
`PYTHONPATH`). The tracker is a stand-in for a real one: its tickets are the table below,
and what agents do to them goes to a ledger outside the workspace, the JSON-lines file
`TICKET_LEDGER` names. `get_ticket` only reads (`effects="none"`); `comment_on_ticket`
changes the tracker (`external`, the default), so Cairn checkpoints before each call and
hands it an idempotency key, the same on every retry, resume and replay of the call: the
ledger applies each key once, as a real tracker's `Idempotency-Key` header would.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Annotated

from pydantic import Field

from cairn import ToolContext, tool
from cairn.errors import ToolError

LEDGER = "TICKET_LEDGER"  # the worker's variable naming the ledger file
TICKET_ID = Annotated[str, Field(pattern=r"^TCK-\d+$", description="a ticket id, e.g. TCK-101")]
TICKETS: dict[str, dict[str, str]] = {
    "TCK-101": {
        "title": "to_fahrenheit(0) says 0",
        "reporter": "dana",
        "body": (
            "temps.to_fahrenheit(0) returns 0.0; water freezes at 32 °F. "
            "100 °C comes out 32 degrees short too (180 instead of 212)."
        ),
    },
}


@tool(effects="none")
def get_ticket(ticket_id: TICKET_ID) -> dict[str, object]:
    """Read a ticket of the tracker: its title, report, status and comments.

    Args:
        ticket_id: the ticket's id

    """
    ticket = TICKETS.get(ticket_id)
    if ticket is None:
        raise ToolError(f"no ticket {ticket_id}; the tracker has {', '.join(sorted(TICKETS))}")
    comments = [entry for entry in _read(_ledger()) if entry["ticket"] == ticket_id]
    resolved = any(entry["resolve"] for entry in comments)
    return {
        "id": ticket_id,
        **ticket,
        "status": "resolved" if resolved else "open",
        "comments": [{"by": entry["agent"], "text": entry["comment"]} for entry in comments],
    }


@tool  # effects="external": it changes the tracker, outside the workspace
def comment_on_ticket(
    ctx: ToolContext, ticket_id: TICKET_ID, comment: str, resolve: bool = False
) -> str:
    """Comment on a ticket of the tracker, and resolve it if asked.

    Args:
        ctx: the call's context (Cairn's, not the model's)
        ticket_id: the ticket's id
        comment: what to say on the ticket
        resolve: true to mark the ticket resolved

    """
    if ticket_id not in TICKETS:
        raise ToolError(f"no ticket {ticket_id}; the tracker has {', '.join(sorted(TICKETS))}")
    entry = {
        "key": ctx.idempotency_key,
        "task": ctx.task,
        "agent": ctx.agent,
        "ticket": ticket_id,
        "comment": comment,
        "resolve": resolve,
    }
    path = _ledger()
    with path.open("a+", encoding="utf-8") as ledger:
        fcntl.flock(ledger, fcntl.LOCK_EX)  # one writer at a time; released as it closes
        ledger.seek(0)
        if any(line["key"] == ctx.idempotency_key for line in _parse(ledger.read())):
            return f"{ticket_id}: this comment is on the ticket already"
        ledger.write(json.dumps(entry) + "\n")
    return f"{ticket_id}: commented{' and resolved' if resolve else ''}"


def _ledger() -> Path:
    """The ledger file of this worker, from its environment."""
    path = os.environ.get(LEDGER)
    if not path:
        raise ToolError(f"{LEDGER} is not set on this worker: the tracker has no ledger")
    return Path(path)


def _read(path: Path) -> list[dict[str, object]]:
    return _parse(path.read_text(encoding="utf-8")) if path.exists() else []


def _parse(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]
