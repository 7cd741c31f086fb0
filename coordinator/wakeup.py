"""How the leading coordinator waits between ticks: its poll, cut short by a superstep's last vote.

A coordinator polls every task each tick (`Coordinator.run`'s `poll`, 50 ms), so without
more a superstep would wait up to that long after its last vote for its commit. Each vote
is also pushed on the votes channel as it lands (`storage.backends.votes`): the wait
takes the pushed LCs into the barrier's read-ahead (verified against the checksum the vote
names, as a read from Redis is) and ends as soon as they complete a superstep it waits
for. The tick that follows commits it without reading those LCs back. Votes alone do not
cut the wait short: a team of ten would tick ten times a superstep. Missed pushes cost
nothing but the poll: the votes hash stays the record.
"""

from __future__ import annotations

import threading
import time

import redis

from agents.barrier import StepOutputs, pushed_outputs
from storage.backends.votes import PushedVote, VoteFeed
from storage.records import LCRef
from storage.store import CheckpointStore

# (task, epoch, superstep) → agent → (its vote, the outputs read from that LC)
ReadAhead = dict[tuple[str, int, int], dict[str, tuple[LCRef, StepOutputs]]]
# Supersteps whose read-ahead pushes may fill, at most: the oldest go first. Pushes carry
# every task's votes, the leader's or not; a task this coordinator does not visit again
# must not keep its entry for ever.
READ_AHEAD_KEPT = 4_096
STOP_CHECK_EVERY = 0.1  # seconds: how soon a wait ends once its `stop` is set


class Wakeup:
    """The leader's wait between ticks, and the supersteps it waits on."""

    def __init__(self, client: redis.Redis, store: CheckpointStore) -> None:
        self.store = store
        self.feed = VoteFeed(client)
        self._awaited: dict[str, tuple[int, int, frozenset[str]]] = {}

    def expect(self, task: str, epoch: int, superstep: int, agents: set[str]) -> None:
        """Wait on `task`'s superstep: its commit is due once every one of `agents` voted."""
        self._awaited[task] = (epoch, superstep, frozenset(agents))

    def forget(self, task: str) -> None:
        """Wait on nothing of `task` (it ended, or waits on no vote)."""
        self._awaited.pop(task, None)

    def wait(self, stop: threading.Event, poll: float, read_ahead: ReadAhead) -> None:
        """Wait up to `poll` s, until `stop`, or until pushed votes complete a superstep.

        Pushed LCs that open with their vote's checksum join `read_ahead`.
        """
        deadline = time.monotonic() + poll
        while not stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            # Every pushed vote is taken, not only those up to the first that completes;
            # a wait ends within `STOP_CHECK_EVERY` of `stop`.
            pushed = self.feed.wait(min(left, STOP_CHECK_EVERY))
            completed = [self._take(vote, read_ahead) for vote in pushed]
            if any(completed):
                return

    def close(self) -> None:
        """Stop listening (a later `wait` listens again)."""
        self.feed.close()

    def _take(self, vote: PushedVote, read_ahead: ReadAhead) -> bool:
        """Keep a pushed vote's outputs; True when they complete a superstep waited on."""
        outputs = pushed_outputs(self.store, vote)
        if outputs is None:
            return False
        key = (vote.task, vote.epoch, vote.superstep)
        if key not in read_ahead and len(read_ahead) >= READ_AHEAD_KEPT:
            del read_ahead[next(iter(read_ahead))]
        seen = read_ahead.setdefault(key, {})
        seen[vote.agent] = (vote.ref, outputs)
        awaited = self._awaited.get(vote.task)
        return awaited is not None and awaited[:2] == key[1:] and awaited[2] <= seen.keys()
