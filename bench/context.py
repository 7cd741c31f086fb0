"""The context benchmark: a long run stays under its budget, and ends as it would have.

One `anthropic:` agent codes for STEPS steps against a local server speaking the Messages
API, which plays the model: each turn reads the file the turn before wrote and writes the
next (FILE_BYTES each), so the history grows by a few kilobytes a step, as a real coding
agent's does. The server counts each request's tokens as the real API would bill them
(a token per 4 bytes of its JSON), and answers a compaction's summary request with a
summary. The same run is made twice, through the real step (`run_step` on a private
redis-server, a barrier committed after each superstep):

- with `context: {strategy: off}`: every request carries the whole history;
- with `context: {max_tokens: BUDGET, keep_last: 4}`: the oldest turns are summarized.

Targets: the largest request of the compacted run against its budget (<= 1x), and the
files the two runs end with (none may differ). Reported: the largest request and the
input tokens billed by each run.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast

import orjson
from pydantic import JsonValue

from bench.report import Target, pick, private_store, quick, table
from cairn.agents.barrier import build_gc, runnable
from cairn.agents.spec import AgentSpec, StepPolicy, TaskRecord
from cairn.agents.step import run_step
from cairn.agents.task import start_task
from cairn.storage.keys import SPEC_DOC
from cairn.storage.store import CheckpointStore

STEPS = pick(200, 30)
BUDGET = pick(20_000, 6_000)  # tokens a compacted request may hold
FILE_BYTES = 1_500
SUMMARY = "Files f0 to the latest are written; each holds its part of the program."


@dataclass
class Played:
    """What the server saw: each turn request's billed tokens, and summaries made."""

    turns: list[int] = field(default_factory=list)
    summaries: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class ModelServer(ThreadingHTTPServer):
    """Plays the coding agent over the Messages API on a free port of 127.0.0.1."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.played = Played()

    @property
    def url(self) -> str:
        """The `base_url` an `anthropic:` agent is given."""
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        server = cast(ModelServer, self.server)
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        body = orjson.dumps(_answer(orjson.loads(raw), len(raw) // 4, server.played))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Keep the bench's output to its tables."""


