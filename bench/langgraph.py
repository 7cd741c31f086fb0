"""The LangGraph benchmark: Cairn's saver against LangGraph's own, on one graph.

One `StateGraph` whose only node appends an assistant message to an `add_messages`
history runs on every saver in turn: `CairnSaver` on a private redis-server (never the one
on port 6379), `InMemorySaver`, `SqliteSaver` on a file in a temporary directory, and
`PostgresSaver` in a database this part creates and drops, when a PostgreSQL server
answers. At each history length the savers take turns step by step, so this machine's
noise moves them together; the ratios are against `SqliteSaver` in the same run.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Annotated, Any, TypedDict, cast

import redis
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.graph.state import CompiledStateGraph

from bench.report import Samples, Target, clock, duration, now_ns, pick, ratio, size, table
from bench.report import time_together as take_turns
from bench.storage import Text
from cairn.storage.backends.redis import connect
from cairn.storage.keys import LANGGRAPH_PREFIX as PREFIX
from cairn.storage.keys import ThreadKeys
from cairn.storage.langgraph import CairnSaver
from cairn.testing.redis_server import RedisServer

# pick(full, quick): `python -m bench --quick` runs the same code at the second sizes
HISTORIES = pick((10, 100, 1_000), (10, 100))  # messages of history before the timed steps
BIG = HISTORIES[-1]
STEPS = pick(40, 5)  # timed turns (invokes) per history length and saver
WARM_STEPS = 2  # untimed invokes after the history is built
READS = pick(50, 5)  # get_state calls per history length and saver
CONTENT_CHARS = 200  # every message's content
FLAT = 1.5  # "flat in history length": cost at BIG messages within this of cost at 10
POSTGRES = os.environ.get(
    "CAIRN_BENCH_POSTGRES", "host=127.0.0.1 port=5432 user=postgres dbname=test"
)
BASELINE = "SqliteSaver"


# the graph -------------------------------------------------------------------------------
class State(TypedDict):
    """The graph's state: a chat history merged by `add_messages`."""

    messages: Annotated[list[AnyMessage], add_messages]


Graph = CompiledStateGraph[State, None, State, State]
_TEXT = Text(seed=2026)
_CONTENTS: list[str] = []


def content(n: int) -> str:
    """The content of the `n`-th message of a thread: the same for every saver.

    Every message differs (pseudo-prose that compresses about 3:1, as prose does), so
    no saver's compression gains from repeats a real chat would not have.
    """
    while len(_CONTENTS) <= n:
        _CONTENTS.append(_TEXT.words(CONTENT_CHARS))
    return _CONTENTS[n]


def reply(state: State) -> dict[str, list[AnyMessage]]:
    """The graph's one node: answer with one assistant message."""
    n = len(state["messages"])
    return {"messages": [AIMessage(content=content(n), id=f"ai-{n}")]}


def build_graph(saver: BaseCheckpointSaver[Any]) -> Graph:
    """Compile START -> reply -> END with `saver` as its checkpointer."""
    builder = StateGraph(State)
    builder.add_node("reply", reply)
    builder.add_edge(START, "reply")
    builder.add_edge("reply", END)
    return builder.compile(checkpointer=saver)


def thread(history: int) -> RunnableConfig:
    """The config of the thread that starts with `history` messages."""
    return {"configurable": {"thread_id": f"h{history}"}}


def human(n: int) -> State:
    """An input of one user message, the thread's `n`-th."""
    return {"messages": [HumanMessage(content=content(n), id=f"human-{n}")]}


# the savers ------------------------------------------------------------------------------
@dataclass(slots=True)
class Meter:
    """Time spent inside a saver's `put` and `put_writes`, and how many puts there were."""

    puts: int = 0
    ns: int = 0
    cpu_ns: int = 0  # CPU time of the thread running them (no wait for the GIL or I/O)

    def attach(self, saver: BaseCheckpointSaver[Any]) -> None:
        """Route the saver's `put` and `put_writes` through this meter.

        Instance attributes shadow the methods, so the graph's own calls are the ones
        timed, wherever its loop makes them.
        """
        for name in ("put", "put_writes"):
            saver.__dict__[name] = self._timed(getattr(saver, name), counts=name == "put")

    def _timed(self, method: Callable[..., Any], *, counts: bool) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:  # noqa: ANN401 - the saver's own types
            started, cpu = now_ns(), time.thread_time_ns()
            try:
                return method(*args, **kwargs)
            finally:
                self.ns += now_ns() - started
                self.cpu_ns += time.thread_time_ns() - cpu
                self.puts += counts

        return timed


