"""The spawning benchmark: the commit that admits 100 spawned members against an ordinary one.

Both through the coordinator's own barrier (`Coordinator.advance`: the watcher reads the
last vote's LC, `Committer.commit` builds the GC, joins the spawned members and commits),
on a private redis-server, no workers: this process writes each step's vote as a step
does, so the coordinator finds every step voted.

- baseline: a task of TEAM scripted agents, one superstep after another; every agent
  votes (a tool call and its result), and the commit takes in the TEAM votes;
- spawn: a fresh task of one lead whose first step records TEAM spawns (scripted members,
  each with a one-line brief), as `StepContext.spawn` records them; the commit admits
  them all (`cairn.agents.joining`: each member's first LC written, the GC names it).

Each is timed from the last vote to the GC committed, as the coordinator part's commit
measurement is: the look that finds the votes is untimed, the early votes' LCs are read
as they arrive (`Watcher.ingest`, untimed), and the clock stops when the commit's write
(`commit_and_begin`, which begins the next superstep too) returns. What follows it (the
next superstep's jobs enqueued, the GC archived on the archiver's thread) is untimed and
done before the next run. The two take turns, run by run.
"""

from __future__ import annotations

import contextlib
import gc as collector
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from unittest import mock

from bench.report import Samples, Target, duration, now_ns, pick, private_store, ratio, table
from cairn.agents.spawn import prepare_first_lcs
from cairn.agents.spec import AgentSpec
from cairn.coordinator.coordinator import Coordinator
from cairn.coordinator.runs import Look
from cairn.coordinator.spec import TaskSpec
from cairn.coordinator.tasks import Tasks
from cairn.storage.chain import WorkingState
from cairn.storage.records import GlobalCheckpoint, LCRef, Message, Role, SpawnRequest, ToolCall
from cairn.storage.store import CheckpointStore

TEAM = 100  # members of the baseline team; members the lead spawns
RUNS = pick(40, 3)  # timed commits of each kind, after WARMUP untimed ones
WARMUP = pick(3, 1)
GOAL = "Make the project pass its tests."
MAX_SUPERSTEPS = 10_000  # the baseline task commits a superstep a run


@dataclass(slots=True)
class Stopwatch:
    """When the commit's write returned, for the run in flight (`CheckpointStore` patched)."""

    started: int = 0
    took: list[int] = field(default_factory=list)

    @contextlib.contextmanager
    def on(self, store: CheckpointStore) -> Iterator[None]:
        """Note the time since `started` each time `commit_gc` or `commit_and_begin` returns."""
        commit_gc, commit_and_begin = store.commit_gc, store.commit_and_begin

        def timed(call: Callable[..., object]) -> Callable[..., object]:
            def run(*args: object, **kw: object) -> object:
                done = call(*args, **kw)
                self.took.append(now_ns() - self.started)
                return done

            return run

        with (
            mock.patch.object(store, "commit_gc", timed(commit_gc)),
            mock.patch.object(store, "commit_and_begin", timed(commit_and_begin)),
        ):
            yield

    def time(self, advance: Callable[[], None]) -> tuple[int, int]:
        """Run `advance` (GC paused, as `bench.report.clock` does); return (commit, advance) ns."""
        self.took.clear()
        paused = collector.isenabled()
        collector.disable()
        try:
            self.started = now_ns()
            advance()
            total = now_ns() - self.started
        finally:
            if paused:
                collector.enable()
        if len(self.took) != 1:
            raise RuntimeError(f"expected one commit in the advance, saw {len(self.took)}")
        return self.took[0], total


def spec(name: str, agents: list[str], max_agents: int | None = None) -> TaskSpec:
    """A task of scripted agents named `agents`, with no turns to play (this process votes)."""
    team = [AgentSpec(name=a, model="scripted") for a in agents]
    return TaskSpec(name=name, goal=GOAL, files={"README.md": "# notes\n"}, agents=team,
                    max_supersteps=MAX_SUPERSTEPS, max_agents=max_agents)  # fmt: skip


def look(c: Coordinator, task: str) -> Look:
    """The task as the coordinator's next look finds it."""
    found = c.runs.look([task])[task]
    if isinstance(found, Exception):
        raise found
    return found


def states(store: CheckpointStore, gc: GlobalCheckpoint) -> list[WorkingState]:
    """Every member's state as of `gc`, in its order."""
    return [store.read_state(gc.task, a, ref.id, ref.checksum) for a, ref in gc.members.items()]


def vote(
    store: CheckpointStore, state: WorkingState, seen: Look, spawns: list[SpawnRequest]
) -> LCRef:
    """`state` takes its step of the superstep in flight (a tool call, its result) and votes."""
    state.superstep, state.epoch = int(seen.run["superstep"]), int(seen.run["epoch"])
    state.attempt, state.step = 1, state.step + 1
    state.changes, state.outbox, state.spawns = {}, [], spawns
    call = ToolCall(id=f"call-{state.step}", name="write_file", args={"path": "a.py"})
    state.messages += [
        Message(role=Role.ASSISTANT, content="ok", tool_calls=[call]),
        Message(role=Role.TOOL, tool_call_id=call.id, name=call.name, content="ok"),
    ]
    # As a step ends: the members it spawned get their first LCs before its vote.
    prepare_first_lcs(store, state, state.workspace_before or "")
    return store.write_lc(state, vote=True)


