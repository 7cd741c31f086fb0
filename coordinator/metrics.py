"""Cairn's Prometheus metrics: every metric is defined here, and served from here.

Set `CAIRN_METRICS_PORT` (the CLI's `--metrics-port`) and each process serves
`http://HOST:PORT/metrics`:

- the coordinator process (`python -m cairn.coordinator`, `cairn coordinator`, the one
  `cairn up` starts) on PORT itself;
- each worker process on PORT + 1 + N, N being the `slot-N` cache directory the worker
  claimed (`cairn.coordinator.slots.claim_slot`), so `cairn worker --count 3` on one host serves
  on PORT + 1, PORT + 2 and PORT + 3 and no two live workers collide. A restarted worker
  takes a dead one's slot, hence its port.

Workers observe the LC histograms through the metered store they open
(`open_store(settings, client, metered=True)`: `MeteredStore` over `MeteredHotStore`).
A port already in use is one warning in the process's log, and the process runs on
without an endpoint. With no port set nothing is served; the counters and histograms are
still updated (in memory, no Redis round trip), which costs nothing that matters.

Metrics (`name{labels}` kind: what, where it is counted):

- `cairn_lc_write_seconds{level}` histogram: time to cut, seal and store an LC, `level`
  step or tool (workers);
- `cairn_lc_write_bytes{level}` histogram: the LC's sealed (stored) size (workers);
- `cairn_gc_commits_total` counter: GCs committed: GC 0 of a submission, supersteps,
  verify barriers; not restores (coordinator, and `cairn submit` for GC 0);
- `cairn_gc_aborts_total` counter: supersteps given up (coordinator);
- `cairn_restores_total{outcome}` counter: restores ending `restored` (to the GC asked
  for, or the latest), `fallback` (to an older one) or `unrecoverable` (whoever restores);
- `cairn_step_retries_total` counter: step attempts retried (coordinator);
- `cairn_model_tokens_total{kind}` counter: tokens of model calls, `kind` prompt,
  completion or cached (a part of prompt), retried and replayed calls included (workers);
- `cairn_model_cost_usd_total` counter: what they cost at the tasks' prices (workers);
- `cairn_queue_depth{queue}` gauge: jobs waiting on `cairn-steps` and `cairn-control`
  (coordinator, read when scraped);
- `cairn_live_workers` gauge: RQ workers registered on Cairn's queues whose worker key
  is alive (coordinator, read when scraped).

The two gauges are read from Redis when Prometheus scrapes (one round trip for the
queues and registries, one for the worker keys), never on the coordinator's loop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from functools import cache

import redis
from prometheus_client import REGISTRY, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from rq import Queue
from rq.worker_registration import WORKERS_BY_QUEUE_KEY

from cairn.agents.logs import get_logger
from cairn.storage.backends.redis import RedisHotStore
from cairn.storage.base import LCEntry
from cairn.storage.chain import WorkingState
from cairn.storage.records import LCRef, Level, Usage
from cairn.storage.store import CheckpointStore

log = get_logger(__name__)

QUEUES = ("cairn-steps", "cairn-control")  # cairn.coordinator.jobs' names (no import: no cycle)
MAX_PORT = 65_535

LC_WRITE_SECONDS = Histogram(
    "cairn_lc_write_seconds",
    "Time to write a local checkpoint (cut, seal, fenced store in Redis).",
    ["level"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
LC_WRITE_BYTES = Histogram(
    "cairn_lc_write_bytes",
    "Size of a written local checkpoint as stored (sealed bytes).",
    ["level"],
    buckets=tuple(float(4**k) for k in range(4, 14)),  # 256 B .. 64 MiB
)
GC_COMMITS = Counter("cairn_gc_commits", "Global checkpoints committed by this coordinator.")
GC_ABORTS = Counter("cairn_gc_aborts", "Supersteps aborted (their GC given up) by this process.")
RESTORES = Counter(
    "cairn_restores",
    "Coordinated restores: to the GC asked for, to an older one, or none possible.",
    ["outcome"],
)
STEP_RETRIES = Counter("cairn_step_retries", "Step attempts retried by this coordinator.")
MODEL_TOKENS = Counter(
    "cairn_model_tokens", "Tokens of the model calls this worker made, by kind.", ["kind"]
)
MODEL_COST = Counter("cairn_model_cost_usd", "US dollars of those calls, at the tasks' prices.")

_lock = threading.Lock()
_served: set[str] = set()  # roles whose endpoint this process started (or tried to)


def serve(port: int, role: str) -> bool:
    """Serve the metrics on `port` (all interfaces), once per process and role.

    Returns whether the endpoint is up; a port in use, or out of range, is one warning.
    """
    with _lock:
        if role in _served:
            return False
        _served.add(role)
    if not 1 <= port <= MAX_PORT:
        log.warning("metrics not served: port out of range", role=role, port=port)
        return False
    try:
        start_http_server(port)
    except OSError as exc:
        log.warning("metrics not served: port unavailable", role=role, port=port, error=str(exc))
        return False
    log.info("metrics served", role=role, port=port)
    return True


class RedisCollector(Collector):
    """Queue depths and live workers, read from Redis when scraped."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """Yield the gauges (none when Redis cannot be read: the scrape still succeeds)."""
        try:
            depths, workers = self._read()
        except redis.RedisError as exc:
            log.warning("metrics: redis unreadable", error=str(exc))
            return
        depth = GaugeMetricFamily("cairn_queue_depth", "Jobs waiting in a queue.", labels=["queue"])
        for name, count in depths.items():
            depth.add_metric([name], count)
        yield depth
        yield GaugeMetricFamily(
            "cairn_live_workers", "RQ workers alive on Cairn's queues.", value=workers
        )

    def _read(self) -> tuple[dict[str, int], int]:
        with self.client.pipeline(transaction=False) as batch:
            for name in QUEUES:
                batch.llen(Queue.redis_queue_namespace_prefix + name)
                batch.smembers(WORKERS_BY_QUEUE_KEY % name)  # RQ's registry of a queue's workers
            replies = batch.execute()
        depths = {name: int(replies[2 * i]) for i, name in enumerate(QUEUES)}
        registered: set[bytes] = set().union(*(replies[2 * i + 1] for i in range(len(QUEUES))))
        if not registered:
            return depths, 0
        names = sorted(registered)
        with self.client.pipeline(transaction=False) as batch:
            for key in names:
                batch.exists(key)  # a SIGKILLed worker stays registered until its key expires
            alive = sum(int(x) for x in batch.execute())
        return depths, alive


def serve_coordinator(client: redis.Redis, port: int | None) -> bool:
    """Serve the coordinator's metrics (with the Redis gauges) on `port`, if one is set."""
    if port is None:
        return False
    with _lock:
        register = "collector" not in _served
        _served.add("collector")
    if register:
        REGISTRY.register(RedisCollector(client))
    return serve(port, "coordinator")


