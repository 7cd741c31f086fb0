"""The peer benchmark: Cairn's durable overhead per step against DBOS's, on the same work.

One agent, STEPS steps, each a 20 ms model call (a `ScriptedModel` turn that sleeps) and
one `write_file` of a small file, run four ways in the same process, taking turns run by
run: a plain loop in memory (the baseline: ask, run the tool, append to a list), Cairn
(`run_step` and the barrier's commit on a private redis-server, as the agents part runs
them), and a DBOS workflow whose step does the plain loop's turn, on SQLite and on
PostgreSQL. A variant's overhead per step is its p50 step minus the plain loop's p50 step
of the same run. DBOS is the `bench` extra (`make bench` installs it); without it, or
without a PostgreSQL server, the column says why.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from functools import cache, partial
from pathlib import Path
from types import ModuleType
from typing import Any, cast
from unittest import mock
from urllib.parse import quote

from redis.connection import AbstractConnection

import bench.agents as agents_part
from bench.agents import AGENT, FILE_CHARS, GOAL, SYSTEM, Team, initial_files, turns
from bench.report import Samples, Target, clock, duration, now_ns, pick, private_store, table
from bench.storage import Text
from cairn.agents import step as step_module
from cairn.agents.heartbeat import Heartbeat
from cairn.agents.models.base import ModelRequest
from cairn.agents.models.scripted import ScriptedModel
from cairn.agents.spec import TOOL_NAMES, StepPolicy, Turn
from cairn.agents.toolkit import ToolRegistry
from cairn.agents.tools import TOOLS, ToolContext
from cairn.agents.workspace import Workspace
from cairn.coordinator.settings import Settings, open_store
from cairn.storage.backends.redis import RedisHotStore, connect
from cairn.storage.records import Message, Role
from cairn.storage.store import CheckpointStore
from cairn.testing.redis_server import RedisServer

# pick(full, quick): `python -m bench --quick` runs the same code at the second size
STEPS = pick(100, 12)  # timed steps a run
RUNS = pick(5, 1)  # runs of each variant, taking turns
WARM_STEPS = pick(10, 3)  # one untimed run of each variant first, this long
LATENCY = 0.02  # the model's latency, seconds
SQLITE_LIMIT, POSTGRES_LIMIT = 1.0, 0.5  # Cairn's overhead / DBOS's
POSTGRES = os.environ.get(
    "CAIRN_BENCH_POSTGRES", "host=127.0.0.1 port=5432 user=postgres dbname=test"
)
PLAIN, CAIRN, CAIRN_AOF = "plain", "cairn", "cairn-aof"
SQLITE, PG = "dbos-sqlite", "dbos-postgres"
SQLITE2, PG2 = "dbos-sqlite-2", "dbos-postgres-2"  # a step for the model, one for the tool
NAMES = {
    PLAIN: "plain loop in memory (the baseline)",
    CAIRN: "Cairn: run_step + barrier on Redis (no AOF)",
    CAIRN_AOF: "Cairn, Redis with AOF appendfsync always",
    SQLITE: "DBOS on SQLite, one step a turn",
    PG: "DBOS on PostgreSQL, one step a turn",
    SQLITE2: "DBOS on SQLite, model step + tool step",
    PG2: "DBOS on PostgreSQL, model step + tool step",
}


# the plain loop, also each DBOS step's body ------------------------------------------------
@dataclass(slots=True)
class Loop:
    """An agent loop that checkpoints nothing: its model, history and tool context."""

    model: ScriptedModel
    ctx: ToolContext
    messages: list[Message] = field(
        default_factory=lambda: [
            Message(role=Role.SYSTEM, content=SYSTEM),
            Message(role=Role.USER, content=GOAL),
        ]
    )

    @classmethod
    def fresh(cls, root: Path, name: str, script: list[Turn], text: Text) -> Loop:
        """A loop over a new workspace holding the task's initial files."""
        workspace = Workspace(root / "plain", name, AGENT)
        for path, content in initial_files(text).items():
            (workspace.tree / path).parent.mkdir(parents=True, exist_ok=True)
            (workspace.tree / path).write_bytes(content)
        ctx = ToolContext(workspace, AGENT, [AGENT], 1, StepPolicy())
        return cls(ScriptedModel(script), ctx)

    def ask(self) -> Message:
        """The model call: the assistant's message (its reply and tool calls)."""
        tools = [TOOLS[name].schema for name in TOOL_NAMES]
        reply = self.model.complete(ModelRequest(self.messages, tools, agent=AGENT))
        return Message(role=Role.ASSISTANT, content=reply.content, tool_calls=reply.tool_calls)

    def act(self, said: Message) -> list[Message]:
        """Run the tools `said` calls; return the assistant's message and the tools'."""
        out = [said]
        for call in said.tool_calls:
            result = TOOLS[call.name].run(self.ctx, call.args)
            out.append(
                Message(role=Role.TOOL, tool_call_id=call.id, name=call.name, content=result)
            )
        return out

    def turn(self) -> list[Message]:
        """One turn: ask, run the tools; the turn's new messages (appended by `append`)."""
        return self.act(self.ask())

    def append(self, new: list[Message]) -> None:
        """Add a turn's messages to the history."""
        self.messages.extend(new)


