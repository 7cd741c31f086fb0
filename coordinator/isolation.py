"""Keeping one task's trouble to that task: what the coordinator does when advancing one fails.

The coordinator advances every active task in one loop. Whatever advancing one task
raises (a Redis error, a damaged record, a bug met by a hostile agent's data) is caught
for that task alone, and the loop goes on with the others. `TaskFaults` decides what
follows:

- It logs a task's failures at a bounded rate: the first of a run of them at once, then
  at most one line every `LOG_EVERY` seconds counting those left unsaid, and one line
  when the task advances again.
- A failure that says nothing about the task (`PASSING`: Redis out of reach or full, a
  disk full, a restore that failed in passing, a stale lease; not Redis's plain error
  replies, such as a key of the wrong type, which are about what the task's keys hold)
  is tried again at the next look, as it passes for every task at once.
- Any other (a record that fails its check, state that does not parse, a bug) is tried
  again after a backoff (0.25 s doubling to `MAX_WAIT`), so a task that fails at every
  try costs the loop little; lasting `PAUSE_AFTER` seconds over at least `PAUSE_TRIES`
  tries, while another running task advanced meanwhile, it pauses the task, its reason
  naming the phase and the error: a person can look, restore the task to a checkpoint,
  and resume it. A coordinator that advances no task at all (a wrong signing key, a bug
  that every task meets) pauses none: the trouble is its own, and a standby may do better.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from cairn.agents.logs import get_logger
from cairn.errors import (
    ArchiveError,
    CommitRefused,
    FencedWrite,
    RestoreFailed,
    Unavailable,
    one_line,
)
from cairn.storage.redact import redact

log = get_logger(__name__)
PASSING = (redis.RedisError, Unavailable, ArchiveError, RestoreFailed, CommitRefused, FencedWrite)
LOG_EVERY = 60.0  # seconds between two log lines about one task's failures
MAX_WAIT = 5.0  # seconds: the longest backoff between two tries of a failing task
PAUSE_AFTER = 10.0  # seconds a task's advance may keep failing before the task is paused
PAUSE_TRIES = 3  # …over at least this many tries
MAX_ERROR = 300  # characters of an error's text kept in a log line or a reason
FAULT_REASON = "the coordinator could not advance this task"  # how a pause's reason begins


@dataclass(slots=True)
class _Streak:
    """A run of failed tries to advance one task."""

    since: float  # monotonic: the first failure
    tries: int = 0
    unsaid: int = 0  # failures not logged since the last line
    logged_at: float = 0.0
    due: float = 0.0  # monotonic: not tried again before


class TaskFaults:
    """Each task's run of failures; `after` is how long a run lasts before a pause.

    `pause(task, reason)` pauses a task and says whether it did (not if it was paused
    already: a paused task's superstep in flight is still watched, and may still fail).
    """

    def __init__(self, pause: Callable[[str, str], bool], after: float = PAUSE_AFTER) -> None:
        self._pause, self._after = pause, after
        self._streaks: dict[str, _Streak] = {}
        self._advanced_at = float("-inf")  # monotonic: a running task last went through

    def due(self, task: str, now: float | None = None) -> bool:
        """Say whether `task` may be advanced now (False while it waits out a backoff)."""
        streak = self._streaks.get(task)
        return streak is None or (time.monotonic() if now is None else now) >= streak.due

    def succeeded(self, task: str, running: bool = True, now: float | None = None) -> None:
        """Note that advancing `task` went through: its run of failures, if any, ends.

        A `running` task that went through shows that this coordinator can advance tasks:
        only then is a task that keeps failing its own trouble, and paused.
        """
        if running:
            self._advanced_at = time.monotonic() if now is None else now
        streak = self._streaks.pop(task, None)
        if streak is not None:
            log.info("task advanced again", task=task, failed_tries=streak.tries)

    def failed(self, task: str, exc: BaseException, phase: str, now: float | None = None) -> None:
        """Note that advancing `task` raised `exc` in `phase`; log, back off, maybe pause."""
        now = time.monotonic() if now is None else now
        streak = self._streaks.setdefault(task, _Streak(since=now))
        streak.tries += 1
        # Redacted before it is cut: a secret cut short may no longer look like one.
        error = f"{type(exc).__name__}: {redact(one_line(exc))[:MAX_ERROR]}"
        if streak.tries == 1 or now - streak.logged_at >= LOG_EVERY:
            log.warning("task not advanced", task=task, phase=phase, error=error,
                        tries=streak.tries, unsaid=streak.unsaid)  # fmt: skip
            streak.logged_at, streak.unsaid = now, 0
        else:
            streak.unsaid += 1
        if _passing(exc):
            return  # tried again at the next look: it passes for every task at once
        streak.due = now + min(MAX_WAIT, 0.25 * 2.0 ** (streak.tries - 1))
        lasting = now - streak.since >= self._after and streak.tries >= PAUSE_TRIES
        # A coordinator that advances no task (its signing key wrong, a bug of its own)
        # fails them all alike: that is not theirs to be paused for.
        if lasting and self._advanced_at > streak.since:
            reason = f"{FAULT_REASON} ({phase}, {streak.tries} tries): {error}"
            if self._pause(task, reason):
                log.error("task paused: the coordinator could not advance it", task=task,
                          phase=phase, error=error)  # fmt: skip

    def forget(self, task: str) -> None:
        """Drop what was noted of `task` (it ended)."""
        self._streaks.pop(task, None)


def _passing(exc: BaseException) -> bool:
    """Say whether `exc` is trouble that passes, and passes for every task alike.

    Redis's plain error replies (a key of the wrong type, a script refusing what it read)
    are about what one task's keys hold; its other errors (out of reach, out of memory,
    read-only, loading) are about Redis.
    """
    if type(exc) is redis.ResponseError:
        return False
    return isinstance(exc, PASSING)
