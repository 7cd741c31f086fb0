"""The Redis connection Cairn makes, and the hot store across a Redis restart."""

from __future__ import annotations

from pathlib import Path

from storage.backends.disk import DiskArchive
from storage.backends.redis import RedisHotStore, connect
from storage.codec import Codec
from storage.redis_server import RedisServer
from storage.store import CheckpointStore
from tests.factories import read_gc_whole, run_task


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
