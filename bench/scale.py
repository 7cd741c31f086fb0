"""The scale benchmark: hundreds of agents on a few worker processes, and what each costs.

Real processes, started as `cairn worker` and `cairn coordinator` start theirs
(`python -m cairn.coordinator.worker`, `python -m cairn.coordinator`, settings in `CAIRN_*`), on a
private redis-server (no AOF); this process submits the tasks and watches from outside:

1. density: TASKS tasks of TEAM scripted agents at LATENCY s a model turn, on PROCESSES
   worker processes of LANES lanes and one coordinator: sustained steps/s, the resident
   memory of every Cairn process, enqueue-to-start latency, the coordinator's CPU, and
   Redis's commands and bytes per step;
2. scaling: one task of SCALE_AGENTS agents at SCALE_LATENCY s on SCALE_WIDTH workers of
   one lane, on one worker of SCALE_WIDTH lanes, and on one worker of one lane.

Times come from the RQ job of each step: `enqueued_at` (the coordinator's `_launch`
enqueues a superstep's jobs in one pipeline), `started_at` (the worker's main thread took
the job and hands it a lane) and `ended_at` (the step returned), all on this machine's
clock. CPU from /proc/PID/stat (utime + stime), memory from /proc/PID/status (VmRSS) and
/proc/PID/smaps_rollup (Pss), sampled every SAMPLE_EVERY s.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, cast

import redis
from rq import Queue, Worker
from rq.utils import utcparse

from bench.report import Samples, Target, pick, private_store, quick, size, table
from cairn.agents.spec import AgentSpec, ToolRequest, Turn
from cairn.coordinator.jobs import STEPS_QUEUE
from cairn.coordinator.spec import TaskSpec
from cairn.coordinator.tasks import Tasks
from cairn.storage import keys
from cairn.storage.store import CheckpointStore
from cairn.testing.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[1]
GOAL = "Make the project pass its tests."
# pick(full, quick): `python -m bench --quick` runs the same code at the second sizes
TASKS, TEAM, LATENCY, SUPERSTEPS = pick((40, 10, 4.0, 10), (4, 5, 0.2, 3))
PROCESSES, LANES = pick((8, 64), (2, 10))
SCALE_AGENTS, SCALE_SUPERSTEPS, SCALE_LATENCY = pick((64, 10, 0.5), (8, 3, 0.1))
SCALE_WIDTH = pick(16, 2)  # workers of one lane, and lanes of one worker
BASELINE_SUPERSTEPS = 2  # one worker of one lane: superstep 1 warms up, superstep 2 is timed
WIDE_BUDGET = 8 * 1024**3  # bytes: processes of one lane each that fit in this are reported
RSS_LIMIT = 2 * 1024**3  # bytes: every Cairn process of the density run together
STEPS_PER_S = 80.0  # the density target (the ideal is TASKS * TEAM / LATENCY)
BARRIER_P50_MS, BARRIER_P99_MS = 30.0, 150.0  # the density run's barrier targets
START_P99_MS = 250.0
SPEEDUP = 12.0  # the scaling targets, as throughput
SAMPLE_EVERY = 0.5  # seconds between memory samples
POLL = 0.5  # seconds between looks at whether the tasks have ended
READ_EVERY = 20  # looks between reads of the steps' RQ jobs (kept a minute once ended)
MiB = 1024 * 1024
TICK = os.sysconf("SC_CLK_TCK")


# processes ---------------------------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of `pid` (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def memory(pid: int) -> tuple[int, int]:
    """`pid`'s resident set (VmRSS) and proportional set (Pss), in bytes (0 when gone)."""
    rss = pss = 0
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                pss = int(line.split()[1]) * 1024
    return rss, pss