@dataclass(slots=True)
class Contestant:
    """One saver, its graph, and how to count the payload bytes it holds for a thread."""

    name: str
    saver: BaseCheckpointSaver[Any]
    stored: Callable[[str], int]  # payload bytes held for a thread id
    counted: str  # how `stored` counts, for the reader
    server_cpu: Callable[[], int] = lambda: 0  # ns of CPU its own server has used
    meter: Meter = field(default_factory=Meter)
    graph: Graph = field(init=False)

    def __post_init__(self) -> None:
        self.meter.attach(self.saver)
        self.graph = build_graph(self.saver)


def cairn_bytes(client: redis.Redis, thread_id: str) -> int:
    """The bytes of every string and hash value under a thread's keys (indexes aside)."""
    total = 0
    for key in client.scan_iter(match=f"{PREFIX}:{{{thread_id}}}:*", count=1_000):
        kind = cast(bytes, client.type(key))
        if kind == b"string":
            total += client.strlen(key)
        elif kind == b"hash":
            total += sum(len(v) for v in cast(list[bytes], client.hvals(key)))
    return total


def stored_whole(c: Contestant, history: int) -> tuple[int, int]:
    """How many `messages` versions CairnSaver stored whole, and how many as tails.

    Reads its blobs back from Redis: a tail names the versions it extends (`base`).
    """
    saver = cast(CairnSaver, c.saver)
    thread_id = str(thread(history)["configurable"]["thread_id"])
    whole = tails = 0
    found = saver.redis.scan_iter(match=f"{PREFIX}:{{{thread_id}}}:b:*:messages:*")
    blobs = saver._blobs(ThreadKeys(thread_id, ""), [key.decode() for key in found])
    for blob in blobs.values():
        if "base" in blob:
            tails += 1
        else:
            whole += 1
    return whole, tails


def memory_bytes(saver: InMemorySaver, thread_id: str) -> int:
    """The bytes of the serialized checkpoints, metadata, blobs and writes of a thread."""
    total = 0
    for saved in saver.storage[thread_id].values():
        for (_, checkpoint), (_, metadata), _parent in saved.values():
            total += len(checkpoint) + len(metadata)
    total += sum(len(data) for (tid, *_), (_, data) in saver.blobs.items() if tid == thread_id)
    for (tid, *_), writes in saver.writes.items():
        if tid == thread_id:
            total += sum(len(data) for _task, _channel, (_, data), _path in writes.values())
    return total


def sqlite_bytes(conn: sqlite3.Connection, thread_id: str) -> int:
    """The `length()` of the checkpoint, metadata and write values of a thread."""
    row = conn.execute(
        "SELECT (SELECT coalesce(sum(length(checkpoint) + length(metadata)), 0) "
        "FROM checkpoints WHERE thread_id = ?1) + "
        "(SELECT coalesce(sum(length(value)), 0) FROM writes WHERE thread_id = ?1)",
        (thread_id,),
    ).fetchone()
    return int(row[0])


def cairn(stack: contextlib.ExitStack, root: Path) -> Contestant:
    """CairnSaver on a private redis-server (no AOF) with its archive under `root`."""
    server = RedisServer(root / "redis", appendonly=False)
    stack.callback(server.stop)
    server.start()
    client = stack.enter_context(connect(server.url))
    info = cast(dict[str, object], client.info("server"))
    return Contestant(
        "CairnSaver",
        CairnSaver(client, root / "archive"),
        partial(cairn_bytes, client),
        f"sum of STRLEN/HSTRLEN of the thread's keys (sealed records) in redis-server "
        f"{info.get('redis_version')} (private, port {server.port}, no AOF)",
        partial(redis_cpu, client),
    )


