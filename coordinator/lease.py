"""The leader lease: one coordinator acts at a time; a standby takes over when it lapses.

Each holder gets a fencing token from a counter that only rises, so a coordinator that
paused past its lease and resumed can tell (and be told) that it is no longer the leader.
A Redis at `maxmemory` refuses the writes that take a lease (renewing one still works): a
standby then stays a standby, and asks again on its next poll.
"""

from __future__ import annotations

import time
from typing import cast

import redis

from cairn.agents.logs import get_logger
from cairn.storage import keys

log = get_logger(__name__)

# Renew only while the lease still names us: compare and extend in one step.
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
# Raise the token counter to at least ARGV[1]; it never goes down.
_OUTRANK = """
if tonumber(redis.call('GET', KEYS[1]) or '0') < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1])
end
return 1
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class Lease:
    """A leader lease named `holder`, held for `ttl_ms` unless renewed."""

    def __init__(self, client: redis.Redis, holder: str, ttl_ms: int = 5_000) -> None:
        self._redis = client
        self.holder = holder
        self.ttl_ms = ttl_ms
        self.token: int | None = None
        self._refused = False  # the last take was refused for memory: said once a streak
        self._renewed = 0.0  # when the lease was last taken or renewed (`time.monotonic()`)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)
        self._outrank = client.register_script(_OUTRANK)

    @property
    def _value(self) -> str:
        return f"{self.holder}:{self.token}"

    def acquire(self) -> bool:
        """Take the lease if it is free; True when this coordinator now leads.

        A lease renewed less than a tenth of its time ago is not renewed again: a
        coordinator woken hundreds of times a second spends no round trip on it. Nothing
        rests on that tenth: every write a coordinator makes is fenced by its token.
        """
        if self.token is not None and time.monotonic() - self._renewed < self.ttl_ms / 10_000:
            return True
        if self.token is not None and self.renew():
            return True
        self.token = None
        try:
            token = int(self._redis.incr(keys.LEASE_TOKEN))
            taken = self._redis.set(keys.LEASE, f"{self.holder}:{token}", nx=True, px=self.ttl_ms)
        except redis.OutOfMemoryError as exc:
            # Not leading is the safe reading: a token drawn but not used only goes unused.
            if not self._refused:
                log.warning("lease not taken: Redis is out of memory", error=str(exc))
            self._refused = True
            return False
        self._refused = False
        if taken:
            self.token = token
            self._renewed = time.monotonic()
            return True
        return False

    def renew(self) -> bool:
        """Extend the lease; False (and no longer leading) when it lapsed or was taken."""
        if self.token is None:
            return False
        if int(self._renew(keys=[keys.LEASE], args=[self._value, self.ttl_ms])) == 1:
            self._renewed = time.monotonic()
            return True
        self.token = None
        return False

    def release(self) -> None:
        """Give the lease up at once, so a standby need not wait for it to lapse."""
        if self.token is not None:
            self._release(keys=[keys.LEASE], args=[self._value])
            self.token = None

    def outrank(self, token: int) -> None:
        """Give the lease up so that the next one taken, by any coordinator, beats `token`.

        For a task owned by a token above this lease's: a Redis that lost writes (a
        failover to a replica that lagged, a FLUSHALL) handed out tokens again from a lower
        count, while a coordinator drawn before it wrote its higher token as a task's owner.
        The counter rises past that owner, so the task is not refused to every later leader.
        """
        self._outrank(keys=[keys.LEASE_TOKEN], args=[token])
        log.warning("lease given up for a token above a task's owner", token=self.token,
                    owner=token)  # fmt: skip
        self.release()

    def holder_now(self) -> str | None:
        """Who holds the lease now (`holder:token`), or None."""
        value = cast(bytes | None, self._redis.get(keys.LEASE))
        return None if value is None else value.decode()
