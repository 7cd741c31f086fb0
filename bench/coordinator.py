"""The coordinator benchmark: the 2PC commit, coordinated restore, workers, empty steps.

A private redis-server and archive in a temporary directory; worker processes started as
tests/cluster.py starts them and stopped whatever happens; the coordinator ticks here.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import IO, cast
from unittest import mock

import redis
from rq import Queue, Worker
from rq.registry import FinishedJobRegistry
from rq.serializers import JSONSerializer

from bench.report import (
    Samples,
    Target,
    clock,
    duration,
    now_ns,
    pick,
    private_store,
    ratio,
    table,
)
from bench.storage import CONTENT_CHARS, Text, filesystem
from bench.storage import Bench as StorageBench
from cairn.agents.barrier import Barrier, build_gc, read_outputs
from cairn.agents.spec import AgentSpec, TaskRecord, ToolRequest, Turn
from cairn.agents.task import start_task
from cairn.coordinator import archiver as archiver_module
from cairn.coordinator.coordinator import Coordinator
from cairn.coordinator.jobs import STEPS_QUEUE
from cairn.coordinator.launcher import Launcher
from cairn.coordinator.restore import Restorer
from cairn.coordinator.runs import TERMINAL
from cairn.coordinator.spec import CheckpointPolicy, TaskSpec
from cairn.coordinator.tasks import Tasks
from cairn.storage import keys
from cairn.storage.archive import archive_gc, trim_cold, trim_hot
from cairn.storage.chain import WorkingState
from cairn.storage.records import GlobalCheckpoint, LCRef, Message, Role, ToolCall
from cairn.storage.store import MAX_CHAIN, CheckpointStore

ROOT = Path(__file__).resolve().parents[1]
GOAL = "Make the project pass its tests."
FULL_EVERY = 20
# pick(full, quick): `python -m bench --quick` runs the same code at the second sizes
TEAMS = pick((1, 8, 32, 128, 1_000), (1, 8, 128))  # agents per team in measurement 1
RATIO_TEAM = 128  # measurement 1's targets: this team against the 1-agent team
ROUNDS = pick(30, 4)  # supersteps per team; the largest team commits every BIG_EVERY-th
BIG_EVERY = 3
RESTORE_AGENTS, RESTORE_MESSAGES, RESTORES = pick((16, 200, 12), (4, 20, 2))
RESTORE_WORKERS, RESTORE_WARM, RESTORE_STAGED = pick((4, 2, 5), (2, 1, 1))
SCALE_AGENTS, SCALE_STEPS, SCALE_STEPS_ONE = pick((64, 20, 5), (8, 4, 3))
SCALE_WORKERS, LATENCY = pick(16, 2), 0.05
EMPTY_STEPS, EMPTY_RUNS, EMPTY_WORKERS = pick((200, 5, 4), (20, 1, 2))
EMPTY_WARM_STEPS, EMPTY_WARM_JOBS = pick((16, 50), (4, 10))
RQ_QUEUE, RQ_WORKER = "bench-empty", "worker -w rq.worker.SimpleWorker --logging_level WARNING"
JSON = "rq.serializers.JSONSerializer"
POLL = 0.01  # seconds between coordinator ticks (and RQ completion checks)


@dataclass(slots=True)
class Bench(StorageBench):
    """The storage part's set-up, plus the worker processes this part starts."""

    cairn: list[subprocess.Popen[bytes]] = field(default_factory=list)
    rq: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[IO[bytes]] = field(default_factory=list)

    def workers(self, n: int, *, plain: bool = False) -> None:
        """Grow or shrink to `n` Cairn (or plain RQ) workers, started as tests/cluster.py does."""
        procs, queue = (self.rq, RQ_QUEUE) if plain else (self.cairn, STEPS_QUEUE)
        while len(procs) > n:
            stop(procs.pop())
        while len(procs) < n:
            name = f"{'rq' if plain else 'cairn'}-worker-{len(self.logs)}"
            args = [sys.executable, "-m", "cairn.coordinator.worker", self.server.url]
            if plain:
                rq = str(Path(sys.executable).with_name("rq"))
                args = [rq, *RQ_WORKER.split(), "-S", JSON, "-u", self.server.url, queue]
            env = {**os.environ, "PYTHONPATH": str(ROOT), "CAIRN_REDIS_URL": self.server.url,
                   "CAIRN_ARCHIVE_DIR": str(self.root / "archive"),
                   "CAIRN_CACHE_DIR": str(self.root / name)}  # fmt: skip
            log = (self.root / f"{name}.log").open("wb")
            self.logs.append(log)
            procs.append(subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=log))
        watched, deadline = Queue(queue, connection=self.client), time.monotonic() + 60
        while Worker.count(connection=self.client, queue=watched) != n:
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError(f"{n} workers on {queue} did not come up; see {self.root}")
            time.sleep(0.05)

    def close(self) -> None:
        """Stop every worker process and close their logs."""
        for proc in [*self.cairn, *self.rq]:
            stop(proc)
        for log in self.logs:
            log.close()


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop a worker process (SIGTERM: an idle RQ worker exits at once), else kill it."""
    proc.terminate()  # does nothing to a process that has exited
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def cpu_used(b: Bench, workers: list[subprocess.Popen[bytes]], into: list[float]) -> Iterator[None]:
    """Set `into` to the CPU seconds `workers`, this process and redis-server used inside."""
    server = b.server.process.pid if b.server.process else 0
    groups = [[p.pid for p in workers], [os.getpid()], [server]]

    def cpu(pids: list[int]) -> float:  # user + system time, from /proc (Linux)
        ticks = 0
        for pid in pids:
            with contextlib.suppress(OSError):  # an exited process: nothing to add
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                ticks += int(fields[11]) + int(fields[12])
        return ticks / os.sysconf("SC_CLK_TCK")

    before = [cpu(g) for g in groups]
    yield
    into[:] = [cpu(g) - was for g, was in zip(groups, before, strict=True)]


def per_step(used: list[float], steps: int) -> str:
    """CPU per step of workers + this process + redis-server, as "1.2+3.4+5.6 ms"."""
    return "+".join(f"{1e3 * s / steps:.1f}" for s in used) + " ms"


# a team written directly ---------------------------------------------------------------
@dataclass(slots=True)
class Team:
    """A task whose agents' step LCs this process writes itself: no workers, no model."""

    store: CheckpointStore
    gc: GlobalCheckpoint
    states: list[WorkingState]

    @classmethod
    def start(cls, store: CheckpointStore, task: str, agents: int) -> Team:
        """Start `task` (GC 0) with agents a0..a{agents-1} and read their states back."""
        specs = [AgentSpec(name=f"a{i}", model="scripted") for i in range(agents)]
        gc = start_task(store, TaskRecord(task=task, goal=GOAL, agents=specs), {"README.md": b"x"})
        states = [store.read_state(task, a, ref.id, ref.checksum) for a, ref in gc.members.items()]
        return cls(store, gc, states)

    def vote(self, words: Callable[[], str]) -> dict[str, LCRef]:
        """Every agent takes a step (a tool call and its result) and votes with its LC."""
        superstep, votes = self.gc.superstep + 1, {}
        for state in self.states:
            state.superstep, state.attempt, state.step = superstep, 1, state.step + 1
            call = ToolCall(id=f"call-{state.step}", name="write_file", args={"path": "a.py"})
            state.messages += [
                Message(role=Role.ASSISTANT, content=words(), tool_calls=[call]),
                Message(role=Role.TOOL, tool_call_id=call.id, name=call.name, content="ok"),
            ]
            self.store.hot.begin_attempt(state.task, state.agent, superstep, 1)
            votes[state.agent] = self.store.write_lc(state, vote=True)
        return votes

    def commit(self, votes: dict[str, LCRef]) -> tuple[int, int, int]:
        """Build and commit the next GC as the coordinator does; return three times (ns).

        From the last vote to committed, of commit_gc alone, and of its hot-store call. The
        coordinator reads each LC's outputs as its vote arrives (`Watcher.ingest`): the early
        votes are read untimed, the last one inside the timed part.
        """
        gc, order = self.gc, [s.agent for s in self.states]
        number, superstep = gc.number + 1, gc.superstep + 1
        intent = gc.model_copy(update={"number": number, "superstep": superstep})
        self.store.prepare_gc(intent)  # untimed: the coordinator prepares at launch
        *early, last = order
        ahead = read_outputs(self.store, gc.task, {a: votes[a] for a in early})

        def barrier() -> Barrier:
            read = {**ahead, **read_outputs(self.store, gc.task, {last: votes[last]})}
            return build_gc(self.store, gc, votes, order, number=number, superstep=superstep,
                            epoch=gc.epoch, outputs=read)  # fmt: skip

        built, build_ns = clock(barrier)
        script = [0]
        with timing(script, self.store.hot, "commit_gc"):
            self.gc, commit_ns = clock(partial(self.store.commit_gc, built.gc))
        return build_ns + commit_ns, commit_ns, script[0]


