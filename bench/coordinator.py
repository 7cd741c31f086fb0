"""The coordinator benchmark: the 2PC commit, coordinated restore, workers, empty steps.

Everything runs against a private redis-server and an archive in a temporary directory,
both removed at the end. Worker processes start as `tests/cluster.py` starts them
(`python -m coordinator.worker URL`, each with a workspace cache of its own) and are
stopped at the end whatever happens; the coordinator ticks in this process.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import IO, cast
from unittest import mock

import redis
import structlog
from rq import Queue, Worker
from rq.registry import FinishedJobRegistry
from rq.serializers import JSONSerializer

from agents.barrier import build_gc
from agents.logs import configure_logging
from agents.spec import AgentSpec, TaskRecord, ToolRequest, Turn
from agents.task import start_task
from bench.report import Samples, Target, clock, duration, now_ns, ratio, table
from bench.storage import CONTENT_CHARS, Text, filesystem
from coordinator import coordinator as coordinator_module
from coordinator.coordinator import TERMINAL, Coordinator
from coordinator.jobs import STEPS_QUEUE
from coordinator.restore import Restorer
from coordinator.spec import CheckpointPolicy, TaskSpec
from storage import keys
from storage.archive import archive_gc, trim_cold, trim_hot
from storage.backends.disk import DiskArchive
from storage.backends.redis import RedisHotStore, connect
from storage.chain import AgentState
from storage.codec import Codec
from storage.records import GlobalCheckpoint, LCRef, Message, Role, ToolCall
from storage.redis_server import RedisServer
from storage.store import MAX_CHAIN, CheckpointStore

ROOT = Path(__file__).resolve().parents[1]
GOAL = "Make the project pass its tests."
FULL_EVERY = 20
TEAMS = (1, 8, 32, 128, 1_000)  # agents per team in measurement 1
ROUNDS = 30  # supersteps per team; the 1,000-agent team commits every BIG_EVERY-th
BIG_EVERY = 3
RESTORE_AGENTS, RESTORE_MESSAGES, RESTORES = 16, 200, 12
SCALE_AGENTS, SCALE_STEPS, SCALE_STEPS_ONE, LATENCY = 64, 20, 5, 0.05
EMPTY_STEPS, EMPTY_RUNS, EMPTY_WORKERS = 200, 3, 4
RQ_QUEUE = "bench-empty"
POLL = 0.01  # seconds between coordinator ticks (and RQ completion checks)


@dataclass(slots=True)
class Bench:
    """The private Redis, the store over it, the worker processes, the targets."""

    root: Path
    server: RedisServer
    client: redis.Redis
    store: CheckpointStore
    text: Text
    cairn: list[subprocess.Popen[bytes]] = field(default_factory=list)
    rq: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[IO[bytes]] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)

    def spawn(self, args: list[str], cache: str) -> subprocess.Popen[bytes]:
        """Start one worker process as tests/cluster.py does, its stderr to a log file."""
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "CAIRN_REDIS_URL": self.server.url,
            "CAIRN_ARCHIVE_DIR": str(self.root / "archive"),
            "CAIRN_CACHE_DIR": str(self.root / cache),
        }
        log = (self.root / f"{cache}.log").open("wb")
        self.logs.append(log)
        return subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=log)

    def workers(self, n: int, *, plain: bool = False) -> None:
        """Grow or shrink to `n` Cairn workers (or plain `rq worker`s) and wait for them."""
        procs, queue = (self.rq, RQ_QUEUE) if plain else (self.cairn, STEPS_QUEUE)
        while len(procs) > n:
            stop(procs.pop())
        while len(procs) < n:
            name = f"{'rq' if plain else 'cairn'}-worker-{len(self.logs)}"
            args = [sys.executable, "-m", "coordinator.worker", self.server.url]
            if plain:
                rq = str(Path(sys.executable).with_name("rq"))
                args = [rq, "worker", "-u", self.server.url, "-w", "rq.worker.SimpleWorker"]
                args += ["-S", "rq.serializers.JSONSerializer", "--logging_level", "WARNING"]
                args.append(queue)
            procs.append(self.spawn(args, name))
        watched = Queue(queue, connection=self.client)
        deadline = time.monotonic() + 60
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
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# a team written directly ---------------------------------------------------------------
@dataclass(slots=True)
class Team:
    """A task whose agents' step LCs this process writes itself: no workers, no model."""

    store: CheckpointStore
    gc: GlobalCheckpoint
    states: list[AgentState]

    @classmethod
    def start(cls, store: CheckpointStore, task: str, agents: int) -> Team:
        """Start `task` (GC 0) with agents a0..a{agents-1} and read their states back."""
        specs = [AgentSpec(name=f"a{i}") for i in range(agents)]
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

    def commit(self, votes: dict[str, LCRef]) -> tuple[int, int]:
        """Prepare (untimed, as the coordinator does at launch), then build and commit the GC.

        Returns the nanoseconds build_gc and commit_gc took.
        """
        gc, order = self.gc, [s.agent for s in self.states]
        number, superstep = gc.number + 1, gc.superstep + 1
        self.store.prepare_gc(gc.model_copy(update={"number": number, "superstep": superstep}))
        built, build_ns = clock(
            partial(build_gc, self.store, gc, votes, order, number=number, superstep=superstep,
                    epoch=gc.epoch)
        )  # fmt: skip
        self.gc, commit_ns = clock(partial(self.store.commit_gc, built.gc))
        return build_ns, commit_ns


