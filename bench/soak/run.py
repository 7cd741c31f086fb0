"""One soak: real processes, tasks back to back and side by side, a fault every minute.

The processes are the chaos suite's (`chaos.run.ChaosRun`: coordinators, workers, the
`cairn` CLI, each started as `cairn up` starts them), without its delaying proxy or its
audit stream, on a private redis-server with an AOF as `cairn up` runs it. `TASKS` tasks
run at once, each of `TEAM` scripted agents playing 10 to 30 supersteps; one that ends is
replaced at once. Once a minute one fault lands, in turn: SIGKILL a worker (the chaos
supervisor starts another), SIGKILL the leading coordinator (the standby leads; another
standby starts), `cairn restore` by hand of a running task. Redis and the processes are
sampled every 10 s; a minute's row (`bench.soak.verdict.Minute`) holds their means, the
archive's size at its end and its steps/s.

Cairn keeps an ended task's run state and hot checkpoints in Redis until it is forgotten
(`cairn forget`, docs/operations.md). The soak does what an operator does: once a task
ended and its latest GC is in the archive, it counts what the task left in Redis, by kind
(`bench.soak.verdict.Ended`), then forgets it. So the key count measures the running
system, and what an ended task leaves is judged apart.
"""

from __future__ import annotations

import contextlib
import os
import random
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import redis

from bench.scale import memory, turns
from bench.soak.verdict import STUCK_S, YOUNG, Ended, Minute
from cairn.agents.spec import AgentSpec
from cairn.coordinator.archiver import cold_slack
from cairn.coordinator.runs import TaskState
from cairn.coordinator.settings import open_store
from cairn.coordinator.spec import CheckpointPolicy, TaskSpec
from cairn.coordinator.tasks import Tasks
from cairn.errors import InvalidSpec
from cairn.storage import keys
from cairn.storage.archive import DEFAULT_SKEW_MARGIN
from cairn.storage.backends.redis import connect
from cairn.storage.store import CheckpointStore
from cairn.testing.redis_server import RedisServer
from chaos.faults import Fault, Plan
from chaos.run import ChaosRun
from chaos.team import AGENTS

TASKS, TEAM, LATENCY = 4, 3, 0.3  # tasks at once, agents a task, seconds a model turn
SUPERSTEPS = (10, 30)  # a task's length, drawn
HOT_KEEP, COLD_KEEP = 2, 5
WORKERS, CONCURRENCY = 2, 8
FAULTS = ("kill_worker", "kill_coordinator", "manual_restore")  # one a minute, in turn
FAULT_AT = 10.0  # seconds into each minute
RETIRE_AFTER = 3.0  # seconds after its end before an ended task is counted and removed
POLL = 0.5
SAMPLE_EVERY = 10.0  # seconds: a row is the mean of a minute's samples, not one moment
ENDED = {s.value for s in TaskState if s.ended}


def cold_bound() -> int:
    """The most GCs an ended task's archive may hold: `cold_keep` plus the trim's slack."""
    return COLD_KEEP + cold_slack(COLD_KEEP)


def soak_spec(name: str, supersteps: int) -> TaskSpec:
    """A task of TEAM scripted agents (named as the chaos team's) playing `supersteps` turns."""
    team = [
        AgentSpec(name=AGENTS[i], model="scripted", script=turns(i, supersteps, LATENCY))
        for i in range(TEAM)
    ]
    return TaskSpec(
        name=name,
        goal="Take notes, turn by turn.",
        files={"README.md": "# notes\n"},
        agents=team,
        max_supersteps=1_000,  # a restore by hand replays supersteps
        checkpoints=CheckpointPolicy(hot_keep=HOT_KEEP, cold_keep=COLD_KEEP),
    )


def tree_bytes(root: Path) -> int:
    """The bytes of every file under `root` (0 when it does not exist)."""
    total = 0
    for base, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                total += (Path(base) / name).stat().st_size
    return total


