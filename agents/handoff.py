"""Handoff: an agent hands its conversation to a teammate, and rests.

The `handoff` tool (and `AgentContext.handoff` for code) sends the teammate one message:
the handing agent's note, then its conversation as a transcript, newest turns kept when
it is long. The teammate reads it at the barrier like any message (a resting teammate
wakes for it); the agent that handed over rests until a message wakes it. A summary
instead of the transcript is the agent's to write: a note with `include_history` false.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic_core import to_json

from cairn.storage.records import Message, Role

HEADER = "--- the conversation {agent} hands over ---"


def handoff_text(agent: str, note: str, history: Sequence[Message], limit: int) -> str:
    """The message handing `history` over: `note`, then the transcript, in `limit` bytes."""
    head = f"{note}\n\n{HEADER.format(agent=agent)}\n"
    room = limit - len(head.encode(errors="surrogatepass"))
    lines: list[str] = []
    used = 0
    spoken = [m for m in history if m.role is not Role.SYSTEM]
    for at, message in enumerate(reversed(spoken)):
        line = _line(message)
        size = len(line.encode(errors="surrogatepass")) + 1
        if used + size > room - 80:  # room for the line saying what was left out
            lines.append(f"[{len(spoken) - at} earlier messages left out]")
            break
        lines.append(line)
        used += size
    return head + "\n".join(reversed(lines))


def _line(message: Message) -> str:
    """One message of a transcript: who said it, what, and the calls it asked for."""
    who = message.role.value if message.name is None else f"{message.role.value} {message.name}"
    calls = "".join(f"\n  -> {c.name}({to_json(c.args).decode()})" for c in message.tool_calls)
    return f"[{who}] {message.content or ''}{calls}"
