"""The cache benchmark: what Anthropic's prompt cache saves a coding agent's long session.

One `anthropic:` agent works through a scripted coding session of STEPS steps: it reads
files, rewrites them, runs commands (in the sandbox, as a worker does) and once reads
every file at once, each result a few KB, its history growing with every step. Each step
goes through the real step path: `run_step` on a private redis-server, then the
superstep's GC built and committed, as the agents harness does. The model is
`bench.cache_server`: a local Messages API that plays the session and bills each request
as Anthropic's prompt cache does (breakpoints, the 20-block lookback, writes at 1.25x the
input price, reads at 0.1x). Nothing is downloaded.

The same session runs three times in one run, each against a server with an empty cache:
with Cairn's breakpoints (the default), with none (`params: {cache_control: null}`), and
with the API's automatic caching alone (`params: {cache_control: {type: ephemeral}}`: one
breakpoint, at the end). The measure is the prompt's billed tokens, writes and reads at
their rates, against the run with none.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import redis
from pydantic import JsonValue

from bench.cache_server import Bill, ModelServer, Play, Reply
from bench.report import Target, pick, private_store, ratio, table
from bench.storage import Text
from cairn.agents.barrier import build_gc, runnable
from cairn.agents.spec import AgentSpec, TaskRecord
from cairn.agents.step import run_step
from cairn.agents.task import start_task
from cairn.coordinator.spend import read_spend
from cairn.storage.records import Usage
from cairn.storage.store import CheckpointStore

AGENT = "coder"
MODEL = "anthropic:claude-bench"
STEPS = pick(60, 15)  # model turns of the session, the last one its answer
WIDE = pick(30, 8)  # the step that reads every file at once: past the 20-block lookback
FILES = 12  # src/module_0.py ... src/module_11.py
FILE_CHARS = 3000  # of a file, as written at the start and by each rewrite
SAY_CHARS = 300  # of what the model says at each turn
SYSTEM_CHARS = 6000  # of the system prompt
LIMIT = 0.3  # billed prompt tokens with Cairn's breakpoints / with none
SYSTEM = Text(seed=11).words(SYSTEM_CHARS)
GOAL = "Refactor the modules under src/ and keep every command's output clean."
VARIANTS: dict[str, tuple[str, dict[str, JsonValue]]] = {
    "none": ("no breakpoints (params cache_control: null)", {"cache_control": None}),
    "cairn": ("Cairn's breakpoints (the default)", {}),
    "auto": (
        "the API's automatic caching alone (params cache_control: {type: ephemeral})",
        {"cache_control": {"type": "ephemeral"}},
    ),
}


def session(text: Text) -> list[Reply]:
    """The model's STEPS turns: read, rewrite, run a command, in turn; once, read them all."""
    replies = []
    for step in range(1, STEPS + 1):
        say = {"type": "text", "text": text.words(SAY_CHARS)}
        module = f"src/module_{step // 3 % FILES}.py"
        following = f"src/module_{(step // 3 + 1) % FILES}.py"
        if step == STEPS:
            replies.append(Reply([say]))
            continue
        if step == WIDE:
            calls = [("read_file", {"path": f"src/module_{k}.py"}) for k in range(FILES)]
        elif step % 3 == 1:
            calls = [("read_file", {"path": module})]
        elif step % 3 == 2:
            calls = [("write_file", {"path": module, "content": text.words(FILE_CHARS)})]
        else:
            calls = [("run_command", {"command": f"cat {module} {following}"})]
        uses = [{"type": "tool_use", "id": f"toolu_{step:03d}_{index}", "name": name, "input": args}
                for index, (name, args) in enumerate(calls)]  # fmt: skip
        replies.append(Reply([say, *uses], "tool_use"))
    return replies


def play_for(replies: list[Reply]) -> Play:
    """A `play` answering a request with n assistant turns in it with `replies[n]`."""

    def play(body: Mapping[str, Any]) -> Reply:
        answered: int = sum(m["role"] == "assistant" for m in body["messages"])
        return replies[answered]

    return play


@dataclass(frozen=True, slots=True)
class Run:
    """One session: what the server billed for each request, what Cairn counted."""

    bills: list[Bill]
    counted: Usage  # the agent's spend counters at the end
    results: list[tuple[int, bool]]  # each tool result in the last request: bytes, failed

    def total(self) -> Bill:
        """The bills of every request together."""
        return Bill(
            sum(b.input_tokens for b in self.bills),
            sum(b.cache_creation_input_tokens for b in self.bills),
            sum(b.cache_read_input_tokens for b in self.bills),
            sum(b.output_tokens for b in self.bills),
        )