# 1. the 2PC commit ---------------------------------------------------------------------
def commits(b: Bench) -> None:
    """Measurement 1: last vote to committed (last LC read + build_gc + commit_gc) by size."""
    teams = {n: Team.start(b.store, f"commit{n}", n) for n in TEAMS}
    got = {n: (Samples(), Samples(), Samples()) for n in TEAMS}  # both, commit_gc, script
    ping = Samples()
    for r in range(-2, ROUNDS):  # two warm-up rounds
        for n, team in teams.items():
            if n < TEAMS[-1] or r % BIG_EVERY == 0:
                times = (*team.commit(team.vote(lambda: "ok")), clock(b.client.ping)[1])
                for into, ns in zip((*got[n], ping), times if r >= 0 else (), strict=False):
                    into.add(ns)
    headers = ["team", "commits", "vote→commit p50", "vote→commit p99", "commit_gc p50",
               "commit_gc p99"]  # fmt: skip
    rows = [["floor: PING round trip", "-", *map(duration, (ping.p50, ping.p99)), "-", "-", "-"]]
    rows += [
        [f"{n:,} agents", str(len(both)), *map(duration, (both.p50, both.p99, alone.p50,
         alone.p99, script.p50))]
        for n, (both, alone, script) in got.items()
    ]  # fmt: skip
    table(
        f"1. 2PC commit, last vote to committed: read the last LC, build_gc, commit_gc "
        f"(teams take turns "
        f"superstep by superstep; the {TEAMS[-1]:,}-agent team every {BIG_EVERY}rd)",
        [*headers, "its hot.commit_gc p50"],
        rows,
    )
    print(
        "(As the coordinator does, each LC's outputs are read when its vote arrives: the "
        "early votes' untimed, the last one's timed. build_gc merges the change sets and "
        "builds the GC; commit_gc seals it (canonical JSON, sha256, zstd) and runs one "
        "EVALSHA that checks every member against the superstep's tentative-LC hash "
        "(written with each LC), moves the pointer and sweeps the superstep's other LCs. "
        "Each agent voted in an EVALSHA of its own, untimed)"
    )
    for i, name, limit in ((0, "last vote to committed", 3.0), (1, "commit_gc", None),
                           (2, "its hot.commit_gc", None)):  # fmt: skip
        measured = got[RATIO_TEAM][i].p50 / got[1][i].p50
        b.targets.append(
            Target(f"{name} p50 @{RATIO_TEAM} agents / @1 agent", measured, limit).report()
        )


