"""Fault hooks for tests and the chaos suite: a coordinator that fails where it is told to.

`PoisonedCoordinator` is a `Coordinator` that, before each phase of advancing a task
(`PHASES`: the method of the coordinator, or of one of its parts, that does it), looks in
Redis for a poison naming that task and that phase, and raises `InjectedFault` if it finds
one, as a bug or a hostile record met there would. So a test shows that one task's failure
in any phase stays that task's. Set a poison with `poison`, lift it with `cure`.

Two faults of the wake-up path too, each armed in Redis for whichever such coordinator
leads: `kill_at_commit` makes the next one to commit a superstep SIGKILL itself as the
commit begins, past the last vote and its wake, before anything of the commit is
written; `lose_wakes` makes the leader drop every wake it takes for a while, as wakes
lost on the way would be, so it moves its tasks on by its scheduled looks alone.
`python -m cairn.testing.coordinator` runs it as `python -m cairn.coordinator` runs the
real one. Cairn's own tests and the chaos suite use it; `cairn.testing` does not export it.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from functools import wraps
from typing import Any, cast

import redis

from cairn.agents.logs import get_logger
from cairn.coordinator import __main__ as entry
from cairn.coordinator.committer import Committer
from cairn.coordinator.coordinator import Coordinator
from cairn.coordinator.finisher import Finisher
from cairn.coordinator.launcher import Launcher
from cairn.coordinator.wakes import Wakes
from cairn.coordinator.watcher import Watcher
from cairn.storage.keys import PREFIX

log = get_logger(__name__)

POISONS = f"{PREFIX}:testing:poisons"  # hash task → the phase that raises for it
KILL_AT_COMMIT = f"{PREFIX}:testing:kill-at-commit"  # string: armed while it exists
LOSE_WAKES = f"{PREFIX}:testing:lose-wakes"  # string with a TTL: wakes dropped meanwhile
# phase (as a task's fault names it) → the class (the coordinator or a part) and its method
PHASES: dict[str, tuple[type, str]] = {
    "restore": (Coordinator, "_restore_again"),
    "begin": (Launcher, "begin"),
    "watch": (Watcher, "watch"),
    "commit": (Committer, "commit"),
    "after commit": (Committer, "after_commit"),
    "archive": (Committer, "archive"),
    "verify": (Committer, "verify"),
    "rollback": (Finisher, "give_up"),
    "finish": (Finisher, "finish"),
}


class InjectedFault(RuntimeError):
    """Raised by a poisoned phase: not a `CairnError`, as a bug's exception is not."""


def poison(client: redis.Redis, task: str, phase: str) -> None:
    """Make `phase` raise for `task` in every `PoisonedCoordinator` of this Redis."""
    if phase not in PHASES:
        raise ValueError(f"unknown phase {phase!r}: one of {', '.join(PHASES)}")
    client.hset(POISONS, task, phase)


def cure(client: redis.Redis, task: str) -> None:
    """Lift `task`'s poison."""
    client.hdel(POISONS, task)


def kill_at_commit(client: redis.Redis) -> None:
    """Arm a kill: the next `PoisonedCoordinator` to begin a commit SIGKILLs itself there."""
    client.set(KILL_AT_COMMIT, "1")


def lose_wakes(client: redis.Redis, seconds: float) -> None:
    """Make the leading `PoisonedCoordinator` drop every wake it takes for `seconds`."""
    client.set(LOSE_WAKES, "1", px=max(int(seconds * 1000), 1))


class LosingWakes(Wakes):
    """Wakes taken as ever, then dropped while `lose_wakes` holds: lost on the way."""

    def wait(self, timeout: float) -> list[str]:
        """What `Wakes.wait` took, or [] while wakes are being lost."""
        woken = super().wait(timeout)
        if woken and self.redis.exists(LOSE_WAKES):
            log.info("wakes lost on purpose", tasks=woken)
            return []
        return woken


class PoisonedCoordinator(Coordinator):
    """A coordinator whose phases raise for the tasks a poison names (see the module)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # noqa: ANN401 - Coordinator's own
        super().__init__(*args, **kwargs)
        self.wakes = LosingWakes(self.redis)
        commit = self.committer.commit

        @wraps(commit)
        def killed_first(*args: Any, **kwargs: Any) -> Any:  # noqa: ANN401 - commit's own
            if self.redis.delete(KILL_AT_COMMIT):  # one kill an arming, whoever leads
                log.warning("killed at commit on purpose", task=args[0] if args else None)
                os.kill(os.getpid(), signal.SIGKILL)
            return commit(*args, **kwargs)

        self.committer.commit = killed_first  # type: ignore[method-assign]
        # Wrapped on each instance: the parts call one another through their attributes.
        parts = (self, self.launcher, self.watcher, self.committer, self.finisher)
        for phase, (kind, method) in PHASES.items():
            owner = next(part for part in parts if isinstance(part, kind))
            setattr(owner, method, self._poisoned(phase, getattr(owner, method)))

    def _poisoned(self, phase: str, method: Callable[..., Any]) -> Callable[..., Any]:
        @wraps(method)
        def checked(task: str, *args: Any, **kwargs: Any) -> Any:  # noqa: ANN401 - any phase's
            named = cast(bytes | None, self.redis.hget(POISONS, task))
            if named is not None and named.decode() == phase:
                self.ctx.phase = phase
                raise InjectedFault(f"injected fault in {phase}")
            return method(task, *args, **kwargs)

        return checked


if __name__ == "__main__":
    sys.exit(entry.main(kind=PoisonedCoordinator))
