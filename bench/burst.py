"""The burst benchmark: a thousand tasks submitted at once, and every one of them finishes.

Real processes, as the scale part starts them (`bench.scale.Cluster`: one coordinator,
PROCESSES workers of LANES lanes each, a private redis-server), and two ways in, at the
same moment:

- the Python API: API_TASKS `cairn.Client.submit` calls from THREADS threads sharing one
  client, each call timed;
- the shell: CLI_TASKS `cairn submit --json` processes started together, each timed from
  its start to its exit (so with the interpreter's start, which a person pays too).

Each task is TEAM scripted agents playing SUPERSTEPS turns at LATENCY s. The part waits
until the coordinator's set of active tasks is empty, then requires every task to have
succeeded: a task that did not is a bug, and the part fails (raises) naming how many.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import cast

import yaml

from bench.report import Samples, Target, clock, pick, quick, table
from bench.scale import Cluster, spec
from cairn import Client
from cairn.coordinator.settings import Settings
from cairn.storage import keys

API_TASKS, CLI_TASKS = pick((1_000, 100), (20, 4))
TEAM, SUPERSTEPS, LATENCY = 2, 2, 0.05
PROCESSES, LANES = pick((2, 32), (2, 8))
THREADS = pick(32, 8)
DRAIN_TIMEOUT = pick(900.0, 120.0)  # seconds for every task to end after the last submit
POLL = 0.5


def submit_api(client: Client, count: int) -> tuple[list[str], Samples]:
    """Submit `count` tasks at once from THREADS threads; return their ids and times."""
    specs = [spec(f"burst-api{i}", TEAM, SUPERSTEPS, LATENCY) for i in range(count)]
    with ThreadPoolExecutor(THREADS) as pool:
        done = list(pool.map(lambda s: clock(lambda: client.submit(s).id), specs))
    return [task for task, _ in done], Samples([ns for _, ns in done])


def submit_cli(c: Cluster, count: int) -> tuple[list[str], Samples]:
    """Start `count` `cairn submit --json` processes at once; return the ids and wall times."""
    path = c.root / "burst.yaml"
    document = spec("burst-cli", TEAM, SUPERSTEPS, LATENCY).model_dump(mode="json")
    path.write_text(yaml.safe_dump(document))
    env = c.env("cli")
    started, procs = [], []
    for _ in range(count):
        started.append(time.perf_counter_ns())
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "cairn.cli", "submit", str(path), "--json"], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        ))  # fmt: skip
    ids, times = [], Samples()
    pending = dict(enumerate(procs))
    while pending:  # each process's exit, as soon as it comes, for its wall time
        for n, proc in list(pending.items()):
            if proc.poll() is None:
                continue
            times.add(time.perf_counter_ns() - started[n])
            out, err = proc.communicate()
            if proc.returncode != 0:
                raise RuntimeError(f"cairn submit exited {proc.returncode}: {err.decode()[-500:]}")
            ids.append(str(json.loads(out)["task_id"]))
            del pending[n]
        time.sleep(0.005)
    return ids, times


def drain(c: Cluster, tasks: list[str], since: float) -> tuple[float, Counter[str]]:
    """Wait until no task is active; return the seconds since `since` and the statuses."""
    while c.client.scard(keys.ACTIVE_TASKS):
        if c.coordinator and c.coordinator.poll() is not None:
            raise RuntimeError(f"burst: the coordinator exited; see {c.root}")
        if time.monotonic() - since > DRAIN_TIMEOUT:
            left = c.client.scard(keys.ACTIVE_TASKS)
            raise RuntimeError(f"burst: {left} tasks still active after {DRAIN_TIMEOUT:g} s")
        time.sleep(POLL)
    seconds = time.monotonic() - since
    pipe = c.client.pipeline(transaction=False)
    for task in tasks:
        pipe.hget(keys.run(task), "status")
    statuses = cast(list[bytes | None], pipe.execute())
    return seconds, Counter((s or b"none").decode() for s in statuses)


def ms(ns: float) -> str:
    """Nanoseconds as milliseconds."""
    return f"{ns / 1e6:,.1f} ms"


def run() -> list[Target]:
    """Submit the burst through both ways at once; wait for every task; return the targets."""
    with contextlib.ExitStack() as stack:
        c = Cluster.private(stack)
        print(
            f"\n== burst ==\n{API_TASKS} tasks through cairn.Client.submit ({THREADS} threads, "
            f"one client) and {CLI_TASKS} `cairn submit` processes, all at once; {TEAM} "
            f"scripted agents x {SUPERSTEPS} supersteps at {LATENCY:g} s a task; one "
            f"coordinator, {PROCESSES} workers x {LANES} lanes; private redis-server (no AOF)"
            + (" (quick: sizes too small to judge)" if quick() else "")
        )
        c.start_coordinator()
        c.start_workers(PROCESSES, LANES)
        settings = Settings(redis_url=c.server.url, archive_dir=c.root / "archive",
                            signing_key=None, audit=False)  # fmt: skip
        api = stack.enter_context(Client(settings=settings))
        since = time.monotonic()
        with ThreadPoolExecutor(1) as shell:
            from_cli = shell.submit(submit_cli, c, CLI_TASKS)
            api_ids, api_times = submit_api(api, API_TASKS)
            cli_ids, cli_times = from_cli.result()
        submitted = time.monotonic() - since
        tasks = api_ids + cli_ids
        seconds, statuses = drain(c, tasks, since)
        finished = statuses.get("succeeded", 0)
        table(
            f"Burst: {len(tasks):,} tasks submitted in {submitted:.1f} s, all ended "
            f"{seconds:.1f} s after the first submit",
            ["way in", "tasks", "submit p50", "submit p99", "max"],
            [["cairn.Client.submit", str(len(api_ids)), ms(api_times.p50), ms(api_times.p99),
              ms(max(api_times.ns))],
             ["cairn submit (process start to exit)", str(len(cli_ids)), ms(cli_times.p50),
              ms(cli_times.p99), ms(max(cli_times.ns))]],
        )  # fmt: skip
        print(f"statuses: {dict(statuses)}; {finished / seconds:.1f} tasks/s end to end")
        if finished != len(tasks):
            raise RuntimeError(f"burst: {len(tasks) - finished} of {len(tasks)} tasks did not "
                               f"succeed: {dict(statuses)}; see {c.root}")  # fmt: skip
        return [
            Target("burst: Client.submit p50", api_times.p50 / 1e6, None, "ms").report(),
            Target("burst: Client.submit p99", api_times.p99 / 1e6, None, "ms").report(),
            Target("burst: cairn submit p50", cli_times.p50 / 1e6, None, "ms").report(),
            Target("burst: cairn submit p99", cli_times.p99 / 1e6, None, "ms").report(),
            Target("burst: tasks that did not succeed", float(len(tasks) - finished), 0.0,
                   "tasks").report(),
            Target("burst: first submit to the last task's end", seconds, None, "s").report(),
        ]  # fmt: skip