def descriptors(pid: int) -> int:
    """How many descriptors `pid` has open (0 when it is gone)."""
    try:
        return sum(1 for _ in Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return 0


def key_kind(key: str, task: str) -> str:
    """A task's key as its kind: `gc:*` for `cairn:{task}:gc:7`, `spend` for the spend hash."""
    head, *rest = key.removeprefix(keys.task_prefix(task)).split(":")
    return f"{head}:*" if rest else head


@dataclass(slots=True)
class Live:
    """A task the soak watches: its length, last GC seen and when it changed, when it ended."""

    supersteps: int
    latest: int = 0
    moved: float = field(default_factory=time.monotonic)
    ended: float | None = None
    status: str = ""
    replaced: bool = False  # another task was submitted when it first ended


@dataclass(slots=True)
class Process:
    """One Cairn process at one sample: its name, VmRSS and open descriptors."""

    name: str
    rss: int
    fds: int


class Soak(ChaosRun):
    """A soak in `directory` for `minutes`; `on_minute` sees each row as it is measured."""

    def __init__(
        self, directory: Path, minutes: int, seed: int = 1, minute_s: float = 60.0
    ) -> None:
        plan = Plan(seed, "async", WORKERS, [], CONCURRENCY)
        super().__init__(plan, directory, directory / "ledger", minute_s * minutes, mount=False)
        # As `cairn up` runs its own; `server` too, so the chaos run's stop kills it.
        self.redis_server = self.server = RedisServer(directory / "redis", appendonly=True)
        self.minutes = minutes
        self.minute_s = minute_s  # a "minute" of tests is shorter: faults, rows, rates alike
        self.live: dict[str, Live] = {}
        self.ended: list[Ended] = []
        self.stuck: list[str] = []
        self.retired_calls = 0
        self.submitted = 0
        self.store: CheckpointStore | None = None
        self.processes: list[list[Process]] = []  # per minute
        self.rq_keys: list[int] = []  # per minute
        self.faults: list[str] = []  # per minute: the fault and what it hit
        # this minute's samples: used_memory, keys, RQ's keys, summed VmRSS, summed fds
        self.samples: list[tuple[int, int, int, int, int]] = []
        self.last_processes: list[Process] = []
        self.draw = random.Random(seed)

    # processes ----------------------------------------------------------------------------
    def _env(self, name: str, port: int | None = None) -> dict[str, str]:
        """A process's settings: straight to Redis (no proxy), no audit stream."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("CAIRN_")}
        return {**env, "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
                "CAIRN_REDIS_URL": self.redis_server.url, "CAIRN_ARCHIVE_DIR": str(self.archive),
                "CAIRN_CACHE_DIR": str(self.dir / "cache" / name),
                "CAIRN_LOG_FORMAT": "json", "CAIRN_LOG_LEVEL": "info"}  # fmt: skip

    def _start(self) -> None:
        self.redis_server.start()
        self.client = connect(self.redis_server.url)
        self.store = open_store(self.settings, self.client)
        for _ in range(2):
            self._start_coordinator()
        for _ in range(self.plan.workers):
            self.workers.append(self._start_worker())

    def _start_worker(self) -> subprocess.Popen[bytes]:
        self._spawned += 1
        name = f"worker-{self._spawned}"
        concurrency = ["--concurrency", str(self.plan.concurrency)]
        return self._spawn(["cairn.coordinator.worker", *concurrency], name)

    def cairn_processes(self) -> list[Process]:
        """Every live Cairn process (coordinators, then workers), measured now."""
        named = [(n, p) for n, p in sorted(self.coordinators.items())]
        named += [(f"worker-{i + 1}", p) for i, p in enumerate(self.workers)]
        return [Process(n, memory(p.pid)[0], descriptors(p.pid)) for n, p in named
                if p.poll() is None]  # fmt: skip

    # tasks --------------------------------------------------------------------------------
    def _submit_one(self) -> None:
        assert self.client is not None
        assert self.store is not None
        self.submitted += 1
        supersteps = self.draw.randint(*SUPERSTEPS)
        task = Tasks(self.client, self.store).submit(soak_spec(f"soak{self.submitted}", supersteps))
        self.live[task] = Live(supersteps)

    def _look(self) -> None:
        """Note each live task's progress and end; replace an ended one; retire the old."""
        assert self.client is not None
        now = time.monotonic()
        pipe = self.client.pipeline(transaction=False)
        tasks = list(self.live)
        for task in tasks:
            pipe.hget(keys.run(task), "status")
            pipe.get(keys.latest(task))
        replies = cast(list[bytes | None], pipe.execute())
        for task, status, latest in zip(tasks, replies[::2], replies[1::2], strict=True):
            live = self.live[task]
            number = int(latest or 0)
            if number != live.latest:
                live.latest, live.moved = number, now
            if live.ended is None and status is not None and status.decode() in ENDED:
                live.ended, live.status = now, status.decode()
                if not live.replaced:
                    live.replaced = True
                    self._submit_one()
            elif live.ended is None and now - live.moved > STUCK_S and task not in self.stuck:
                self.stuck.append(task)
            if live.ended is not None and now - live.ended >= RETIRE_AFTER:
                self._retire(task)

    def _retire(self, task: str) -> None:
        """Count what an ended, archived task left in Redis and the archive; delete its keys."""
        assert self.client is not None
        assert self.store is not None
        live = self.live[task]
        if live.latest not in self.store.cold.list_gcs(task):
            late = live.ended is not None and time.monotonic() - live.ended > STUCK_S
            if late and task not in self.stuck:
                self.stuck.append(f"{task} (ended, GC {live.latest} not archived)")
            return  # not archived yet: the next look tries again
        found = [k.decode() for k in cast(Iterator[bytes], self.client.scan_iter(
            match=keys.task_prefix(task).replace("{", "\\{").replace("}", "\\}") + "*",
            count=1_000))]  # fmt: skip
        young = time.time() - DEFAULT_SKEW_MARGIN
        fresh = {sha for sha, at in self.store.hot.blob_times(task).items() if at >= young}
        kinds: dict[str, int] = {}
        for key in found:
            kind = key_kind(key, task)
            if kind == "blob:*" and key.rsplit(":", 1)[1] in fresh:
                kind += YOUNG
            kinds[kind] = kinds.get(kind, 0) + 1
        self.retired_calls += self._calls(task)
        where = self.archive / "tasks" / task
        self.ended.append(Ended(task, live.latest, live.status, kinds, tree_bytes(where),
                                len(self.store.cold.list_gcs(task))))  # fmt: skip
        try:
            Tasks(self.client, self.store).forget(task)
        except InvalidSpec:  # a restore ran it again since it ended: watch it to its new end
            live.ended, live.moved = None, time.monotonic()
            return
        del self.live[task]

    def _calls(self, task: str) -> int:
        """Model calls (step attempts) the task's agents made: its spend hash's counters."""
        assert self.client is not None
        spend = cast(dict[bytes, bytes], self.client.hgetall(keys.spend(task)))
        return sum(int(v) for f, v in spend.items()
                   if f.endswith(b":calls") and not f.startswith(b"inherited:"))  # fmt: skip

    def steps(self) -> int:
        """Step attempts so far, over every task the soak submitted."""
        return self.retired_calls + sum(self._calls(t) for t in self.live)

    # faults -------------------------------------------------------------------------------
    def _fault(self, kind: str, into: list[str]) -> None:
        """Inject `kind` into a running task (as the chaos suite does); note what it hit."""
        # A copy taken at once: the main thread adds and removes tasks meanwhile.
        running = [t for t, live in list(self.live.items()) if live.ended is None]
        self.task = self.draw.choice(running) if running else ""
        try:
            detail = getattr(self, f"_{kind}")(Fault(kind, 0.0, self.draw.random()))
        except (OSError, redis.RedisError) as exc:
            detail = {"error": str(exc)}
        into.append(kind if detail is None else f"{kind} {detail}")

    # the soak -----------------------------------------------------------------------------
    def run(self, on_minute: Callable[[Minute, list[Process], int, str], None]) -> list[Minute]:
        """Soak for `minutes`, calling `on_minute` with each row; stop everything at the end."""
        self.logs.mkdir(parents=True, exist_ok=True)
        rows: list[Minute] = []
        try:
            self._start()
            for _ in range(TASKS):
                self._submit_one()
            self.started = time.monotonic()
            steps_before = 0
            for minute in range(1, self.minutes + 1):
                begun = self.started + self.minute_s * (minute - 1)
                fault: list[str] = []
                injector: threading.Thread | None = None
                sampled = begun
                while (now := time.monotonic()) < begun + self.minute_s:
                    if injector is None and now >= begun + FAULT_AT * self.minute_s / 60:
                        kind = FAULTS[(minute - 1) % len(FAULTS)]
                        injector = threading.Thread(target=self._fault, args=(kind, fault),
                                                    name="soak-fault", daemon=True)  # fmt: skip
                        injector.start()
                    self.supervise()
                    self._look()
                    if now >= sampled + SAMPLE_EVERY * self.minute_s / 60:
                        self._sample()
                        sampled = now
                    time.sleep(POLL)
                if injector is not None:
                    injector.join(timeout=120)
                steps = self.steps()
                row, processes, rq = self._measure(minute, (steps - steps_before) / self.minute_s)
                steps_before = steps
                rows.append(row)
                self.processes.append(processes)
                self.rq_keys.append(rq)
                self.faults.append(fault[0] if fault else "-")
                on_minute(row, processes, rq, self.faults[-1])
            return rows
        finally:
            self.done.set()
            self._stop()

    def _sample(self) -> None:
        """Take one sample of Redis and the processes, for the minute's row."""
        assert self.client is not None
        info = cast(dict[str, int], self.client.info("memory"))
        rq = sum(1 for _ in self.client.scan_iter(match="rq:*", count=1_000))
        processes = self.cairn_processes()
        rss, fds = sum(p.rss for p in processes), sum(p.fds for p in processes)
        self.samples.append((int(info["used_memory"]), int(self.client.dbsize()), rq, rss, fds))
        self.last_processes = processes

    def _measure(self, minute: int, rate: float) -> tuple[Minute, list[Process], int]:
        """The minute's row: the means of its samples (one is taken now), archive, rate."""
        self._sample()
        columns = zip(*self.samples, strict=True)
        used, count, rq, rss, fds = (round(statistics.fmean(c)) for c in columns)
        self.samples = []
        row = Minute(minute, used, count, rss, fds, tree_bytes(self.archive), rate)
        return row, self.last_processes, rq
