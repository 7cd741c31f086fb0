"""The Redis connection Cairn makes, the hot store across a Redis restart, big commits."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import redis
from redis.client import Pipeline

from cairn.coordinator.runs import Look, RunState
from cairn.errors import CommitRefused, FencedWrite
from cairn.storage import keys
from cairn.storage.backends.disk import DiskArchive
from cairn.storage.backends.redis import RedisHotStore, connect
from cairn.storage.backends.redis.scripts import source
from cairn.storage.codec import Codec
from cairn.storage.records import Level
from cairn.storage.store import CheckpointStore
from cairn.testing.redis_server import RedisServer, free_port
from tests.factories import make_gc, manifest, new_agent, read_gc_whole, run_task, take_step


def test_connect_packs_large_values_in_python_and_round_trips(redis_server: RedisServer) -> None:
    """connect() swaps the command packer only: a 4 MiB value goes in and out intact."""
    client = connect(redis_server.url)
    value = bytes(range(256)) * 16384
    client.set("cairn-test-large", value)
    assert value == client.get("cairn-test-large")
    connection = client.connection_pool.get_connection()
    try:
        packer = connection._command_packer
        assert "_HybridPacker" == type(packer).__name__
        assert 3 == len(packer.pack("SET", "k", value))  # header, the value alone, CRLF
        assert 1 == len(packer.pack("SET", "k", b"small"))  # one buffer, from hiredis
    finally:
        client.connection_pool.release(connection)
    client.delete("cairn-test-large")
    client.close()


def test_free_port_never_hands_out_a_port_twice() -> None:
    """Ports chosen before any server binds them are all distinct (the kernel repeats some).

    A replica set chooses its six ports at once; a repeat made a replica fail to bind its
    primary's port (chaos seed 85). Among 1,000 ports the kernel offers, some ~3% repeat.
    """
    ports = [free_port() for _ in range(1_000)]
    assert len(ports) == len(set(ports))


def test_committed_state_survives_a_redis_restart(own_redis: RedisServer, tmp_path: Path) -> None:
    """Redis stopped and started again (AOF on) keeps every GC; the client reconnects."""
    client = connect(own_redis.url)
    store = CheckpointStore(RedisHotStore(client), DiskArchive(tmp_path / "a"), Codec())
    gcs = run_task(store, "restart", supersteps=3)
    before = [read_gc_whole(store, "restart", gc.number) for gc in gcs]
    own_redis.stop()
    own_redis.start()
    after = [read_gc_whole(store, "restart", gc.number) for gc in gcs]
    assert before == after
    assert 3 == store.hot.latest_gc("restart")
    assert [] == store.cold.list_gcs("restart")  # it all came from Redis
    client.close()


def test_a_redis_that_lost_the_scripts_is_sent_them_again(
    real_store: CheckpointStore, redis_client: redis.Redis
) -> None:
    """After SCRIPT FLUSH (a Redis restarted without them) the next write loads its script."""
    state = new_agent(real_store, "flushed", "coder")
    take_step(state, 1)
    redis_client.script_flush()
    ref = real_store.write_lc(state, vote=True)
    assert {"coder": ref} == real_store.hot.get_votes("flushed", 1, 1)


def test_a_look_claims_its_tasks_on_a_redis_that_lost_the_claim_script(
    redis_client: redis.Redis,
) -> None:
    """A coordinator's look sends its claim as a bare EVALSHA: after SCRIPT FLUSH, loaded."""
    runs = RunState(redis_client, RedisHotStore(redis_client), token=lambda: 7)
    redis_client.script_flush()
    seen = runs.look(["claimed-1"])["claimed-1"]
    assert isinstance(seen, Look)
    assert b"7" == redis_client.get(keys.owner("claimed-1"))
    outranked = RunState(redis_client, RedisHotStore(redis_client), token=lambda: 6)
    assert isinstance(outranked.look(["claimed-1"])["claimed-1"], FencedWrite)
    redis_client.delete(keys.owner("claimed-1"))


class Counted(redis.Redis):
    """A client whose pipelines are counted: one pipeline, one round trip."""

    pipelines = 0

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> Pipeline:
        """The client's pipeline, counted."""
        self.pipelines += 1
        return super().pipeline(transaction, shard_hint)