def machine_cpu() -> tuple[float, float]:
    """The machine's (busy, total) CPU seconds since boot, over all CPUs (/proc/stat)."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = ticks[3] + ticks[4]  # idle + iowait
    return (sum(ticks) - idle) / TICK, sum(ticks) / TICK


@dataclass(slots=True)
class Cluster:
    """A private redis-server, worker processes and a coordinator process, stopped at the end."""

    root: Path
    server: RedisServer
    client: redis.Redis
    store: CheckpointStore
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    coordinator: subprocess.Popen[bytes] | None = None
    logs: list[IO[bytes]] = field(default_factory=list)
    started: int = 0  # processes started so far, for their names

    @classmethod
    def private(cls, stack: contextlib.ExitStack) -> Cluster:
        """A cluster on a private redis-server (no AOF) of its own, stopped when `stack` closes."""
        root, server, client, store = private_store(stack, quiet=True)
        cluster = cls(root, server, client, store)
        stack.callback(cluster.close)
        return cluster

    def env(self, name: str, concurrency: int = 1) -> dict[str, str]:
        """A child's environment: this one's without `CAIRN_*`, plus the bench's settings."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("CAIRN_")}
        return {**env, "PYTHONPATH": str(ROOT), "CAIRN_REDIS_URL": self.server.url,
                "CAIRN_ARCHIVE_DIR": str(self.root / "archive"),
                "CAIRN_CACHE_DIR": str(self.root / name), "CAIRN_LOG_FORMAT": "json",
                "CAIRN_LOG_LEVEL": "info",
                "CAIRN_WORKER_CONCURRENCY": str(concurrency)}  # fmt: skip

    def spawn(self, name: str, args: list[str], concurrency: int = 1) -> subprocess.Popen[bytes]:
        """Start `python -m <args>` as `name`, its log in the bench's directory."""
        log = (self.root / f"{name}.log").open("wb")
        self.logs.append(log)
        self.started += 1
        return subprocess.Popen(
            [sys.executable, "-m", *args],
            env=self.env(name, concurrency),
            stdout=subprocess.DEVNULL,
            stderr=log,
        )

    def start_coordinator(self) -> None:
        """Start the one coordinator (it takes the lease at once: no other)."""
        self.coordinator = self.spawn("coordinator", ["cairn.coordinator", "--name", "bench"])

    def start_workers(self, n: int, concurrency: int) -> None:
        """Replace the workers by `n` processes of `concurrency` lanes; wait until they serve."""
        self.stop_workers()
        for _ in range(n):
            name = f"worker-{self.started}"
            self.workers.append(self.spawn(name, ["cairn.coordinator.worker"], concurrency))
        watched = Queue(STEPS_QUEUE, connection=self.client)
        deadline = time.monotonic() + 60 + 2 * n  # starting is CPU-bound: 2 s a process
        while Worker.count(connection=self.client, queue=watched) != n:
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.workers):
                raise RuntimeError(f"{n} workers did not come up; see {self.root}")
            time.sleep(0.1)

    def stop_workers(self) -> None:
        """Stop every worker (SIGTERM: an idle one exits at once), all at the same time."""
        stop_all(self.workers)
        self.workers = []

    def close(self) -> None:
        """Stop every process and close their logs."""
        stop_all([*self.workers, *([self.coordinator] if self.coordinator else [])])
        for log in self.logs:
            log.close()

    def cairn_pids(self) -> list[int]:
        """The coordinator's and the workers' process ids."""
        found = [self.coordinator.pid] if self.coordinator else []
        return found + [p.pid for p in self.workers]

    @property
    def redis_pid(self) -> int:
        """The redis-server's process id."""
        return self.server.process.pid if self.server.process else 0


def stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM every process, then SIGKILL those still alive after 15 s."""
    for proc in procs:
        proc.terminate()  # does nothing to a process that has exited
    deadline = time.monotonic() + 15
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# sampling ----------------------------------------------------------------------------------
@dataclass(slots=True)
class Memory:
    """The largest sums of VmRSS and Pss seen, over a run, of some processes."""

    rss: int = 0
    pss: int = 0
    each: dict[int, int] = field(default_factory=dict)  # pid → its largest VmRSS

    def add(self, pids: list[int]) -> None:
        """Take one sample of `pids`."""
        seen = [memory(pid) for pid in pids]
        self.rss = max(self.rss, sum(r for r, _ in seen))
        self.pss = max(self.pss, sum(p for _, p in seen))
        for pid, (rss, _) in zip(pids, seen, strict=True):
            self.each[pid] = max(self.each.get(pid, 0), rss)


@contextlib.contextmanager
def sampled(cluster: Cluster, cairn: Memory, server: Memory) -> Iterator[None]:
    """Sample the Cairn processes' and the redis-server's memory while the block runs."""
    done = threading.Event()

    def sample() -> None:
        while True:
            cairn.add(cluster.cairn_pids())
            server.add([cluster.redis_pid])
            if done.wait(SAMPLE_EVERY):
                return

    thread = threading.Thread(target=sample, name="bench-memory", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


@dataclass(frozen=True, slots=True)
class RedisStats:
    """Redis's counters at one moment: calls per command, bytes in and out, memory."""

    calls: dict[str, int]
    net_in: int
    net_out: int
    used_memory: int

    @classmethod
    def read(cls, client: redis.Redis) -> RedisStats:
        """Read INFO commandstats, stats and memory."""
        commands = cast(dict[str, dict[str, int]], client.info("commandstats"))
        stats, mem = cast(dict[str, int], client.info("stats")), client.info("memory")
        return cls(
            {name.removeprefix("cmdstat_"): int(c["calls"]) for name, c in commands.items()},
            int(stats["total_net_input_bytes"]),
            int(stats["total_net_output_bytes"]),
            int(cast(dict[str, int], mem)["used_memory"]),
        )

    def since(self, before: RedisStats) -> RedisStats:
        """The counters' growth since `before`."""
        calls = {n: c - before.calls.get(n, 0) for n, c in self.calls.items()}
        return RedisStats(
            {n: c for n, c in calls.items() if c},
            self.net_in - before.net_in,
            self.net_out - before.net_out,
            self.used_memory - before.used_memory,
        )


