"""The table a chaos session prints: runs, faults by kind, violations by invariant, seeds."""

from __future__ import annotations

from collections import Counter

from chaos.checker import INVARIANTS
from chaos.faults import KINDS
from chaos.run import RunResult


def table(results: list[RunResult], replay: str) -> str:
    """Render the session's results; `replay` is the command, with {seed} to fill in."""
    faults: Counter[str] = Counter()
    violations: Counter[str] = Counter()
    for result in results:
        faults.update(result.history.faults)
        violations.update(v.invariant for v in result.violations)
    failed = [r for r in results if r.violations]
    seconds = sum(r.seconds for r in results)
    width = max(len(k) for k in [*KINDS, *INVARIANTS])
    lines = [
        f"chaos: {len(results)} runs, {len(failed)} failed, {seconds:.0f} s of tasks",
        "",
        f"{'fault':<{width}}  injected",
        *(f"{kind:<{width}}  {faults[kind]:>8}" for kind in KINDS),
        "",
        f"{'invariant':<{width}}  violations",
        *(f"{name:<{width}}  {violations[name]:>10}" for name in INVARIANTS),
        "",
        "also seen: "
        f"{sum(r.history.fenced for r in results)} zombie attempts refused, "
        f"{sum(len(r.history.restores) for r in results)} restores, "
        f"{sum(r.observed.ledger_calls - len(r.observed.ledger) for r in results)} repeated "
        "side effects absorbed by their idempotency key",
    ]
    for result in failed:
        lines.append("")
        lines.append(
            f"seed {result.plan.seed} FAILED (task {result.task}); replay: "
            + replay.format(seed=result.plan.seed)
        )
        lines += [f"  {v.invariant}: {v.detail}" for v in result.violations]
    return "\n".join(lines)