def redis_cpu(client: redis.Redis) -> int:
    """Nanoseconds of CPU the (private) redis-server has used, user and system."""
    info = cast(dict[str, float], client.info("cpu"))
    return int((info["used_cpu_user"] + info["used_cpu_sys"]) * 1e9)


def sqlite(stack: contextlib.ExitStack, root: Path) -> Contestant:
    """SqliteSaver on a file (WAL, as LangGraph sets it) in `root`."""
    conn = sqlite3.connect(root / "langgraph.sqlite", check_same_thread=False)
    stack.callback(conn.close)
    saver = SqliteSaver(conn)
    saver.setup()
    return Contestant(
        BASELINE,
        saver,
        partial(sqlite_bytes, conn),
        f"sum of length(checkpoint, metadata, writes.value) (sqlite {sqlite3.sqlite_version}, "
        "a file on disk)",
    )


def memory() -> Contestant:
    """InMemorySaver: serialized, but kept in dicts."""
    saver = InMemorySaver()
    return Contestant(
        "InMemorySaver",
        saver,
        partial(memory_bytes, saver),
        "sum of the serialized bytes in its storage, blobs and writes dicts",
    )


def postgres(stack: contextlib.ExitStack) -> Contestant | None:
    """PostgresSaver in a fresh database dropped at the end; None (and why) if unavailable."""
    try:
        import psycopg  # noqa: PLC0415 - optional: only this column needs it
        from langgraph.checkpoint.postgres import PostgresSaver  # noqa: PLC0415 - ditto
        from psycopg.rows import dict_row  # noqa: PLC0415 - ditto
    except ImportError as exc:
        print(f"PostgresSaver skipped: {exc} (pip install langgraph-checkpoint-postgres)")
        return None
    database = f"cairn_bench_{os.getpid()}"
    try:
        admin = stack.enter_context(psycopg.connect(POSTGRES, autocommit=True, connect_timeout=3))
        admin.execute(f'CREATE DATABASE "{database}"')
    except psycopg.Error as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"PostgresSaver skipped: no database of ours at '{POSTGRES}' ({reason})")
        return None
    stack.callback(admin.execute, f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    conn = stack.enter_context(
        psycopg.connect(
            f"{POSTGRES} dbname={database}",
            autocommit=True,
            prepare_threshold=0,
            row_factory=dict_row,
        )
    )
    saver = PostgresSaver(conn)
    saver.setup()
    version = admin.execute("SHOW server_version").fetchone()

    def stored(thread_id: str) -> int:
        row = conn.execute(
            "SELECT (SELECT coalesce(sum(pg_column_size(checkpoint) + pg_column_size(metadata)),"
            " 0) FROM checkpoints WHERE thread_id = %(t)s) + "
            "(SELECT coalesce(sum(pg_column_size(blob)), 0) FROM checkpoint_blobs "
            "WHERE thread_id = %(t)s) + "
            "(SELECT coalesce(sum(pg_column_size(blob)), 0) FROM checkpoint_writes "
            "WHERE thread_id = %(t)s) AS total",
            {"t": thread_id},
        ).fetchone()
        return int(cast(dict[str, Any], row)["total"])

    return Contestant(
        "PostgresSaver",
        saver,
        stored,
        f"sum of pg_column_size(checkpoint, metadata, blobs, writes), as stored "
        f"(PostgreSQL {version[0] if version else '?'}, database {database}, dropped after)",
    )


# the measurements ------------------------------------------------------------------------
@dataclass(slots=True)
class Row:
    """One saver's measurements at one history length."""

    puts: int = 0
    checkpoint_ns: int = 0
    cpu_ns: int = 0  # the saver's thread, plus its own server's (Cairn's private Redis)
    stored: int = 0
    invokes: Samples = field(default_factory=Samples)
    reads: Samples = field(default_factory=Samples)

    @property
    def cost(self) -> float:
        """Nanoseconds inside put and put_writes per superstep (per put)."""
        return self.checkpoint_ns / self.puts

    @property
    def cpu(self) -> float:
        """Nanoseconds of CPU per superstep: the saver's thread (and its own server)."""
        return self.cpu_ns / self.puts

    @property
    def bytes(self) -> float:
        """Payload bytes stored per superstep (per put)."""
        return self.stored / self.puts


def prefill(c: Contestant, history: int) -> int:
    """Build a thread of `history` messages through the graph itself; return its length.

    One invoke carries `history - 1` user messages in, the node answers, then WARM_STEPS
    more turns, all untimed: the saver stores the history through its own puts.
    """
    config = thread(history)
    first: State = {
        "messages": [HumanMessage(content=content(i), id=f"human-{i}") for i in range(history - 1)]
    }
    c.graph.invoke(first, config, durability="sync")
    for _ in range(WARM_STEPS):
        n = len(c.graph.get_state(config).values["messages"])
        c.graph.invoke(human(n), config, durability="sync")
    return len(c.graph.get_state(config).values["messages"])


def step(c: Contestant, history: int, n: int, row: Row) -> None:
    """One timed turn: a user message in, the node's answer out, checkpointed per superstep."""
    puts, spent, cpu, server = c.meter.puts, c.meter.ns, c.meter.cpu_ns, c.server_cpu()
    row.invokes.add(clock(partial(c.graph.invoke, human(n), thread(history), durability="sync"))[1])
    row.puts += c.meter.puts - puts
    row.checkpoint_ns += c.meter.ns - spent
    row.cpu_ns += c.meter.cpu_ns - cpu + c.server_cpu() - server


def measure(contestants: Sequence[Contestant], history: int) -> dict[str, Row]:
    """Every measurement at one history length, the savers taking turns."""
    rows = {c.name: Row() for c in contestants}
    lengths = {prefill(c, history) for c in contestants}
    if len(lengths) != 1:
        raise RuntimeError(f"the savers' threads differ in length: {sorted(lengths)}")
    n = lengths.pop()
    thread_id = str(thread(history)["configurable"]["thread_id"])
    before = {c.name: c.stored(thread_id) for c in contestants}
    for i in range(STEPS):
        for c in contestants:
            step(c, history, n + 2 * i, rows[c.name])
    for c in contestants:
        rows[c.name].stored = c.stored(thread_id) - before[c.name]
    reads = take_turns(
        [partial(c.graph.get_state, thread(history)) for c in contestants], READS, warmup=3
    )
    for c, samples in zip(contestants, reads, strict=True):
        rows[c.name].reads = samples
    return rows


# the report ------------------------------------------------------------------------------
Results = dict[int, dict[str, Row]]


def report(
    title: str,
    results: Results,
    names: Sequence[str],
    cell: Callable[[Row], str],
    key: Callable[[Row], float],
) -> None:
    """Print one metric: a row per history length, a column per saver, Cairn vs Sqlite.

    `cell` formats a saver's measurement, `key` is the number the ratio compares.
    """
    table(
        title,
        ["history", *names, "Cairn/Sqlite"],
        [
            [
                f"{history:,} msgs",
                *(cell(rows[name]) for name in names),
                ratio(key(rows["CairnSaver"]), key(rows[BASELINE])),
            ]
            for history, rows in results.items()
        ],
    )


def p50_p99(samples: Samples) -> str:
    """A latency cell: p50 / p99."""
    return f"{duration(samples.p50)} / {duration(samples.p99)}"


def targets(results: Results, names: Sequence[str]) -> list[Target]:
    """The targets, and the same ratios against the other savers as information."""
    small, big = results[HISTORIES[0]]["CairnSaver"], results[BIG]
    cairn_big, sqlite_big = big["CairnSaver"], big[BASELINE]
    found = [
        Target(
            f"LangGraph: Cairn checkpoint CPU per superstep @{BIG:,} msgs / @{HISTORIES[0]} "
            "msgs (flat)",
            cairn_big.cpu / small.cpu,
            FLAT,
        ),
        Target(
            f"LangGraph: Cairn checkpoint wall time per superstep @{BIG:,} msgs / "
            f"@{HISTORIES[0]} msgs",
            cairn_big.cost / small.cost,
            None,
        ),
        Target(
            f"LangGraph: Cairn / SqliteSaver checkpoint cost per superstep @{BIG:,} msgs",
            cairn_big.cost / sqlite_big.cost,
            0.5,
        ),
        Target(
            f"LangGraph: Cairn / SqliteSaver bytes per superstep @{BIG:,} msgs",
            cairn_big.bytes / sqlite_big.bytes,
            0.1,
        ),
        Target(
            f"LangGraph: Cairn / SqliteSaver get_state p50 @{BIG:,} msgs",
            cairn_big.reads.p50 / sqlite_big.reads.p50,
            None,
        ),
    ]
    found += [
        Target(
            f"LangGraph: Cairn / {name} checkpoint cost per superstep @{BIG:,} msgs",
            cairn_big.cost / big[name].cost,
            None,
        )
        for name in names
        if name not in ("CairnSaver", BASELINE)
    ]
    return [t.report() for t in found]


@contextlib.contextmanager
def contestants() -> Iterator[list[Contestant]]:
    """Every saver this machine can run, torn down (databases dropped) on the way out."""
    with contextlib.ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="cairn-bench-lg-")))
        found = [cairn(stack, root), memory(), sqlite(stack, root)]
        pg = postgres(stack)
        yield found if pg is None else [*found, pg]


