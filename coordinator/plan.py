"""What follows a committed GC: the next superstep's agents, or what else is due.

`Barrier` is what beginning a superstep reads besides the latest GC (in one round trip),
`Plan` the coordinator's decision, `Then` what is due when no superstep begins.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import redis

from cairn.coordinator.runs import REPLAY_UNTIL, TaskState
from cairn.coordinator.spend import parse_spend
from cairn.storage import keys
from cairn.storage.records import GlobalCheckpoint, Usage


@dataclass(frozen=True, slots=True)
class Barrier:
    """What starting a superstep reads besides the latest GC, in one round trip."""

    running: bool  # the run's status is `running` (not paused or ended meanwhile)
    epoch: int
    restoring: bool  # a restore holds the task's lock
    budget: bytes | None  # the budget last set (`Tasks.budget`), if any
    spent: dict[str, Usage]  # agent → what its model calls spent
    raised: dict[str, str] = field(default_factory=dict)  # member → its budget as last raised
    replay_until: int = 0  # supersteps up to this one redo what a restore discarded

    @classmethod
    def read(cls, client: redis.Redis, task: str) -> Barrier:
        """Read them for `task`."""
        pipe = client.pipeline(transaction=False)
        pipe.hmget(keys.run(task), ["status", "budget", REPLAY_UNTIL])
        pipe.get(keys.epoch(task))
        pipe.exists(keys.restore_lock(task))
        pipe.hgetall(keys.spend(task))
        pipe.hgetall(keys.member_budgets(task))
        (status, budget, replay), epoch, locked, spend, raised = pipe.execute()
        running = status == TaskState.RUNNING.value.encode()
        members = {k.decode(): v.decode() for k, v in raised.items()}
        return cls(running, int(epoch or 0), bool(locked), budget, parse_spend(spend)[0],
                   members, int(replay or 0))  # fmt: skip

    def may_begin(self, latest: GlobalCheckpoint) -> bool:
        """Say whether the superstep after `latest` may begin now.

        Not once the task was paused, ended or restored since the caller looked, nor while
        a restore that raised the epoch past `latest`'s holds the lock: it leads until it
        commits or gives up.
        """
        return self.running and not (self.epoch != latest.epoch and self.restoring)


class Then(str, Enum):
    """What follows a committed GC when no superstep starts after it (yet)."""

    VERIFY = "verify"  # every agent rests: run the task's verify command
    WAIT = "wait"  # an agent's tool call waits for a person's approval
    FAIL = "fail"  # past max_supersteps
    PAUSE = "pause"  # the budget is reached (the task's, or its runnable members')


@dataclass(frozen=True, slots=True)
class Plan:
    """What follows a committed GC: the next superstep's agents, else `then` and its reason."""

    agents: tuple[str, ...] = ()
    then: Then | None = None
    reason: str = ""
    held: bool = False  # paused because only members over their budgets have work
