"""Run the benchmarks: `python -m bench` runs every part, `python -m bench storage` one.

A part is a module `bench.<name>` whose `run()` prints its tables and returns its targets.
"""

from __future__ import annotations

import importlib
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from bench.report import Target, now_ns, summary

# in the order `python -m bench` runs them
PARTS = ("storage", "agents", "coordinator", "langgraph")


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
        print(f"usage: python -m bench [{' | '.join(PARTS)} ...]\n\n{__doc__}")
        return 0
    unknown = [arg for arg in argv if arg not in PARTS]
    if unknown:
        print(f"unknown part(s): {', '.join(unknown)}; known: {', '.join(PARTS)}", file=sys.stderr)
        return 2
    chosen = [p for p in PARTS if p in argv] or list(PARTS)
    header()
    started = now_ns()
    targets: list[Target] = []
    for name in chosen:
        run: Callable[[], list[Target]] = importlib.import_module(f"bench.{name}").run
        targets += run()
    summary(targets)
    print(f"\nbench took {(now_ns() - started) / 1e9:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
