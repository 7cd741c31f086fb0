"""What the two halves of the Redis hot store share: a client, held connections, scripts.

Each thread runs the scripts on a client of its own that holds one connection (`_held`);
the audit flag goes to every script that writes what the chaos suite's checker replays.
"""

from __future__ import annotations

import os
import threading
from typing import cast

import redis

from cairn.storage import keys
from cairn.storage.backends.redis.scripts import Lua, Pending


class RedisRecords:
    """The state both halves of `RedisHotStore` work on: one Redis and the scripts' calls."""

    def __init__(self, client: redis.Redis, *, audit: bool = False) -> None:
        self.redis = client
        self._threads = threading.local()  # see `_held`
        # With auditing (the `audit` setting, CAIRN_AUDIT=1), the scripts append every
        # epoch raise, fence and accepted LC write to the task's `audit` stream, in the
        # order Redis ran them: the history the chaos suite's checker replays. Off, it
        # costs nothing.
        self.audit = audit
        self._audit_flag = "1" if self.audit else "0"
        self._write_lc = Lua(self._held, "write_lc")
        self._write_spawned_lc = Lua(self._held, "write_spawned_lc")
        self._read_chain = Lua(self._held, "read_chain")
        self._walk_chains = Lua(self._held, "walk_chains")
        self._prepare_gc = Lua(self._held, "prepare_gc")
        self._commit_gc = Lua(self._held, "commit_gc")
        self._abort_gc = Lua(self._held, "abort_gc")
        self._raise_epoch = Lua(self._held, "raise_epoch")
        self._step_start = Lua(self._held, "step_start")
        self._beat = Lua(self._held, "beat")
        self._begin_attempt = Lua(self._held, "begin_attempt")
        self._claim = Lua(self._held, "claim")
        self._spend = Lua(self._held, "spend")

    def _held(self) -> redis.Redis:
        """Return the calling thread's client, which holds one connection while the thread lives.

        The scripts run on it: a command then takes no connection from the pool and gives
        none back, which a step's few calls in a row feel. The connection returns to the
        pool when the thread ends (its client is collected); a forked child makes its own.
        """
        held = self._threads
        if getattr(held, "pid", None) != os.getpid():
            pool = self.redis.connection_pool
            held.client = redis.Redis(connection_pool=pool, single_connection_client=True)
            held.pid = os.getpid()
            held.pending = None
        pending: Pending | None = held.pending
        if pending is not None:  # a reply still on the connection is read first
            held.pending = None
            pending.settle()
        return cast(redis.Redis, held.client)

    def read_audit(self, task: str) -> list[dict[str, str]]:
        """The task's audit stream, oldest first (empty unless some writer audited).

        Each entry has `kind` (epoch, fence or lc) and `at`, and `agent` and `lc` where
        they apply; an LC a step wrote for a member it spawned names the spawner as its
        `agent` (whose fence it passed) and the member as its `member`.
        """
        entries = cast(list[tuple[bytes, dict[bytes, bytes]]], self.redis.xrange(keys.audit(task)))
        return [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in entries]