# 2. coordinated restore ----------------------------------------------------------------
def restore_team(b: Bench, task: str) -> int:
    """Run RESTORE_AGENTS agents to RESTORE_MESSAGES messages; return the last GC number.

    Two messages per agent a superstep; every GC is committed and archived, as under the
    default CheckpointPolicy, and both tiers are trimmed to it once, at the end (the end
    state of trimming after each GC, without trim_cold reading every archived chain).
    """
    policy, team = CheckpointPolicy(), Team.start(b.store, task, RESTORE_AGENTS)
    while len(team.states[0].messages) < RESTORE_MESSAGES:
        team.commit(team.vote(partial(b.text.words, CONTENT_CHARS)))
        archive_gc(b.store, task, team.gc.number)
    trim_hot(b.store, task, policy.hot_keep)
    trim_cold(b.store, task, policy.cold_keep)
    for agent, ref in team.gc.members.items():  # the hot case must be all hot
        chain = b.store.load_chain(task, agent, ref.id, ref.checksum)
        if len(b.store.hot.read_chain(task, ref.id, MAX_CHAIN)) != len(chain):
            raise RuntimeError(f"{agent}'s chain is not all in Redis")
    return team.gc.number


def wipe(client: redis.Redis, task: str) -> None:
    """Delete every Redis key of `task`, as a FLUSHALL would: only the archive has it."""
    names = list(client.scan_iter(match=keys.task_prefix(task) + "*", count=1_000))
    if names:
        client.delete(*names)


