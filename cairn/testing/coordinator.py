"""Fault hooks for tests and the chaos suite: a coordinator that fails where it is told to.

`PoisonedCoordinator` is a `Coordinator` that, before each phase of advancing a task
(`PHASES`: the method of the coordinator, or of one of its parts, that does it), looks in
Redis for a poison naming that task and that phase, and raises `InjectedFault` if it finds
one, as a bug or a hostile record met there would. So a test shows that one task's failure
in any phase stays that task's. Set a poison with `poison`, lift it with `cure`.
`python -m cairn.testing.coordinator` runs it as `python -m cairn.coordinator` runs the
real one. Cairn's own tests and the chaos suite use it; `cairn.testing` does not export it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import wraps
from typing import Any, cast

import redis

from cairn.coordinator import __main__ as entry
from cairn.coordinator.committer import Committer
from cairn.coordinator.coordinator import Coordinator
from cairn.coordinator.finisher import Finisher
from cairn.coordinator.launcher import Launcher
from cairn.coordinator.watcher import Watcher
from cairn.storage.keys import PREFIX

POISONS = f"{PREFIX}:testing:poisons"  # hash task → the phase that raises for it
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


class PoisonedCoordinator(Coordinator):
    """A coordinator whose phases raise for the tasks a poison names (see the module)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # noqa: ANN401 - Coordinator's own
        super().__init__(*args, **kwargs)
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