# the tasks ---------------------------------------------------------------------------------
def turns(agent: int, supersteps: int, latency: float) -> list[Turn]:
    """One turn per superstep at `latency`: write a note or read the README; finish last."""

    def note(k: int) -> ToolRequest:
        return ToolRequest(name="write_file", args={"path": f"a{agent}.md", "content": f"{k}\n"})

    read = ToolRequest(name="read_file", args={"path": "README.md"})
    tools = [read if k % 2 else note(k) for k in range(supersteps - 1)]
    tools.append(ToolRequest(name="finish", args={"summary": "done"}))
    return [Turn(say=f"turn {k}", latency=latency, tools=[t]) for k, t in enumerate(tools)]


def spec(name: str, agents: int, supersteps: int, latency: float) -> TaskSpec:
    """A task of `agents` scripted agents a0.., each playing `supersteps` turns."""
    team = [
        AgentSpec(name=f"a{i}", model="scripted", script=turns(i, supersteps, latency))
        for i in range(agents)
    ]
    return TaskSpec(name=name, goal=GOAL, files={"README.md": "# notes\n"}, agents=team)


@dataclass(frozen=True, slots=True)
class Step:
    """One step's RQ job: its task, superstep, attempt and when it was enqueued, started, ended."""

    task: str
    superstep: int
    attempt: int
    enqueued: float
    started: float
    ended: float


def read_steps(
    client: redis.Redis, tasks: list[str], seen: dict[bytes, Step] | None = None
) -> list[Step]:
    """Every step job of `tasks` (`cairn-<task>-<epoch>-<superstep>-<agent>-<attempt>`).

    RQ keeps a finished job a minute (the coordinator's `result_ttl`), so a run longer than
    that reads as it goes: with `seen`, jobs read before are not read again, the ones found
    ended are added to it, and all of it is returned.
    """
    wanted, names, seen = set(tasks), [], {} if seen is None else seen
    for raw in cast(Iterator[bytes], client.scan_iter(match="rq:job:cairn-*", count=10_000)):
        parts = raw.decode().removeprefix("rq:job:cairn-").rsplit("-", 4)
        if raw in seen or not (len(parts) == 5 and parts[0] in wanted):
            continue
        if parts[2].isdigit() and parts[4].isdigit():
            names.append((raw, parts[0], int(parts[2]), int(parts[4])))
    pipe = client.pipeline(transaction=False)
    for raw, *_ in names:
        pipe.hmget(raw, "enqueued_at", "started_at", "ended_at")
    for (raw, task, superstep, attempt), stamps in zip(
        names, cast(list[list[bytes | None]], pipe.execute()), strict=True
    ):
        if not all(stamps):  # running, or a retried attempt's job canceled before it started
            continue
        when = [utcparse(cast(bytes, s).decode()).timestamp() for s in stamps]
        seen[raw] = Step(task, superstep, attempt, *when)
    return list(seen.values())


