"""The votes channel: each accepted vote pushed to the leading coordinator, on real Redis.

A push is a hint: the coordinator wakes on it and takes the LC it carries once that LC
opens with the checksum its vote names; what it missed it reads, as before.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import redis

from agents.barrier import pushed_outputs, read_outputs
from agents.models.scripted import ScriptedModel
from agents.step import run_step
from agents.task import start_task
from storage.backends.disk import DiskArchive
from storage.backends.redis import RedisHotStore, connect
from storage.backends.votes import PushedVote, VoteFeed
from storage.codec import Codec
from storage.errors import FencedWrite
from storage.redis_server import RedisServer
from storage.store import CheckpointStore
from tests.agent_harness import record, scripted
from tests.cluster import Cluster, team_spec

WRITE = {"name": "write_file", "args": {"path": "a.txt", "content": "a"}}
TURN = {"say": "writing", "tools": [WRITE]}


def _started(store: CheckpointStore, task: str) -> None:
    gc = start_task(store, record(task, scripted("coder", [TURN, {"say": "done"}])), {})
    intent = gc.model_copy(update={"number": 1, "superstep": 1})
    store.begin_superstep(intent, {"coder": 1})


def test_a_vote_is_pushed_with_the_lc_its_barrier_reads(
    real_store: CheckpointStore, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """A listening feed hears the vote a step writes; its LC gives what a read gives."""
    _started(real_store, "t")  # its GC 0 is voted too: heard by no one yet
    feed = VoteFeed(redis_client)
    feed.listen()
    try:
        models = lambda spec: ScriptedModel(spec.script)  # noqa: E731 - the step's factory
        ref = run_step("t", "coder", 1, 1, 1, store=real_store, cache=tmp_path, models=models).lc
        pushed = feed.wait(2.0)
        assert [("t", "coder", 1, 1, ref)] == [
            (p.task, p.agent, p.epoch, p.superstep, p.ref) for p in pushed
        ]
        read = read_outputs(real_store, "t", {"coder": ref})["coder"]
        assert read == pushed_outputs(real_store, pushed[0])
        assert {"a.txt"} == set(read.changes)
    finally:
        feed.close()


def test_only_an_accepted_vote_is_pushed(
    real_store: CheckpointStore, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """A zombie's refused vote pushes nothing; nor does an LC written without a vote."""
    _started(real_store, "t")  # its GC 0 is voted too: heard by no one yet
    feed = VoteFeed(redis_client)
    feed.listen()
    try:
        models = lambda spec: ScriptedModel(spec.script)  # noqa: E731 - the step's factory
        real_store.hot.begin_attempt("t", "coder", 1, 2)  # attempt 1 is a zombie now
        with pytest.raises(FencedWrite):
            run_step("t", "coder", 1, 1, 1, store=real_store, cache=tmp_path, models=models)
        gc = real_store.latest_gc("t")
        assert gc is not None
        state = real_store.read_state("t", "coder", gc.members["coder"].id)
        state.superstep, state.epoch, state.attempt = 1, 1, 2
        real_store.write_lc(state)  # current, but no vote
        assert [] == feed.wait(0.5)
    finally:
        feed.close()


def test_a_push_that_does_not_open_with_its_votes_checksum_is_not_taken(
    real_store: CheckpointStore, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """Bytes that are not the LC the vote names give nothing; the barrier reads the LC."""
    _started(real_store, "t")
    models = lambda spec: ScriptedModel(spec.script)  # noqa: E731 - the step's factory
    ref = run_step("t", "coder", 1, 1, 1, store=real_store, cache=tmp_path, models=models).lc
    data = real_store.hot.read_lcs("t", [ref.id])[ref.id]
    assert pushed_outputs(real_store, PushedVote("t", "coder", 1, 1, ref, data)) is not None
    damaged = data[:-1] + bytes([data[-1] ^ 1])
    assert pushed_outputs(real_store, PushedVote("t", "coder", 1, 1, ref, damaged)) is None
    other = ref.model_copy(update={"checksum": "0" * 64})
    assert pushed_outputs(real_store, PushedVote("t", "coder", 1, 1, other, data)) is None


def test_a_feed_outlives_a_restart_of_redis(own_redis: RedisServer) -> None:
    """While Redis is down a wait raises nothing and waits; once back, votes are heard."""
    client = redis.Redis.from_url(own_redis.url)
    feed = VoteFeed(client)
    try:
        feed.listen()
        own_redis.kill()
        started = time.monotonic()
        assert [] == feed.wait(0.2)
        assert time.monotonic() - started >= 0.2  # waited as a poll would, not spun
        own_redis.start()
        deadline = time.monotonic() + 10
        heard: list[PushedVote] = []
        while not heard:
            assert time.monotonic() < deadline, "the feed never listened again"
            feed.listen()
            client.publish("cairn:votes", b"t\tcoder\t1\t2\tlc\tsum\nbytes")
            heard = feed.wait(0.2)
        assert ("t", "coder", 1, 2) == (heard[0].task, heard[0].agent, heard[0].epoch,
                                        heard[0].superstep)  # fmt: skip
    finally:
        feed.close()
        client.close()


def test_a_leader_commits_as_the_last_vote_lands_not_at_its_poll(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A coordinator polling every 30 s still drives a task of many supersteps to its end.

    Only the pushed votes can wake it between its polls: without them the task would be
    at its second superstep when the test gives up.
    """
    cluster.start_worker()
    cluster.start_worker()
    task = cluster.tasks.submit(team_spec(tmp_path / "ledger"))
    stop = threading.Event()
    runner = threading.Thread(target=cluster.coordinator.run, args=(stop, 30.0), daemon=True)
    runner.start()
    try:
        deadline = time.monotonic() + 25
        while not cluster.tasks.status(task).ended:
            assert time.monotonic() < deadline, cluster.status(task)
            time.sleep(0.1)
    finally:
        stop.set()
        runner.join(timeout=40)
    assert "succeeded" == cluster.status(task)["status"]
    gc = cluster.store.latest_gc(task)
    assert gc is not None
    assert gc.superstep >= 3


def test_a_user_the_acl_denies_the_channel_still_votes(
    own_redis: RedisServer, tmp_path: Path
) -> None:
    """Without `&cairn:votes` (Redis 7's default for a new user) a vote is still recorded."""
    admin = redis.Redis.from_url(own_redis.url)
    admin.acl_setuser("worker", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all"],
                      reset_channels=True)  # fmt: skip
    host, port = own_redis.url.removeprefix("redis://").split("/")[0].rsplit(":", 1)
    client = connect(f"redis://worker:pw@{host}:{port}/0")
    try:
        store = CheckpointStore(RedisHotStore(client), DiskArchive(tmp_path / "a"), Codec())
        _started(store, "t")
        models = lambda spec: ScriptedModel(spec.script)  # noqa: E731 - the step's factory
        ref = run_step("t", "coder", 1, 1, 1, store=store, cache=tmp_path, models=models).lc
        assert {"coder": ref} == store.hot.get_votes("t", 1, 1)
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.publish("cairn:votes", b"x")  # the channel is denied indeed
    finally:
        client.close()
        admin.close()
