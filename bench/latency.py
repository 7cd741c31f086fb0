"""The latency benchmark: what a person waits for, and what an idle deployment burns.

Real processes, as the scale part starts them (`bench.scale.Cluster`: one coordinator
process, `python -m cairn.coordinator`; worker processes, `python -m
cairn.coordinator.worker`: one of TEAM lanes, one for each agent, and, for an info row,
TEAM of one lane each, as `cairn worker --count 3` runs them; a private redis-server, no
AOF); this process submits through `cairn.Client` and reads what happened afterwards:

1. superstep overhead: one task of TEAM scripted agents at zero model latency, SUPERSTEPS
   supersteps, every agent taking a step each (one write_file or read_file; finish last).
   From the trace: a step runs from its first record's `started_at` to its last record's
   `finished_at`; the barrier gap of superstep k is superstep k+1's first start minus
   superstep k's last finish, split at the `committed_at` of the GC committed between.
   The same task again on TEAM worker processes of one lane is reported as info;
2. submit to first step: SUBMITS tasks of one scripted agent, one after another (each
   waited to its end): the time from just before `Client.submit` to the task's first trace
   record's `started_at`, both wall-clock UTC on this machine;
3. idle cost: PAUSED tasks paused and APPROVALS tasks waiting for approval, nothing else;
   the CPU the coordinator and the worker use over IDLE seconds (/proc/PID/stat, utime +
   stime), as a share of one core.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime

from bench.report import Samples, Target, pick, quick, table
from bench.scale import GOAL, TICK, Cluster, cpu_seconds, read_steps, spec
from cairn import Client, Task, TaskStatus
from cairn.agents.spec import AgentSpec, ToolRequest, Turn
from cairn.coordinator.runs import TaskState
from cairn.coordinator.settings import Settings
from cairn.coordinator.spec import TaskSpec
from cairn.storage.records import GCStatus
from cairn.storage.store import CheckpointStore

# pick(full, quick): `python -m bench --quick` runs the same code at the second sizes
TEAM, SUPERSTEPS = 3, pick(50, 8)
SUBMITS = pick(20, 3)
PAUSED, APPROVALS = 5, 5
IDLE = pick(60.0, 3.0)  # seconds of idle CPU measured
SETTLE = 2.0  # seconds the processes are left alone before the idle measurement
GAP_P50_MS, GAP_P99_MS, SUBMIT_P50_MS, IDLE_PERCENT = 10.0, 40.0, 50.0, 1.0
POLL = 0.05  # seconds between looks at a task this process waits for
TIMEOUT = 120.0  # seconds a task may take to reach the state waited for


def ms(ns: float) -> str:
    """Nanoseconds as milliseconds."""
    return f"{ns / 1e6:,.1f} ms"


def wait_for(task: Task, done: Callable[[TaskStatus], bool], what: str) -> TaskStatus:
    """Poll `task` every POLL s until `done(status)`; raise after TIMEOUT s."""
    deadline = time.monotonic() + TIMEOUT
    while not done(status := task.status()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"task {task.id} not {what} after {TIMEOUT:g} s: {status.state}")
        time.sleep(POLL)
    return status


def succeeded(task: Task) -> None:
    """Wait until `task` ends; raise unless it succeeded."""
    status = wait_for(task, lambda s: s.ended, "ended")
    if status.state is not TaskState.SUCCEEDED:
        raise RuntimeError(f"task {task.id} ended {status.state.value}: {status.reason}")


# 1. superstep overhead -----------------------------------------------------------------------
def committed(store: CheckpointStore, task: str) -> list[datetime]:
    """When each committed GC of `task` was committed, in order."""
    found = []
    for summary in store.list_gcs(task):
        if summary.status is GCStatus.COMMITTED:
            at = store.read_gc(task, summary.number).committed_at
            if at is not None:
                found.append(at)
    return sorted(found)


def covered(spans: list[tuple[float, float]]) -> float:
    """The length of the union of `spans` (start, end), in the spans' unit."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def superstep_times(api: Client, c: Cluster, name: str) -> list[Samples]:
    """Run one task of TEAM agents on the workers `c` has; its supersteps' times.

    In order: the overhead, the overhead less the step jobs' runs, the barrier gap, and
    the gap's two parts (last finish to commit, commit to next first start).
    """
    task = api.submit(spec(name, TEAM, SUPERSTEPS, 0.0))
    succeeded(task)
    work: dict[int, list[tuple[float, float]]] = defaultdict(list)
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    for entry in task.trace():
        k, start, end = entry.superstep, entry.started_at.timestamp(), entry.finished_at.timestamp()
        work[k].append((start, end))
        first[k] = min(first.get(k, start), start)
        last[k] = max(last.get(k, end), end)
    enqueued: dict[int, float] = {}
    jobs: dict[int, list[tuple[float, float]]] = defaultdict(list)  # RQ's started to ended
    for step in read_steps(c.client, [task.id]):
        enqueued[step.superstep] = min(enqueued.get(step.superstep, step.enqueued), step.enqueued)
        jobs[step.superstep].append((step.started, step.ended))
    if len(work) != SUPERSTEPS or set(enqueued) != set(work):
        raise RuntimeError(f"overhead: supersteps {sorted(work)} ran, {sorted(enqueued)} read")
    commits = [at.timestamp() for at in committed(c.store, task.id)]
    over, beside, gaps, to_commit, to_start = (Samples() for _ in range(5))
    for k, after in itertools.pairwise(sorted(work)):
        span = enqueued[after] - enqueued[k]
        over.add(int((span - covered(work[k])) * 1e9))
        beside.add(int((span - covered(jobs[k])) * 1e9))
        end, start = last[k], first[after]
        gaps.add(int((start - end) * 1e9))
        between = [at for at in commits if end <= at <= start]
        if between:
            to_commit.add(int((between[0] - end) * 1e9))
            to_start.add(int((start - between[0]) * 1e9))
    return [over, beside, gaps, to_commit, to_start]