def coordinator_events(log: Path) -> dict[tuple[str, str, int], float]:
    """(event, task, superstep) → when the coordinator logged it (Unix seconds).

    The events are "superstep committed" and "steps launched" (its first attempts').
    """
    found: dict[tuple[str, str, int], float] = {}
    with contextlib.suppress(OSError):
        for line in log.read_text(errors="replace").splitlines():
            if '"superstep committed"' not in line and '"steps launched"' not in line:
                continue
            with contextlib.suppress(ValueError, KeyError, TypeError):
                event = json.loads(line)
                key = (event["event"], event["task"], int(event["superstep"]))
                when = datetime.fromisoformat(event["timestamp"]).timestamp()
                found.setdefault(key, when)
    return found


@dataclass(slots=True)
class Run:
    """What one run measured."""

    name: str
    tasks: int
    agents: int  # per task
    supersteps: int
    latency: float
    processes: int
    lanes: int
    wall: float  # from the first submit to the last task's end
    steps: list[Step]
    cpu: dict[str, float]  # CPU seconds: coordinator, workers, redis, this process, machine
    machine_total: float  # the machine's CPU seconds (all CPUs) over the run
    cairn: Memory
    server: Memory
    workers_idle: int  # VmRSS of the workers, summed, just before the first submit
    redis: RedisStats

    @property
    def retries(self) -> int:
        """Step attempts past the first (a step retried, for any reason)."""
        return sum(1 for s in self.steps if s.attempt > 1)

    def launches(self) -> dict[str, dict[int, float]]:
        """Per task, per superstep: when its jobs were enqueued (its first attempts')."""
        first: dict[str, dict[int, float]] = defaultdict(dict)
        for s in self.steps:
            at = first[s.task]
            at[s.superstep] = min(at.get(s.superstep, math.inf), s.enqueued)
        return first

    def ends(self) -> dict[str, dict[int, float]]:
        """Per task, per superstep: when its last step ended."""
        last: dict[str, dict[int, float]] = defaultdict(dict)
        for s in self.steps:
            at = last[s.task]
            at[s.superstep] = max(at.get(s.superstep, 0.0), s.ended)
        return last

    def sustained(self) -> float:
        """Steps/s over the steady middle: per task, supersteps lo..n-1 enqueue to enqueue.

        Summed over the tasks, which run at the same time: a task plays its middle
        supersteps at agents x supersteps / their span.
        """
        lo = 3 if self.supersteps >= 5 else 2  # past the first supersteps (warm-up)
        hi = self.supersteps  # the last superstep's span ends in the task's end: left out
        return sum(self.agents * (hi - lo) / (at[hi] - at[lo]) for at in self.launches().values())

    def after_first(self) -> float:
        """Steps/s from superstep 2's enqueue to the last step's end (one task's runs)."""
        ((task, at),) = self.launches().items()
        return self.agents * (self.supersteps - 1) / (self.ends()[task][self.supersteps] - at[2])

    def whole(self) -> float:
        """Steps/s over the whole run, from the first enqueue to the last step's end."""
        return len(self.steps) / (
            max(s.ended for s in self.steps) - min(s.enqueued for s in self.steps)
        )

    def waits(self) -> Samples:
        """Each step's time from its job's enqueue to a worker taking it (ns)."""
        return Samples([int((s.started - s.enqueued) * 1e9) for s in self.steps])

    def durations(self) -> Samples:
        """Each step's time from its job's start to its end (ns)."""
        return Samples([int((s.ended - s.started) * 1e9) for s in self.steps])

    def barriers(self) -> Samples:
        """Per superstep but the last: its last step's end to the next superstep's enqueue."""
        ends, got = self.ends(), Samples()
        for task, at in self.launches().items():
            for k in range(1, self.supersteps):
                got.add(int((at[k + 1] - ends[task][k]) * 1e9))
        return got

    def barrier_parts(self, events: dict[tuple[str, str, int], float]) -> list[Samples]:
        """The barrier in three, from the coordinator's log (ns).

        The last step's end to committed, committed to the next superstep's launch, the
        launch to its jobs enqueued.
        """
        ends, got = self.ends(), [Samples(), Samples(), Samples()]
        for task, at in self.launches().items():
            for k in range(1, self.supersteps):
                done = events.get(("superstep committed", task, k))
                launched = events.get(("steps launched", task, k + 1))
                if done is None or launched is None:
                    continue
                marks = (ends[task][k], done, launched, at[k + 1])
                for into, (a, b) in zip(got, itertools.pairwise(marks), strict=False):
                    into.add(int((b - a) * 1e9))
        return got

    def spans(self) -> Samples:
        """Per superstep but the last: enqueue to the next superstep's enqueue (ns)."""
        got = Samples()
        for at in self.launches().values():
            for k in range(1, self.supersteps):
                got.add(int((at[k + 1] - at[k]) * 1e9))
        return got