# 1. the 2PC commit ---------------------------------------------------------------------
def commits(b: Bench) -> None:
    """Measurement 1: last vote to committed (build_gc + commit_gc) by team size."""
    teams = {n: Team.start(b.store, f"commit{n}", n) for n in TEAMS}
    both = {n: Samples() for n in TEAMS}
    alone = {n: Samples() for n in TEAMS}
    ping = Samples()
    for r in range(-2, ROUNDS):  # two warm-up rounds
        for n, team in teams.items():
            if n == TEAMS[-1] and r % BIG_EVERY:
                continue
            build_ns, commit_ns = team.commit(team.vote(lambda: "ok"))
            ping_ns = clock(b.client.ping)[1]
            if r >= 0:
                both[n].add(build_ns + commit_ns)
                alone[n].add(commit_ns)
                ping.add(ping_ns)
    rows = [["floor: PING round trip", "-", duration(ping.p50), duration(ping.p99), "-", "-"]]
    rows += [
        [f"{n:,} agents", str(len(alone[n])), duration(both[n].p50), duration(both[n].p99),
         duration(alone[n].p50), duration(alone[n].p99)]
        for n in TEAMS
    ]  # fmt: skip
    table(
        f"1. 2PC commit, last vote to committed: build_gc + commit_gc (teams take turns "
        f"superstep by superstep; the {TEAMS[-1]:,}-agent team every {BIG_EVERY}rd)",
        ["team", "commits", "both p50", "both p99", "commit_gc p50", "commit_gc p99"],
        rows,
    )
    one, mid, big = (alone[n].p50 for n in (1, 128, TEAMS[-1]))
    print(
        f"(commit_gc is one Lua script checking every member's LC; at {TEAMS[-1]:,} agents "
        f"{ratio(big, one)} of 1 agent's; build_gc reads every voted LC: "
        f"{duration(both[TEAMS[-1]].p50 - big)} at {TEAMS[-1]:,} agents)"
    )
    b.targets.append(Target("commit_gc p50 @128 agents / @1 agent", mid / one, 3.0).report())
    b.targets.append(
        Target("build_gc + commit_gc p50 @128 / @1", both[128].p50 / both[1].p50, None).report()
    )


