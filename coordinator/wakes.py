"""Wake-ups: the coordinator learns a task has news the moment it does, not a tick later.

Whatever a coordinator waits for ends with a wake: a step job that voted or failed, a
verify that ruled, a person's submit, fork, resume, restore or decision on a call. A wake
is the task's id pushed on one Redis list; the leading coordinator blocks on that list
(`BLPOP`, with a timeout well under redis-py's socket timeout), takes every id waiting
there at once, and looks at those tasks alone.

A wake is a hint, never the only way news arrives: it is pushed after the write it
announces, outside that write's script (a task's keys share one Cluster slot, this list
has its own). A step's vote carries its wake in the vote's own round trip (the hot
store's `write_lc`); any other news is followed by `wake`. A push that fails, a
coordinator killed between popping and acting, or a standby that does not read the list
all lose it. The coordinator still looks at every active task on its own schedule
(`Coordinator.run`), so a lost wake costs latency, never progress. A wake pushed twice
(redis-py retried a push whose reply it lost) is one look more. The list is capped, so
wakes pushed while no coordinator runs cannot fill Redis.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import cast

import redis

from cairn.storage import keys


def wake(client: redis.Redis, *tasks: str) -> None:
    """Tell the leading coordinator to look at `tasks` now; never raises a Redis error.

    Best effort by design (see the module's docstring): a wake that is lost is made up by
    the coordinator's own schedule.
    """
    if not tasks:
        return
    pipe = client.pipeline(transaction=False)
    for command in keys.wake_commands(*tasks):
        pipe.execute_command(*command)  # type: ignore[no-untyped-call]
    with contextlib.suppress(redis.RedisError):
        pipe.execute()


class Wakes:
    """The leading coordinator's side: wait for wakes, then take every one waiting."""

    def __init__(self, client: redis.Redis) -> None:
        self.redis = client

    def wait(self, timeout: float) -> list[str]:
        """The tasks woken, in order and each once; [] when none came within `timeout` s.

        Blocks at most `timeout` seconds (rounded to Redis's millisecond), which the caller
        keeps below the client's socket timeout.
        """
        first = cast(
            tuple[bytes, bytes] | None,
            self.redis.blpop([keys.WAKES], timeout=max(round(timeout, 3), 0.001)),
        )
        if first is None:
            return []
        rest = cast(list[bytes] | None, self.redis.lpop(keys.WAKES, keys.WAKES_CAP)) or []
        return _unique(raw.decode(errors="replace") for raw in (first[1], *rest))

    def active(self, tasks: list[str]) -> list[str]:
        """Those of `tasks` still active, in order.

        A wake for a task that ended, was forgotten or never was (whatever was pushed on
        the list, a late wake of a zombie step) is dropped here: a look claims the tasks
        it reads, and would leave a key behind for a task that is gone.
        """
        if not tasks:
            return []
        member = cast(list[int], self.redis.smismember(keys.ACTIVE_TASKS, tasks))
        return [task for task, is_member in zip(tasks, member, strict=True) if is_member]


def _unique(tasks: Iterable[str]) -> list[str]:
    """`tasks` without repeats, first occurrence kept."""
    return list(dict.fromkeys(tasks))


class Timers:
    """Looks due at a time of their own, which no wake announces: a retry's backoff ending.

    Kept by the coordinator that leads, in its memory: a successor's scheduled looks find
    the same steps due.
    """

    def __init__(self) -> None:
        self._at: dict[str, float] = {}  # task → when a look at it is due (Unix time)

    def at(self, task: str, when: float) -> None:
        """Have `task` looked at by `when` (Unix time); the earliest time asked holds."""
        self._at[task] = min(when, self._at.get(task, when))

    def due(self, now: float) -> list[str]:
        """The tasks whose time has come by `now`, no longer kept."""
        found = [task for task, when in self._at.items() if when <= now]
        for task in found:
            del self._at[task]
        return found

    def next(self) -> float | None:
        """When the next look is due (Unix time), or None."""
        return min(self._at.values(), default=None)

    def forget(self, task: str) -> None:
        """Drop what was kept of a task that ended."""
        self._at.pop(task, None)