def play(
    c: Cluster, name: str, tasks: int, agents: int, supersteps: int, latency: float,
    lanes: int, stagger: float, timeout: float,
) -> Run:  # fmt: skip
    """Submit `tasks` tasks, one every `stagger` s, and wait until every one ended."""
    pids = {"coordinator": [c.coordinator.pid if c.coordinator else 0],
            "workers": [p.pid for p in c.workers], "redis": [c.redis_pid],
            "bench": [os.getpid()]}  # fmt: skip
    workers_idle = sum(memory(pid)[0] for pid in pids["workers"])
    cairn, server = Memory(), Memory()
    submit = Tasks(c.client, c.store).submit
    ids: list[str] = []
    cpu_before = {k: sum(map(cpu_seconds, v)) for k, v in pids.items()}
    busy_before, total_before = machine_cpu()
    stats_before = RedisStats.read(c.client)
    started = time.monotonic()
    seen: dict[bytes, Step] = {}
    looks = 0
    with sampled(c, cairn, server):
        for i in range(tasks):
            ids.append(submit(spec(f"{name}{i}", agents, supersteps, latency)))
            if i + 1 < tasks:
                time.sleep(max(0.0, started + (i + 1) * stagger - time.monotonic()))
        while c.client.scard(keys.ACTIVE_TASKS):
            if c.coordinator and c.coordinator.poll() is not None:
                last = (c.root / "coordinator.log").read_text(errors="replace")[-2_000:]
                raise RuntimeError(f"run {name}: the coordinator exited; its log ends:\n{last}")
            if time.monotonic() - started > timeout:
                raise RuntimeError(f"run {name}: tasks did not end in {timeout:g} s; see {c.root}")
            looks += 1
            if looks % READ_EVERY == 0:
                read_steps(c.client, ids, seen)
            time.sleep(POLL)
        wall = time.monotonic() - started
    stats = RedisStats.read(c.client).since(stats_before)
    busy, total = machine_cpu()
    cpu = {k: sum(map(cpu_seconds, v)) - cpu_before[k] for k, v in pids.items()}
    cpu["machine"] = busy - busy_before
    pipe = c.client.pipeline(transaction=False)
    for task in ids:
        pipe.hget(keys.run(task), "status")
    ended = [(s or b"").decode() for s in cast(list[bytes | None], pipe.execute())]
    steps = read_steps(c.client, ids, seen)
    firsts = sum(1 for s in steps if s.attempt == 1)
    if any(s != "succeeded" for s in ended) or firsts != tasks * agents * supersteps:
        raise RuntimeError(f"run {name}: statuses {sorted(set(ended))}, {firsts} first attempts")
    return Run(name, tasks, agents, supersteps, latency, len(c.workers), lanes, wall, steps, cpu,
               total - total_before, cairn, server, workers_idle, stats)  # fmt: skip


def ms(ns: float) -> str:
    """Nanoseconds as milliseconds."""
    return f"{ns / 1e6:,.0f} ms"


