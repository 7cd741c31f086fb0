"""`Journal`: what an agent in code did so far in a run of its function, for a replay.

A Python function cannot be resumed half-way through, so a step of an agent in code that
is retried from a tool-level checkpoint runs the function again from its start, on the
state it started from, and replays it (as Temporal replays a workflow): each thing the
function does through its context (ask the model, call a tool, read the inbox, send) is
an entry of the journal, kept in the checkpoint; while entries are left, the function's
next action is answered from its entry instead of being done again, so the model is not
paid twice and a finished call does not run twice. The checkpoint's history, files and
outbox already hold what those actions did. Past the last entry, actions run for real.

Each entry carries a fingerprint of the action (what it is and its arguments): code that
does something else on the replay than it did the first time (it read the clock, or a
random number, to decide) cannot be replayed, and raises `Diverged`; the step is then run
again from its global checkpoint, where there is nothing to replay.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import JsonValue

from cairn.agents.tools import call_digest
from cairn.errors import Diverged

Entry = dict[str, JsonValue]


def fingerprint(action: str, args: dict[str, JsonValue]) -> str:
    """What an entry says an action was: its name and a digest of its arguments."""
    return f"{action}:{call_digest(action, args)[:16]}"


@dataclass(slots=True)
class Journal:
    """The entries of one run of an agent's function: recorded, and being replayed.

    `entries` is the list kept in the agent's state (so every checkpoint holds it);
    `at` is how many of them the replay has answered so far.
    """

    entries: list[JsonValue]
    agent: str
    at: int = field(default=0)

    @property
    def replaying(self) -> bool:
        """Whether entries recorded before a crash are still to be answered."""
        return self.at < len(self.entries)

    def replay(self, action: str, args: dict[str, JsonValue]) -> Entry | None:
        """The recorded entry of this action, if the replay has one left; else None.

        Raises `Diverged` when the next recorded entry is of another action.
        """
        if not self.replaying:
            return None
        entry = self.entries[self.at]
        said = fingerprint(action, args)
        if not isinstance(entry, dict) or entry.get("did") != said:
            was = entry.get("did") if isinstance(entry, dict) else entry
            raise Diverged(
                f"agent {self.agent}'s code did something else on its replay: action "
                f"{self.at + 1} was {was}, and is now {said} (code must decide from what its "
                "context gives it, not from the clock or chance)"
            )
        self.at += 1
        return entry

    def record(self, action: str, args: dict[str, JsonValue], **outcome: JsonValue) -> None:
        """Record an action done for real, with what a replay answers it with."""
        self.entries.append({"did": fingerprint(action, args), **outcome})
        self.at = len(self.entries)
