"""The storage benchmark: LC writes, bytes per step, reads, archiving, the command packer.

Everything runs against a private redis-server (never the one on port 6379) and a disk
archive in a temporary directory, both removed at the end. Each measurement is compared
with a baseline measured in the same run: the least work that could do the same job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import itertools
import os
import random
import statistics
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import cast
from unittest import mock

import orjson
import redis
import zstandard

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
    time_together,
)
from cairn.storage import keys
from cairn.storage.archive import archive_gc
from cairn.storage.backends.disk import DiskArchive
from cairn.storage.base import LCEntry
from cairn.storage.chain import WorkingState, base_after_write, cut_lc
from cairn.storage.codec import (
    DEFAULT_COMPRESS_ABOVE,
    FLAG_ZSTD,
    HEADER_SIZE,
    Place,
    canonical_bytes,
)
from cairn.storage.records import (
    GlobalCheckpoint,
    LCRef,
    Level,
    LocalCheckpoint,
    Message,
    Role,
    ToolCall,
    TraceRecord,
    Usage,
    WorkspaceManifest,
)
from cairn.storage.store import CheckpointStore
from cairn.testing.redis_server import RedisServer

FULL_EVERY = 20
# pick(full, quick): `python -m bench --quick` runs every measurement at the second size
SIZES = pick((10, 100, 1_000), (10, 100))  # messages of history before the timed steps
BIG = SIZES[-1]
STEPS = pick(300, 45)  # timed LC writes per size (quick: still two full LCs among them)
PHASE_STEPS = pick(100, 25)  # steps timed phase by phase at BIG messages
CONTENT_CHARS = 346  # makes an assistant message's canonical JSON about 500 bytes
VOCABULARY = 5_000
READS = pick(50, 5)
CHAIN_DELTAS = 10  # chains read and archived: one full LC and this many deltas
ARCHIVE_RUNS = pick(3, 1)
ARCHIVE_AGENTS = 3
WORKSPACE_FILES = pick(200, 20)
FILE_BYTES = 4_096
SET_BYTES = 512 * 1024
SETS = pick(200, 10)
WARMUP = pick(10, 2)
T0 = datetime(2026, 1, 1, tzinfo=UTC)
AGENT = "coder"


# workload ------------------------------------------------------------------------------
class Text:
    """Pseudo-prose: words of a random vocabulary drawn with Zipf frequencies.

    Repeating one letter would let zstd shrink every record to almost nothing; this text
    compresses about 3:1 with zstd-3, as English prose does, so sizes after compression
    mean something.
    """

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        letters = "abcdefghijklmnopqrstuvwxyz"
        self._words = [
            "".join(self.rng.choices(letters, k=self.rng.randint(1, 10))) for _ in range(VOCABULARY)
        ]
        self._cum = list(itertools.accumulate(1 / rank for rank in range(1, VOCABULARY + 1)))

    def words(self, chars: int) -> str:
        """Return `chars` characters of pseudo-prose."""
        out = ""
        while len(out) < chars:
            out += " ".join(self.rng.choices(self._words, cum_weights=self._cum, k=chars // 4))
            out += " "
        return out[:chars]


def new_agent(store: CheckpointStore, task: str, agent: str = AGENT) -> WorkingState:
    """Register `task` (epoch 1) and return an agent state with its system prompt.

    A copy of `tests.factories.new_agent` (the benchmark does not import the tests).
    """
    epoch = store.hot.init_task(task)
    store.hot.begin_attempt(task, agent, 1, 1)
    return WorkingState(
        task=task,
        agent=agent,
        epoch=epoch,
        attempt=1,
        superstep=1,
        messages=[Message(role=Role.SYSTEM, content=f"You are {agent}.")],
    )


def next_superstep(store: CheckpointStore, state: WorkingState) -> None:
    """Move `state` to its next superstep, attempt 1 (as `tests.factories` does)."""
    state.superstep += 1
    state.attempt = 1
    store.hot.begin_attempt(state.task, state.agent, state.superstep, 1)


def take_step(state: WorkingState, text: Text) -> None:
    """Append one ~500-byte assistant message with a tool call and its trace record."""
    state.step += 1
    i = state.step
    path = f"src/module_{i}.py"
    state.messages.append(
        Message(
            role=Role.ASSISTANT,
            content=text.words(CONTENT_CHARS),
            tool_calls=[ToolCall(id=f"call-{i}", name="write_file", args={"path": path})],
        )
    )
    started = T0 + timedelta(seconds=2 * i)
    state.trace.append(
        TraceRecord(
            step=i,
            superstep=state.superstep,
            tool="write_file",
            arguments={"path": path, "bytes": 2048 + i % 97},
            result={"ok": True},
            side_effect=True,
            started_at=started,
            finished_at=started + timedelta(milliseconds=1500 + i % 13),
            duration_ms=1500.0 + i % 13,
            usage=Usage(prompt_tokens=400 * i, completion_tokens=120 + i % 50),
        )
    )


def fill(state: WorkingState, messages: int, text: Text) -> None:
    """Take steps (without writing LCs) until the history holds `messages` messages."""
    while len(state.messages) < messages:
        take_step(state, text)


def new_bytes(state: WorkingState) -> bytes:
    """The canonical JSON of the last step's message and trace record: what a step adds."""
    return canonical_bytes(state.messages[-1]) + canonical_bytes(state.trace[-1])