# 1. density --------------------------------------------------------------------------------
def density(c: Cluster) -> tuple[list[Target], Run]:
    """Measurement 1: TASKS x TEAM agents on PROCESSES x LANES, one coordinator."""
    c.start_workers(PROCESSES, LANES)
    agents = TASKS * TEAM
    run = play(c, "dense", TASKS, TEAM, SUPERSTEPS, LATENCY, LANES, LATENCY / TASKS,
               timeout=60 + 10 * SUPERSTEPS * LATENCY)  # fmt: skip
    steps, gcs, ideal = len(run.steps), TASKS * SUPERSTEPS, agents / LATENCY
    sustained, waits, durations = run.sustained(), run.waits(), run.durations()
    barriers, spans = run.barriers(), run.spans()
    workers_peak = sum(run.cairn.each.get(p.pid, 0) for p in c.workers)
    coord = run.cpu["coordinator"]
    rows = [
        ["agent-steps/s, steady middle (supersteps 3..n-1)", f"{sustained:.1f}",
         f"{sustained / ideal:.0%} of the ideal {ideal:g}"],
        ["agent-steps/s, whole run (first enqueue to last end)", f"{run.whole():.1f}",
         f"{steps:,} steps in {run.wall:.1f} s, {run.retries} retried"],
        ["superstep, enqueue to next enqueue, p50 / p99", f"{ms(spans.p50)} / {ms(spans.p99)}",
         f"model latency {LATENCY:g} s"],
        ["enqueue to a worker taking the step, p50 / p99", f"{ms(waits.p50)} / {ms(waits.p99)}",
         f"max {ms(max(waits.ns))}"],
        ["a step, taken to ended, p50 / p99", f"{ms(durations.p50)} / {ms(durations.p99)}",
         f"above the model: p50 {ms(durations.p50 - LATENCY * 1e9)}"],
        ["barrier, last step's end to next enqueue, p50 / p99",
         f"{ms(barriers.p50)} / {ms(barriers.p99)}", "the coordinator's notice, commit, launch"],
        ["VmRSS, every Cairn process (largest sum sampled)", size(run.cairn.rss),
         f"Pss {size(run.cairn.pss)}"],
        ["VmRSS, workers at their largest / idle before, per step running",
         f"{size(workers_peak)} / {size(run.workers_idle)}",
         f"{size((workers_peak - run.workers_idle) / agents)} a step; coordinator "
         f"{size(run.cairn.each.get(c.coordinator.pid if c.coordinator else 0, 0))}"],
        ["VmRSS, redis-server", size(run.server.rss),
         f"used_memory grew {size(run.redis.used_memory)}"],
    ]  # fmt: skip
    table(
        f"1. Density: {TASKS} tasks x {TEAM} agents = {agents} agents, {SUPERSTEPS} supersteps "
        f"at {LATENCY:g} s model latency, on {PROCESSES} worker processes x {LANES} lanes and one"
        f" coordinator process (tasks submitted {LATENCY / TASKS * 1e3:g} ms apart)",
        ["measure", "value", "note"],
        rows,
    )
    ours = ("coordinator", "workers", "redis", "bench")
    run.cpu["others"] = run.cpu["machine"] - sum(run.cpu[who] for who in ours)
    cpu_rows = [
        [who, f"{run.cpu[who]:.1f} s", f"{run.cpu[who] / run.wall:.0%}",
         f"{1e3 * run.cpu[who] / steps:.2f} ms"]
        for who in (*ours, "others", "machine")
    ]  # fmt: skip
    table(
        f"CPU over the run ({run.wall:.1f} s wall; the machine has {os.cpu_count()} CPUs, "
        f"{run.machine_total:.0f} CPU-s in all; bench: this process, which submits and "
        "samples; others: the machine's other processes and the kernel)",
        ["process", "CPU", "of one core", "per step"],
        cpu_rows,
    )
    per_core = steps / coord if coord else math.inf
    split = run.barrier_parts(coordinator_events(c.root / "coordinator.log"))
    notice, tick, launch = (p.p50 if len(p) else 0 for p in split)
    parts = {
        "waiting for a worker": waits.p50,
        "the step above the model": durations.p50 - LATENCY * 1e9,
        "the barrier": barriers.p50,
    }
    most = max(parts, key=lambda k: parts[k])
    print(
        f"(Coordinator: {1e3 * coord / gcs:.1f} ms of CPU per GC ({gcs} GCs of {TEAM} votes);"
        f" one core of it would drive {per_core:,.0f} steps/s at this team size."
        f" A superstep's p50 overhead above the model, {ms(spans.p50 - LATENCY * 1e9)}: "
        + ", ".join(f"{k} {ms(v)}" for k, v in parts.items())
        + f" (p50s, not additive); the largest is {most}. The barrier, from the coordinator's "
        f"log, p50: last step's end to 'superstep committed' {ms(notice)} (the last vote's "
        f"wake, the look at its task, build and commit), to the next 'steps launched' "
        f"{ms(tick)} (the same look begins the next superstep), to the jobs enqueued "
        f"{ms(launch)}. The coordinator looks at a task when woken, and at every active "
        f"task once a second. Cairn's processes used "
        f"{sum(run.cpu[w] for w in ours[:3]) / run.wall:.2f} of the {os.cpu_count()} CPUs, "
        f"the machine {run.cpu['machine'] / run.wall:.2f}; the coordinator "
        f"{coord / run.wall:.0%} of one core.)"
    )
    redis_rows = [
        [name, f"{calls / steps:.2f}"]
        for name, calls in sorted(run.redis.calls.items(), key=lambda kv: -kv[1])[:12]
    ]
    table(
        f"Redis per step over the run: {sum(run.redis.calls.values()) / steps:.1f} commands, "
        f"{run.redis.net_in / steps:,.0f} B in, {run.redis.net_out / steps:,.0f} B out "
        f"(INFO deltas / {steps:,} steps; the busiest commands)",
        ["command", "calls per step"],
        redis_rows,
    )
    targets = [
        Target(f"wall time per agent-step, steady middle (>= {STEPS_PER_S:g} steps/s)",
               1e3 / sustained, 1e3 / STEPS_PER_S, "ms").report(),
        Target("VmRSS of every Cairn process, summed", run.cairn.rss / MiB, RSS_LIMIT / MiB,
               "MiB").report(),
        Target("workers' VmRSS per step running (largest - idle)",
               (workers_peak - run.workers_idle) / agents / MiB, None, "MiB").report(),
        Target("VmRSS of the redis-server", run.server.rss / MiB, None, "MiB").report(),
        Target("superstep enqueue to a step's start, p99", waits.p99 / 1e6, START_P99_MS,
               "ms").report(),
        Target("coordinator CPU per step", 1e3 * coord / steps, None, "ms").report(),
        Target("coordinator CPU per GC", 1e3 * coord / gcs, None, "ms").report(),
        Target("steps/s one coordinator core drives", per_core, None, "steps/s").report(),
        Target("barrier, last step's end to the next superstep's enqueue, p50",
               barriers.p50 / 1e6, BARRIER_P50_MS, "ms").report(),
        Target("barrier, last step's end to the next superstep's enqueue, p99",
               barriers.p99 / 1e6, BARRIER_P99_MS, "ms").report(),
        Target("of it, committed to the next launch, p50", tick / 1e6,
               None, "ms").report(),
        Target("Redis commands per step", sum(run.redis.calls.values()) / steps, None,
               "commands").report(),
        Target("Redis bytes in per step", run.redis.net_in / steps, None, "B").report(),
        Target("Redis bytes out per step", run.redis.net_out / steps, None, "B").report(),
    ]  # fmt: skip
    return targets, run


