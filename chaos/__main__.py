"""`python -m chaos [--seeds N] [--seed S]`: the seeded chaos suite (`make chaos`).

First a fault-free run of the team gives the expected result; then one run per seed
(S, S+1, …, S+N-1) injects that seed's faults and is checked against it. Prints the
table; exits 1 when any invariant was violated (or the fault-free run was not clean).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from chaos.faults import Plan, draw
from chaos.report import table
from chaos.run import ChaosRun, RunResult

TIMEOUT = 180.0  # seconds a run may take before its task counts as stuck
HORIZON = 8.0  # faults land within this many seconds of the submission


def main(argv: list[str] | None = None) -> int:
    """Run the session; return the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=200, help="how many runs (default 200)")
    parser.add_argument("--seed", type=int, default=1, help="the first seed (default 1)")
    parser.add_argument("--keep", action="store_true", help="keep every run's directory")
    args = parser.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so every run's processes, Redis and mounts are cleaned up.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    can_mount = os.geteuid() == 0 and shutil.which("mount") is not None
    root = Path(tempfile.mkdtemp(prefix="cairn-chaos-"))
    ledger = root / "ledger"
    print(f"chaos: seeds {args.seed}..{args.seed + args.seeds - 1}, runs in {root}", flush=True)
    started = time.monotonic()
    reference = ChaosRun(Plan(0, "async", 2), root / "fault-free", ledger, TIMEOUT, False)
    baseline = reference.execute(None)
    if baseline.violations or baseline.observed.status != "succeeded":
        print(table([baseline], "the fault-free run failed; see " + str(root)))
        return 1
    print(f"fault-free run: {baseline.seconds:.1f} s, {len(baseline.observed.gcs)} GCs",
          flush=True)  # fmt: skip
    results: list[RunResult] = []
    broken: list[str] = []  # runs the harness itself could not finish
    for seed in range(args.seed, args.seed + args.seeds):
        plan = draw(seed, HORIZON, can_mount)
        run = ChaosRun(plan, root / f"seed-{seed}", ledger, TIMEOUT, can_mount)
        try:
            result = run.execute(baseline.observed)
        except Exception as exc:  # noqa: BLE001 - one run's harness failure ends no session
            broken.append(f"seed {seed}: the harness failed: {type(exc).__name__}: {exc}")
            print(broken[-1], flush=True)
            continue
        results.append(result)
        kinds = ", ".join(f.kind for f in plan.faults)
        verdict = "ok" if not result.violations else f"{len(result.violations)} VIOLATIONS"
        skipped = f"; not injected: {'; '.join(result.skipped)}" if result.skipped else ""
        shape = f"{plan.durability}; {plan.workers}x{plan.concurrency} workers"
        print(f"seed {seed}: {verdict} in {result.seconds:.1f} s ({shape}; {kinds})"
              + skipped, flush=True)  # fmt: skip
        if result.violations:  # said now, and kept beside the run, not only in the summary
            found = [f"  {v.invariant}: {v.detail}" for v in result.violations]
            print("\n".join(found), flush=True)
            (run.dir / "violations.txt").write_text("\n".join(found) + "\n")
        elif not args.keep:
            shutil.rmtree(run.dir, ignore_errors=True)
    print()
    print(table(results, "make chaos SEED={seed}"))
    for line in broken:
        print(f"\n{line} (its directory is kept; replay: make chaos SEED={line.split()[1][:-1]})")
    failed = bool(broken) or any(r.violations for r in results)
    if failed or args.keep:
        print(f"\n{time.monotonic() - started:.0f} s in all; runs kept in {root}")
    else:
        print(f"\n{time.monotonic() - started:.0f} s in all")
        shutil.rmtree(root, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