# 2. coordinated restore ----------------------------------------------------------------
def restore_team(b: Bench, task: str) -> int:
    """Run RESTORE_AGENTS agents to RESTORE_MESSAGES messages, archiving as policy says.

    Each superstep adds two messages per agent; every GC is committed, archived and the
    tiers trimmed as the coordinator does under the default CheckpointPolicy. Returns the
    last GC's number.
    """
    policy, team = CheckpointPolicy(), Team.start(b.store, task, RESTORE_AGENTS)
    while len(team.states[0].messages) < RESTORE_MESSAGES:
        team.commit(team.vote(partial(b.text.words, CONTENT_CHARS)))
        archive_gc(b.store, task, team.gc.number)
        trim_hot(b.store, task, policy.hot_keep)
        trim_cold(b.store, task, policy.cold_keep)
    for agent, ref in team.gc.members.items():
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
    b.workers(4)
    on_workers = Restorer(b.client, b.store, workers=True)
    on_workers.restore("rhot", to=hot_to)  # warm-up: the workers import the restore code
    workers = Samples([clock(partial(on_workers.restore, "rhot", to=hot_to))[1] for _ in "123"])
    b.client.srem(keys.ACTIVE_TASKS, "rhot", "rcold")  # the restorer made them active
    archived = len(b.store.cold.list_gcs("rcold"))
    rows = [
        ("hot: everything in Redis, staged inline", hot),
        (f"cold: task wiped from Redis, from the archive ({archived} GCs)", cold),
        ("hot, staged on 4 worker processes (info)", workers),
    ]
    table(
        f"2. Coordinated restore of {RESTORE_AGENTS} agents x {RESTORE_MESSAGES} msgs "
        f"(full_every={FULL_EVERY}; hot and cold take turns, {RESTORES} each after a warm-up)",
        ["restore", "runs", "p50", "p99", "p50 vs hot"],
        [[n, str(len(s)), duration(s.p50), duration(s.p99), ratio(s.p50, hot.p50)]
         for n, s in rows],
    )  # fmt: skip
    print(
        "(cold: every key of the task is deleted before each run, as a FLUSHALL would, so "
        "the spec, the GC list, every GC, every LC of each chain and the workspace come "
        f"from the archive on {filesystem(b.root)}, its files in the page cache; the staged"
        " LCs and the new GC are written to Redis as in the hot case. Workers: the restorer"
        " polls for votes every 20 ms)"
    )
    b.targets.append(Target("restore cold p50 / hot p50", cold.p50 / hot.p50, 3.0).report())
    b.targets.append(
        Target("restore on 4 workers p50 / inline p50 (hot)", workers.p50 / hot.p50, None).report()
    )


# coordinator runs ----------------------------------------------------------------------
@dataclass(slots=True)
class Drive:
    """One task driven to its end: when each GC committed, and where the coordinator went."""

    commits: list[int]  # ns after the first tick at which GC 1, 2, ... was seen committed
    wall: int
    ticks: int  # ns spent inside tick(), this process's share of the work
    archiving: int  # ns of it spent in archive_gc (the default policy archives every GC)
    status: str


@contextlib.contextmanager
def timing(into: list[int], owner: object, name: str) -> Iterator[None]:
    """Add the time every call of `owner.name` takes to `into[0]`."""
    real = getattr(owner, name)

    def timed(*args: object, **kwargs: object) -> object:
        started = now_ns()
        try:
            return real(*args, **kwargs)
        finally:
            into[0] += now_ns() - started

    with mock.patch.object(owner, name, timed):
        yield


def drive(b: Bench, coordinator: Coordinator, task: str, timeout: float = 240.0) -> Drive:
    """Tick every POLL seconds until `task` ends; time each commit from the first tick."""
    archiving, busy, seen = [0], 0, list[int]()
    with timing(archiving, coordinator_module, "archive_gc"):
        started = now_ns()
        while True:
            t = now_ns()
            coordinator.tick()
            busy += now_ns() - t
            latest = b.store.hot.latest_gc(task) or 0
            seen += [now_ns() - started] * (latest - len(seen))
            status = cast(bytes | None, b.client.hget(keys.run(task), "status")) or b""
            if status.decode() in TERMINAL:
                return Drive(seen, now_ns() - started, busy, archiving[0], status.decode())
            if now_ns() - started > timeout * 1e9:
                raise RuntimeError(f"task {task} did not end: {coordinator.status(task)}")
            time.sleep(POLL)


def scripted(name: str, agents: int, turns: Callable[[int], list[Turn]]) -> TaskSpec:
    """A task of `agents` scripted agents a0.., agent i playing `turns(i)`."""
    team = [AgentSpec(name=f"a{i}", script=turns(i)) for i in range(agents)]
    return TaskSpec(name=name, goal=GOAL, files={"README.md": "# notes\n"}, agents=team)