def restores(b: Bench) -> None:
    """Measurement 2: restore of RESTORE_AGENTS agents, hot, cold, and on 4 workers."""
    hot_to, cold_to = restore_team(b, "rhot"), restore_team(b, "rcold")
    inline = Restorer(b.client, b.store, workers=False)
    hot, cold = Samples(), Samples()
    for i in range(-1, RESTORES):  # one warm-up round
        hot_ns = clock(partial(inline.restore, "rhot", to=hot_to))[1]
        wipe(b.client, "rcold")
        cold_ns = clock(partial(inline.restore, "rcold", to=cold_to))[1]
        if i >= 0:
            hot.add(hot_ns)
            cold.add(cold_ns)
    b.workers(RESTORE_WORKERS)
    staged = partial(Restorer(b.client, b.store, workers=True).restore, "rhot", to=hot_to)
    for _ in range(RESTORE_WARM):  # warm-up: every worker imports the code and builds its store
        staged()
    workers = Samples([clock(staged)[1] for _ in range(RESTORE_STAGED)])
    b.client.srem(keys.ACTIVE_TASKS, "rhot", "rcold")  # the restorer made them active
    archived = len(b.store.cold.list_gcs("rcold"))
    rows = [
        ("hot: everything in Redis, staged inline", hot),
        (f"cold: task wiped from Redis, from the archive ({archived} GCs)", cold),
        (f"hot, staged on {RESTORE_WORKERS} worker processes (info)", workers),
    ]
    table(
        f"2. Coordinated restore of {RESTORE_AGENTS} agents x {RESTORE_MESSAGES} msgs "
        f"(full_every={FULL_EVERY}; hot and cold take turns, {RESTORES} each after a warm-up)",
        ["restore", "runs", "p50", "p99", "p50 vs hot"],
        [[n, str(len(s)), duration(s.p50), duration(s.p99), ratio(s.p50, hot.p50)]
         for n, s in rows],
    )  # fmt: skip
    print(
        "(cold: every key of the task is deleted before each run, as a FLUSHALL would: the "
        "spec, GC list, GCs, every chain's LCs and the workspace come from the archive (in "
        "the page cache); staged LCs and the new GC go to Redis. The restorer on workers "
        "polls for votes every 20 ms)"
    )
    for name, measured, limit in (("restore cold p50 / hot p50", cold.p50 / hot.p50, 3.0),
                                  (f"restore on {RESTORE_WORKERS} workers p50 / inline p50 (hot)",
                                   workers.p50 / hot.p50, None)):  # fmt: skip
        b.targets.append(Target(name, measured, limit).report())


