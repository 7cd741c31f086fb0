"""A step's records in the Redis hot store: epochs, attempts, LCs, votes, heartbeats, spend.

What a step reads and writes as it runs (its fencing, its checkpoints, its heartbeat and
spend), the chains of LCs a restore walks, and the task's documents.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import cast

import redis
from redis.exceptions import NoScriptError

from cairn.storage import keys
from cairn.storage.backends.redis.base import RedisRecords
from cairn.storage.backends.redis.scripts import (
    Lua,
    batch,
    owner_token,
    pipelined,
    translated,
    translating,
)
from cairn.storage.base import LCEntry, LCLink, StepStart
from cairn.storage.keys import SPEC_DOC
from cairn.storage.records import LCRef, Usage

# How long an attempt's spend entry is kept: past any step's life (step_timeout ≤ 24 h).
ATTEMPT_SPEND_TTL_S = 2 * 24 * 3600


def parse_ref(value: bytes | None) -> LCRef | None:
    """Parse an "lc_id checksum" pair as stored for votes and progress."""
    if value is None:
        return None
    lc_id, checksum = value.decode().split(" ")
    return LCRef(id=lc_id, checksum=checksum)


class StepRecords(RedisRecords):
    """The hot store's records of steps: fencing, LCs, votes, heartbeats, spend, documents."""

    def init_task(self, task: str) -> int:
        self.redis.set(keys.epoch(task), 1, nx=True)
        return self.get_epoch(task)

    def get_epoch(self, task: str) -> int:
        value = self.redis.get(keys.epoch(task))
        return 0 if value is None else int(cast(bytes, value))

    def raise_epoch(self, task: str, to: int, owner: int | None = None) -> int:
        return int(
            cast(
                int,
                translating(
                    lambda: self._raise_epoch(
                        keys=[keys.epoch(task), keys.owner(task), keys.audit(task)],
                        args=[to, owner_token(owner), self._audit_flag],
                    )
                ),
            )
        )

    def begin_attempt(
        self, task: str, agent: str, superstep: int, attempt: int, *, epoch: int | None = None
    ) -> None:
        translating(
            lambda: self._begin_attempt(
                keys=[keys.attempts(task), keys.epoch(task), keys.audit(task)],
                args=[agent, superstep, attempt, self._audit_flag, "" if epoch is None else epoch],
            )
        )

    def write_lc(self, entry: LCEntry, *, vote: bool = False) -> None:
        command = self._write_command(entry, vote)
        if vote:
            translating(lambda: self._vote(command, entry.record.task))
        else:
            translating(lambda: self._write_lc.run(self._held(), command))

    def _vote(self, command: tuple[object, ...], task: str) -> None:
        """Write a voting LC, and wake the coordinator, in one round trip.

        The wake is sent after the vote, so Redis runs it after; it is a hint, as every
        wake is (`cairn.coordinator.wakes`): refused (Redis at maxmemory), it is lost,
        and the coordinator's own schedule finds the vote. Sent again on a lost
        connection or a Redis that lost the script, a vote is the same vote and a wake
        one look more.
        """
        sent = [command, *keys.wake_commands(task)]
        client = self._held()
        try:
            replies = batch(client, sent, errors=True)
        except redis.ConnectionError:  # a held connection Redis closed: replaced, as `pipelined`
            replies = batch(client, sent, errors=True)
        if isinstance(replies[0], NoScriptError):
            self._write_lc.load(client)
            replies = batch(client, sent, errors=True)
        if isinstance(replies[0], redis.ResponseError):
            raise replies[0]

    def write_first_lcs(self, entries: Iterable[LCEntry]) -> None:
        # A pipeline, not a transaction: each write runs after its own fence, and is
        # refused by the same checks when that fence was (a stale epoch).
        for reply in pipelined(self._held(), list(self._first_lc_scripts(entries))):
            if isinstance(reply, redis.ResponseError):
                raise translated(reply)

    def write_spawned_lcs(self, entries: Iterable[LCEntry], spawner: str, attempt: int) -> None:
        scripts = []
        for entry in entries:
            lc, t = entry.record, entry.record.task
            at = f"{lc.epoch}:{lc.superstep}:{attempt}"
            command = self._write_spawned_lc.command(
                keys=[keys.epoch(t), keys.attempts(t), keys.lc(t, lc.id),
                      keys.superstep_lcs(t, lc.epoch, lc.superstep), keys.audit(t)],
                args=[lc.epoch, spawner, at, lc.agent, lc.id, entry.sealed.checksum,
                      entry.sealed.data, lc.level.value, self._audit_flag],
            )  # fmt: skip
            scripts.append((self._write_spawned_lc, command))
        for reply in pipelined(self._held(), scripts):
            if isinstance(reply, redis.ResponseError):
                raise translated(reply)

    def _first_lc_scripts(
        self, entries: Iterable[LCEntry]
    ) -> Iterator[tuple[Lua, tuple[object, ...]]]:
        """Each entry's `begin_attempt` then its `write_lc`, as scripts to send."""
        flag = self._audit_flag
        for entry in entries:
            lc = entry.record
            fence = (keys.attempts(lc.task), keys.epoch(lc.task), keys.audit(lc.task))
            args = [lc.agent, lc.superstep, lc.attempt, flag, lc.epoch]
            yield self._begin_attempt, self._begin_attempt.command(fence, args)
            yield self._write_lc, self._write_command(entry, vote=False)

    def _write_command(self, entry: LCEntry, vote: bool) -> tuple[object, ...]:
        """The write_lc.lua call that stores `entry` (and votes with it)."""
        lc = entry.record
        t = lc.task
        return self._write_lc.command(
            keys=[
                keys.epoch(t),
                keys.attempts(t),
                keys.lc(t, lc.id),
                keys.superstep_lcs(t, lc.epoch, lc.superstep),
                keys.votes(t, lc.epoch, lc.superstep),
                keys.progress(t, lc.epoch, lc.superstep),
                keys.audit(t),
                keys.blobs(t),
                *(keys.blob(t, sha) for sha in entry.blobs),
            ],
            args=[
                lc.epoch,
                lc.agent,
                f"{lc.epoch}:{lc.superstep}:{lc.attempt}",
                lc.id,
                entry.sealed.checksum,
                entry.sealed.data,
                lc.parent_id or "",
                "1" if lc.full else "0",
                lc.level.value,
                "1" if vote else "0",
                self._audit_flag,
                time.time(),
                *(part for blob in entry.blobs.items() for part in blob),
            ],
        )

    def read_chain(self, task: str, lc_id: str, max_links: int) -> list[bytes]:
        found = self._read_chain(keys=[keys.lc(task, lc_id)], args=[keys.lc(task, ""), max_links])
        return cast(list[bytes], found)

    def read_lcs(self, task: str, lc_ids: Iterable[str]) -> dict[str, bytes]:
        wanted = list(dict.fromkeys(lc_ids))
        if not wanted:
            return {}
        prefix = keys.lc(task, "")
        commands = [("HGET", prefix + lc_id, "data") for lc_id in wanted]
        found = cast(list[bytes | None], batch(self._held(), commands))
        return {i: data for i, data in zip(wanted, found, strict=True) if data is not None}

    def lc_link(self, task: str, lc_id: str) -> LCLink | None:
        fields = cast(
            list[bytes | None], self.redis.hmget(keys.lc(task, lc_id), ["agent", "parent", "full"])
        )
        agent, parent, full = fields
        if agent is None:
            return None
        return LCLink(lc_id, agent.decode(), (parent or b"").decode() or None, full == b"1")

    def walk_chains(self, task: str, heads: Iterable[str], known: Iterable[str] = ()) -> set[str]:
        prefix = keys.lc(task, "")
        starts = [prefix + lc_id for lc_id in dict.fromkeys(heads)]
        if not starts:
            return set()
        found = cast(list[bytes], self._walk_chains(keys=starts, args=[prefix, *known]))
        return {lc_id.decode() for lc_id in found}

    def delete_lcs(self, task: str, lc_ids: Iterable[str]) -> None:
        names = [keys.lc(task, i) for i in lc_ids]
        if names:
            self.redis.delete(*names)

    def get_votes(self, task: str, epoch: int, superstep: int) -> dict[str, LCRef]:
        raw = cast(dict[bytes, bytes], self.redis.hgetall(keys.votes(task, epoch, superstep)))
        return {agent.decode(): cast(LCRef, parse_ref(value)) for agent, value in raw.items()}

    def step_start(
        self, task: str, agent: str, epoch: int, superstep: int, token: str, ttl_ms: int
    ) -> StepStart:
        reply = cast(
            list[bytes | None],
            self._step_start(
                keys=[
                    keys.heartbeat(task, agent),
                    keys.epoch(task),
                    keys.latest(task),
                    keys.progress(task, epoch, superstep),
                    keys.doc(task, SPEC_DOC),
                    keys.attempts(task),
                ],
                args=[token, ttl_ms, agent, keys.gc(task, 0).removesuffix("0")],
            ),
        )
        epoch_, latest, gc, progress, spec, current = reply
        return StepStart(
            epoch=int(epoch_ or 0),
            latest=None if latest is None else int(latest),
            gc=gc,
            progress=parse_ref(progress),
            spec=spec,
            current=None if current is None else current.decode(),
        )

    def get_progress(self, task: str, epoch: int, superstep: int, agent: str) -> LCRef | None:
        return parse_ref(
            cast(bytes | None, self.redis.hget(keys.progress(task, epoch, superstep), agent))
        )

    def beat(self, task: str, agent: str, token: str, ttl_ms: int) -> bool:
        kept = self._beat(
            keys=[keys.heartbeat(task, agent), keys.attempts(task)], args=[token, ttl_ms, agent]
        )
        return bool(kept)

    def beating(self, task: str, agent: str) -> str | None:
        value = cast(bytes | None, self.redis.get(keys.heartbeat(task, agent)))
        return None if value is None else value.decode()

    def record_spend(
        self,
        task: str,
        agent: str,
        epoch: int,
        superstep: int,
        attempt: int,
        usage: Usage,
        call: int = 0,
    ) -> bool:
        return self.send_spend(task, agent, epoch, superstep, attempt, usage, call)()

    def send_spend(
        self,
        task: str,
        agent: str,
        epoch: int,
        superstep: int,
        attempt: int,
        usage: Usage,
        call: int = 0,
    ) -> Callable[[], bool]:
        pending = self._spend.send(
            keys=[keys.spend(task), keys.attempt_spend(task, epoch, superstep)],
            args=[
                agent,
                attempt,
                usage.prompt_tokens,
                usage.completion_tokens,
                usage.cached_tokens,
                repr(usage.cost_usd),
                ATTEMPT_SPEND_TTL_S,
                call,
            ],
        )
        self._threads.pending = pending  # read before this thread's next script
        return lambda: bool(pending.result())

    def put_doc(self, task: str, name: str, data: bytes) -> None:
        self.redis.set(keys.doc(task, name), data)

    def get_doc(self, task: str, name: str) -> bytes | None:
        return cast(bytes | None, self.redis.get(keys.doc(task, name)))

    def delete_doc(self, task: str, name: str) -> None:
        self.redis.delete(keys.doc(task, name))

    def put_live(self, task: str, agent: str, data: bytes, ttl_ms: int) -> None:
        self.redis.set(keys.live(task, agent), data, px=ttl_ms)

    def get_live(self, task: str, agents: Iterable[str]) -> dict[str, bytes]:
        names = list(dict.fromkeys(agents))
        if not names:
            return {}
        # One slot (the task's hash tag), so one MGET even on a cluster.
        found = cast(list[bytes | None], self.redis.mget([keys.live(task, a) for a in names]))
        return {name: data for name, data in zip(names, found, strict=True) if data is not None}

    def clear_live(self, task: str, agent: str) -> None:
        self.redis.delete(keys.live(task, agent))

    def claim(self, task: str, token: int) -> None:
        translating(lambda: self._claim(keys=[keys.owner(task)], args=[token]))