def plain_run(loop: Loop, steps: int) -> Samples:
    """`steps` turns of the plain loop; one sample each."""
    return Samples([clock(lambda: loop.append(loop.turn()))[1] for _ in range(steps)])


# DBOS ------------------------------------------------------------------------------------
_current: list[Loop] = []  # the loop the DBOS steps below work on, set by dbos_run


def _turn_step() -> list[Message]:
    return _current[0].turn()


def _ask_step() -> Message:
    return _current[0].ask()


def _act_step(said: Message) -> list[Message]:
    return _current[0].act(said)


@dataclass(frozen=True, slots=True)
class Dbos:
    """The DBOS library, its version and the workflows this part runs, registered once."""

    lib: ModuleType
    version: str
    one_step: Callable[[int], list[int]]  # `n` turns, one step each; ns per turn
    two_steps: Callable[[int], list[int]]  # `n` turns, a model step and a tool step each


@cache
def dbos() -> Dbos | str:
    """DBOS with this part's workflows registered, or why it cannot be used."""
    try:
        from importlib.metadata import version  # noqa: PLC0415 - only when DBOS is used

        import dbos as lib  # noqa: PLC0415 - optional: the `bench` extra
    except ImportError as exc:
        return f"DBOS not importable ({exc}); `make bench` installs the `bench` extra"
    step = lib.DBOS.step()
    turn_step: Callable[[], list[Message]] = step(_turn_step)
    ask_step: Callable[[], Message] = step(_ask_step)
    act_step: Callable[[Message], list[Message]] = step(_act_step)

    def one(n: int) -> list[int]:
        loop = _current[0]
        return [clock(lambda: loop.append(turn_step()))[1] for _ in range(n)]

    def two(n: int) -> list[int]:
        loop = _current[0]
        return [clock(lambda: loop.append(act_step(ask_step())))[1] for _ in range(n)]

    workflow = lib.DBOS.workflow()
    return Dbos(lib, version("dbos"), workflow(one), workflow(two))


@contextlib.contextmanager
def launched(lib: ModuleType, url: str) -> Iterator[None]:
    """DBOS launched on the system database at `url`, destroyed on the way out."""
    config = {"name": "cairn-bench-peer", "system_database_url": url, "log_level": "WARNING"}
    lib.DBOS(config=config)
    try:
        lib.DBOS.launch()
        yield
    finally:
        lib.DBOS.destroy()


def dbos_run(
    lib: ModuleType,
    url: str,
    loop: Loop,
    steps: int,
    two: Callable[[int], list[int]] | None,
    one: Callable[[int], list[int]],
) -> Samples:
    """One DBOS workflow of `steps` turns over `loop` (`two`: two steps a turn)."""
    _current[:] = [loop]
    with launched(lib, url):
        return Samples((two or one)(steps))


