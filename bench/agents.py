"""The agents benchmark: what a checkpointed step costs on top of its model and tools.

One scripted agent rewrites one small file per turn. Its turns come from a `ScriptedModel`
handed to `run_step` by the model factory, not from the task's spec: every step reads the
spec, and a long script in it would be a cost no real task has. Logs render as JSON at
level info into /dev/null, so their cost counts as in production.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import cast
from unittest import mock

import redis
from redis.connection import AbstractConnection

from bench import mcp_call
from bench.report import (
    Samples,
    Target,
    clock,
    duration,
    now_ns,
    pick,
    private_store,
    ratio,
    size,
    table,
)
from bench.storage import Text, filesystem, floor_write
from cairn.agents.barrier import build_gc
from cairn.agents.context import StepContext
from cairn.agents.heartbeat import Heartbeat
from cairn.agents.kinds.code import AgentContext
from cairn.agents.kinds.python import agent
from cairn.agents.models.base import Model, ModelRequest
from cairn.agents.models.scripted import ScriptedModel
from cairn.agents.spec import TOOL_NAMES, AgentSpec, StepPolicy, TaskRecord, ToolRequest, Turn
from cairn.agents.step import run_step
from cairn.agents.task import start_task
from cairn.agents.toolkit import ToolRegistry, builtin_tools, tool
from cairn.agents.tools import TOOLS, Args, Tool, ToolContext
from cairn.agents.workspace import Workspace
from cairn.storage import store as store_module
from cairn.storage.backends.redis import RedisHotStore
from cairn.storage.codec import Codec, canonical_bytes
from cairn.storage.records import GlobalCheckpoint, LCRef, Message, Role
from cairn.storage.store import CheckpointStore

AGENT = "coder"
HOT_PACKAGE = "cairn.storage.backends.redis"  # the hot store's package, whose parts are timed
SYSTEM = "You are a careful Python programmer."
GOAL = "Make the project pass its tests."
FILES = 20  # the workspace: this many small files, one rewritten per turn
FILE_CHARS = 400
SAY_CHARS = 200
# pick(full, quick): `python -m bench --quick` runs the same code at the second size
HISTORY = pick(200, 40)  # messages before the timed steps (each turn adds two)
STEPS = pick(200, 24)  # timed supersteps of measurement 1
PROFILE_EVERY = 4  # after every 4th timed superstep, one more with every phase timed
LATENCY = 0.02  # measurement 2's model latency, seconds
ON_OFF_STEPS = pick(100, 15)
ON_OFF_RUNS = pick(3, 1)
MODEL, TOOL = "model call (scripted, excluded)", "tool write_file (excluded)"
SEND, READ = "send", "read"  # one row, IO; its calls are round trips (sends)
IO = "Redis I/O: send, wait, read replies"
HOT = "redis-py: build commands, parse replies"
ToolRun = Callable[[ToolContext, Args], str]


# timing phases -------------------------------------------------------------------------
class Phases:
    """Exclusive time per labelled function: a wrapped call's time minus its wrapped callees.

    Only calls on the thread that built it count (the heartbeat's thread is not timed).
    """

    def __init__(self) -> None:
        self.ns: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self._stack: list[int] = []
        self._thread = threading.get_ident()

    def wrap(self, label: str, fn: Callable[..., object]) -> Callable[..., object]:
        """Return `fn` timed under `label`."""

        def timed(*args: object, **kwargs: object) -> object:
            if threading.get_ident() != self._thread:
                return fn(*args, **kwargs)
            self._stack.append(0)
            started = now_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                took = now_ns() - started
                self.ns[label] += took - self._stack.pop()
                self.calls[label] += 1
                if self._stack:
                    self._stack[-1] += took

        return timed

    def reset(self) -> None:
        """Forget the last step's times."""
        self.ns, self.calls = Counter(), Counter()

    @contextlib.contextmanager
    def instrumented(self) -> Iterator[None]:
        """Time every phase of a step (and each hot-store call) while inside."""
        targets: list[tuple[object, str, str]] = [
            (AbstractConnection, "send_packed_command", SEND),
            (AbstractConnection, "read_response", READ),
            (Heartbeat, "__enter__", "heartbeat: schedule its beats"),
            (Heartbeat, "__exit__", "heartbeat: end its beats"),
            (CheckpointStore, "read_doc", "read task spec: open + validate"),
            (CheckpointStore, "latest_gc", "latest GC: open + validate"),
            (CheckpointStore, "read_state", "read_state: open + validate + rebuild chain"),
            (CheckpointStore, "read_manifest", "read_manifest: open + validate"),
            (Workspace, "sync", "workspace.sync: scan tree, write index"),
            (StepContext, "_trace", "trace records: pydantic validate"),
            (Workspace, "capture", "workspace.capture: scan, hash, write index"),
            (CheckpointStore, "put_blob", "put_blob: sha256 (+zstd) seal"),
            (CheckpointStore, "put_manifest", "put_manifest: canonical JSON"),
            (store_module, "cut_lc", "cut_lc: build the LC record"),
            (Codec, "encode", "encode LC: canonical JSON + sha256 + zstd"),
        ]
        # The store's own methods, whichever of its parts (steps, checkpoints) defines each.
        own = {name for part in RedisHotStore.__mro__ if part.__module__.startswith(HOT_PACKAGE)
               for name in vars(part)}  # fmt: skip
        targets += [
            (RedisHotStore, name, f"hot.{name}")
            for name in sorted(own)
            if not name.startswith("_") and callable(getattr(RedisHotStore, name))
        ]
        with contextlib.ExitStack() as stack:
            for owner, name, label in targets:
                if hasattr(owner, name):  # others refactor concurrently: skip what is gone
                    wrapped = self.wrap(label, getattr(owner, name))
                    stack.enter_context(mock.patch.object(owner, name, wrapped))
            yield


# the team ------------------------------------------------------------------------------
def turns(text: Text, n: int, latency: float = 0.0) -> list[Turn]:
    """`n` turns, each saying a little and rewriting one of the FILES files."""
    out = []
    for i in range(n):
        args: Args = {"path": f"src/module_{i % FILES}.py", "content": text.words(FILE_CHARS)}
        tools = [ToolRequest(name="write_file", args=args)]
        out.append(Turn(say=text.words(SAY_CHARS), latency=latency, tools=tools))
    return out


def initial_files(text: Text) -> dict[str, bytes]:
    """The workspace the task starts from."""
    return {f"src/module_{j}.py": text.words(FILE_CHARS).encode() for j in range(FILES)}


@dataclass(slots=True)
class Team:
    """One scripted agent's task on Redis, driven superstep by superstep as a coordinator."""

    store: CheckpointStore
    cache: Path
    model: Model
    gc: GlobalCheckpoint
    tools: ToolRegistry = field(default_factory=builtin_tools)
    begun: bool = False  # the next superstep is prepared and its attempt fenced in

    @classmethod
    def start(
        cls,
        store: CheckpointStore,
        root: Path,
        task: str,
        model: Model,
        text: Text,
        tools: Sequence[str] = TOOL_NAMES,
        kind: str = "llm",
    ) -> Team:
        """Start `task` (GC 0) with one agent of `kind` whose turns `model` plays, with `tools`."""
        agent = AgentSpec(name=AGENT, kind=kind, model="scripted", system=SYSTEM,
                          tools=list(tools))  # fmt: skip
        record = TaskRecord(task=task, goal=GOAL, agents=[agent])
        return cls(store, root / "cache", model, start_task(store, record, initial_files(text)))

    def begin(self) -> None:
        """Prepare the next GC and fence in attempt 1 of its superstep, unless the commit did.

        As the coordinator does; its commit under `durability: async` did it in its write.
        """
        if self.begun:
            return
        gc = self.gc
        intent = gc.model_copy(update={"number": gc.number + 1, "superstep": gc.superstep + 1})
        self.store.begin_superstep(intent, {AGENT: 1})
        self.begun = True

    def step(self) -> LCRef:
        """Run the agent's step of the next superstep; return its voted LC."""
        gc, models = self.gc, lambda _spec: self.model
        s = gc.superstep + 1
        return run_step(gc.task, AGENT, s, gc.epoch, 1, store=self.store, cache=self.cache,
                        models=models, tools=self.tools).lc  # fmt: skip

    def barrier(self, vote: LCRef) -> None:
        """Build and commit the superstep's GC, beginning the next superstep in its write.

        As the coordinator does under `durability: async`.
        """
        gc = self.gc
        built = build_gc(
            self.store,
            gc,
            {AGENT: vote},
            [AGENT],
            number=gc.number + 1,
            superstep=gc.superstep + 1,
            epoch=gc.epoch,
        ).gc
        self.gc, prepared = self.store.commit_and_begin(built, {AGENT: 1})
        self.begun = prepared is not None

    def superstep(self) -> None:
        """Begin (unless the last commit did), step and commit the next superstep."""
        self.begin()
        self.barrier(self.step())


@dataclass(slots=True)
class Env:
    """What both measurements use: the store over a private Redis, text, the targets."""

    root: Path
    client: redis.Redis
    store: CheckpointStore
    text: Text
    targets: list[Target] = field(default_factory=list)


# 1. step overhead ------------------------------------------------------------------------
FLOOR = "floor: MULTI/EXEC RPUSH new bytes + HSET"
WHOLE = "run_step, whole (zero-latency model)"
DURABLE = "run_step minus model and tool (durable part)"
BARRIER = "coordinator: build_gc + commit_gc, which begins the next superstep"
MODEL_ROW, TOOL_ROW = "  model call (excluded)", "  tool write_file (excluded)"
SUPERSTEP = "durable part + barrier, per superstep"
ROWS = (FLOOR, WHOLE, MODEL_ROW, TOOL_ROW, DURABLE, BARRIER, SUPERSTEP)


@dataclass(slots=True)
class StepTimes:
    """Measurement 1's samples: ROWS, then the instrumented steps' phases."""

    rows: dict[str, Samples] = field(default_factory=lambda: {row: Samples() for row in ROWS})
    new_bytes: list[int] = field(default_factory=list)
    profiled: Samples = field(default_factory=Samples)
    phases: dict[str, Samples] = field(default_factory=dict)
    calls: Counter[str] = field(default_factory=Counter)


def timed_superstep(env: Env, team: Team, phases: Phases, into: StepTimes) -> None:
    """Time one superstep's begin, run_step and barrier, then the floor for its new bytes."""
    begin = clock(team.begin)[1]
    phases.reset()
    vote, took = clock(team.step)
    model, tool = phases.ns[MODEL], phases.ns[TOOL]
    barrier = begin + clock(partial(team.barrier, vote))[1]
    lc = env.store.read_lc(team.gc.task, AGENT, vote.id)  # what the step added, untimed:
    payload = b"".join(canonical_bytes(r) for r in [*lc.messages[-2:], *lc.trace[-2:]])
    into.new_bytes.append(len(payload))
    floor = clock(partial(floor_write, env.client, payload, team.gc.number))[1]
    durable = took - model - tool
    values = (floor, took, model, tool, durable, barrier, durable + barrier)
    for row, ns in zip(ROWS, values, strict=True):
        into.rows[row].add(ns)


def profiled_superstep(team: Team, phases: Phases, into: StepTimes) -> None:
    """Run one superstep with every phase of its run_step timed (exclusive times)."""
    team.begin()
    with phases.instrumented():
        phases.reset()
        vote, took = clock(team.step)
        into.calls.update(phases.calls)
    team.barrier(vote)
    into.profiled.add(took)
    rows: Counter[str] = Counter()
    for label, ns in phases.ns.items():
        rows[HOT if label.startswith("hot.") else IO if label in (SEND, READ) else label] += ns
    rows["rest of run_step (unwrapped code)"] = took - sum(rows.values())
    for label, ns in rows.items():
        into.phases.setdefault(label, Samples()).add(ns)


def step_overhead(env: Env) -> None:
    """Measurement 1: run_step and the barrier at a HISTORY-message history, against the floor."""
    phases, times, tool = Phases(), StepTimes(), TOOLS["write_file"]
    profiled, fill = STEPS // PROFILE_EVERY, (HISTORY - 2) // 2
    model = ScriptedModel(turns(env.text, fill + STEPS + profiled + 10))
    timed_tool = replace(tool, run=cast(ToolRun, phases.wrap(TOOL, tool.run)))
    with mock.patch.object(ScriptedModel, "complete", phases.wrap(MODEL, ScriptedModel.complete)):
        team = Team.start(env.store, env.root, "steps", model, env.text)
        team.tools = ToolRegistry([timed_tool, *(t for t in TOOLS.values() if t is not tool)])
        for _ in range(fill):  # builds the history the way a team does, and warms up
            team.superstep()
        for i in range(1, STEPS + 1):
            timed_superstep(env, team, phases, times)
            if i % PROFILE_EVERY == 0:
                profiled_superstep(team, phases, times)
    base = times.rows[FLOOR].p50
    table(
        f"1. One step of one agent, {HISTORY} msgs of history growing to "
        f"{2 + 2 * (fill + STEPS + profiled)} ({STEPS} timed supersteps; floor timed after each)",
        ["operation", "p50", "p99", "mean", "p50 vs floor"],
        [
            [name, duration(s.p50), duration(s.p99), duration(s.mean), ratio(s.p50, base)]
            for name, s in times.rows.items()
        ],
    )
    durable = times.rows[DURABLE]
    early, late = (Samples(durable.ns[part]) for part in (slice(20), slice(-20, None)))
    print(
        f"(the history was built by {fill} untimed supersteps run as above, so the LC chain "
        f"has a real one's shape: a full LC every {env.store.full_every}. A step adds "
        f"{size(statistics.fmean(times.new_bytes))} of canonical JSON: the assistant message, "
        "the tool message and two trace records, the model's and the tool's. Durable part "
        f"p50 over the first 20 timed steps {duration(early.p50)}, over the last 20 "
        f"{duration(late.p50)}: reading the state back grows with the history)"
    )
    for name, row in (("run_step durable part", DURABLE), ("barrier", BARRIER)):
        measured = times.rows[row].p50 / base
        env.targets.append(Target(f"{name} p50 / storage floor p50", measured, None).report())
    phase_table(times, profiled)


def phase_table(times: StepTimes, profiled: int) -> None:
    """Print where an instrumented run_step's time goes, largest share first."""
    whole = times.profiled.mean
    hot = sorted((k.removeprefix("hot."), n) for k, n in times.calls.items() if k[:4] == "hot.")
    calls = {label: f"{n / profiled:g}" for label, n in times.calls.items()}
    calls[HOT] = f"{sum(n for _, n in hot) / profiled:g}"
    calls[IO] = calls[SEND]
    table(
        f"1b. Where run_step's time goes ({profiled} instrumented supersteps taking turns with "
        "the timed ones; exclusive time: a phase's own, not its wrapped callees')",
        ["phase", "calls/step", "mean", "p50", "share of mean"],
        [
            [label, calls.get(label, "-"), *map(duration, (s.mean, s.p50)), f"{s.mean / whole:.0%}"]
            for label, s in sorted(times.phases.items(), key=lambda item: -item[1].mean)
        ],
    )
    print(
        f"(instrumented run_step mean {duration(whole)}, p50 {duration(times.profiled.p50)}; "
        f"uninstrumented p50 {duration(times.rows[WHOLE].p50)}. Redis round trips per step: "
        f"{times.calls[SEND] / profiled:g}, from hot-store calls "
        + ", ".join(f"{name} x{n / profiled:g}" for name, n in hot)
        + ")"
    )


# 2. checkpointing on vs off ------------------------------------------------------------
CHECKPOINT_WRITES = "checkpoint writes"


def run_on(env: Env, run: int, script: list[Turn], writes: Counter[str]) -> Samples:
    """ON_OFF_STEPS supersteps through run_step and the barrier on Redis; one sample each.

    `writes` gains the time spent taking checkpoints proper: every LC written (tool and
    step level: cut, encode, the fenced Redis write) and every GC prepared and committed.
    """
    team = Team.start(env.store, env.root, f"on{run}", ScriptedModel(script), env.text)
    timer = Phases()
    with contextlib.ExitStack() as stack:
        for name in ("write_lc", "begin_superstep", "commit_gc"):
            wrapped = timer.wrap(CHECKPOINT_WRITES, getattr(CheckpointStore, name))
            stack.enter_context(mock.patch.object(CheckpointStore, name, wrapped))
        samples = Samples([clock(team.superstep)[1] for _ in range(ON_OFF_STEPS)])
    writes[CHECKPOINT_WRITES] += timer.ns[CHECKPOINT_WRITES]
    return samples


def plain_turn(model: Model, messages: list[Message], ctx: ToolContext) -> None:
    """One turn of an agent loop that checkpoints nothing: ask, run the tools, append."""
    tools = [TOOLS[name].schema for name in TOOL_NAMES]
    reply = model.complete(ModelRequest(messages, tools, agent=AGENT))
    messages.append(
        Message(role=Role.ASSISTANT, content=reply.content, tool_calls=reply.tool_calls)
    )
    for call in reply.tool_calls:
        result = TOOLS[call.name].run(ctx, call.args)
        messages.append(
            Message(role=Role.TOOL, tool_call_id=call.id, name=call.name, content=result)
        )


def run_off(env: Env, run: int, script: list[Turn]) -> Samples:
    """The same turns in memory: no Redis, no checkpoints; one sample per turn."""
    workspace = Workspace(env.root / "off", f"off{run}", AGENT)
    for path, content in initial_files(env.text).items():
        (workspace.tree / path).parent.mkdir(parents=True, exist_ok=True)
        (workspace.tree / path).write_bytes(content)
    ctx = ToolContext(workspace, AGENT, [AGENT], 1, StepPolicy())
    messages = [Message(role=Role.SYSTEM, content=SYSTEM), Message(role=Role.USER, content=GOAL)]
    turn = partial(plain_turn, ScriptedModel(script), messages, ctx)
    return Samples([clock(turn)[1] for _ in range(ON_OFF_STEPS)])


def on_off(env: Env) -> None:
    """Measurement 2: checkpointing on vs off, ON_OFF_STEPS turns at LATENCY s each."""
    script = turns(env.text, ON_OFF_STEPS, LATENCY)
    runs: dict[str, list[Samples]] = {"off": [], "on": []}
    writes: Counter[str] = Counter()
    for run in range(1, ON_OFF_RUNS + 1):
        runs["on"].append(run_on(env, run, script, writes))
        runs["off"].append(run_off(env, run, script))
    total = {key: statistics.median(sum(s.ns) for s in samples) for key, samples in runs.items()}
    names = {
        "off": "off: plain loop in memory (model, tools, list)",
        "on": "on: run_step + barrier commit on Redis",
    }
    table(
        f"2. Checkpointing on vs off: {ON_OFF_STEPS} turns, model latency "
        f"{LATENCY * 1000:g} ms, one write_file each ({ON_OFF_RUNS} runs each, taking turns)",
        ["variant", "median total", "runs", "step p50", "overhead/step", "vs off"],
        [
            [
                names[key],
                duration(total[key]),
                " / ".join(f"{sum(s.ns) / 1e9:.3f} s" for s in samples),
                duration(statistics.median(s.p50 for s in samples)),
                "-" if key == "off" else duration((total[key] - total["off"]) / ON_OFF_STEPS),
                ratio(total[key], total["off"]),
            ]
            for key, samples in runs.items()
        ],
    )
    # Two readings of "checkpointing": taking the checkpoints themselves (LC and GC writes),
    # and the whole durable runtime (those, plus loading state on a stateless worker,
    # syncing its workspace copy, the heartbeat, the barrier's merge).
    taking = writes[CHECKPOINT_WRITES] / ON_OFF_RUNS  # ns, like `total`
    print(
        f"taking checkpoints (every LC and GC written, within 'on'): {duration(taking)} a run,"
        f" {duration(taking / ON_OFF_STEPS)} a step, {taking / total['off'] * 100:.2f}% of 'off'"
    )
    per_step_s = (total["on"] - total["off"]) / ON_OFF_STEPS / 1e9
    print(
        f"the whole runtime's overhead is 3% of a step once the model takes "
        f"{per_step_s / 0.03 * 1000:.0f} ms or more (at 1-10 s, a chat model's usual time: "
        f"{per_step_s * 100:.2f}%-{per_step_s / 10.0 * 100:.3f}%)"
    )
    name = f"checkpoint writes / off, {ON_OFF_STEPS} steps at {LATENCY * 1000:g} ms latency"
    env.targets.append(Target(name, 1 + taking / total["off"], 1.03).report())
    name = f"whole durable runtime on / off, {ON_OFF_STEPS} steps at {LATENCY * 1000:g} ms"
    env.targets.append(Target(name, total["on"] / total["off"], None).report())


# 3. a Python tool vs a built-in one -------------------------------------------------------
TOOL_STEPS = pick(200, 12)  # timed steps of each variant, taking turns
TOOL_FILL = pick(10, 3)  # untimed supersteps of each variant first (history and warm-up)
PY_TOOL = "note"  # the `@tool(effects="none")` function's name
TOOL_STEP_LIMIT = 1.1


def python_tool(text: str) -> Tool:
    """A `@tool(effects="none")` as trivial as read_file: it returns `text`, a file's size."""

    @tool(name=PY_TOOL, effects="none")
    def note(path: str) -> str:
        """Return the note filed under a path.

        Args:
            path: where the note is filed

        """
        return text

    return note


def tool_turns(text: Text, name: str, n: int) -> list[Turn]:
    """`n` turns, each saying a little and calling tool `name` on the same small file.

    The same file each time: the worker's copy of it is then up to date, as a file an
    agent reads again is (a first read fetches the file's blob from the store).
    """
    args: Args = {"path": "src/module_0.py"}
    return [Turn(say=text.words(SAY_CHARS), tools=[ToolRequest(name=name, args=args)])] * n


def tool_steps(env: Env) -> None:
    """Measurement 3: a step calling a Python tool vs one calling read_file, taking turns.

    Two tasks of one agent each, alike but for the tool their turns call: a `@tool(effects=
    "none")` function returning a string as long as the files (validating its argument
    with pydantic, as every Python tool does) or the built-in read_file on a small file
    (FILE_CHARS). Both offer the same tools, so their model requests are the same size,
    and their histories grow alike, so full LCs land on the same steps.
    """
    phases = Phases()
    note = python_tool(env.text.words(FILE_CHARS))
    runs = {PY_TOOL: note, "read_file": TOOLS["read_file"]}
    registry = ToolRegistry(
        [
            *(t for t in TOOLS.values() if t.name not in runs),
            *(replace(t, run=cast(ToolRun, phases.wrap(name, t.run))) for name, t in runs.items()),
        ]
    )
    n = TOOL_FILL + TOOL_STEPS + 5
    offered = [*TOOL_NAMES, PY_TOOL]
    teams = {}
    for name in runs:
        model = ScriptedModel(tool_turns(env.text, name, n))
        teams[name] = Team.start(env.store, env.root, f"tool-{name}", model, env.text, offered)
        teams[name].tools = registry
    for _ in range(TOOL_FILL):
        for team in teams.values():
            team.superstep()
    steps = {name: Samples() for name in teams}
    own = {name: Samples() for name in teams}
    for i in range(TOOL_STEPS):
        order = list(teams) if i % 2 == 0 else list(reversed(teams))  # neither always first
        for name in order:
            team = teams[name]
            team.begin()
            phases.reset()
            vote, took = clock(team.step)
            assert phases.calls[name] == 1, f"the {name} step did not call {name}"
            steps[name].add(took)
            own[name].add(phases.ns[name])
            team.barrier(vote)
    base = steps["read_file"].p50
    names = {
        PY_TOOL: f'run_step calling @tool(effects="none") {PY_TOOL}',
        "read_file": "run_step calling read_file",
    }
    table(
        f"3. A Python tool vs a built-in: {TOOL_STEPS} steps each, taking turns, zero-latency "
        f"model, after {TOOL_FILL} untimed supersteps each; each tool returns {FILE_CHARS} chars",
        ["operation", "p50", "p99", "mean", "tool's own p50", "p50 vs read_file"],
        [
            [
                names[name],
                *(duration(v) for v in (s.p50, s.p99, s.mean, own[name].p50)),
                ratio(s.p50, base),
            ]
            for name, s in steps.items()
        ],
    )
    print(
        f"(the tool's own time is its `run`: for {PY_TOOL}, validating the arguments with "
        "pydantic, the call and the result as text; for read_file, resolving the path in "
        "the workspace and reading the file. The rest of the step is the same for both)"
    )
    name = 'step calling a @tool(effects="none") p50 / step calling read_file p50'
    env.targets.append(Target(name, steps[PY_TOOL].p50 / base, TOOL_STEP_LIMIT).report())


# 4. an agent in code vs the built-in loop ---------------------------------------------------
# "No more than a built-in step": the code's own bookkeeping (its context, the journal's two
# entries and their digests) is ~75 Python calls a step, about 1% of it; the p50s of two
# like steps taking turns differ by up to a few percent run to run (the disk's renames).
CODE_STEP_LIMIT = 1.05
CODE_KIND = "bench_coder"


@agent(name=CODE_KIND)
def code_coder(ctx: AgentContext) -> str:
    """The built-in loop's work, written in Python: one model turn, then the calls it asked for."""
    ctx.run_calls(ctx.ask(tools=True))
    return "continue"


def code_steps(env: Env) -> None:
    """Measurement 4: a step of an agent in code vs a built-in step doing the same, in turns.

    Two tasks of one agent each, playing the same turns (a say and one write_file): one of
    the built-in `llm` kind, one of a `cairn.agent` kind whose function asks the model with
    the tools on offer and runs the calls, as the built-in loop does. The code's step adds
    its journal to the checkpoints and its context's calls to the step.
    """
    registry = builtin_tools()
    registry.add_kind(code_coder, "bench")
    n = TOOL_FILL + TOOL_STEPS + 5
    teams = {}
    for kind in ("llm", CODE_KIND):
        model = ScriptedModel(turns(env.text, n))
        teams[kind] = Team.start(env.store, env.root, f"kind-{kind}", model, env.text, kind=kind)
    for team in teams.values():
        team.tools = registry
    for _ in range(TOOL_FILL):
        for team in teams.values():
            team.superstep()
    steps = {kind: Samples() for kind in teams}
    for i in range(TOOL_STEPS):
        order = list(teams) if i % 2 == 0 else list(reversed(teams))  # neither always first
        for kind in order:
            team = teams[kind]
            team.begin()
            vote, took = clock(team.step)
            steps[kind].add(took)
            team.barrier(vote)
    for kind, team in teams.items():  # both did the work: a turn and a write a superstep
        lc = env.store.read_lc(team.gc.task, AGENT, team.gc.members[AGENT].id)
        assert lc.messages[-1].name == "write_file", f"the {kind} step wrote nothing"
    base = steps["llm"].p50
    names = {"llm": "run_step, built-in llm kind", CODE_KIND: "run_step, a cairn.agent kind"}
    table(
        f"4. An agent in code vs the built-in loop, the same work (a turn and a write_file): "
        f"{TOOL_STEPS} steps each, taking turns, zero-latency model, after {TOOL_FILL} untimed",
        ["operation", "p50", "p99", "mean", "p50 vs llm"],
        [
            [names[kind], *(duration(v) for v in (s.p50, s.p99, s.mean)), ratio(s.p50, base)]
            for kind, s in steps.items()
        ],
    )
    name = "step of a cairn.agent p50 / step of the built-in llm kind p50, same work"
    env.targets.append(Target(name, steps[CODE_KIND].p50 / base, CODE_STEP_LIMIT).report())


# the part ------------------------------------------------------------------------------
def run() -> list[Target]:
    """Run the agents measurements (MCP's without Redis); return the targets."""
    with contextlib.ExitStack() as stack:
        root, server, client, store = private_store(stack, quiet=True)
        env = Env(root, client, store, Text(seed=2027))
        print("\n== agents ==")
        print(
            f"redis-server private (port {server.port}, no AOF); workspaces on "
            f"{filesystem(root)}. CheckpointStore: Codec() unsigned, full_every="
            f"{store.full_every}; default policy (a tool-level LC before each external call, "
            "none before writes); logs rendered as JSON at level info into /dev/null"
        )
        step_overhead(env)
        on_off(env)
        tool_steps(env)
        code_steps(env)
        env.targets += [target.report() for target in mcp_call.run()]
        return env.targets
