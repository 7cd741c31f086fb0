"""The soak's pass/fail criteria: pure functions of the minute samples and the ended tasks.

A criterion compares the judged samples (the minutes after the warm-up) in two halves,
earlier and later, so a steady series passes whatever its noise does between minutes,
and one that keeps rising fails once it has risen by the tolerance. The faults come in a
fixed round (one a minute), and each leaves its own mark on a minute (a replaced worker
holds fewer descriptors while it starts): the judged minutes are the last whole rounds,
an even number of them, so each half holds every fault equally often.

- Redis `used_memory` and its key count (DBSIZE): later mean within ±10% of earlier;
- the summed VmRSS of the Cairn processes: within ±10%;
- their summed open descriptors: the later mean at most 2 + 5% above the earlier
  (a socket in flight), so any steady growth fails;
- steps/s: within ±20%, and no judged minute under half the judged median (a stall);
- what an ended task leaves (its Redis keys by kind, its archive's bytes) must not grow
  with the task's length: the mean over the longest third of the ended tasks at most
  10% (+1 key) above the shortest third's for each key kind, 25% for the archive's
  bytes (blobs younger than the hot trim's skew margin are reported, not judged); and no
  task's archive holds more than `cold_keep` plus the archiver's slack GCs;
- every task that ended succeeded, and none went a `STUCK_S` without a superstep.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

WARMUP = 1 / 3  # of the minutes: caches, pools and Redis fill to their steady size
LEVEL = 0.10  # Redis memory, Redis keys and RSS: later half within ±10% of the earlier
RATE = 0.20  # steps/s: within ±20%
STALL = 0.5  # no judged minute under half the judged median steps/s
FDS_SLACK, FDS_SHARE = 2.0, 0.05  # descriptors: later mean <= earlier + 2 + 5%
KEYS_SHARE, KEYS_SLACK = 0.10, 1.0  # an ended task's keys of one kind, long vs short
ARCHIVE_SHARE = 0.25  # an ended task's archive bytes, long vs short
STUCK_S = 120.0  # seconds without a new superstep: a task is stuck
# A kind of key named with this is reported, not judged: blobs the hot trim spares for
# its clock-skew margin (300 s) leave at a later trim, and a soak's task ends sooner.
YOUNG = " (within the trim's skew margin)"


@dataclass(frozen=True, slots=True)
class Minute:
    """One row of the soak's table: what was measured at the end of a minute."""

    minute: int
    used_memory: int
    keys: int
    rss: int  # VmRSS of every Cairn process, summed (bytes)
    fds: int  # open descriptors of every Cairn process, summed
    archive: int  # bytes of the archive directory
    steps_per_s: float


@dataclass(frozen=True, slots=True)
class Ended:
    """What one ended task left behind: its length, status, Redis keys by kind, archive."""

    task: str
    supersteps: int
    status: str
    keys: dict[str, int]
    archive_bytes: int
    archive_gcs: int


@dataclass(slots=True)
class Verdict:
    """Every criterion's result: `failed` names each that failed, with the figures."""

    passed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # too few samples to judge

    @property
    def ok(self) -> bool:
        """True when no criterion failed."""
        return not self.failed

    def add(self, ok: bool, line: str) -> None:
        """Record one criterion's result."""
        (self.passed if ok else self.failed).append(line)


def judged(minutes: Sequence[Minute], warmup: float = WARMUP, cycle: int = 1) -> list[Minute]:
    """The judged minutes, each half holding every fault of a round equally often.

    After the warm-up (at least the first minute), the last `2k` whole rounds of `cycle`
    minutes, or all of them when they hold fewer than two rounds.
    """
    rest = list(minutes[max(1, round(len(minutes) * warmup)) :])
    whole = len(rest) // (2 * cycle) * 2 * cycle
    return rest[len(rest) - whole :] if whole else rest


def least_minutes(cycle: int, warmup: float = WARMUP) -> int:
    """The shortest soak whose judged minutes hold two whole rounds of `cycle` faults."""
    minutes = 2 * cycle
    while minutes - max(1, round(minutes * warmup)) < 2 * cycle:
        minutes += 1
    return minutes


def halves(values: Sequence[float]) -> tuple[float, float]:
    """The means of the earlier and the later half (the middle one, if odd, in neither)."""
    half = len(values) // 2
    return statistics.fmean(values[:half]), statistics.fmean(values[-half:])