def requests(count: int) -> list[SpawnRequest]:
    """`count` spawns of scripted members, recorded as `cairn.agents.spawn.spawn` records them."""
    made = []
    for i in range(count):
        member = AgentSpec(name=f"m{i}", model="scripted", system=f"You review part {i}.")
        data = member.model_dump(mode="json", exclude_defaults=True)
        made.append(SpawnRequest(name=member.name, spec=data,
                                 brief=f"Review part {i} of the project and report."))  # fmt: skip
    return made


@dataclass(slots=True)
class Runs:
    """The two tasks' drivers on one coordinator, with what each run took."""

    c: Coordinator
    watch: Stopwatch
    tasks: Tasks
    baseline: str = ""
    team: list[WorkingState] = field(default_factory=list)
    commit: dict[str, Samples] = field(default_factory=dict)
    advance: dict[str, Samples] = field(default_factory=dict)

    def settle(self) -> None:
        """What follows a commit, untimed: the archiver done, the jobs nobody runs dropped."""
        self.c.archiver.drain()
        self.c.queue.empty()  # type: ignore[no-untyped-call]

    def ordinary(self) -> tuple[int, int]:
        """One superstep of the TEAM-member task: every member votes; time its commit."""
        store, task = self.c.store, self.baseline
        seen = look(self.c, task)
        votes = {s.agent: vote(store, s, seen, []) for s in self.team}
        *early, _ = votes
        epoch, superstep = int(seen.run["epoch"]), int(seen.run["superstep"])
        self.c.watcher.ingest(task, epoch, superstep, {a: votes[a] for a in early})
        seen = look(self.c, task)
        took = self.watch.time(lambda: self.c.advance(task, seen))
        self.settle()
        return took

    def spawning(self, run: int) -> tuple[int, int]:
        """A fresh task's lead spawns TEAM members in its first step; time the commit."""
        store = self.c.store
        task = self.tasks.submit(spec(f"spawn{run}", ["lead"], TEAM + 1))
        self.c.advance(task)  # its first superstep begins
        seen = look(self.c, task)
        gc = store.latest_gc(task)
        assert gc is not None
        [lead] = states(store, gc)
        vote(store, lead, seen, requests(TEAM))
        seen = look(self.c, task)
        took = self.watch.time(lambda: self.c.advance(task, seen))
        joined = store.latest_gc(task)
        if joined is None or len(joined.members) != TEAM + 1 or len(joined.spawned) != TEAM:
            raise RuntimeError(f"{task}: the spawned members did not join")
        self.settle()
        self.tasks.cancel(task)  # ends it; its GCs archived (untimed)
        return took


def run() -> list[Target]:
    """Time both commits on a private Redis, taking turns; return the target."""
    with contextlib.ExitStack() as stack:
        _root, server, client, store = private_store(stack, quiet=True)
        print(
            f"\n== spawning ==\nredis-server private (port {server.port}, no AOF); no workers: "
            "this process votes as each step would; Coordinator logs as JSON into /dev/null"
        )
        c = Coordinator(client, store)
        stack.callback(c.archiver.drain)
        watch, tasks = Stopwatch(), Tasks(client, store)
        stack.enter_context(watch.on(store))
        r = Runs(c, watch, tasks)
        r.baseline = tasks.submit(spec("baseline", [f"a{i}" for i in range(TEAM)]))
        c.advance(r.baseline)  # its first superstep begins
        gc0 = store.latest_gc(r.baseline)
        assert gc0 is not None
        r.team = states(store, gc0)
        got = {k: (Samples(), Samples()) for k in ("ordinary", "spawn")}
        for i in range(-WARMUP, RUNS):
            for kind, took in (("ordinary", r.ordinary()), ("spawn", r.spawning(i + WARMUP))):
                if i >= 0:
                    for into, ns in zip(got[kind], took, strict=True):
                        into.add(ns)
        ordinary, spawn = got["ordinary"][0], got["spawn"][0]
        rows = [
            [name, str(len(commit)), duration(commit.p50), duration(commit.p99),
             ratio(commit.p50, ordinary.p50), duration(whole.p50)]
            for name, (commit, whole) in (
                (f"ordinary: {TEAM} members vote", got["ordinary"]),
                (f"spawn: 1 lead votes with {TEAM} spawns", got["spawn"]),
            )
        ]  # fmt: skip
        table(
            f"Commit of one superstep through Coordinator.advance: {TEAM} members voting, "
            f"or one lead spawning {TEAM} (taking turns, after {WARMUP} untimed each)",
            ["commit", "runs", "last vote→commit p50", "p99", "p50 vs ordinary",
             "whole advance p50"],
            rows,
        )  # fmt: skip
        print(
            "(last vote→commit: the watcher reads the last vote's LC (the earlier ones were "
            "read as they arrived), the committer builds the GC, admits the spawned members "
            "(naming the first LCs the spawning step wrote before its vote) and commits it "
            "with the next "
            "superstep begun, in one write. whole advance: that and the next superstep's "
            f"jobs enqueued. The spawn task is fresh each run: {TEAM + 1} members after)"
        )
        return [
            Target(f"commit spawning {TEAM} members p50 / a {TEAM}-member team's commit p50",
                   spawn.p50 / ordinary.p50, 3.0).report()
        ]  # fmt: skip
