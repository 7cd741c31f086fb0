"""The hot store on Redis: fenced LC writes and atomic GC commits as Lua scripts.

Every key comes from `cairn.storage.keys` and carries the task's `{task}` hash tag. Every write
is idempotent, because redis-py 8 retries a command whose reply it lost (10 tries).

`RedisHotStore` is one class of two halves over a shared base (`base.RedisRecords`: the
client, each thread's held connection, the scripts):

- `steps.StepRecords`: what a step reads and writes (epochs, attempts, LCs, votes,
  progress, heartbeats, spend) and the task's documents;
- `checkpoints.GCRecords`: the GCs (prepared, committed, aborted, listed) and the blobs
  of the workspace.

`scripts` loads and sends the Lua scripts of `cairn.storage.backends`' `lua/` folder and
says what their replies mean; `connection` makes the clients (`connect`).
"""

from __future__ import annotations

from cairn.storage.backends.redis.checkpoints import GCRecords
from cairn.storage.backends.redis.connection import connect
from cairn.storage.backends.redis.scripts import Lua, script, translated, translating
from cairn.storage.backends.redis.steps import StepRecords, parse_ref

__all__ = [
    "Lua",
    "RedisHotStore",
    "connect",
    "parse_ref",
    "script",
    "translated",
    "translating",
]


class RedisHotStore(StepRecords, GCRecords):
    """A `HotStore` on one Redis (or a cluster: each script touches one slot)."""
