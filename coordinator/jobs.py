"""The functions RQ workers run for Cairn; a Cairn worker runs no other.

Jobs carry only JSON (RQ's JSON serializer): names and numbers. A job builds its store
from the environment once per process (`CAIRN_REDIS_URL`, `CAIRN_ARCHIVE_DIR`,
`CAIRN_CACHE_DIR`) and reports why a step ended without a vote in the task's `outcomes`
hash, so the coordinator can tell a fatal model error from a crash.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import redis
import structlog

from agents.step import run_step
from coordinator import metrics
from storage import keys
from storage.backends.disk import DiskArchive
from storage.backends.redis import RedisHotStore, connect
from storage.base import LCEntry
from storage.chain import AgentState
from storage.codec import Codec
from storage.errors import CairnError, FencedWrite, ModelError
from storage.records import LCRef, Level
from storage.store import CheckpointStore

STEPS_QUEUE = "cairn-steps"
CONTROL_QUEUE = "cairn-control"  # restores; workers serve it first
STEP_JOB = "coordinator.jobs.step_job"
ALLOWED_JOBS = frozenset({STEP_JOB, "coordinator.restore.stage_job"})

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Environment:
    """What a worker process needs to run steps."""

    redis: redis.Redis
    store: CheckpointStore
    cache: Path


def default_archive() -> Path:
    """The archive directory: `CAIRN_ARCHIVE_DIR`, else `.cairn/archive`."""
    return Path(os.environ.get("CAIRN_ARCHIVE_DIR", ".cairn/archive"))


def default_cache() -> Path:
    """Where workers keep workspace copies: `CAIRN_CACHE_DIR`, else `.cairn/cache`."""
    return Path(os.environ.get("CAIRN_CACHE_DIR", ".cairn/cache"))


def claim_slot(root: Path) -> Path:
    """Return a directory under `root` that no other live process holds, held until exit.

    Worker processes may share one `CAIRN_CACHE_DIR`; each takes the first free `slot-N`
    (an flock the kernel drops when the process dies), so two never work in one tree and
    a restarted worker inherits a dead one's warm files.
    """
    root.mkdir(parents=True, exist_ok=True)
    for n in itertools.count():
        slot = root / f"slot-{n}"
        slot.mkdir(exist_ok=True)
        fd = os.open(slot / ".lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        _HELD_SLOTS.append(fd)  # open for the process's life: the lock is the claim
        return slot
    raise AssertionError("unreachable")


_HELD_SLOTS: list[int] = []


@cache
def worker_slot() -> Path:
    """The cache slot of this process (`slot-N` under `CAIRN_CACHE_DIR`), claimed once."""
    return claim_slot(default_cache())


def serve_worker_metrics() -> None:
    """Serve this worker's metrics on `CAIRN_METRICS_PORT` + 1 + its slot, if a port is set."""
    base = metrics.configured_port()
    if base is not None:
        slot = int(worker_slot().name.removeprefix("slot-"))
        metrics.serve(metrics.worker_port(base, slot), "worker")


class MeteredHotStore(RedisHotStore):
    """Redis as the hot store, observing the size of each LC written."""

    def write_lc(self, entry: LCEntry, *, vote: bool = False) -> None:
        """Write as Redis does, then observe the sealed bytes' length."""
        super().write_lc(entry, vote=vote)
        metrics.LC_WRITE_BYTES.labels(entry.record.level.value).observe(entry.sealed.size)


class MeteredStore(CheckpointStore):
    """The checkpoint store, observing how long each LC write takes (fenced ones aside)."""

    def write_lc(
        self, state: AgentState, level: Level = Level.STEP, *, vote: bool = False
    ) -> LCRef:
        """Write as the store does, timed."""
        started = time.perf_counter()
        ref = super().write_lc(state, level, vote=vote)
        metrics.LC_WRITE_SECONDS.labels(level.value).observe(time.perf_counter() - started)
        return ref


@cache
def environment() -> Environment:
    """Build the process's store from the environment, once (and serve its metrics)."""
    url = os.environ.get("CAIRN_REDIS_URL")
    if not url:
        raise CairnError("CAIRN_REDIS_URL is not set: a worker needs to know its Redis")
    client = connect(url)
    store = MeteredStore(MeteredHotStore(client), DiskArchive(default_archive()), Codec.from_env())
    serve_worker_metrics()
    return Environment(client, store, worker_slot())


def record_outcome(
    client: redis.Redis,
    task: str,
    agent: str,
    superstep: int,
    epoch: int,
    attempt: int,
    kind: str,
    message: str,
) -> None:
    """Say why an attempt ended without a vote: `retryable`, `fatal` or `fenced`."""
    value = json.dumps({"attempt": attempt, "kind": kind, "message": message[:500]})
    client.hset(keys.outcomes(task, epoch, superstep), agent, value)


def step_job(task: str, agent: str, superstep: int, epoch: int, attempt: int) -> str:
    """Run one attempt of one step; return the agent's status after it.

    A fenced attempt (a zombie, or one the coordinator gave up on) stops quietly. A model
    error or any other Cairn error is recorded, then raised, so RQ marks the job failed.
    """
    env = environment()
    where = (env.redis, task, agent, superstep, epoch, attempt)
    try:
        result = run_step(task, agent, superstep, epoch, attempt, store=env.store, cache=env.cache)
    except FencedWrite as exc:
        record_outcome(*where, "fenced", str(exc))
        log.info("attempt fenced", task=task, agent=agent, reason=str(exc))
        return "fenced"
    except ModelError as exc:
        record_outcome(*where, "retryable" if exc.retryable else "fatal", str(exc))
        raise
    except CairnError as exc:
        record_outcome(*where, "fatal", f"{type(exc).__name__}: {exc}")
        raise
    return result.status.value