def overhead(api: Client, c: Cluster) -> list[Target]:
    """Measurement 1: what a superstep of one task of TEAM agents spends beside its steps.

    On one worker process of TEAM lanes, then, as info, on a pool of TEAM worker processes
    of one lane each (`cairn worker --count 3`): the steps no longer share one interpreter,
    but the machine's cores still.
    """
    c.start_workers(TEAM, 1)
    pool = superstep_times(api, c, "overhead-pool")[0]
    c.start_workers(1, TEAM)  # the rest of the part runs on this one
    over, beside, gaps, to_commit, to_start = superstep_times(api, c, "overhead")
    rows = [
        ("superstep overhead: enqueue to next enqueue, less the steps' own work", over),
        ("  the same, less the step jobs' runs (RQ's started to ended) (info)", beside),
        ("barrier gap: last step's finish to the next superstep's first start", gaps),
        ("  of it: last finish to the GC's committed_at", to_commit),
        ("  of it: committed_at to the next superstep's first start", to_start),
        (f"superstep overhead on {TEAM} worker processes of one lane (info)", pool),
    ]
    table(
        f"1. Superstep overhead: one task of {TEAM} scripted agents at 0 s model latency, "
        f"{SUPERSTEPS} supersteps (a write_file or read_file a step, finish last), on a "
        f"worker of {TEAM} lanes",
        ["measure", "samples", "p50", "p99", "max"],
        [[n, str(len(s)), ms(s.p50), ms(s.p99), ms(max(s.ns))] for n, s in rows],
    )
    print(
        "(a step's own work runs from its first trace record's start to its last's finish "
        "(the agent's turn: its model call and tools); the overhead is the rest of the time "
        "from one superstep's enqueue to the next one's: the worker taking each job and "
        "loading the agent, writing its checkpoint and vote, the coordinator waking on the "
        "last vote, the commit and the next enqueue. The info row takes a step's work to be "
        "its whole job instead (RQ's started to ended, the step's loading and checkpoint "
        "included): what is left is the queue and the barrier. Enqueue times from the RQ "
        f"jobs, the commit from the GC record. The last row runs the same task on {TEAM} "
        "worker processes of one lane each)"
    )
    return [
        Target("superstep overhead p50", over.p50 / 1e6, GAP_P50_MS, "ms").report(),
        Target("superstep overhead p99", over.p99 / 1e6, GAP_P99_MS, "ms").report(),
        Target(f"overhead p50, {TEAM} processes of one lane", pool.p50 / 1e6, None,
               "ms").report(),
    ]  # fmt: skip