def run() -> list[Target]:
    """Run the LangGraph comparison on every available saver; return the targets."""
    print("\n== langgraph ==")
    with contestants() as savers:
        names = [c.name for c in savers]
        print(
            f"graph: START -> reply -> END, state {{messages: add_messages}}; every message "
            f"{CONTENT_CHARS} chars, all different. Per history length: one invoke brings the "
            f"thread to it, {WARM_STEPS} untimed turns, then {STEPS} timed turns (1 user "
            "message in, 1 assistant message out; durability='sync'), the savers taking turns."
        )
        print(
            "checkpoint cost = time inside the saver's put + put_writes, per put (one put per "
            "superstep); bytes = payload bytes the saver holds for the thread after the turns "
            "minus before, per put. How each saver's bytes are counted:"
        )
        for c in savers:
            print(f"  {c.name}: {c.counted}")
        results: Results = {}
        for history in HISTORIES:
            results[history] = measure(savers, history)
        puts = results[HISTORIES[0]]["CairnSaver"].puts / STEPS
        print(f"({puts:g} puts per turn: the input's, __start__'s and reply's supersteps)")
        ours = next(c for c in savers if c.name == "CairnSaver")
        whole = {h: stored_whole(ours, h) for h in HISTORIES}
    report(
        f"LangGraph 1. checkpoint cost per superstep (mean over {STEPS} turns)",
        results,
        names,
        lambda row: duration(row.cost),
        lambda row: row.cost,
    )
    report(
        f"LangGraph 1b. checkpoint CPU per superstep (mean over {STEPS} turns): the CPU time "
        "of the thread running put + put_writes, plus, for Cairn, its private redis-server's",
        results,
        names,
        lambda row: duration(row.cpu),
        lambda row: row.cpu,
    )
    report(
        "LangGraph 2. payload bytes stored per superstep",
        results,
        names,
        lambda row: size(row.bytes),
        lambda row: row.bytes,
    )
    report(
        f"LangGraph 3. graph.get_state, p50 / p99 ({READS} calls each, taking turns)",
        results,
        names,
        lambda row: p50_p99(row.reads),
        lambda row: row.reads.p50,
    )
    report(
        f"LangGraph 4. whole invoke per turn, p50 / p99 ({STEPS} turns; "
        "the graph's own work included)",
        results,
        names,
        lambda row: p50_p99(row.invokes),
        lambda row: row.invokes.p50,
    )
    print(
        "CairnSaver's `messages` versions over each thread's life (build-up included), "
        "stored whole / in pieces after the first: "
        + "; ".join(f"{h:,} msgs {w} / {t}" for h, (w, t) in whole.items())
    )
    print(
        f"(flat: Cairn's CPU per superstep at {BIG:,} msgs is at most {FLAT}x its CPU at "
        f"{HISTORIES[0]} msgs. LangGraph runs put on a background thread while its main "
        "thread goes on with the next step, whose work grows with the history (add_messages "
        "copies the list): the wall time inside put includes waiting for the GIL, for every "
        "saver alike, so table 1 is shown and table 1b is the saver's own cost. The ratio "
        "columns are p50 for latencies, mean for cost)"
    )
    return targets(results, names)