# 2. scaling --------------------------------------------------------------------------------
def scaling(c: Cluster) -> tuple[list[Target], int, float]:
    """Measurement 2: wide on processes, wide on lanes, and one lane; return the RSS of one.

    Returns the targets, the largest VmRSS of one single-lane worker and the CPU seconds
    one took to start (import and register).
    """
    plays = (
        (f"{SCALE_WIDTH} workers x 1 lane", SCALE_WIDTH, 1, SCALE_SUPERSTEPS),
        (f"1 worker x {SCALE_WIDTH} lanes", 1, SCALE_WIDTH, SCALE_SUPERSTEPS),
        ("1 worker x 1 lane", 1, 1, BASELINE_SUPERSTEPS),
    )
    runs, rows = [], []
    one_rss, start_cpu = 0, 0.0
    used = ("workers", "coordinator", "redis")
    for label, workers, lanes, supersteps in plays:
        c.start_workers(workers, lanes)
        if workers > 1:
            start_cpu = max(cpu_seconds(p.pid) for p in c.workers)
        timeout = 60 + 4 * SCALE_AGENTS * supersteps * SCALE_LATENCY / (workers * lanes)
        run = play(c, f"scale{workers}x{lanes}-", 1, SCALE_AGENTS, supersteps, SCALE_LATENCY,
                   lanes, 0.0, timeout)  # fmt: skip
        if workers > 1:
            one_rss = max(run.cairn.each.get(p.pid, 0) for p in c.workers)
        runs.append(run)
        rate = run.after_first()
        rows.append(
            [label, str(supersteps), f"{run.wall:.1f} s", f"{rate:.2f}",
             f"{workers * lanes / SCALE_LATENCY:.1f}", ms(run.waits().p99),
             f"{1e3 * sum(run.cpu[k] for k in used) / len(run.steps):.1f} ms",
             size(sum(run.cairn.each.get(p.pid, 0) for p in c.workers))]
        )  # fmt: skip
    c.stop_workers()
    wide, lanes_run, one = (r.after_first() for r in runs)
    for row, r in zip(rows, runs, strict=True):
        row.append(f"{r.after_first() / one:.2f}x")
    table(
        f"2. Scaling: one task of {SCALE_AGENTS} agents at {SCALE_LATENCY:g} s model latency, "
        "a write_file or read_file a turn",
        ["workers x lanes", "supersteps", "wall", "steps/s (superstep 2..)", "ideal steps/s",
         "enqueue→taken p99", "CPU/step, all", "workers' VmRSS", "vs 1 x 1"],
        rows,
    )  # fmt: skip
    print(
        f"(steps/s: the steps of supersteps 2..n over the time from superstep 2's enqueue to "
        f"its last step's end (superstep 1 fills the caches). One worker of one lane plays "
        f"{BASELINE_SUPERSTEPS} supersteps, so its figure is superstep 2 alone, "
        f"{SCALE_AGENTS} steps one after another: {SCALE_AGENTS * SCALE_SUPERSTEPS} steps at "
        f"{SCALE_LATENCY:g} s would take {SCALE_AGENTS * SCALE_SUPERSTEPS * SCALE_LATENCY:g} s."
        " The ideal is lanes / latency, with nothing but the model.)"
    )
    better = f">= {SPEEDUP:g}x throughput"
    targets = [
        Target(f"time per step, {SCALE_WIDTH} workers x 1 lane / 1 x 1 ({better})",
               one / wide, round(1 / SPEEDUP, 3)).report(),
        Target(f"time per step, 1 worker x {SCALE_WIDTH} lanes / 1 x 1 ({better})",
               one / lanes_run, round(1 / SPEEDUP, 3)).report(),
    ]  # fmt: skip
    return targets, one_rss, start_cpu


