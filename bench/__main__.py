"""Run the benchmarks: `python -m bench` runs every part, `python -m bench storage` one.

A part is a module `bench.<name>` whose `run()` prints its tables and returns its targets.

  --quick  every part at small sizes and few repetitions (CI: `make bench QUICK=1`): it
           shows that each part runs to its end, not whether a target is met
  --json   print each target as one JSON line on stdout, {"part", "target", "limit",
           "measured", "unit", "met"} (unit: "x" for a ratio, "ms" for a difference, else
           the measure's own, such as "MiB"; met: true, false, or null when there is no
           limit); the tables go to stderr

A missed target never fails the run; a part that crashes does: the other parts still
run, and the exit status is 1.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import platform
import shutil
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from bench.report import QUICK_ENV, Target, now_ns, quick, summary

# in the order `python -m bench` runs them
PARTS = (
    "storage",
    "agents",
    "coordinator",
    "spawning",
    "langgraph",
    "peer",
    "scale",
    "burst",
    "latency",
    "cache",
    "context",
)


def cpu_model() -> str:
    """Return the CPU's model name (Linux), else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def redis_server_version() -> str:
    """Return `redis-server --version`, or why it is unknown."""
    binary = shutil.which("redis-server")
    if binary is None:
        return "redis-server not on PATH"
    try:
        out = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, check=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"redis-server --version failed: {exc}"
    return out.stdout.strip()


def header() -> None:
    """Print the machine a run was measured on."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    print("Cairn benchmarks")
    print(f"machine: {platform.platform()}; {cpu_model()}")
    print(f"CPUs: {os.cpu_count()} (usable by this process: {usable or 'unknown'})")
    print(f"python: {platform.python_implementation()} {platform.python_version()}")
    print(f"redis: {redis_server_version()}")
    print(
        "timing: time.perf_counter_ns; Python's garbage collector is paused inside each "
        "timed call (as timeit does) and runs between calls"
    )


def main(argv: list[str]) -> int:
    """Run the named parts (all when none is named); return the exit status."""
    if any(arg in ("-h", "--help") for arg in argv):
        print(f"usage: python -m bench [--quick] [--json] [{' | '.join(PARTS)} ...]\n\n{__doc__}")
        return 0
    flags = {arg for arg in argv if arg.startswith("-")}
    unknown = [arg for arg in argv if arg not in (*PARTS, "--quick", "--json")]
    if unknown:
        print(
            f"unknown argument(s): {', '.join(unknown)}; parts: {', '.join(PARTS)}; "
            "flags: --quick, --json",
            file=sys.stderr,
        )
        return 2
    # Set (or cleared) before any part is imported: each part sizes itself on import.
    if "--quick" in flags:
        os.environ[QUICK_ENV] = "1"
    else:
        os.environ.pop(QUICK_ENV, None)
    as_json = "--json" in flags
    chosen = [p for p in PARTS if p in argv] or list(PARTS)
    out = sys.stdout
    with contextlib.redirect_stdout(sys.stderr if as_json else sys.stdout):
        return run_parts(chosen, out if as_json else None)


def run_parts(chosen: list[str], json_out: TextIO | None) -> int:
    """Run `chosen` parts in turn; with `json_out`, write each target there as a JSON line."""
    header()
    if quick():
        print("QUICK MODE: small sizes and few repetitions; the verdicts below mean nothing")
    started = now_ns()
    targets: list[Target] = []
    crashed: list[str] = []
    for name in chosen:
        part_started = now_ns()
        try:
            run: Callable[[], list[Target]] = importlib.import_module(f"bench.{name}").run
            found = run()
        except Exception:  # noqa: BLE001 - reported, and the run fails; the next part runs
            traceback.print_exc()
            crashed.append(name)
            print(f"\nbench: part {name} CRASHED (above); the run will exit 1")
            continue
        finally:
            print(f"({name} took {(now_ns() - part_started) / 1e9:.1f} s)")
        targets += found
        if json_out is not None:
            for target in found:
                json_out.write(json.dumps(target.record(name)) + "\n")
            json_out.flush()
    summary(targets)
    print(f"\nbench took {(now_ns() - started) / 1e9:.1f} s")
    if crashed:
        print(f"bench: crashed: {', '.join(crashed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