# 2. submit to first step ---------------------------------------------------------------------
def first_steps(api: Client) -> list[Target]:
    """Measurement 2: SUBMITS tasks of one agent, each from submit to its first step."""
    waits = Samples()
    for i in range(SUBMITS):
        document = spec(f"submit{i}", 1, 1, 0.0)
        before = datetime.now(UTC)
        task = api.submit(document)
        succeeded(task)
        start = min(entry.started_at for entry in task.trace())
        waits.add(int((start - before).total_seconds() * 1e9))
    table(
        f"2. Submit to first step: {SUBMITS} tasks of one scripted agent, submitted one "
        "after another (each waited to its end)",
        ["measure", "samples", "p50", "p99", "max"],
        [["just before Client.submit to the first step's start", str(len(waits)),
          ms(waits.p50), ms(waits.p99), ms(max(waits.ns))]],
    )  # fmt: skip
    print(
        "(what a person waits from submitting to the agent running: the submit, the "
        "coordinator woken by it, its first GC and enqueue, the worker taking "
        "the job and loading the agent; both ends wall-clock UTC on this machine)"
    )
    return [
        Target("submit to first step p50", waits.p50 / 1e6, SUBMIT_P50_MS, "ms").report(),
        Target("submit to first step p99", waits.p99 / 1e6, None, "ms").report(),
    ]


# 3. idle cost --------------------------------------------------------------------------------
def approval_spec(name: str) -> TaskSpec:
    """One scripted agent whose first turn writes a file, a call that waits for a person."""
    write = ToolRequest(name="write_file", args={"path": "a.md", "content": "x\n"})
    finish = ToolRequest(name="finish", args={"summary": "done"})
    agent = AgentSpec(
        name="a0",
        model="scripted",
        approve=["write_file"],
        script=[Turn(say="write", tools=[write]), Turn(say="done", tools=[finish])],
    )
    return TaskSpec(name=name, goal=GOAL, files={"README.md": "# notes\n"}, agents=[agent])


def at_rest(state: TaskState) -> Callable[[TaskStatus], bool]:
    """True of a status in `state` with no superstep in flight."""
    return lambda s: s.state is state and s.running_superstep is None


def idle(api: Client, c: Cluster) -> list[Target]:
    """Measurement 3: the CPU of the coordinator and the worker with nothing to do."""
    paused = []
    for i in range(PAUSED):
        task = api.submit(spec(f"paused{i}", 1, 100, 0.5))
        task.pause()
        paused.append(task)
    waiting = [api.submit(approval_spec(f"approval{i}")) for i in range(APPROVALS)]
    for task in paused:
        wait_for(task, at_rest(TaskState.PAUSED), "paused")
    for task in waiting:
        wait_for(task, at_rest(TaskState.WAITING_APPROVAL), "waiting for approval")
    time.sleep(SETTLE)
    coordinator = c.coordinator.pid if c.coordinator else 0
    (worker,) = (p.pid for p in c.workers)
    before = {pid: cpu_seconds(pid) for pid in (coordinator, worker)}
    started = time.monotonic()
    time.sleep(IDLE)
    wall = time.monotonic() - started
    share = {pid: 100 * (cpu_seconds(pid) - before[pid]) / wall for pid in before}
    if c.coordinator is None or c.coordinator.poll() is not None:
        raise RuntimeError("idle: the coordinator exited")
    table(
        f"3. Idle cost: {PAUSED} tasks paused and {APPROVALS} waiting for approval, nothing "
        f"else to do, over {wall:.1f} s",
        ["process", "CPU", "share of one core"],
        [[name, f"{share[pid] * wall / 100:.2f} s", f"{share[pid]:.2f}%"]
         for name, pid in (("coordinator", coordinator), (f"worker ({TEAM} lanes)", worker))],
    )  # fmt: skip
    print(
        "(what a deployment burns doing nothing: user + system CPU from /proc/PID/stat, "
        f"in clock ticks of 1/{TICK} s)"
    )
    return [
        Target("coordinator idle CPU, % of one core", share[coordinator], IDLE_PERCENT,
               "%").report(),
        Target("worker idle CPU, % of one core", share[worker], IDLE_PERCENT, "%").report(),
    ]  # fmt: skip


# the part ------------------------------------------------------------------------------------
def run() -> list[Target]:
    """Run the latency measurements on a private Redis and real processes; return the targets."""
    with contextlib.ExitStack() as stack:
        c = Cluster.private(stack)
        print(
            f"\n== latency ==\nredis-server private (port {c.server.port}, no AOF); one "
            f"coordinator process; one worker process of {TEAM} lanes (and, for one info "
            f"row, {TEAM} of one lane); logs as JSON at level info into files"
            + (" (quick: sizes too small to judge)" if quick() else "")
        )
        c.start_coordinator()
        settings = Settings(redis_url=c.server.url, archive_dir=c.root / "archive",
                            signing_key=None, audit=False)  # fmt: skip
        api = stack.enter_context(Client(settings=settings))
        targets = overhead(api, c)
        targets += first_steps(api)
        targets += idle(api, c)
        return targets