def wide(density_run: Run, one_rss: int, start_cpu: float) -> list[Target]:
    """The density run at one lane a process: how many fit in WIDE_BUDGET; not run."""
    agents = TASKS * TEAM
    count = WIDE_BUDGET // one_rss if one_rss else 0
    table(
        f"1b. The density run at 1 lane a process, as many processes as fit in "
        f"{WIDE_BUDGET // 1024**3} GiB (computed, not run)",
        ["measure", "value"],
        [
            ["VmRSS of one worker process of one lane (largest, scaling run)", size(one_rss)],
            [f"processes in {WIDE_BUDGET // 1024**3} GiB", f"{count}"],
            [f"steps at once: {count} of {agents} agents", f"{min(count, agents) / agents:.0%}"],
            ["ideal steps/s at that width", f"{min(count, agents) / LATENCY:.1f}"],
            [f"processes for all {agents} agents / their VmRSS",
             f"{agents} / {size(agents * one_rss)}"],
            [f"the same {density_run.processes} x {density_run.lanes} density run's VmRSS",
             size(density_run.cairn.rss)],
            ["CPU one worker process takes to start (import, register)", f"{start_cpu:.2f} s"],
        ],
    )  # fmt: skip
    print(
        f"(Not run: {count} processes would take about {count * start_cpu:.0f} CPU-s to start "
        f"on {os.cpu_count()} CPUs before the first step, and their RQ upkeep and each step's "
        "own threads would share those CPUs with the run; the figures above are what the "
        "lanes save in memory: per-process cost paid once instead of once per agent.)"
    )
    return [
        Target(f"processes of 1 lane in {WIDE_BUDGET // 1024**3} GiB", float(count), None,
               "processes").report(),
        Target("VmRSS of one worker process of 1 lane", one_rss / MiB, None, "MiB").report(),
    ]  # fmt: skip


# the part ----------------------------------------------------------------------------------
def run() -> list[Target]:
    """Run the scale measurements on a private Redis and real processes; return the targets."""
    with contextlib.ExitStack() as stack:
        c = Cluster.private(stack)
        print(
            f"\n== scale ==\nredis-server private (port {c.server.port}, no AOF); every process "
            "logs JSON at level info into a file; one coordinator process throughout"
            + (" (quick: sizes too small to judge)" if quick() else "")
        )
        c.start_coordinator()
        targets, dense = density(c)
        found, one_rss, start_cpu = scaling(c)
        targets += found
        targets += wide(dense, one_rss, start_cpu)
        return targets
