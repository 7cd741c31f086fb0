"""The global checkpoints in the Redis hot store: prepare, commit, abort, list; blobs.

A GC is prepared when its superstep begins (with its attempts fenced, in one round trip)
and committed or aborted at its barrier, each in one script; a commit may begin the next
superstep in the same script. Blobs (a workspace's files and manifests, stored once per
task by address) are kept, read and trimmed here too.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import cast

import redis
from redis.connection import Connection

from cairn.errors import CommitRefused
from cairn.storage import keys
from cairn.storage.backends.redis.base import RedisRecords
from cairn.storage.backends.redis.scripts import (
    Lua,
    owner_token,
    pipelined,
    translated,
    translating,
)
from cairn.storage.base import GCEntry, GCInfo, NextSuperstep
from cairn.storage.records import GCStatus, LCRef


def _pack_members(members: dict[str, LCRef]) -> str:
    """Pack a GC's members into the one argument commit_gc.lua reads.

    A line per member: LC id, checksum and agent, tab-separated. The command then grows by
    one short line an agent rather than by a key and two arguments, each of which Redis
    and the script handle on their own. Raises `CommitRefused` when a field holds a tab or
    a newline, which would shift the fields the script reads.
    """
    packed = "".join([f"{ref.id}\t{ref.checksum}\t{agent}\n" for agent, ref in members.items()])
    if packed.count("\t") != 2 * len(members) or packed.count("\n") != len(members):
        raise CommitRefused("a member's agent, LC id or checksum holds a tab or a newline")
    return packed


class GCRecords(RedisRecords):
    """The hot store's GCs (prepared, committed, aborted, listed) and its blobs."""

    def begin_attempts(
        self,
        task: str,
        attempts: Mapping[str, int],
        superstep: int,
        *,
        epoch: int,
        prepare: GCEntry | None = None,
        owner: int | None = None,
    ) -> None:
        # A pipeline, not a transaction: Redis runs every script even after one refused.
        # That is harmless: an attempt only moves forward and a stale epoch is refused, so
        # a fence that runs after a refused prepare hands no step back to an older attempt,
        # and the caller enqueues no step job unless every reply is good.
        scripts: list[tuple[Lua, tuple[object, ...]]] = []
        if prepare is not None:
            scripts.append((self._prepare_gc, self._prepare_command(prepare, owner)))
        fence = (keys.attempts(task), keys.epoch(task), keys.audit(task))
        flag = self._audit_flag
        scripts += [
            (
                self._begin_attempt,
                self._begin_attempt.command(fence, [agent, superstep, attempt, flag, epoch]),
            )
            for agent, attempt in attempts.items()
        ]
        for reply in pipelined(self._held(), scripts):
            if isinstance(reply, redis.ResponseError):
                raise translated(reply)

    def prepare_gc(self, entry: GCEntry, owner: int | None = None) -> None:
        command = self._prepare_command(entry, owner)
        client = self._held()
        translating(lambda: self._prepare_gc.run(client, command))

    def _prepare_command(self, entry: GCEntry, owner: int | None) -> tuple[object, ...]:
        gc = entry.record
        t = gc.task
        return self._prepare_gc.command(
            [keys.epoch(t), keys.gc(t, gc.number), keys.gcs(t), keys.owner(t)],
            [
                gc.number,
                gc.epoch,
                entry.sealed.data,
                entry.sealed.checksum,
                gc.superstep,
                owner_token(owner),
            ],
        )

    def commit_gc(
        self, entry: GCEntry, owner: int | None = None, then: NextSuperstep | None = None
    ) -> bool:
        gc = entry.record
        t = gc.task
        begin_keys: list[str] = []
        begin_args: list[object] = []
        if then is not None:
            nxt = then.prepare.record
            begin_keys = [keys.gc(t, nxt.number), keys.attempts(t), keys.audit(t)]
            lines = "".join(f"{agent}\t{attempt}\n" for agent, attempt in then.attempts.items())
            begin_args = [
                nxt.number,
                then.prepare.sealed.data,
                then.prepare.sealed.checksum,
                nxt.superstep,
                lines,
                self._audit_flag,
            ]
        reply = translating(
            lambda: self._commit_gc(
                keys=[
                    keys.epoch(t),
                    keys.gc(t, gc.number),
                    keys.gcs(t),
                    keys.latest(t),
                    keys.blob(t, gc.workspace),
                    keys.superstep_lcs(t, gc.epoch, gc.superstep),
                    keys.votes(t, gc.epoch, gc.superstep),
                    keys.progress(t, gc.epoch, gc.superstep),
                    keys.owner(t),
                    keys.attempt_spend(t, gc.epoch, gc.superstep),
                    *begin_keys,
                ],
                args=[
                    gc.number,
                    gc.epoch,
                    entry.sealed.data,
                    entry.sealed.checksum,
                    gc.superstep,
                    keys.lc(t, ""),
                    owner_token(owner),
                    _pack_members(gc.members),
                    len(gc.members),
                    *begin_args,
                ],
            )
        )
        return reply == b"BEGUN"

    def confirm_replicas(self, task: str, number: int, replicas: int, timeout_ms: int) -> int:
        # WAIT counts the replicas holding its connection's last write. The probe makes that
        # a write after GC `number`, on the Redis found holding the GC, whichever connection
        # committed it: the three go out together on one connection, so a failover between
        # them fails the call instead of asking a new primary about an old one's write.
        connection = cast(Connection, self._held().connection)
        commands = [
            ("HGET", keys.gc(task, number), "status"),
            ("SET", keys.replica_probe(task), number),
            ("WAIT", replicas, timeout_ms),
        ]
        packed = connection.pack_commands(commands)  # type: ignore[no-untyped-call]
        try:
            connection.send_packed_command(packed)  # type: ignore[no-untyped-call]
            status, _, count = [connection.read_response() for _ in commands]
        except Exception:
            connection.disconnect()  # type: ignore[no-untyped-call]  # no reply left behind
            raise
        return int(count) if status == GCStatus.COMMITTED.value.encode() else 0

    def abort_gc(self, entry: GCEntry, owner: int | None = None) -> None:
        gc = entry.record
        t = gc.task
        translating(
            lambda: self._abort_gc(
                keys=[
                    keys.gc(t, gc.number),
                    keys.gcs(t),
                    keys.superstep_lcs(t, gc.epoch, gc.superstep),
                    keys.votes(t, gc.epoch, gc.superstep),
                    keys.progress(t, gc.epoch, gc.superstep),
                    keys.owner(t),
                ],
                args=[
                    gc.number,
                    entry.sealed.data,
                    entry.sealed.checksum,
                    gc.superstep,
                    keys.lc(t, ""),
                    owner_token(owner),
                ],
            )
        )

    def read_gc(self, task: str, number: int) -> bytes | None:
        return cast(bytes | None, self.redis.hget(keys.gc(task, number), "data"))

    def list_gcs(self, task: str) -> list[GCInfo]:
        numbers = [int(n) for n in cast(list[bytes], self.redis.zrange(keys.gcs(task), 0, -1))]
        pipe = self.redis.pipeline(transaction=False)
        for n in numbers:
            pipe.hmget(keys.gc(task, n), ["status", "superstep"])
            pipe.hstrlen(keys.gc(task, n), "data")
        replies = pipe.execute()
        infos = []
        for i, n in enumerate(numbers):
            status, superstep = replies[2 * i]
            if status is None:  # deleted by retention between the two reads
                continue
            infos.append(GCInfo(n, GCStatus(status.decode()), int(superstep), replies[2 * i + 1]))
        return infos

    def latest_gc(self, task: str) -> int | None:
        value = self.redis.get(keys.latest(task))
        return None if value is None else int(cast(bytes, value))

    def delete_gc(self, task: str, number: int) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(keys.gc(task, number))
        pipe.zrem(keys.gcs(task), number)
        pipe.execute()

    def put_blob(self, task: str, sha: str, data: bytes) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.set(keys.blob(task, sha), data, nx=True)
        pipe.zadd(keys.blobs(task), {sha: time.time()})
        pipe.execute()

    def get_blob(self, task: str, sha: str) -> bytes | None:
        return cast(bytes | None, self.redis.get(keys.blob(task, sha)))

    def get_blobs(self, task: str, shas: Iterable[str]) -> dict[str, bytes]:
        wanted = list(dict.fromkeys(shas))
        if not wanted:
            return {}
        # One MGET: every blob key carries the task's hash tag, so it is one cluster slot.
        prefix = keys.blob(task, "")
        found = cast(list[bytes | None], self.redis.mget([prefix + sha for sha in wanted]))
        return {sha: data for sha, data in zip(wanted, found, strict=True) if data is not None}

    def blob_times(self, task: str) -> dict[str, float]:
        pairs = cast(
            list[tuple[bytes, float]], self.redis.zrange(keys.blobs(task), 0, -1, withscores=True)
        )
        return {sha.decode(): score for sha, score in pairs}

    def delete_blobs(self, task: str, shas: Iterable[str]) -> None:
        wanted = list(shas)
        if not wanted:
            return
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(*[keys.blob(task, s) for s in wanted])
        pipe.zrem(keys.blobs(task), *wanted)
        pipe.execute()