def worker_port(base: int, slot: int) -> int:
    """The port a worker in cache slot `slot` serves on: `base` + 1 + `slot`."""
    return base + 1 + slot


class MeteredHotStore(RedisHotStore):
    """Redis as the hot store, observing the size of each LC written."""

    def write_lc(self, entry: LCEntry, *, vote: bool = False) -> None:
        """Write as Redis does, then observe the sealed bytes' length."""
        super().write_lc(entry, vote=vote)
        LC_WRITE_BYTES.labels(entry.record.level.value).observe(entry.sealed.size)

    def write_first_lcs(self, entries: Iterable[LCEntry]) -> None:
        """Write as Redis does, then observe each LC's sealed bytes' length."""
        entries = list(entries)
        super().write_first_lcs(entries)
        for entry in entries:
            LC_WRITE_BYTES.labels(entry.record.level.value).observe(entry.sealed.size)

    def write_spawned_lcs(self, entries: Iterable[LCEntry], spawner: str, attempt: int) -> None:
        """Write as Redis does, then observe each LC's sealed bytes' length."""
        entries = list(entries)
        super().write_spawned_lcs(entries, spawner, attempt)
        for entry in entries:
            LC_WRITE_BYTES.labels(entry.record.level.value).observe(entry.sealed.size)

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
        """Count as Redis does; a call counted for the first time is counted here too."""
        answer = super().send_spend(task, agent, epoch, superstep, attempt, usage, call)

        def counted() -> bool:
            first = answer()
            if first:
                for kind in ("prompt", "completion", "cached"):
                    MODEL_TOKENS.labels(kind).inc(getattr(usage, f"{kind}_tokens"))
                MODEL_COST.inc(usage.cost_usd)
            return first

        return cache(counted)  # answered once, counted once


class MeteredStore(CheckpointStore):
    """The checkpoint store, observing how long each LC write takes (fenced ones aside)."""

    def write_lc(
        self,
        state: WorkingState,
        level: Level = Level.STEP,
        *,
        vote: bool = False,
        blobs: Iterable[bytes] = (),
        full: bool = False,
    ) -> LCRef:
        """Write as the store does, timed."""
        started = time.perf_counter()
        ref = super().write_lc(state, level, vote=vote, blobs=blobs, full=full)
        LC_WRITE_SECONDS.labels(level.value).observe(time.perf_counter() - started)
        return ref