def busy_turns(agent: int, supersteps: int) -> list[Turn]:
    """One turn per superstep at LATENCY: write a note, read the README, finish last."""
    out = []
    for k in range(supersteps):
        if k == supersteps - 1:
            tool = ToolRequest(name="finish", args={"summary": "done"})
        elif k % 2 == 0:
            tool = ToolRequest(
                name="write_file", args={"path": f"notes/a{agent}.md", "content": f"note {k}\n"}
            )
        else:
            tool = ToolRequest(name="read_file", args={"path": "README.md"})
        out.append(Turn(say=f"turn {k}", latency=LATENCY, tools=[tool]))
    return out


# 3. worker scaling ---------------------------------------------------------------------
def scaling(b: Bench, coordinator: Coordinator) -> None:
    """Measurement 3: SCALE_AGENTS agents at LATENCY per turn on 1 worker vs 16."""
    runs: dict[int, Drive] = {}
    for workers, supersteps in ((1, SCALE_STEPS_ONE), (16, SCALE_STEPS)):
        b.workers(workers)
        spec = scripted(f"scale{workers}", SCALE_AGENTS, partial(busy_turns, supersteps=supersteps))
        runs[workers] = run = drive(b, coordinator, coordinator.submit(spec))
        if run.status != "succeeded" or len(run.commits) != supersteps:
            raise RuntimeError(f"{workers}-worker run: {run.status}, {len(run.commits)} GCs")
    per: dict[int, float] = {}
    rows = []
    for workers, run in runs.items():
        first, n = run.commits[0], len(run.commits)
        per[workers] = (run.commits[-1] - first) / (n - 1)  # supersteps 2..n
        whole = first + (SCALE_STEPS - 1) * per[workers]
        rows.append(
            [f"{workers} worker{'s' * (workers > 1)}", str(n), f"{run.wall / 1e9:.2f} s",
             duration(first), duration(per[workers]), f"{1e9 / per[workers]:.2f}",
             f"{SCALE_AGENTS * 1e9 / per[workers]:.0f}", f"{whole / 1e9:.2f} s",
             f"{run.ticks / run.wall:.0%} / {run.archiving / run.wall:.0%}"]
        )  # fmt: skip
    floor = SCALE_AGENTS * LATENCY * 1e9
    table(
        f"3. Worker scaling: {SCALE_AGENTS} agents, one turn per superstep at "
        f"{LATENCY * 1e3:g} ms model latency (a write_file or read_file, finish last)",
        ["workers", "supersteps", "wall", "superstep 1", "per superstep 2..", "supersteps/s",
         "steps/s", f"est. {SCALE_STEPS} supersteps", "tick / archive share of wall"],
        rows,
    )  # fmt: skip
    print(
        f"(the 1-worker run plays {SCALE_STEPS_ONE} supersteps, the 16-worker run "
        f"{SCALE_STEPS}; throughput is the mean time per superstep after the first, which "
        "fills each worker's workspace cache; 'est.' is superstep 1 plus that mean times "
        f"{SCALE_STEPS - 1}. Latency alone is {duration(floor)} per superstep on 1 worker, "
        f"{duration(floor / 16)} on 16; the machine has {os.cpu_count()} CPUs; the "
        f"coordinator ticks every {POLL * 1e3:g} ms in this process)"
    )
    b.targets.append(
        Target("time per superstep, 16 workers / 1 worker (>= 10x throughput)",
               per[16] / per[1], 0.1).report()
    )  # fmt: skip


# 4. empty steps against empty RQ jobs --------------------------------------------------
def rq_empty(b: Bench, queue: Queue, jobs: int) -> int:
    """Enqueue `jobs` calls of builtins.len; return ns until the last has finished."""
    finished = FinishedJobRegistry(queue=queue).key
    before = int(b.client.zcard(finished))
    started = now_ns()
    for _ in range(jobs):
        queue.enqueue_call("builtins.len", args=("x",), result_ttl=3_600, failure_ttl=86_400)
    while int(b.client.zcard(finished)) < before + jobs:
        if now_ns() - started > 120e9:
            raise RuntimeError("the RQ jobs did not finish")
        time.sleep(POLL)
    return now_ns() - started