def test_a_look_reads_the_votes_it_expects_in_its_first_round_trip(
    real_store: CheckpointStore, redis_client: redis.Redis
) -> None:
    """A task looked at again in the same superstep takes one round trip, not two.

    Its votes are read with its run state, for the superstep its last look found in
    flight; a task whose superstep moved on meanwhile has the new one's read in a second.
    """
    state = new_agent(real_store, "guessed", "coder")
    take_step(state, 1)
    ref = real_store.write_lc(state, vote=True)  # epoch 1, superstep 1
    redis_client.hset(keys.run("guessed"), mapping={"epoch": 1, "superstep": 1, "number": 2})
    redis_client.script_load(source("claim"))  # no look sent again for NOSCRIPT
    counted = Counted(connection_pool=redis_client.connection_pool)
    runs = RunState(counted, RedisHotStore(redis_client), token=lambda: 3)

    def look() -> Look:
        seen = runs.look(["guessed"])["guessed"]
        assert isinstance(seen, Look)
        return seen

    assert {"coder": ref} == look().votes  # first: no guess yet
    assert 2 == counted.pipelines
    assert {"coder": ref} == look().votes
    assert 3 == counted.pipelines
    redis_client.hset(keys.run("guessed"), "superstep", 2)  # moved on: the guess misses
    assert {} == look().votes
    assert 5 == counted.pipelines
    assert {} == look().votes
    assert 6 == counted.pipelines
    redis_client.hset(keys.run("guessed"), "superstep", 0)  # nothing in flight
    assert {} == look().votes
    assert 7 == counted.pipelines


def test_each_thread_holds_a_connection_of_its_own(real_store: CheckpointStore) -> None:
    """The scripts a thread runs share one held connection; another thread holds another."""
    hot = real_store.hot
    assert isinstance(hot, RedisHotStore)
    mine = hot._held()
    theirs: list[redis.Redis] = []
    thread = threading.Thread(target=lambda: theirs.append(hot._held()))
    thread.start()
    thread.join()
    assert mine is hot._held()
    assert mine.connection is not theirs[0].connection


def test_a_team_beyond_one_chunk_commits_and_sweeps(
    real_store: CheckpointStore, redis_client: redis.Redis
) -> None:
    """1,001 members are checked and 1,001 tool LCs swept, past the script's 1,000 a call."""
    store = real_store
    refs, tools = {}, []
    for i in range(1_001):
        state = new_agent(store, "big", f"a{i}")
        take_step(state, 1, size=10)
        tools.append(store.write_lc(state, Level.TOOL))
        refs[state.agent] = store.write_lc(state, vote=True)
    ws = manifest(store, "big", {"a.txt": b"a"})
    committed = store.commit_gc(make_gc("big", 1, 1, 1, refs, ws))
    assert 1 == store.hot.latest_gc("big")
    assert refs == store.read_gc("big", 1).members  # sealed at zstd level 1, opened alike
    assert committed.checksum == store.read_gc("big", 1).checksum
    members = [ref.id for ref in refs.values()]
    assert set(members) == set(store.hot.read_lcs("big", members))
    assert {} == store.hot.read_lcs("big", [t.id for t in tools])
    assert [] == redis_client.keys(keys.superstep_lcs("big", 1, 1))


def test_a_member_name_with_a_tab_is_refused_before_sending(real_store: CheckpointStore) -> None:
    """A tab in a member's name would shift the packed fields: refused, nothing written."""
    state = new_agent(real_store, "t", "coder")
    take_step(state, 1)
    ref = real_store.write_lc(state, vote=True)
    ws = manifest(real_store, "t", {"a.txt": b"a"})
    with pytest.raises(CommitRefused, match="tab or a newline"):
        real_store.commit_gc(make_gc("t", 1, 1, 1, {"co\tder": ref}, ws))
    assert [] == real_store.hot.list_gcs("t")


def test_the_audit_stream_holds_fences_and_accepted_writes_in_order(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    """With auditing on, Redis's own order of epochs, fences and accepted LC writes is kept.

    A write refused by the fence is not in it; with auditing off nothing is written.
    """
    hot = RedisHotStore(redis_client, audit=True)
    store = CheckpointStore(hot, DiskArchive(tmp_path / "a"), Codec())
    state = new_agent(store, "audited", "coder")
    take_step(state, 1)
    first = store.write_lc(state, Level.STEP, vote=True)
    hot.begin_attempt("audited", "coder", 1, 2)  # the step is retried: attempt 1 is fenced
    take_step(state, 2)
    with pytest.raises(FencedWrite):
        store.write_lc(state, Level.STEP, vote=True)
    hot.raise_epoch("audited", 2)
    assert [
        {"kind": "fence", "agent": "coder", "at": "1:1:1"},
        {"kind": "lc", "agent": "coder", "at": "1:1:1", "lc": first.id},
        {"kind": "fence", "agent": "coder", "at": "1:1:2"},
        {"kind": "epoch", "at": "2"},
    ] == hot.read_audit("audited")
    quiet = CheckpointStore(RedisHotStore(redis_client, audit=False), store.cold, Codec())
    plain = new_agent(quiet, "unaudited", "coder")
    take_step(plain, 1)
    quiet.write_lc(plain, Level.STEP, vote=True)
    assert 0 == redis_client.exists(keys.audit("unaudited"))