def postgres_url(stack: contextlib.ExitStack) -> str:
    """A fresh database's SQLAlchemy URL (dropped by `stack`); ValueError says why not."""
    try:
        import psycopg  # noqa: PLC0415 - optional: only this column needs it
        from psycopg.conninfo import conninfo_to_dict  # noqa: PLC0415 - ditto
    except ImportError as exc:
        raise ValueError(f"psycopg not importable ({exc})") from exc
    try:
        admin = stack.enter_context(psycopg.connect(POSTGRES, autocommit=True, connect_timeout=3))
    except psycopg.Error as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"no PostgreSQL server at '{POSTGRES}' ({reason})") from exc
    name = f"cairn_bench_peer_{os.getpid()}"
    admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
    admin.execute(f'CREATE DATABASE "{name}"')
    stack.callback(admin.execute, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    info = conninfo_to_dict(POSTGRES)
    user = quote(str(info.get("user", "postgres")))
    if info.get("password"):
        user += ":" + quote(str(info["password"]))
    host = info.get("host", "127.0.0.1")
    settings = admin.execute(
        "SELECT current_setting('fsync'), current_setting('synchronous_commit'), version()"
    ).fetchone()
    print(
        f"PostgreSQL: {settings[2].split(' on ')[0] if settings else '?'}; database {name} "
        f"(created, dropped at the end); fsync={settings[0] if settings else '?'}, "
        f"synchronous_commit={settings[1] if settings else '?'}"
    )
    return f"postgresql://{user}@{host}:{info.get('port', 5432)}/{name}"


# Cairn -----------------------------------------------------------------------------------
def cairn_run(team: Team, steps: int) -> Samples:
    """`steps` supersteps (run_step, then the barrier that begins the next), one sample each."""
    return Samples([clock(team.superstep)[1] for _ in range(steps)])


MODEL, TOOL = "model call (20 ms sleep; excluded)", "tool write_file (excluded)"
IO = "of which Redis round trips (send + wait + read)"


class Inclusive:
    """Inclusive time of labelled calls on this thread.

    A labelled call inside another one is not counted again, so the labels add up; Redis
    I/O is summed at any depth, apart.
    """

    def __init__(self) -> None:
        self.ns: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self.io_ns = 0
        self.depth = 0
        self.thread = threading.get_ident()

    def wrap(self, label: str, fn: Callable[..., object]) -> Callable[..., object]:
        """Return `fn` timed under `label`."""

        def timed(*args: object, **kwargs: object) -> object:
            if threading.get_ident() != self.thread:
                return fn(*args, **kwargs)
            self.calls[label] += 1
            self.depth += 1
            started = now_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                self.depth -= 1
                if self.depth == 0:
                    self.ns[label] += now_ns() - started

        return timed

    def io(self, fn: Callable[..., object]) -> Callable[..., object]:
        """Return `fn` (a Redis send or read) with its time summed into `io_ns`."""

        def timed(*args: object, **kwargs: object) -> object:
            if threading.get_ident() != self.thread:
                return fn(*args, **kwargs)
            started = now_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                self.io_ns += now_ns() - started
                self.calls[IO] += fn.__name__ == "send_packed_command"

        return timed


def cairn_profile(team: Team, steps: int, cairn_overhead: float) -> None:
    """Run `steps` more supersteps with their parts timed; print where the time goes."""
    timer = Inclusive()
    parts: list[tuple[object, str, str]] = [
        (CheckpointStore, "begin_superstep", "coordinator: prepare the GC + fence (first only)"),
        (RedisHotStore, "step_start", "step_start: fence + claim + first beat (Redis)"),
        (Heartbeat, "__enter__", "heartbeat: schedule its beats"),
        (Heartbeat, "__exit__", "heartbeat: end its beats"),
        (CheckpointStore, "read_doc", "read the task spec"),
        (CheckpointStore, "latest_gc", "read the latest GC"),
        (CheckpointStore, "read_state", "read_state: the agent's LC chain"),
        (Workspace, "sync", "workspace.sync"),
        (ScriptedModel, "complete", MODEL),
        (RedisHotStore, "send_spend", "send_spend: the model call's spend (sent, not awaited)"),
        (getattr(step_module, "_Step", None), "_trace", "trace records"),
        (Workspace, "capture", "workspace.capture: scan, hash"),
        (CheckpointStore, "put_blob", "put_blob"),
        (CheckpointStore, "write_lc", "write_lc: cut, encode, fenced write of LC + vote + blobs"),
        (agents_part, "build_gc", "barrier: build_gc (reads the vote's LC)"),
        (CheckpointStore, "commit_and_begin", "barrier: commit_gc + the next begin (one script)"),
    ]
    tool = TOOLS["write_file"]
    team.tools = ToolRegistry(
        [
            replace(tool, run=cast(Any, timer.wrap(TOOL, tool.run))),
            *(t for t in TOOLS.values() if t is not tool),
        ]
    )
    per_step: dict[str, Samples] = {}
    whole = Samples()
    with contextlib.ExitStack() as stack:
        for owner, name, label in parts:
            if owner is not None and hasattr(owner, name):  # others refactor: skip what is gone
                stack.enter_context(
                    mock.patch.object(owner, name, timer.wrap(label, getattr(owner, name)))
                )
        for name in ("send_packed_command", "read_response"):
            stack.enter_context(
                mock.patch.object(
                    AbstractConnection, name, timer.io(getattr(AbstractConnection, name))
                )
            )
        for _ in range(steps):
            timer.ns, timer.io_ns = Counter(), 0
            took = clock(team.superstep)[1]
            whole.add(took)
            rows = Counter(timer.ns)
            rows["rest (unwrapped code: run_step's own, logs, pydantic)"] = took - sum(
                rows.values()
            )
            rows[IO] = timer.io_ns
            for label, ns in rows.items():
                per_step.setdefault(label, Samples()).add(ns)
    durable = whole.mean - per_step[MODEL].mean - per_step.get(TOOL, Samples([0])).mean
    labels = sorted(per_step, key=lambda k: (k == IO, -per_step[k].mean))
    table(
        f"Where Cairn's time goes: {steps} more supersteps with their parts timed (inclusive, "
        "not counted twice when nested; the heartbeat's thread is not timed)",
        ["part of a superstep", "calls/step", "mean", "p50", "share of durable part"],
        [
            [
                label,
                f"{timer.calls[label] / steps:g}" if label in timer.calls else "-",
                duration(s.mean),
                duration(s.p50),
                "-" if label in (MODEL, TOOL) else f"{s.mean / durable:.0%}",
            ]
            for label in labels
            for s in [per_step[label]]
        ],
    )
    print(
        f"(instrumented superstep mean {duration(whole.mean)}, of it durable {duration(durable)}"
        f" a step; the uninstrumented runs' overhead over the plain loop: "
        f"{duration(cairn_overhead)} p50)"
    )


# the part --------------------------------------------------------------------------------
Run = Callable[[int, int], Samples]  # (run number, steps) -> one sample a step


@dataclass(slots=True)
class Variant:
    """One contestant: how to run it, its samples per run, or why it did not run."""

    run: Run | None
    why: str = ""
    runs: list[Samples] = field(default_factory=list)


@dataclass(slots=True)
class Setup:
    """What every variant runs on: the private store, its directory, the script."""

    stack: contextlib.ExitStack
    root: Path
    store: CheckpointStore
    text: Text
    script: list[Turn]

    def loop(self, name: str) -> Loop:
        """A fresh plain loop over this script."""
        return Loop.fresh(self.root, name, self.script, self.text)

    def plain(self, run: int, steps: int) -> Samples:
        """One run of the plain loop."""
        return plain_run(self.loop(f"plain{run}"), steps)

    def cairn(self, store: CheckpointStore, key: str, run: int, steps: int) -> Samples:
        """One run of Cairn on `store`: a fresh task, `steps` supersteps."""
        team = Team.start(store, self.root, f"{key}{run}", ScriptedModel(self.script), self.text)
        return cairn_run(team, steps)

    def dbos(self, key: str, url: str, found: Dbos, two: bool, run: int, steps: int) -> Samples:
        """One run of DBOS: one workflow of `steps` turns over a fresh plain loop."""
        one, both = found.one_step, found.two_steps if two else None
        return dbos_run(found.lib, url, self.loop(f"{key}{run}"), steps, both, one)


def aof_store(stack: contextlib.ExitStack, root: Path) -> CheckpointStore:
    """A second store as `private_store`'s, on a redis-server with AOF, appendfsync always."""
    server = RedisServer(root / "redis-aof", appendonly=True, fsync="always")
    stack.callback(server.stop)
    server.start()
    client = stack.enter_context(connect(server.url))
    settings = Settings(archive_dir=root / "archive-aof", signing_key=None, audit=False)
    return open_store(settings, client)


def dbos_variants(setup: Setup) -> dict[str, Variant]:
    """DBOS's four variants, or each with why it cannot run."""
    found = dbos()
    if isinstance(found, str):
        return {key: Variant(None, found) for key in (SQLITE, PG, SQLITE2, PG2)}
    print(
        f"DBOS {found.version} (dbos on PyPI), its default pickle serializer, logs at "
        "WARNING; a DBOS step's time is taken inside the workflow, around the step "
        "call (so the workflow's own start and end, once a run, are not in it)"
    )
    sqlite = f"sqlite:///{setup.root / 'dbos.sqlite'}"
    print(f"SQLite: {sqlite} (DBOS's settings: rollback journal, synchronous=FULL)")
    try:
        pg: str | None = postgres_url(setup.stack)
        pg_why = ""
    except ValueError as exc:
        pg, pg_why = None, str(exc)
    out = {}
    for key, url, two in ((SQLITE, sqlite, False), (PG, pg, False),
                          (SQLITE2, sqlite, True), (PG2, pg, True)):  # fmt: skip
        run = None if url is None else partial(setup.dbos, key, url, found, two)
        out[key] = Variant(run, pg_why)
    return out


def take_turns(variants: dict[str, Variant]) -> None:
    """Warm every variant up, then RUNS runs of each, taking turns."""
    for key, v in variants.items():  # imports, connections, caches, the tables' first pages
        if v.run is None:
            continue
        try:
            v.run(0, WARM_STEPS)
        except Exception as exc:  # DBOS failing to launch skips its column
            if key in (PLAIN, CAIRN, CAIRN_AOF):
                raise
            v.run, v.why = None, f"failed: {type(exc).__name__}: {exc}"
    ready = [key for key, v in variants.items() if v.run is not None]
    for key, v in variants.items():
        if v.run is None:
            print(f"{NAMES[key]}: skipped: {v.why}")
    for r in range(1, RUNS + 1):
        shift = (r - 1) % len(ready)
        for key in ready[shift:] + ready[:shift]:  # no variant always first
            variants[key].runs.append(cast(Run, variants[key].run)(r, STEPS))


def overheads(variants: dict[str, Variant], key: str) -> list[float]:
    """Each run's (the variant's p50 - the plain loop's p50 of the same round), ns a step."""
    pairs = zip(variants[key].runs, variants[PLAIN].runs, strict=True)
    return [s.p50 - p.p50 for s, p in pairs]


def overhead(variants: dict[str, Variant], key: str) -> float:
    """The median of `overheads`: the figure the targets are judged on."""
    return statistics.median(overheads(variants, key))


def report(variants: dict[str, Variant]) -> list[Target]:
    """Print the table and the targets; return the targets whose DBOS column ran."""
    rows = []
    for key, v in variants.items():
        if v.run is None:
            rows.append([NAMES[key], "-", "-", "-", f"skipped: {v.why}"])
            continue
        rows.append([
            NAMES[key],
            duration(statistics.median(s.p50 for s in v.runs)),
            " / ".join(duration(s.p50) for s in v.runs),
            duration(statistics.median(s.p99 for s in v.runs)),
            "-" if key == PLAIN else duration(overhead(variants, key)),
        ])  # fmt: skip
    table(
        f"Step overhead against a peer: {STEPS} steps a run at {LATENCY * 1000:g} ms model "
        f"latency, one write_file a step ({RUNS} runs each, taking turns)",
        ["variant", "step p50 (median of runs)", "p50 per run", "step p99", "overhead/step"],
        rows,
    )
    print("(overhead/step: the median over runs of the run's p50 minus the plain loop's p50)")
    ours = overhead(variants, CAIRN)
    targets = []
    for key, limit, db in ((SQLITE, SQLITE_LIMIT, "SQLite"), (PG, POSTGRES_LIMIT, "PostgreSQL")):
        if variants[key].run is None:
            print(f"target Cairn / DBOS on {db}: not measured ({variants[key].why})")
            continue
        theirs = overhead(variants, key)
        name = f"Cairn / DBOS ({db}) overhead per step, {STEPS} steps at {LATENCY * 1000:g} ms"
        measured = ours / theirs if theirs > 0 else float("inf")
        targets.append(Target(name, measured, limit).report())
        # The spread says how far one day's figure can be trusted: each round's own ratio.
        rounds = zip(overheads(variants, CAIRN), overheads(variants, key), strict=True)
        each = " / ".join(f"{o / t:.2f}x" if t > 0 else "-" for o, t in rounds)
        print(f"(Cairn / DBOS on {db}, each run's own ratio: {each})")
    aof = overhead(variants, CAIRN_AOF)
    for key, db in ((SQLITE, "SQLite"), (PG, "PostgreSQL")):
        if variants[key].run is not None and overhead(variants, key) > 0:
            print(
                f"(for information: Cairn with AOF appendfsync always / DBOS on {db}: "
                f"{aof / overhead(variants, key):.2f}x)"
            )
    for key, db in ((SQLITE2, "SQLite"), (PG2, "PostgreSQL")):
        if variants[key].run is not None and overhead(variants, key) > 0:
            print(
                f"(for information: Cairn / DBOS on {db} with a step for the model and one "
                f"for the tool: {ours / overhead(variants, key):.2f}x)"
            )
    return targets


def run() -> list[Target]:
    """Run the peer comparison; return its two targets (those whose DBOS column ran)."""
    with contextlib.ExitStack() as stack:
        root, server, _client, store = private_store(stack, quiet=True)
        text = Text(seed=2028)
        setup = Setup(stack, root, store, text, turns(text, WARM_STEPS + STEPS + 10, LATENCY))
        print("\n== peer ==")
        print(
            f"one agent, {STEPS} timed steps a run ({RUNS} runs of each variant, taking turns, "
            f"after one untimed run of {WARM_STEPS} steps each), model latency "
            f"{LATENCY * 1000:g} ms, one write_file of {FILE_CHARS} chars a step. Cairn: "
            f"redis-server private (port {server.port}, no AOF, as the agents part), store "
            f"Codec() unsigned, full_every={store.full_every}, logs as JSON into /dev/null; a "
            "superstep is run_step + the barrier's commit, whose one script also begins the next "
            "superstep (the GC prepared and the attempt fenced in), as the coordinator's under "
            "durability: async"
        )
        variants = {
            PLAIN: Variant(setup.plain),
            CAIRN: Variant(partial(setup.cairn, store, CAIRN)),
            CAIRN_AOF: Variant(partial(setup.cairn, aof_store(stack, root), CAIRN_AOF)),
        }
        variants |= dbos_variants(setup)
        take_turns(variants)
        targets = report(variants)
        team = Team.start(store, root, "peer-profile", ScriptedModel(setup.script), text)
        for _ in range(WARM_STEPS):
            team.superstep()
        cairn_profile(team, STEPS, overhead(variants, CAIRN))
        return targets