def empty_steps(b: Bench, coordinator: Coordinator) -> None:
    """Measurement 4: EMPTY_STEPS empty steps on 4 Cairn workers vs as many RQ jobs."""
    b.workers(EMPTY_WORKERS)
    b.workers(EMPTY_WORKERS, plain=True)
    queue = Queue(RQ_QUEUE, connection=b.client, serializer=JSONSerializer)

    def empty(run: str, agents: int) -> Drive:
        spec = scripted(f"empty-{run}", agents, lambda _: [Turn(say="Nothing to do.")])
        return drive(b, coordinator, coordinator.submit(spec))

    empty("warm", 16)  # warm-up: each worker imports and runs the step code
    rq_empty(b, queue, 50)
    cairn: list[Drive] = []
    plain: list[int] = []
    for run in range(EMPTY_RUNS):
        cairn.append(empty(str(run), EMPTY_STEPS))
        plain.append(rq_empty(b, queue, EMPTY_STEPS))
    b.workers(0, plain=True)
    rq_ns = statistics.median(plain)
    cairn_ns = statistics.median(d.commits[0] for d in cairn)
    ticks = statistics.median(d.ticks for d in cairn)
    archiving = statistics.median(d.archiving for d in cairn)
    rows = [
        ["RQ: builtins.len('x') jobs, SimpleWorker, JSON", " / ".join(f"{ns / 1e9:.2f} s"
         for ns in plain), f"{rq_ns / 1e9:.2f} s", f"{EMPTY_STEPS * 1e9 / rq_ns:.0f}", "1.00x"],
        ["Cairn: steps of one superstep, enqueue to commit", " / ".join(
         f"{d.commits[0] / 1e9:.2f} s" for d in cairn), f"{cairn_ns / 1e9:.2f} s",
         f"{EMPTY_STEPS * 1e9 / cairn_ns:.0f}", ratio(rq_ns, cairn_ns)],
    ]  # fmt: skip
    table(
        f"4. {EMPTY_STEPS} empty steps through Cairn vs {EMPTY_STEPS} trivial RQ jobs, "
        f"{EMPTY_WORKERS} worker processes each ({EMPTY_RUNS} runs each, taking turns)",
        ["variant", "runs", "median", "per second", "throughput vs RQ"],
        rows,
    )
    print(
        f"(a Cairn run is one task of {EMPTY_STEPS} agents whose one turn calls no tool: "
        "from the first tick, which launches every step, to the GC committing them all, "
        f"archived as the default policy says. Of the median run, {duration(ticks)} was "
        f"spent in coordinator ticks in this process, {duration(archiving)} of it in "
        f"archive_gc. Idle processes meanwhile: {EMPTY_WORKERS} workers of the other kind)"
    )
    b.targets.append(
        Target("Cairn time per empty step / RQ time per empty job (Cairn >= 60% of RQ)",
               cairn_ns / rq_ns, round(1 / 0.6, 2)).report()
    )  # fmt: skip


# the part ------------------------------------------------------------------------------
def run() -> list[Target]:
    """Run the coordinator measurements on a private Redis and workers; return the targets."""
    with contextlib.ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="cairn-bench-")))
        sink = stack.enter_context(open(os.devnull, "w"))  # noqa: PTH123 - the log's sink
        stack.callback(partial(structlog.configure, **structlog.get_config()))
        with contextlib.redirect_stderr(sink):
            configure_logging("json", "info")  # binds the sink as the log's stream
        server = RedisServer(root / "redis", appendonly=False)
        stack.callback(server.stop)
        server.start()
        client = stack.enter_context(connect(server.url))
        store = CheckpointStore(
            RedisHotStore(client), DiskArchive(root / "archive"), Codec(), full_every=FULL_EVERY
        )
        b = Bench(root, server, client, store, Text(seed=2028))
        stack.callback(b.close)
        print("\n== coordinator ==")
        print(
            f"redis-server private (port {server.port}, no AOF); archive on {filesystem(root)}."
            " Workers: `python -m coordinator.worker URL` processes (CairnWorker, a "
            "SimpleWorker), each with its own CAIRN_CACHE_DIR; coordinator logs as JSON at "
            "level info into /dev/null, the workers' into /dev/null as tests/cluster.py has it"
        )
        commits(b)
        restores(b)
        coordinator = Coordinator(client, store, root / "coordinator-cache")
        scaling(b, coordinator)
        empty_steps(b, coordinator)
        return b.targets