# coordinator runs ----------------------------------------------------------------------
@dataclass(slots=True)
class Drive:
    """One task driven to its end: when each GC committed, and where the coordinator went."""

    commits: list[int]  # ns after the first tick at which GC 1, 2, ... was committed
    wall: int
    ticks: int  # ns spent inside tick(), this process's share of the work
    launching: int  # ns of it spent launching steps (begin_attempt, enqueue, note)
    archiving: int  # ns in archive_gc, trim_hot, trim_cold, on the archiver's thread
    status: str
    cpu: list[float]  # CPU seconds of the workers, this process and redis-server


@contextlib.contextmanager
def timing(into: list[int], owner: object, *names: str) -> Iterator[None]:
    """Add the time every call of `owner.<name>` takes to `into[0]` (names gone: skipped)."""
    with contextlib.ExitStack() as stack:
        for name in names:
            real = getattr(owner, name, None)
            if real is None:  # others refactor concurrently
                continue

            def timed(*args: object, _real: Callable[..., object] = real, **kw: object) -> object:
                started = now_ns()
                try:
                    return _real(*args, **kw)
                finally:
                    into[0] += now_ns() - started

            stack.enter_context(mock.patch.object(owner, name, timed))
        yield


def drive(b: Bench, coordinator: Coordinator, task: str, timeout: float = 240.0) -> Drive:
    """Tick every POLL seconds until `task` ends; note when each commit_gc returned."""
    launching, archiving, busy, seen, used = [0], [0], 0, list[int](), list[float]()
    commit_gc, commit_and_begin, started = b.store.commit_gc, b.store.commit_and_begin, now_ns()

    def committing(gc: GlobalCheckpoint, owner: int | None = None) -> GlobalCheckpoint:
        done = commit_gc(gc, owner)
        seen.append(now_ns() - started)
        return done

    def beginning(
        gc: GlobalCheckpoint, attempts: Mapping[str, int], owner: int | None = None
    ) -> tuple[GlobalCheckpoint, GlobalCheckpoint | None]:
        done = commit_and_begin(gc, attempts, owner)
        seen.append(now_ns() - started)
        return done

    with (
        mock.patch.object(b.store, "commit_gc", committing),
        mock.patch.object(b.store, "commit_and_begin", beginning),
        cpu_used(b, b.cairn, used),
        timing(launching, Launcher, "launch"),
        timing(archiving, archiver_module, "archive_gc", "trim_hot", "trim_cold"),
    ):
        while True:
            t = now_ns()
            coordinator.tick()
            busy += now_ns() - t
            status = (cast(bytes | None, b.client.hget(keys.run(task), "status")) or b"").decode()
            if status in TERMINAL:
                break
            if now_ns() - started > timeout * 1e9:
                where = Tasks(b.client, b.store).status(task)
                raise RuntimeError(f"task {task} did not end: {where}")
            time.sleep(POLL)
    return Drive(seen, now_ns() - started, busy, launching[0], archiving[0], status, used)


def scripted(name: str, agents: int, turns: Callable[[int], list[Turn]]) -> TaskSpec:
    """A task of `agents` scripted agents a0.., agent i playing `turns(i)`."""
    team = [AgentSpec(name=f"a{i}", model="scripted", script=turns(i)) for i in range(agents)]
    return TaskSpec(name=name, goal=GOAL, files={"README.md": "# notes\n"}, agents=team)


def busy_turns(agent: int, supersteps: int) -> list[Turn]:
    """One turn per superstep at LATENCY: write a note or read the README; finish last."""

    def note(k: int) -> ToolRequest:
        return ToolRequest(name="write_file", args={"path": f"a{agent}.md", "content": f"{k}\n"})

    read = ToolRequest(name="read_file", args={"path": "README.md"})
    tools = [read if k % 2 else note(k) for k in range(supersteps - 1)]
    tools.append(ToolRequest(name="finish", args={"summary": "done"}))
    return [Turn(say=f"turn {k}", latency=LATENCY, tools=[t]) for k, t in enumerate(tools)]