def drive(store: CheckpointStore, task: str, cache: Path) -> None:
    """Run supersteps of `task` (one agent) until it halts, each GC committed."""
    for _ in range(STEPS + 1):
        gc = store.latest_gc(task)
        assert gc is not None
        if not runnable(store, gc, [AGENT]):
            return
        superstep, epoch = gc.superstep + 1, store.hot.get_epoch(task)
        store.hot.begin_attempt(task, AGENT, superstep, 1)
        vote = run_step(task, AGENT, superstep, epoch, 1, store=store, cache=cache).lc
        built = build_gc(store, gc, {AGENT: vote}, [AGENT], number=gc.number + 1,
                         superstep=superstep, epoch=epoch)  # fmt: skip
        store.prepare_gc(built.gc)
        store.commit_gc(built.gc)
    raise RuntimeError(f"the agent of task {task} still runs after {STEPS} supersteps")


def run_variant(
    env: tuple[Path, redis.Redis, CheckpointStore],
    name: str,
    replies: list[Reply],
    files: dict[str, bytes],
) -> Run:
    """The session with VARIANTS[name]'s params, against a server with an empty cache."""
    root, client, store = env
    with ModelServer(play_for(replies)) as server:
        agent = AgentSpec(name=AGENT, model=MODEL, base_url=server.url, system=SYSTEM,
                          params=VARIANTS[name][1])  # fmt: skip
        task = f"cache-{name}"
        start_task(store, TaskRecord(task=task, goal=GOAL, agents=[agent]), files)
        drive(store, task, root / name)
    if len(server.bills) != STEPS:
        raise RuntimeError(f"{name}: {len(server.bills)} model calls, not {STEPS}")
    last = orjson.loads(server.received[-1])["messages"]
    blocks = [block for turn in last for block in turn["content"]]
    results = [(len(orjson.dumps(block.get("content"))), bool(block.get("is_error")))
               for block in blocks if block["type"] == "tool_result"]  # fmt: skip
    return Run(server.bills, read_spend(client, task)[0][AGENT], results)


def run() -> list[Target]:
    """Run the session with each variant; return the target."""
    with contextlib.ExitStack() as stack:
        root, server, client, store = private_store(stack, quiet=True)
        print("\n== cache ==")
        print(
            f"redis-server private (port {server.port}); one anthropic: agent, {STEPS} steps "
            f"through run_step, its model a local server billing as Anthropic's prompt cache "
            "(writes 1.25x, reads 0.1x, tokens = UTF-8 bytes / 4)"
        )
        text = Text(seed=2029)
        files = {f"src/module_{k}.py": text.words(FILE_CHARS).encode() for k in range(FILES)}
        replies = session(text)
        env = (root, client, store)
        runs = {name: run_variant(env, name, replies, files) for name in VARIANTS}
    return report(runs)


def report(runs: dict[str, Run]) -> list[Target]:
    """Print the tables and return the targets."""
    none = runs["none"].total()
    rows = []
    for name, run_ in runs.items():
        total = run_.total()
        rows.append([VARIANTS[name][0], f"{total.prompt:,}", f"{total.input_tokens:,}",
                     f"{total.cache_creation_input_tokens:,}",
                     f"{total.cache_read_input_tokens:,}", f"{total.billed:,.0f}",
                     ratio(total.billed, none.billed)])  # fmt: skip
    table(
        f"Prompt caching: one {STEPS}-step coding agent, its prompt as billed",
        ["variant", "prompt", "input 1x", "writes 1.25x", "reads 0.1x", "billed", "vs none"],
        rows,
    )
    around = range(max(1, WIDE - 1), min(STEPS, WIDE + 2) + 1)
    table(
        f"Around step {WIDE}, which reads all {FILES} files at once ({2 * FILES + 1} blocks): "
        "tokens read from the cache",
        ["step", "prompt", *(name for name in runs if name != "none")],
        [
            [str(step), f"{runs['none'].bills[step - 1].prompt:,}",
             *(f"{r.bills[step - 1].cache_read_input_tokens:,}"
               for name, r in runs.items() if name != "none")]
            for step in around
        ],
    )  # fmt: skip
    cairn = runs["cairn"]
    billed = cairn.total()
    sizes = [size for size, _ in cairn.results]
    failed = sum(error for _, error in cairn.results)
    print(
        f"(the last request's prompt: {cairn.bills[-1].prompt:,} tokens, {len(sizes)} tool "
        f"results of {min(sizes):,} to {max(sizes):,} bytes, {failed} of them errors. Cairn's "
        f"spend counters for the default run: prompt {cairn.counted.prompt_tokens:,}, cached "
        f"{cairn.counted.cached_tokens:,}; the server billed {billed.prompt:,} and read "
        f"{billed.cache_read_input_tokens:,})"
    )
    if (cairn.counted.prompt_tokens, cairn.counted.cached_tokens) != (
        billed.prompt,
        billed.cache_read_input_tokens,
    ):
        raise RuntimeError("Cairn's spend counters disagree with what the server billed")
    return [
        Target(f"billed prompt tokens, {STEPS} steps: Cairn's breakpoints / none",
               billed.billed / none.billed, LIMIT).report(),
        Target(f"billed prompt tokens, {STEPS} steps: the API's automatic caching / none",
               runs["auto"].total().billed / none.billed, None).report(),
    ]  # fmt: skip
