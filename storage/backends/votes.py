"""The votes channel: each accepted vote, pushed to whoever listens (the coordinator).

`write_lc.lua` publishes every vote it records, a header and the sealed LC, on
`keys.VOTES_CHANNEL`, in the write itself. A coordinator subscribed to it wakes as the
vote lands rather than at its next poll, and holds the LC its barrier reads without
reading it back. It is a hint, never the record: Pub/Sub delivers to those listening at
that moment, at most once, so a listener that missed a vote (it was reconnecting, or on
a primary the Sentinels replaced) finds it in the votes hash at its next look, as
without the channel. A pushed LC is trusted only once it opens with the checksum its
vote names (`agents.barrier.pushed_outputs`).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any, cast

import redis
from redis.client import PubSub

from storage import keys
from storage.records import LCRef

HEADER_FIELDS = 6  # task, agent, epoch, superstep, LC id, checksum
DRAIN_AT_MOST = 1_000  # messages one `wait` takes: a burst is read over several calls


@dataclass(frozen=True, slots=True)
class PushedVote:
    """One vote as the channel carried it: whose, for which superstep, and its sealed LC."""

    task: str
    agent: str
    epoch: int
    superstep: int
    ref: LCRef
    data: bytes  # the sealed LC, not verified yet


def vote_header(task: str, agent: str, epoch: int, superstep: int, lc_id: str, sum_: str) -> str:
    """The header `write_lc.lua` publishes before a vote's sealed LC."""
    return "\t".join((task, agent, str(epoch), str(superstep), lc_id, sum_))


def parse_vote(message: bytes) -> PushedVote | None:
    """The vote a channel message carries; None for anything that is not one."""
    header, newline, data = message.partition(b"\n")
    fields = header.decode(errors="replace").split("\t")
    if not newline or len(fields) != HEADER_FIELDS:
        return None
    task, agent, epoch, superstep, lc_id, checksum = fields
    if not (epoch.isdigit() and superstep.isdigit()):
        return None
    ref = LCRef(id=lc_id, checksum=checksum)
    return PushedVote(task, agent, int(epoch), int(superstep), ref, data)


class VoteFeed:
    """A subscription to the votes channel of the Redis `client` reaches.

    Subscribed at the first `wait`, and again after any failure; behind a Sentinel URL
    it follows the primary the Sentinels name, as the client's commands do.
    """

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._pubsub: PubSub | None = None

    def wait(self, timeout: float) -> list[PushedVote]:
        """The votes pushed since the last call, waiting up to `timeout` s for one.

        Never raises for Redis: when the subscription fails, it is dropped (made again at
        the next call) and the call sleeps out its `timeout`, as a poll would.
        """
        deadline = time.monotonic() + timeout
        try:
            pubsub = self._subscribed()
            # None also stands for a message it skipped (a subscription's confirmation).
            found = None
            while found is None and (left := deadline - time.monotonic()) > 0:
                found = pubsub.get_message(ignore_subscribe_messages=True, timeout=left)
            messages: list[dict[str, Any]] = []
            while found is not None and len(messages) < DRAIN_AT_MOST:
                messages.append(found)
                found = pubsub.get_message(ignore_subscribe_messages=True, timeout=0)
        except (redis.RedisError, OSError, ValueError):
            self.close()
            time.sleep(max(0.0, deadline - time.monotonic()))
            return []
        votes = (parse_vote(m["data"]) for m in messages if isinstance(m.get("data"), bytes))
        return [vote for vote in votes if vote is not None]

    def listen(self) -> None:
        """Subscribe now, so votes written from here on reach the next `wait`.

        A `wait` subscribes when it needs to, hearing only what is pushed after that.
        """
        self._subscribed()

    def close(self) -> None:
        """Unsubscribe and close the feed's connection (a later `wait` subscribes again)."""
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            with contextlib.suppress(Exception):  # closing a connection that already failed
                pubsub.close()

    def _subscribed(self) -> PubSub:
        pubsub = self._pubsub
        if pubsub is not None and self._left_behind(pubsub):
            self.close()
            pubsub = None
        if pubsub is None:
            pubsub = self._client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
            self._pubsub = pubsub
            pubsub.subscribe(keys.VOTES_CHANNEL)
        return pubsub

    def _left_behind(self, pubsub: PubSub) -> bool:
        """True when the subscription is on a primary the Sentinels no longer name.

        A subscriber only reads, so nothing would move it: it would hear no more votes.
        """
        names_another = getattr(self._client.connection_pool, "names_another", None)
        connection = cast(Any, pubsub.connection)
        if names_another is None or connection is None:
            return False
        return bool(names_another((connection.host, connection.port)))