# 3. worker scaling ---------------------------------------------------------------------
def scaling(b: Bench, coordinator: Coordinator) -> None:
    """Measurement 3: SCALE_AGENTS agents at LATENCY per turn on 1 worker vs SCALE_WORKERS."""
    runs: dict[int, Drive] = {}
    for workers, supersteps in ((1, SCALE_STEPS_ONE), (SCALE_WORKERS, SCALE_STEPS)):
        b.workers(workers)
        spec = scripted(f"scale{workers}", SCALE_AGENTS, partial(busy_turns, supersteps=supersteps))
        runs[workers] = run = drive(b, coordinator, Tasks(b.client, b.store).submit(spec))
        if run.status != "succeeded" or len(run.commits) != supersteps:
            raise RuntimeError(f"{workers}-worker run: {run.status}, {len(run.commits)} GCs")
    per, rows = {}, []
    for workers, run in runs.items():
        first, n = run.commits[0], len(run.commits)
        per[workers] = (run.commits[-1] - first) / (n - 1)  # supersteps 2..n
        shares = (x / run.wall for x in (run.ticks, run.launching, run.archiving))
        rows.append(
            [f"{workers} worker{'s' * (workers > 1)}", str(n), f"{run.wall / 1e9:.2f} s",
             duration(first), duration(per[workers]), f"{1e9 / per[workers]:.2f}",
             f"{SCALE_AGENTS * 1e9 / per[workers]:.0f}",
             f"{(first + (SCALE_STEPS - 1) * per[workers]) / 1e9:.2f} s",
             "{:.0%} ({:.0%}), {:.0%}".format(*shares), per_step(run.cpu, n * SCALE_AGENTS)]
        )  # fmt: skip
    table(
        f"3. Worker scaling: {SCALE_AGENTS} agents, one turn per superstep at "
        f"{LATENCY * 1e3:g} ms model latency (a write_file or read_file, finish last)",
        ["workers", "supersteps", "wall", "superstep 1", "per superstep 2..", "supersteps/s",
         "steps/s", f"est. {SCALE_STEPS}", "wall: ticks (launch), archiver",
         "CPU/step: workers+coord.+redis"],
        rows,
    )  # fmt: skip
    many = SCALE_WORKERS
    used = sum(runs[many].cpu) / len(runs[many].commits)
    print(
        f"(1 worker plays {SCALE_STEPS_ONE} supersteps, {many} play {SCALE_STEPS}; throughput is"
        " the mean time per superstep after the first (which fills the workers' caches); "
        f"'est.' adds {SCALE_STEPS - 1} such to superstep 1. Model latency alone: "
        f"{SCALE_AGENTS * LATENCY:g} s a superstep on 1 worker, "
        f"{SCALE_AGENTS * LATENCY / many:g} s on {many}. With {many}, all processes used "
        f"{used:.2f} CPU-s a superstep: >= "
        f"{used / (os.cpu_count() or 1):.2f} s on {os.cpu_count()} CPUs. Ticks every "
        f"{POLL * 1e3:g} ms; launch: Launcher.launch; archiver: archive_gc + trims on "
        "the coordinator's archiver thread, off the loop)"
    )
    b.targets.append(
        Target(f"time per superstep, {many} workers / 1 worker (>= 10x throughput)",
               per[many] / per[1], 0.1).report()
    )  # fmt: skip


# 4. empty steps against empty RQ jobs --------------------------------------------------
def rq_empty(b: Bench, queue: Queue, jobs: int) -> tuple[int, list[float]]:
    """Enqueue `jobs` calls of builtins.len; return ns until all finished, and CPU used."""
    finished, used = FinishedJobRegistry(queue=queue).key, list[float]()
    before = int(b.client.zcard(finished))
    with cpu_used(b, b.rq, used):
        started = now_ns()
        for _ in range(jobs):
            queue.enqueue_call("builtins.len", args=("x",), result_ttl=3_600, failure_ttl=86_400)
        while int(b.client.zcard(finished)) < before + jobs:
            if now_ns() - started > 120e9:
                raise RuntimeError("the RQ jobs did not finish")
            time.sleep(POLL)
        took = now_ns() - started
    return took, used


