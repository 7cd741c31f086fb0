"""What every benchmark part shares: samples, percentiles, tables, targets, a private store."""

from __future__ import annotations

import contextlib
import gc
import math
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TypeVar

import redis
import structlog

from cairn.agents.logs import configure_logging
from cairn.coordinator.settings import Settings, open_store
from cairn.storage.backends.redis import connect
from cairn.storage.chain import DEFAULT_FULL_EVERY
from cairn.storage.store import CheckpointStore
from cairn.testing.redis_server import RedisServer

now_ns = time.perf_counter_ns
T = TypeVar("T")
QUICK_ENV = "CAIRN_BENCH_QUICK"  # set by `python -m bench --quick` before it imports a part


def quick() -> bool:
    """True in quick mode: every code path of every part runs, at sizes too small to judge."""
    return os.environ.get(QUICK_ENV) == "1"


def pick(full: T, small: T) -> T:
    """A part's size: `full`, or `small` in quick mode (read when the part is imported)."""
    return small if quick() else full


def clock(call: Callable[[], T]) -> tuple[T, int]:
    """Run `call` and return its result and nanoseconds taken.

    The garbage collector is paused while `call` runs, as `timeit` does: a collection
    walks every live object of the process, so when it lands is noise, not the cost of
    the call. Collections due run right after, untimed.
    """
    paused = gc.isenabled()
    gc.disable()
    try:
        started = now_ns()
        result = call()
        return result, now_ns() - started
    finally:
        if paused:
            gc.enable()


@dataclass(slots=True)
class Samples:
    """Durations of one operation, in nanoseconds."""

    ns: list[int] = field(default_factory=list)

    def add(self, ns: int) -> None:
        """Record one duration."""
        self.ns.append(ns)

    def __len__(self) -> int:
        return len(self.ns)

    def quantile(self, q: float) -> int:
        """Return the nearest-rank `q` quantile (0 < q <= 1)."""
        if not self.ns:
            raise ValueError("no samples")
        ordered = sorted(self.ns)
        return ordered[max(0, math.ceil(q * len(ordered)) - 1)]

    @property
    def p50(self) -> int:
        """The median."""
        return self.quantile(0.50)

    @property
    def p99(self) -> int:
        """The 99th percentile (nearest rank)."""
        return self.quantile(0.99)

    @property
    def mean(self) -> float:
        """The arithmetic mean."""
        return sum(self.ns) / len(self.ns)


def time_together(calls: Sequence[Callable[[], object]], n: int, warmup: int = 10) -> list[Samples]:
    """Time each call `n` times, taking turns, so all run under the same conditions.

    Each call first runs `warmup` times untimed.
    """
    for _ in range(warmup):
        for call in calls:
            call()
    gc.collect()
    samples = [Samples() for _ in calls]
    for _ in range(n):
        for call, into in zip(calls, samples, strict=True):
            into.add(clock(call)[1])
    return samples


def duration(ns: float) -> str:
    """Format nanoseconds with a unit that keeps three or four significant digits."""
    if ns < 1e3:
        return f"{ns:.0f} ns"
    if ns < 1e6:
        return f"{ns / 1e3:.1f} us"
    if ns < 1e9:
        return f"{ns / 1e6:.2f} ms"
    return f"{ns / 1e9:.2f} s"


def size(n: float) -> str:
    """Format a byte count."""
    if n < 10_000:
        return f"{n:,.0f} B"
    if n < 10_000_000:
        return f"{n / 1024:,.1f} KiB"
    return f"{n / 1024 / 1024:,.1f} MiB"


def ratio(value: float, baseline: float) -> str:
    """Format `value / baseline` as "1.23x"."""
    return f"{value / baseline:.2f}x" if baseline else "n/a"


def table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Print a titled table: the first column left-aligned, the others right-aligned."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]

    def line(cells: Sequence[str]) -> str:
        first, *rest = (
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )
        return "  ".join([first, *rest]).rstrip()

    print(f"\n{title}")
    print(line(headers))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print(line(row))


@dataclass(frozen=True, slots=True)
class Target:
    """A measurement of this run against the most it may be (None: reported only).

    Most are ratios against a baseline of the same run (`unit` "x"); a few are a
    difference from one, in milliseconds (`unit` "ms"), or a measure in its own unit
    ("MiB", "steps/s", ...; the scale part's).
    """

    name: str
    measured: float
    limit: float | None
    unit: str = "x"

    @property
    def met(self) -> bool | None:
        """Whether the target is met; None when there is no limit."""
        return None if self.limit is None else self.measured <= self.limit

    @property
    def verdict(self) -> str:
        """The verdict: met, NOT met, or info when there is no limit."""
        if self.met is None:
            return "info"
        return "met" if self.met else "NOT met"

    def show(self, value: float) -> str:
        """`value` in the target's unit: "1.23x" or "1.23 ms"."""
        return f"{value:.2f}x" if self.unit == "x" else f"{value:.2f} {self.unit}"

    def bound(self) -> str:
        """The limit as "<= 2x" or "<= 2 ms"; "-" when there is none."""
        if self.limit is None:
            return "-"
        return f"<= {self.limit:g}x" if self.unit == "x" else f"<= {self.limit:g} {self.unit}"

    def line(self) -> str:
        """One sentence: the target, the measured value and the verdict."""
        if self.limit is None:
            return f"{self.name}: {self.show(self.measured)} (no target; reported only)"
        return f"target: {self.name} {self.bound()}: {self.show(self.measured)}, {self.verdict}"

    def record(self, part: str) -> dict[str, object]:
        """The target as `python -m bench --json` prints it, one JSON object a line."""
        return {
            "part": part,
            "target": self.name,
            "limit": self.limit,
            "measured": self.measured,
            "unit": self.unit,
            "met": self.met,
        }

    def report(self) -> Target:
        """Print `line()` and return the target, for collecting into the summary."""
        print(self.line())
        return self


def summary(targets: Sequence[Target]) -> None:
    """Print every target of the run with its measured value and verdict."""
    rows = [[t.name, t.bound(), t.show(t.measured), t.verdict] for t in targets]
    table("Summary", ["target", "limit", "measured", "verdict"], rows)


def private_store(
    stack: contextlib.ExitStack, full_every: int = DEFAULT_FULL_EVERY, *, quiet: bool = False
) -> tuple[Path, RedisServer, redis.Redis, CheckpointStore]:
    """Set up what a part runs on, torn down by `stack`: directory, redis-server, store.

    The directory is temporary, the redis-server private (no AOF), the archive inside the
    directory. With `quiet`, Cairn's logs are still rendered (as JSON, so their cost
    counts) but into /dev/null.
    """
    root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="cairn-bench-")))
    if quiet:
        sink = stack.enter_context(open(os.devnull, "w"))  # noqa: PTH123, SIM115 - held by stack
        stack.callback(partial(structlog.configure, **structlog.get_config()))
        with contextlib.redirect_stderr(sink):
            configure_logging("json", "info")  # binds the sink as the log's stream
    server = RedisServer(root / "redis", appendonly=False)
    stack.callback(server.stop)
    server.start()
    client = stack.enter_context(connect(server.url))
    # Unsigned and unaudited whatever the environment says: what the reports describe.
    settings = Settings(archive_dir=root / "archive", signing_key=None, audit=False)
    store = open_store(settings, client, full_every=full_every)
    return root, server, client, store