def check_level(name: str, values: Sequence[float], share: float, verdict: Verdict) -> None:
    """Later half's mean within ±`share` of the earlier half's."""
    early, late = halves(values)
    drift = late / early - 1 if early else (0.0 if not late else float("inf"))
    verdict.add(
        abs(drift) <= share,
        f"{name}: {drift:+.1%} from the earlier half to the later (limit ±{share:.0%}; "
        f"means {early:,.1f} → {late:,.1f})",
    )


def check_minutes(
    minutes: Sequence[Minute], verdict: Verdict, warmup: float = WARMUP, cycle: int = 1
) -> None:
    """The criteria on the minute series, `cycle` faults a round (see the module's docstring)."""
    rows = judged(minutes, warmup, cycle)
    if len(rows) < 2:
        verdict.skipped.append(f"the minute series: {len(rows)} judged minute(s), 2 needed")
        return
    series: list[tuple[str, Callable[[Minute], float], float]] = [
        ("Redis used_memory", lambda m: m.used_memory, LEVEL),
        ("Redis keys", lambda m: m.keys, LEVEL),
        ("VmRSS of the Cairn processes", lambda m: m.rss, LEVEL),
        ("steps/s", lambda m: m.steps_per_s, RATE),
    ]
    for name, read, share in series:
        check_level(name, [read(m) for m in rows], share, verdict)
    early, late = halves([m.fds for m in rows])
    bound = early + FDS_SLACK + FDS_SHARE * early
    verdict.add(
        late <= bound,
        f"open descriptors: later mean {late:.1f}, earlier {early:.1f} (limit {bound:.1f})",
    )
    median = statistics.median(m.steps_per_s for m in rows)
    slowest = min(rows, key=lambda m: m.steps_per_s)
    verdict.add(
        slowest.steps_per_s >= STALL * median,
        f"no stall: slowest judged minute {slowest.minute} at {slowest.steps_per_s:.1f} "
        f"steps/s (limit >= {STALL:.0%} of the median {median:.1f})",
    )


def thirds(ended: Sequence[Ended]) -> tuple[list[Ended], list[Ended]]:
    """The shortest and the longest third of `ended`, by supersteps."""
    ordered = sorted(ended, key=lambda e: e.supersteps)
    third = len(ordered) // 3
    return ordered[:third], ordered[-third:]


def check_ended(
    ended: Sequence[Ended], cold_bound: int, verdict: Verdict, stuck: Sequence[str] = ()
) -> None:
    """The criteria on the ended tasks (see the module's docstring)."""
    bad = [f"{e.task} {e.status}" for e in ended if e.status != "succeeded"]
    verdict.add(not bad, f"every ended task succeeded: {len(ended) - len(bad)} of {len(ended)}"
                + (f" (not: {', '.join(bad[:5])})" if bad else ""))  # fmt: skip
    verdict.add(not stuck, "no task stuck" + (f": {', '.join(stuck[:5])}" if stuck else ""))
    fat = [f"{e.task} ({e.archive_gcs})" for e in ended if e.archive_gcs > cold_bound]
    verdict.add(not fat, f"GCs in an ended task's archive <= {cold_bound}"
                + (f" (not: {', '.join(fat[:5])})" if fat else ""))  # fmt: skip
    short, long = thirds(ended)
    if len(short) < 2 or short[-1].supersteps >= long[0].supersteps:
        verdict.skipped.append(
            f"growth with a task's length: {len(ended)} ended task(s) of too few lengths"
        )
        return
    span = f"{statistics.fmean(e.supersteps for e in short):.0f} vs " \
           f"{statistics.fmean(e.supersteps for e in long):.0f} supersteps"  # fmt: skip
    for kind in sorted({k for e in ended for k in e.keys}):
        few = statistics.fmean(e.keys.get(kind, 0) for e in short)
        many = statistics.fmean(e.keys.get(kind, 0) for e in long)
        bound = few * (1 + KEYS_SHARE) + KEYS_SLACK
        if kind.endswith(YOUNG):
            verdict.skipped.append(f"keys '{kind}': {few:.1f} (short) vs {many:.1f} (long)")
            continue
        verdict.add(
            many <= bound,
            f"keys '{kind}' an ended task leaves: {few:.1f} (short) vs {many:.1f} (long), "
            f"{span} (limit {bound:.1f})",
        )
    few = statistics.fmean(e.archive_bytes for e in short)
    many = statistics.fmean(e.archive_bytes for e in long)
    verdict.add(
        many <= few * (1 + ARCHIVE_SHARE),
        f"archive bytes of an ended task: {few:,.0f} (short) vs {many:,.0f} (long), {span} "
        f"(limit +{ARCHIVE_SHARE:.0%})",
    )