def depth(state: WorkingState) -> int:
    """The depth of the LC a state descends from (it must have one)."""
    if state.base is None:
        raise RuntimeError("state has no base LC")
    return state.base.depth


def agent_with_chain(store: CheckpointStore, task: str, agent: str, text: Text) -> LCRef:
    """Write an agent's full LC and CHAIN_DELTAS deltas after it, ending at BIG messages.

    One step per superstep, as the team runs; no GC is committed.
    """
    state = new_agent(store, task, agent)
    fill(state, BIG - CHAIN_DELTAS, text)
    store.write_lc(state, vote=True)
    ref = None
    for _ in range(CHAIN_DELTAS):
        next_superstep(store, state)
        take_step(state, text)
        ref = store.write_lc(state, vote=True)
    if ref is None or len(state.messages) != BIG or depth(state) != CHAIN_DELTAS:
        raise RuntimeError("chain was not built as intended")
    return ref


@dataclass(slots=True)
class Bench:
    """What every measurement uses: the store over a private Redis and a disk archive."""

    root: Path
    server: RedisServer
    client: redis.Redis
    store: CheckpointStore
    text: Text
    targets: list[Target] = field(default_factory=list)


# 1. LC writes ----------------------------------------------------------------------------
@dataclass(slots=True)
class WriteRun:
    """One agent's timed LC writes, from a history of `messages` messages on."""

    messages: int
    state: WorkingState
    writes: Samples = field(default_factory=Samples)
    fulls: Samples = field(default_factory=Samples)
    refs: list[LCRef] = field(default_factory=list)
    full: list[bool] = field(default_factory=list)
    step_bytes: list[int] = field(default_factory=list)

    @property
    def task(self) -> str:
        """The agent's task."""
        return self.state.task


@dataclass(slots=True)
class Floor:
    """The floor's timings: the write alone, and with encoding the new bytes."""

    write: Samples = field(default_factory=Samples)
    with_encoding: Samples = field(default_factory=Samples)


def floor_write(client: redis.Redis, payload: bytes, n: int) -> None:
    """The floor: one MULTI/EXEC appending `payload` to a list, plus one HSET."""
    pipe = client.pipeline(transaction=True)
    pipe.rpush("bench:{floor}:history", payload)
    pipe.hset("bench:{floor}:head", AGENT, str(n))
    pipe.execute()


def start_run(b: Bench, task: str, messages: int) -> WriteRun:
    """Start an agent at `messages` messages and write its state once, full (untimed)."""
    state = new_agent(b.store, task)
    fill(state, messages, b.text)
    b.store.write_lc(state, vote=True)
    return WriteRun(messages, state)