def _answer(request: dict[str, Any], tokens: int, played: Played) -> dict[str, JsonValue]:
    """The Messages API reply to `request`, billed at `tokens` input tokens."""
    if "You compact the working memory" in str(request.get("system", "")):
        with played.lock:
            played.summaries += 1
        return _message([{"type": "text", "text": SUMMARY}], "end_turn", tokens)
    with played.lock:
        played.turns.append(tokens)
    blocks = [b for m in request["messages"] if isinstance(m["content"], list)
              for b in m["content"]]  # fmt: skip
    done = [int(b["id"].removeprefix("toolu_")) for b in blocks if b.get("type") == "tool_use"]
    turn = (max(done) + 1) // 2 if done else 0  # two calls a turn: toolu_2n, toolu_2n+1
    if turn >= STEPS:
        finish: JsonValue = {"type": "tool_use", "id": f"toolu_{2 * turn}", "name": "finish",
                  "input": {"summary": "done"}}  # fmt: skip
        return _message([finish], "tool_use", tokens)
    content = f"part {turn}: " + "def step(x):\n    return x + 1\n" * (FILE_BYTES // 32)
    calls: list[JsonValue] = [
        {"type": "text", "text": f"Turn {turn}: I read the last part and write the next."},
        {"type": "tool_use", "id": f"toolu_{2 * turn}", "name": "read_file",
         "input": {"path": f"f{max(turn - 1, 0)}.txt"}},
        {"type": "tool_use", "id": f"toolu_{2 * turn + 1}", "name": "write_file",
         "input": {"path": f"f{turn}.txt", "content": content}},
    ]  # fmt: skip
    return _message(calls, "tool_use", tokens)


def _message(content: list[JsonValue], stop: str, tokens: int) -> dict[str, JsonValue]:
    return {
        "id": "msg_bench", "type": "message", "role": "assistant", "model": "claude-bench",
        "content": content, "stop_reason": stop, "stop_sequence": None,
        "usage": {"input_tokens": tokens, "output_tokens": 200},
    }  # fmt: skip


@contextlib.contextmanager
def serving() -> Iterator[ModelServer]:
    """A `ModelServer` answering in a thread until the block ends."""
    server = ModelServer()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        thread.join()
        server.server_close()


def drive(store: CheckpointStore, task: str, cache: Path) -> dict[str, str]:
    """Run the task's supersteps to its end, as the coordinator would; its files' digests."""
    record = store.read_doc(task, SPEC_DOC, TaskRecord)
    order = [agent.name for agent in record.agents]
    for _ in range(STEPS + 5):
        gc = store.latest_gc(task)
        assert gc is not None
        agents = runnable(store, gc, order)
        if not agents:
            return dict(store.read_manifest(task, gc.workspace).files)
        superstep, epoch = gc.superstep + 1, store.hot.get_epoch(task)
        votes = {}
        for agent in agents:
            store.hot.begin_attempt(task, agent, superstep, 1)
            votes[agent] = run_step(task, agent, superstep, epoch, 1, store=store, cache=cache).lc
        barrier = build_gc(store, gc, votes, order, number=gc.number + 1, superstep=superstep,
                           epoch=epoch)  # fmt: skip
        store.prepare_gc(barrier.gc)
        store.commit_gc(barrier.gc)
    raise RuntimeError(f"context: the agent did not finish in {STEPS + 5} supersteps")


def one_run(store: CheckpointStore, root: Path, name: str, context: dict[str, JsonValue]
            ) -> tuple[Played, dict[str, str]]:  # fmt: skip
    """Run the coding agent with `context`; what the server saw, and the files it ended with."""
    with serving() as server:
        agent = AgentSpec.model_validate({
            "name": "coder", "model": "anthropic:claude-bench", "base_url": server.url,
            "tools": ["read_file", "write_file", "finish"], "context": context,
        })  # fmt: skip
        record = TaskRecord(task=name, goal="Write the program, one part a step.",
                            agents=[agent], policy=StepPolicy())  # fmt: skip
        start_task(store, record, {})
        files = drive(store, name, root / f"cache-{name}")
        return server.played, files


def run() -> list[Target]:
    """Both runs; the largest request against the budget, and the files compared."""
    with contextlib.ExitStack() as stack:
        root, _server, _client, store = private_store(stack, quiet=True)
        print(
            f"\n== context ==\none anthropic: agent, {STEPS} steps of reading and writing "
            f"{FILE_BYTES:,}-byte files against a local Messages API server; with the whole "
            f"history, then compacted to {BUDGET:,} tokens (keep_last 4)"
            + (" (quick: sizes too small to judge)" if quick() else "")
        )
        whole, whole_files = one_run(store, root, "whole", {"strategy": "off"})
        kept, kept_files = one_run(store, root, "compacted",
                                   {"max_tokens": BUDGET, "keep_last": 4})  # fmt: skip
        differ = sorted(set(whole_files.items()) ^ set(kept_files.items()))
        table(
            "Context: what each request held, as the server billed it",
            ["run", "turns", "summaries", "largest request", "input tokens billed"],
            [[label, str(len(p.turns)), str(p.summaries), f"{max(p.turns):,}",
              f"{sum(p.turns):,}"]
             for label, p in (("whole history", whole), ("compacted", kept))],
        )  # fmt: skip
        print(f"files: {len(kept_files)} in the compacted run, {len(differ)} differing")
        return [
            Target("context: largest compacted request / budget", max(kept.turns) / BUDGET,
                   1.0).report(),
            Target("context: files that differ from the whole-history run", float(len(differ)),
                   0.0, "files").report(),
            Target("context: input tokens billed, compacted / whole", sum(kept.turns)
                   / sum(whole.turns), None).report(),
        ]  # fmt: skip
