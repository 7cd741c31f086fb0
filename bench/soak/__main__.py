"""`python -m bench.soak [--minutes N] [--keep DIR]`: soak, print a row a minute, judge.

`SOAK_MINUTES` (default 20) is the length when `--minutes` is not given. Exits 0 when
every criterion of `bench.soak.verdict` holds, 1 naming each that failed, 2 on bad
arguments.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from bench.report import size
from bench.soak import run as soak
from bench.soak.verdict import (
    WARMUP,
    Minute,
    Verdict,
    check_ended,
    check_minutes,
    judged,
    least_minutes,
)

MiB = 1024 * 1024
COLUMNS = ("min", "used_memory", "keys", "rq keys", "RSS", "fds", "archive", "steps/s",
           "ended", "processes (VmRSS MiB/fds)", "fault")  # fmt: skip
WIDTHS = (3, 11, 6, 7, 9, 4, 9, 7, 5, 0, 0)


def row_line(cells: list[str]) -> str:
    """One line of the table: the fixed columns right-aligned, the last two as they are."""
    return "  ".join(c.rjust(w) if w else c for c, w in zip(cells, WIDTHS, strict=True))


def main(argv: list[str]) -> int:
    """Run one soak; return the exit status."""
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__)
    parser.add_argument("--minutes", type=int, default=int(os.environ.get("SOAK_MINUTES", "20")))
    parser.add_argument("--keep", type=Path, help="run in DIR and keep it (logs, archive)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    least = least_minutes(len(soak.FAULTS))
    if args.minutes < least:
        parser.error(f"--minutes: at least {least} (a warm-up, then two rounds of the "
                     f"{len(soak.FAULTS)} faults to compare)")  # fmt: skip
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        return play(args.keep, args.minutes, args.seed)
    with tempfile.TemporaryDirectory(prefix="cairn-soak-") as directory:
        return play(Path(directory), args.minutes, args.seed)


def play(directory: Path, minutes: int, seed: int) -> int:
    """Soak in `directory`, print the table and the verdict; return the exit status."""
    print(
        f"soak: {minutes} min; {soak.TASKS} tasks at once of {soak.TEAM} scripted agents at "
        f"{soak.LATENCY:g} s a turn, {soak.SUPERSTEPS[0]}-{soak.SUPERSTEPS[1]} supersteps each, "
        f"hot_keep {soak.HOT_KEEP}, cold_keep {soak.COLD_KEEP}; {soak.WORKERS} workers x "
        f"{soak.CONCURRENCY} lanes, 2 coordinators; a fault a minute ({', '.join(soak.FAULTS)}"
        f"); warm-up: the first {WARMUP:.0%} of the minutes; in {directory}",
        flush=True,
    )
    print(row_line(list(COLUMNS)), flush=True)
    runner = soak.Soak(directory, minutes, seed)

    def show(row: Minute, processes: list[soak.Process], rq: int, fault: str) -> None:
        each = " ".join(f"{p.name.replace('coordinator', 'c').replace('worker', 'w')} "
                        f"{p.rss / MiB:.0f}/{p.fds}" for p in processes)  # fmt: skip
        print(row_line([str(row.minute), size(row.used_memory), str(row.keys), str(rq),
                        size(row.rss), str(row.fds), size(row.archive),
                        f"{row.steps_per_s:.1f}", str(len(runner.ended)), each, fault]),
              flush=True)  # fmt: skip

    rows = runner.run(show)
    verdict = Verdict()
    cycle = len(soak.FAULTS)
    check_minutes(rows, verdict, cycle=cycle)
    check_ended(runner.ended, soak.cold_bound(), verdict, runner.stuck)
    first = judged(rows, cycle=cycle)[0].minute
    print(f"\n{runner.submitted} tasks submitted, {len(runner.ended)} ended and removed from "
          f"Redis; judged minutes {first}..{rows[-1].minute}")  # fmt: skip
    for line in verdict.passed:
        print(f"pass: {line}")
    for line in verdict.skipped:
        print(f"not judged: {line}")
    for line in verdict.failed:
        print(f"FAIL: {line}")
    print("soak: PASSED" if verdict.ok else f"soak: FAILED ({len(verdict.failed)} criteria)")
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