def write_step(b: Bench, run: WriteRun, floor: Floor | None = None) -> None:
    """Take one step (in a superstep of its own, as the team runs) and time its LC write.

    With `floor`, the floor write of the step's new bytes is timed just before the LC.
    """
    store, state = b.store, run.state
    next_superstep(store, state)
    take_step(state, b.text)
    payload, encoding = clock(partial(new_bytes, state))
    run.step_bytes.append(len(payload))
    if floor is not None:
        elapsed = clock(partial(floor_write, b.client, payload, state.step))[1]
        floor.write.add(elapsed)
        floor.with_encoding.add(elapsed + encoding)
    ref, elapsed = clock(partial(store.write_lc, state, vote=True))
    full = depth(state) % store.full_every == 0
    run.writes.add(elapsed)
    if full:
        run.fulls.add(elapsed)
    run.refs.append(ref)
    run.full.append(full)


def write_phases(b: Bench) -> tuple[dict[str, Samples], Samples]:
    """Time each phase of delta LC writes at BIG messages, and the floor next to them.

    The phases mirror `CheckpointStore.write_lc`: cut the LC, make its canonical JSON,
    seal it (sha256 of its place and bytes, zstd), and run the fenced write in Redis.
    """
    store, codec = b.store, b.store.codec
    state = start_run(b, "phases", BIG).state
    phases = {name: Samples() for name in ("cut_lc", "canonical_bytes", "seal", "hot.write_lc")}
    total, floor = Samples(), Samples()
    gc.collect()
    for _ in range(PHASE_STEPS):
        next_superstep(store, state)
        take_step(state, b.text)
        floor.add(clock(partial(floor_write, b.client, new_bytes(state), state.step))[1])
        gc.disable()
        t0 = now_ns()
        lc = cut_lc(state, Level.STEP, store.full_every)
        t1 = now_ns()
        payload = canonical_bytes(lc)
        t2 = now_ns()
        sealed = codec.seal(payload, Place.lc(lc.task, lc.agent, lc.id))
        t3 = now_ns()
        store.hot.write_lc(LCEntry(lc, sealed), vote=True)
        t4 = now_ns()
        gc.enable()
        lc.checksum = sealed.checksum
        state.base = base_after_write(lc, state)
        if lc.full:
            continue
        for name, ns in zip(phases, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            phases[name].add(ns)
        total.add(t4 - t0)
    phases["total"] = total
    return phases, floor


def lc_writes(b: Bench) -> WriteRun:
    """Measurement 1: LC write latency at each history size against the floor.

    The sizes take turns step by step, and the floor runs next to the largest, so every
    row is measured under the same conditions (this machine's noise moves them together).
    """
    runs = [start_run(b, f"lc{n}", n) for n in SIZES]
    floor = Floor()
    gc.collect()
    for _ in range(STEPS):
        for run in runs:
            write_step(b, run, floor if run.messages == BIG else None)
    base = floor.write.p50
    rows: list[tuple[str, Samples, Samples | None]] = [
        ("floor: MULTI/EXEC RPUSH new bytes + HSET", floor.write, None),
        ("  (floor + encoding the new bytes, for reference)", floor.with_encoding, None),
    ]
    rows += [
        (f"write_lc, {r.messages:,} msgs (grows to {r.messages + STEPS:,})", r.writes, r.fulls)
        for r in runs
    ]
    table(
        f"1. LC write, one new message per step ({STEPS} writes per row, sizes interleaved; "
        f"every {FULL_EVERY}th write is full; floor timed next to the {BIG:,}-msg writes)",
        ["operation", "p50", "p99", "mean of full", "p50 vs floor"],
        [
            [
                name,
                duration(s.p50),
                duration(s.p99),
                "-" if fulls is None else duration(fulls.mean),
                ratio(s.p50, base),
            ]
            for name, s, fulls in rows
        ],
    )
    small, big = runs[0], runs[-1]
    b.targets.append(
        Target(f"LC write p50 @{BIG:,} msgs / floor p50", big.writes.p50 / base, 2.0).report()
    )
    b.targets.append(
        Target(
            f"LC write p50 @{BIG:,} msgs / p50 @{small.messages} msgs",
            big.writes.p50 / small.writes.p50,
            1.3,
        ).report()
    )
    phases, phase_floor = write_phases(b)
    whole = phases["total"].p50
    table(
        f"1b. Where a delta LC write goes at {BIG:,} msgs "
        f"({len(phases['total'])} delta writes, phases of CheckpointStore.write_lc)",
        ["phase", "p50", "p99", "share of total p50"],
        [
            [name, duration(s.p50), duration(s.p99), f"{100 * s.p50 / whole:.0f}%"]
            for name, s in phases.items()
        ],
    )
    print(
        f"(floor timed next to these writes: p50 {duration(phase_floor.p50)}; "
        f"hot.write_lc p50 is {ratio(phases['hot.write_lc'].p50, phase_floor.p50)} of it)"
    )
    return big


# 2. bytes per step -----------------------------------------------------------------------
def bytes_per_step(b: Bench, run: WriteRun) -> None:
    """Measurement 2: the bytes each LC write stored, read back from Redis."""
    client, codec = b.client, b.store.codec
    sealed: list[int] = []
    plain: list[int] = []
    memory: list[int] = []
    for ref in run.refs:
        key = keys.lc(run.task, ref.id)
        data = cast(bytes, client.hget(key, "data"))
        sealed.append(len(data))
        plain.append(len(codec.open(data, Place.lc(run.task, AGENT, ref.id))))
        memory.append(int(cast(int, client.memory_usage(key, samples=0))))
    deltas = [i for i, full in enumerate(run.full) if not full]
    fulls = [i for i, full in enumerate(run.full) if full]

    def mean(values: list[int], where: list[int]) -> float:
        return statistics.fmean(values[i] for i in where)

    new = statistics.fmean(run.step_bytes)
    delta_sealed = mean(sealed, deltas)
    amortized = statistics.fmean(sealed)
    full_plain, full_sealed = mean(plain, fulls), mean(sealed, fulls)
    rows = [
        ("new message + trace record, canonical JSON (baseline)", new),
        ("delta LC, canonical JSON before sealing", mean(plain, deltas)),
        ("delta LC, sealed as stored", delta_sealed),
        ("full LC, sealed as stored", full_sealed),
        (f"amortized over all {len(sealed)} writes (1 full in {FULL_EVERY})", amortized),
        ("Redis MEMORY USAGE of a delta LC key (whole hash)", mean(memory, deltas)),
    ]
    table(
        f"2. Bytes stored per step at {BIG:,} msgs (the LC hash's data field read back "
        f"from Redis; {len(deltas)} deltas, {len(fulls)} full)",
        ["record", "mean", "vs new bytes"],
        [[name, size(value), ratio(value, new)] for name, value in rows],
    )
    print(
        f"(a full LC's canonical JSON: {size(full_plain)}, sealed {size(full_sealed)}: "
        f"zstd-3 shrinks it {full_plain / full_sealed:.1f}:1, helped by JSON keys repeating)"
    )
    b.targets.append(
        Target(
            f"delta LC bytes @{BIG:,} msgs / new canonical JSON", delta_sealed / new, 2.0
        ).report()
    )
    b.targets.append(
        Target(
            "amortized LC bytes per step (incl. fulls) / new bytes", amortized / new, None
        ).report()
    )


# 3. reads ------------------------------------------------------------------------------
def reads(b: Bench) -> None:
    """Measurement 3: rebuilding an agent's state at BIG messages, hot and cold.

    The cold chain is a second one of the same shape, archived and then deleted from
    Redis, so that hot, cold and the baseline can take turns.
    """
    store, client, codec = b.store, b.client, b.store.codec
    hot_ref = agent_with_chain(store, "read", AGENT, b.text)
    cold_ref = agent_with_chain(store, "readcold", AGENT, b.text)
    state = store.read_state("read", AGENT, hot_ref.id)
    if len(state.messages) != BIG:
        raise RuntimeError("read_state did not rebuild the history")
    chain = store.load_chain("read", AGENT, hot_ref.id, hot_ref.checksum)
    cold_chain = store.load_chain("readcold", AGENT, cold_ref.id, cold_ref.checksum)
    for loaded in reversed(cold_chain):
        store.cold.put_lc("readcold", AGENT, loaded.record.id, loaded.data)
    store.hot.delete_lcs("readcold", [loaded.record.id for loaded in cold_chain])
    if store.hot.read_chain("readcold", cold_ref.id, 1):
        raise RuntimeError("the cold chain is still in Redis")
    full = codec.encode(cut_lc(dataclasses.replace(state, base=None), Level.STEP, FULL_EVERY))
    raw_key = "bench:{read}:full"
    client.set(raw_key, full.data)

    def raw() -> None:
        data = cast(bytes, client.get(raw_key))
        LocalCheckpoint.model_validate_json(codec.open(data, raw_key))

    if not full.data[4] & FLAG_ZSTD:
        raise RuntimeError("the full record is not compressed: the floor would skip zstd")
    decompressor = zstandard.ZstdDecompressor()

    def parse_only() -> None:
        data = cast(bytes, client.get(raw_key))
        orjson.loads(decompressor.decompress(data[HEADER_SIZE:]))

    floor, baseline, hot, cold = time_together(
        [
            parse_only,
            raw,
            partial(store.read_state, "read", AGENT, hot_ref.id),
            partial(store.read_state, "readcold", AGENT, cold_ref.id),
        ],
        READS,
        WARMUP,
    )
    chain_bytes = sum(len(loaded.data) for loaded in chain)
    rows = [
        ("floor: GET it, zstd decompress, orjson.loads (no checksum, no models)", floor, "-"),
        (f"baseline: GET 1 full record ({size(full.size)}), open, validate", baseline, "-"),
        (f"read_state hot: 1 full + {CHAIN_DELTAS} deltas ({size(chain_bytes)})", hot, "1.00x"),
        ("read_state cold: a chain like it, from the archive", cold, ratio(cold.p50, hot.p50)),
    ]
    table(
        f"3. Reading an agent's state at {BIG:,} msgs ({READS} reads each, taking turns; "
        "the archive's files are in the page cache)",
        ["operation", "p50", "p99", "p50 vs floor", "p50 vs baseline", "p50 vs hot"],
        [
            [
                name,
                duration(s.p50),
                duration(s.p99),
                ratio(s.p50, floor.p50),
                ratio(s.p50, baseline.p50),
                vs_hot,
            ]
            for name, s, vs_hot in rows
        ],
    )
    b.targets.append(
        Target(f"read_state hot p50 @{BIG:,} msgs / raw GET", hot.p50 / baseline.p50, 2.0).report()
    )
    b.targets.append(
        Target(
            f"read_state hot p50 @{BIG:,} msgs / GET + zstd + orjson.loads",
            hot.p50 / floor.p50,
            2.0,
        ).report()
    )
    b.targets.append(Target("read_state cold p50 / hot p50", cold.p50 / hot.p50, None).report())


# 4. archiving ----------------------------------------------------------------------------
def committed_gc(b: Bench, task: str) -> int:
    """Run ARCHIVE_AGENTS agents to BIG messages, one GC per superstep; return the last GC.

    Each agent writes a full LC in superstep 1 and a delta in each of the next
    CHAIN_DELTAS supersteps, so the last GC's members have chains of 1 + CHAIN_DELTAS LCs.
    Every GC names the same workspace of WORKSPACE_FILES files.
    """
    store, text = b.store, b.text
    files = {}
    for j in range(WORKSPACE_FILES):
        content = text.words(text.rng.randint(FILE_BYTES * 3 // 4, FILE_BYTES * 5 // 4))
        files[f"src/pkg{j % 10}/module_{j}.py"] = store.put_blob(task, content.encode())
    workspace = store.put_manifest(task, WorkspaceManifest(files=files))
    states = [new_agent(store, task, f"agent{a}") for a in range(ARCHIVE_AGENTS)]
    for state in states:
        fill(state, BIG - CHAIN_DELTAS, text)
    number = 0
    for superstep in range(1, CHAIN_DELTAS + 2):
        members = {}
        for state in states:
            if superstep > 1:
                next_superstep(store, state)
                take_step(state, text)
            members[state.agent] = store.write_lc(state, vote=True)
        number += 1
        store.commit_gc(
            GlobalCheckpoint(
                task=task,
                number=number,
                superstep=superstep,
                epoch=states[0].epoch,
                members=members,
                workspace=workspace,
            )
        )
    if any(len(s.messages) != BIG or depth(s) != CHAIN_DELTAS for s in states):
        raise RuntimeError("the team was not run as intended")
    return number


def plain_writes(directory: Path, payloads: list[bytes]) -> None:
    """Write each payload to a file of its own with plain open/write/fsync/close."""
    for i, data in enumerate(payloads):
        fd = os.open(directory / f"f{i:04d}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)


def read_only(store: CheckpointStore, task: str, number: int) -> None:
    """Read and verify from Redis what `archive_gc` archives for a GC, writing nothing."""
    found, _ = store.load_gc(task, number)
    for agent, ref in found.members.items():
        store.load_chain(task, agent, ref.id, ref.checksum)
    manifest = store.read_manifest(task, found.workspace)
    for sha in [*sorted(set(manifest.files.values())), found.workspace]:
        data = store.hot.get_blob(task, sha)
        if data is None:
            raise RuntimeError(f"blob {sha} is not in Redis")
        store.codec.open(data, sha, expect_digest=sha)


def archiving(b: Bench) -> None:
    """Measurement 4: archive_gc throughput against plain write + fsync of the same files."""
    archived: list[float] = []
    plain: list[float] = []
    reading: list[float] = []
    files = written = 0
    for r in range(ARCHIVE_RUNS):
        task = f"arch{r}"
        number = committed_gc(b, task)
        cold_root = b.root / f"archive-{r}"
        archiver = CheckpointStore(b.store.hot, DiskArchive(cold_root), b.store.codec, FULL_EVERY)
        gc.collect()
        report, elapsed = clock(partial(archive_gc, archiver, task, number))
        sizes = [p.stat().st_size for p in sorted(cold_root.rglob("*")) if p.is_file()]
        if len(sizes) != report.lcs + report.blobs + 1 or sum(sizes) != report.bytes:
            raise RuntimeError(f"archive holds {len(sizes)} files, {sum(sizes)} bytes: {report}")
        files, written = len(sizes), report.bytes
        archived.append(written / elapsed * 1e3)  # bytes per ns, times 1e3: MB/s
        plain_dir = b.root / f"plain-{r}"
        plain_dir.mkdir()
        payloads = [os.urandom(n) for n in sizes]
        gc.collect()
        plain.append(written / clock(partial(plain_writes, plain_dir, payloads))[1] * 1e3)
        reading.append(written / clock(partial(read_only, b.store, task, number))[1] * 1e3)
    rows = [
        ("baseline: plain open/write/fsync/close per file", plain),
        ("archive_gc (temp file, fsync, rename, fsync dir)", archived),
        ("  read + verify the same from Redis, no writes", reading),
    ]
    base = statistics.median(plain)
    table(
        f"4. Archiving one GC: {ARCHIVE_AGENTS} agents x {BIG:,} msgs ({CHAIN_DELTAS} deltas "
        f"after a full) + {WORKSPACE_FILES} files of ~{FILE_BYTES // 1024} KiB = {files} files, "
        f"{size(written)}; {ARCHIVE_RUNS} runs; on {filesystem(b.root)}",
        ["operation", "median MB/s", "min..max MB/s", "median time", "MB/s vs plain"],
        [
            [
                name,
                f"{statistics.median(rates):.1f}",
                f"{min(rates):.1f}..{max(rates):.1f}",
                duration(written / statistics.median(rates) * 1e3),
                ratio(statistics.median(rates), base),
            ]
            for name, rates in rows
        ],
    )
    fsyncs, directories = count_fsyncs(b, f"arch{ARCHIVE_RUNS - 1}", number)
    print(
        f"(one more archive_gc of the same GC, untimed: {fsyncs} fsync calls and {directories} "
        f"new directories for {files} files; the baseline makes {files} fsync calls)"
    )
    b.targets.append(
        Target(
            "archive_gc MB/s / plain write+fsync MB/s", statistics.median(archived) / base, None
        ).report()
    )


def count_fsyncs(b: Bench, task: str, number: int) -> tuple[int, int]:
    """Archive GC `number` into a fresh directory; return its fsync calls and new dirs."""
    cold_root = b.root / "archive-counted"
    archiver = CheckpointStore(b.store.hot, DiskArchive(cold_root), b.store.codec, FULL_EVERY)
    with mock.patch("os.fsync", wraps=os.fsync) as fsync:
        archive_gc(archiver, task, number)
    return fsync.call_count, sum(1 for p in cold_root.rglob("*") if p.is_dir())


# 5. command packer -----------------------------------------------------------------------
def packer_name(client: redis.Redis) -> str:
    """The class that packs a client's commands."""
    pool = client.connection_pool
    connection = pool.get_connection()
    try:
        return type(getattr(connection, "_command_packer", None)).__name__
    finally:
        pool.release(connection)


def packers(b: Bench) -> None:
    """Measurement 5: a 512 KB SET packed by hiredis against our Python packer."""
    plain_client = redis.Redis(host="127.0.0.1", port=b.server.port)
    try:
        value = os.urandom(SET_BYTES)
        hiredis, python = time_together(
            [
                partial(plain_client.set, "bench:{packer}", value),
                partial(b.client.set, "bench:{packer}", value),
            ],
            SETS,
            WARMUP,
        )
        rows = [
            (f"redis.Redis() ({packer_name(plain_client)})", hiredis),
            (f"storage connect() ({packer_name(b.client)})", python),
        ]
    finally:
        plain_client.close()
    table(
        f"5. SET of {SET_BYTES // 1024} KiB by command packer ({SETS} each, alternating)",
        ["client", "p50", "p99", "p50 vs hiredis"],
        [[name, duration(s.p50), duration(s.p99), ratio(s.p50, hiredis.p50)] for name, s in rows],
    )
    b.targets.append(
        Target(
            f"connect() {SET_BYTES // 1024} KiB SET p50 / hiredis packer p50",
            python.p50 / hiredis.p50,
            1.0,
        ).report()
    )


# the part ------------------------------------------------------------------------------
def filesystem(path: Path) -> str:
    """Name the filesystem type and mount point holding `path` (Linux), or "unknown"."""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return "unknown filesystem"
    target = str(path.resolve())
    best, kind = "", "unknown"
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1]
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) > len(best):
            best, kind = point, fields[2]
    return f"{kind} ({best})"


def setup(b: Bench) -> None:
    """Print what the part runs on, and warm the code paths up."""
    info = cast(dict[str, object], b.client.info("server"))
    probe = new_agent(b.store, "probe")
    take_step(probe, b.text)
    message, trace = (len(canonical_bytes(r)) for r in (probe.messages[-1], probe.trace[-1]))
    print("\n== storage ==")
    print(
        f"redis-server {info.get('redis_version')} (private, port {b.server.port}, no AOF); "
        f"archive and temp files on {filesystem(b.root)}"
    )
    print(
        f"CheckpointStore: Codec() unsigned, zstd above {DEFAULT_COMPRESS_ABOVE // 1024} KiB; "
        f"full_every={FULL_EVERY}. "
        f"A step adds a {message} B message and a {trace} B trace record (canonical JSON)."
    )
    warm = start_run(b, "warmup", SIZES[1])
    for _ in range(2 * FULL_EVERY):
        write_step(b, warm, Floor())


def run() -> list[Target]:
    """Run every storage measurement on a private Redis and archive; return the targets."""
    with contextlib.ExitStack() as stack:
        root, server, client, store = private_store(stack, FULL_EVERY)
        b = Bench(root, server, client, store, Text(seed=2026))
        setup(b)
        big = lc_writes(b)
        bytes_per_step(b, big)
        reads(b)
        archiving(b)
        packers(b)
        return b.targets
