"""Fixtures: a private redis-server per session (flushed per test), stores of every kind."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import structlog

from cairn.agents.logs import RecordHandler
from cairn.agents.sandbox import UNSANDBOXED, process_sandbox, use_sandbox
from cairn.storage.backends.disk import DiskArchive
from cairn.storage.backends.memory import MemoryArchive, MemoryHotStore
from cairn.storage.backends.redis import RedisHotStore, connect
from cairn.storage.base import ColdArchive, HotStore
from cairn.storage.codec import Codec
from cairn.storage.store import CheckpointStore
from cairn.testing.redis_server import RedisServer
from tests import langgraph_suite
from tests.cluster import Cluster

# LangGraph's suite on CairnSaver, started at the session's start (`on_cairn` below).
LANGGRAPH_SUITE = pytest.StashKey[langgraph_suite.Running]()
LOWEST_PRIORITY = 19  # nice: it takes only the CPU Cairn's own tests leave idle


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start LangGraph's suite in the background if a test selected reads its run.

    It takes about 70 s of CPU; Cairn's own tests spend much of their time waiting on
    the processes they start, so run at the lowest priority beside them it costs the
    session little wall time, and them little CPU. One that cannot start (the suite not
    fetched) is left to the test, which says why.
    """
    if any("on_cairn" in getattr(item, "fixturenames", ()) for item in session.items):
        try:
            running = langgraph_suite.start("cairn", nice=LOWEST_PRIORITY)
        except langgraph_suite.SuiteError:
            return
        session.config.stash[LANGGRAPH_SUITE] = running


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop LangGraph's suite if no test waited for it (a session cut short)."""
    running = session.config.stash.get(LANGGRAPH_SUITE, None)
    if running is not None:
        running.stop()


@pytest.fixture(autouse=True)
def _logging_restored() -> Iterator[None]:
    """Give every test the logging set-up the last one found (commands reconfigure it)."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)
    for handler in logging.root.handlers[:]:
        if isinstance(handler, RecordHandler):  # `configure_logging`'s, on the test's stream
            logging.root.removeHandler(handler)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One private redis-server (AOF on) for the session; never the one on port 6379."""
    server = RedisServer(tmp_path_factory.mktemp("redis"), appendonly=True).start()
    yield server
    server.stop()


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A client of the session's server, flushed before the test."""
    client = connect(redis_server.url)
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of the test's own, for tests that kill or restart it."""
    server = RedisServer(tmp_path / "own-redis", appendonly=True).start()
    yield server
    server.kill()


@pytest.fixture(params=["memory", "redis"])
def hot(request: pytest.FixtureRequest) -> HotStore:
    """Each hot store: the in-memory twin and Redis."""
    if request.param == "memory":
        return MemoryHotStore()
    client: redis.Redis = request.getfixturevalue("redis_client")
    return RedisHotStore(client)


@pytest.fixture(params=["memory", "disk"])
def cold(request: pytest.FixtureRequest, tmp_path: Path) -> ColdArchive:
    """Each cold archive: the in-memory twin and a directory on disk."""
    if request.param == "memory":
        return MemoryArchive()
    return DiskArchive(tmp_path / "archive")


@pytest.fixture
def store(hot: HotStore, cold: ColdArchive) -> CheckpointStore:
    """A checkpoint store over every combination of hot and cold backends."""
    return CheckpointStore(hot, cold, Codec(), full_every=5)


@pytest.fixture
def real_store(redis_client: redis.Redis, tmp_path: Path) -> CheckpointStore:
    """Redis and disk, what users run: the store every guarantee is shown on."""
    return CheckpointStore(
        RedisHotStore(redis_client), DiskArchive(tmp_path / "archive"), Codec(), full_every=20
    )


@pytest.fixture
def own_store(own_redis: RedisServer, tmp_path: Path) -> Iterator[CheckpointStore]:
    """A checkpoint store on the test's own redis-server (which the test may kill)."""
    client = connect(own_redis.url)
    yield CheckpointStore(RedisHotStore(client), DiskArchive(tmp_path / "archive"), Codec())
    client.close()


@pytest.fixture
def unsandboxed() -> Iterator[None]:
    """Agents' commands run bare in this process for the test (as `CAIRN_SANDBOX=off`).

    For tests whose commands stand for the world outside: they write a ledger beside the
    workspace, or kill their own worker, which a sandboxed command cannot.
    """
    before = process_sandbox()
    use_sandbox(UNSANDBOXED)
    yield
    use_sandbox(before)


@pytest.fixture
def cluster(own_redis: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    """A private Redis with a coordinator; the test starts the workers it wants."""
    built = Cluster(own_redis, tmp_path)
    yield built
    built.close()