def empty_steps(b: Bench, coordinator: Coordinator) -> None:
    """Measurement 4: EMPTY_STEPS empty steps on 4 Cairn workers vs as many RQ jobs."""
    b.workers(EMPTY_WORKERS)
    b.workers(EMPTY_WORKERS, plain=True)
    queue = Queue(RQ_QUEUE, connection=b.client, serializer=JSONSerializer)
    cairn, plain = [], []

    def empty(run: str, agents: int) -> Drive:
        spec = scripted(f"empty-{run}", agents, lambda _: [Turn(say="Nothing to do.")])
        return drive(b, coordinator, Tasks(b.client, b.store).submit(spec))

    empty("warm", EMPTY_WARM_STEPS)  # warm-up: each worker imports and runs the step code
    rq_empty(b, queue, EMPTY_WARM_JOBS)
    for run in range(EMPTY_RUNS):
        cairn.append(empty(str(run), EMPTY_STEPS))
        plain.append(rq_empty(b, queue, EMPTY_STEPS))
    b.workers(0, plain=True)
    rq_ns, rq_cpu = sorted(plain)[len(plain) // 2]
    mid = sorted(cairn, key=lambda d: d.commits[0])[len(cairn) // 2]
    rows = [
        ["RQ: builtins.len('x') jobs, SimpleWorker, JSON", " / ".join(f"{ns / 1e9:.2f} s"
         for ns, _ in plain), f"{rq_ns / 1e9:.2f} s", f"{EMPTY_STEPS * 1e9 / rq_ns:.0f}",
         "1.00x", per_step(rq_cpu, EMPTY_STEPS)],
        ["Cairn: one superstep of steps, enqueue to commit", " / ".join(
         f"{d.commits[0] / 1e9:.2f} s" for d in cairn), f"{mid.commits[0] / 1e9:.2f} s",
         f"{EMPTY_STEPS * 1e9 / mid.commits[0]:.0f}", ratio(rq_ns, mid.commits[0]),
         per_step(mid.cpu, EMPTY_STEPS)],
    ]  # fmt: skip
    table(
        f"4. {EMPTY_STEPS} empty steps through Cairn vs {EMPTY_STEPS} trivial RQ jobs, "
        f"{EMPTY_WORKERS} worker processes each ({EMPTY_RUNS} runs each, taking turns)",
        ["variant", "runs", "median", "per second", "throughput vs RQ",
         "CPU/step: workers+this process+redis"],
        rows,
    )  # fmt: skip
    print(
        f"(Cairn: one task of {EMPTY_STEPS} agents whose one turn calls no tool, from the "
        "first tick (which launches every step) to commit_gc returning. Of the median run's "
        f"{duration(mid.wall)} to the task's end, ticks took {duration(mid.ticks)}: launching "
        f"{duration(mid.launching)}; the archiver thread archived the GC after the commit in "
        f"{duration(mid.archiving)}. Idle meanwhile: the {EMPTY_WORKERS} workers of the other kind)"
    )
    b.targets.append(
        Target("Cairn time per empty step / RQ time per empty job (Cairn >= 60% of RQ)",
               mid.commits[0] / rq_ns, round(1 / 0.6, 2)).report()
    )  # fmt: skip


# the part ------------------------------------------------------------------------------
def run() -> list[Target]:
    """Run the coordinator measurements on a private Redis and workers; return the targets."""
    with contextlib.ExitStack() as stack:
        root, server, client, store = private_store(stack, FULL_EVERY, quiet=True)
        b = Bench(root, server, client, store, Text(seed=2028))
        stack.callback(b.close)
        print(
            f"\n== coordinator ==\nredis-server private (port {server.port}, no AOF); archive"
            f" on {filesystem(root)}; Coordinator logs as JSON at level info into /dev/null"
        )
        commits(b)
        restores(b)
        coordinator = Coordinator(client, store)
        scaling(b, coordinator)
        empty_steps(b, coordinator)
        return b.targets
