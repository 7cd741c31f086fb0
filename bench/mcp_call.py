"""What an MCP tool call over stdio costs on top of the server's own time (agents part, 4).

A worker's `McpManager` starts `bench/mcp_server.py` (the `mcp` SDK's `MCPServer`) over
stdio. The server is the user's program; what Cairn adds is outside it: the SDK client,
the hand-off between the step's thread and the manager's loop, and the pipes. So the
server's own time is taken at its process's stdio boundary: the server notes, on the
system's monotonic clock (which this process reads too), when it read each request line
from stdin and when it had written the response line to stdout, and writes them to a side
file as it exits (`--times`). Each call's overhead is its round trip minus that call's
own server time; the target is their p50 (p99 reported).

Taking turns with it, baselines place the overhead: the manager's thread hop alone (a
coroutine that does nothing, handed to the loop and waited for), the SDK client's call
timed on the loop itself (no hop), the same JSON-RPC request written by hand to a second
server process over plain pipes (no client SDK), and a line echoed by a bare Python
process (the pipes and two process wake-ups, no MCP at all). The same server with
thread-free stdio (`--direct`) is measured alongside.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, cast

import mcp_types

from bench.report import Samples, Target, duration, pick, table, time_together
from cairn.agents.mcp.config import McpServer
from cairn.agents.mcp.manager import META_KEY, McpManager

SERVER, TOOL = "bench", "clock"
CALLS = pick(2000, 40)  # timed calls of each kind, taking turns
WARMUP = pick(100, 5)
LIMIT_MS = 2.0
ROOT = Path(__file__).resolve().parents[1]  # the server runs as `python -m bench.mcp_server`
COMMAND = [sys.executable, "-m", "bench.mcp_server"]
ECHO = (
    "import sys\nfor line in sys.stdin.buffer:\n sys.stdout.buffer.write(line)\n sys.stdout.flush()"
)

ROUND_TRIP = "McpManager.call_tool round trip (what a step pays)"
THERE = "  way there: caller to the server's read of the request line"
OWN = "  the server's own time: request line read to response line written"
BODY = "    of which the tool's body"
BACK = "  way back: response line written to the caller's return"
OVERHEAD = "round trip - the server's own time, per call (the target)"
IN_LOOP = "SDK client call_tool timed on the loop (no thread hop)"
HOP = "thread hop alone: empty coroutine to the loop and back"
RAW = "hand-written JSON-RPC over plain pipes (no client SDK)"
DIRECT = "the same, server with thread-free stdio (--direct)"
MANAGED_DIRECT = "McpManager.call_tool round trip, --direct server"
DIRECT_OWN = "  its server's own time"
DIRECT_OVERHEAD = "  round trip - the server's own time, per call"
PIPE = "a line echoed by a bare Python process (pipes only)"


class Pipe:
    """A child process spoken to in lines over its stdin and stdout."""

    def __init__(self, command: list[str]) -> None:
        self.process = subprocess.Popen(
            command, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0
        )
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.stdin: IO[bytes] = self.process.stdin
        self.stdout: IO[bytes] = self.process.stdout

    def ask(self, line: bytes) -> bytes:
        """Write `line` (ending in a newline) and return the next line read."""
        self.stdin.write(line)
        return self.stdout.readline()

    def close(self) -> None:
        """Close its stdin (it exits) and wait for it."""
        self.stdin.close()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class RawClient(Pipe):
    """`bench.mcp_server` spoken to by hand: JSON lines, no SDK on this side."""

    def __init__(self, *flags: str) -> None:
        super().__init__([*COMMAND, *flags])
        self.id = 0
        info = {"name": "cairn-bench", "version": "0"}
        params = {"protocolVersion": mcp_types.LATEST_PROTOCOL_VERSION, "capabilities": {}}
        self.request("initialize", {**params, "clientInfo": info})
        self.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')

    def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Send one request and return its response (skipping anything else the server says)."""
        self.id += 1
        line = json.dumps({"jsonrpc": "2.0", "id": self.id, "method": method, "params": params})
        reply = json.loads(self.ask(line.encode() + b"\n"))
        while reply.get("id") != self.id:
            reply = json.loads(self.stdout.readline())
        if "result" not in reply:
            raise RuntimeError(f"{method}: {reply}")
        result: dict[str, Any] = reply["result"]
        return result

    def call(self) -> str:
        """Call the tool, with an idempotency key as the manager sends it."""
        params = {"name": TOOL, "arguments": {}, "_meta": {META_KEY: f"raw-{self.id}"}}
        text: str = self.request("tools/call", params)["content"][0]["text"]
        return text


def ms(ns: float) -> str:
    """Nanoseconds as milliseconds with two decimals."""
    return f"{ns / 1e6:.2f} ms"


def server_times(path: Path) -> dict[str, tuple[int, int]]:
    """A `--times` file: each tools/call's idempotency key to (line read, line written) ns."""
    times = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if row["method"] == "tools/call" and row["key"]:
            times[row["key"]] = (row["read"], row["written"])
    return times


@dataclass(slots=True)
class Calls:
    """Calls through the manager to one server: key to (started, returned, tool's body) ns."""

    server: str
    noted: dict[str, tuple[int, int, int]] = field(default_factory=dict)

    def call(self, manager: McpManager) -> None:
        """One call, with a key of its own, timed on the monotonic clock the server reads."""
        key = f"{self.server}-{len(self.noted)}"
        started = time.monotonic_ns()
        out = manager.call_tool(self.server, TOOL, {}, key)
        done = time.monotonic_ns()
        entered, left = map(int, out.split())
        self.noted[key] = (started, done, left - entered)

    def split(self, times: dict[str, tuple[int, int]]) -> dict[str, Samples]:
        """The timed calls (not the warm-up): round trip, its parts and its overhead."""
        split = {name: Samples() for name in ("trip", "there", "own", "body", "back", "over")}
        for key, (started, done, body) in list(self.noted.items())[-CALLS:]:
            read, written = times[key]
            for name, ns in (
                ("trip", done - started),
                ("there", read - started),
                ("own", written - read),
                ("body", body),
                ("back", done - written),
                ("over", done - started - (written - read)),
            ):
                split[name].add(ns)
        return split


def run() -> list[Target]:
    """Measure the call and its baselines; print the tables; return the two targets."""
    in_loop = Samples()
    calls, direct_calls = Calls(SERVER), Calls("direct")
    with tempfile.TemporaryDirectory(prefix="cairn-mcp-bench-") as tmp:
        noted = {name: Path(tmp, f"{name}.jsonl") for name in (SERVER, "direct", "raw")}
        args = [*COMMAND[1:], "--times"]
        spec = McpServer(
            command=COMMAND[0], args=[*args, str(noted[SERVER])], cwd=str(ROOT), timeout=30
        )
        direct = spec.model_copy(update={"args": [*args, str(noted["direct"]), "--direct"]})
        with contextlib.ExitStack() as stack:
            servers = {SERVER: spec, "direct": direct}
            manager = stack.enter_context(McpManager(servers, connect_timeout=30))
            for name in servers:
                manager.list_tools(name)  # starts the server and shakes hands, untimed
            loop = manager._started()  # the manager's own loop and session, timed apart
            client = manager._sessions[SERVER].client
            raw = RawClient("--times", str(noted["raw"]))
            stack.callback(raw.close)
            raw_direct = RawClient("--direct")
            stack.callback(raw_direct.close)
            echo = Pipe([sys.executable, "-c", ECHO])
            stack.callback(echo.close)
            echo_line = json.dumps({"params": {"name": TOOL, "_meta": {META_KEY: "x" * 36}}})

            def on_loop(coro: Coroutine[Any, Any, object]) -> object:
                return asyncio.run_coroutine_threadsafe(coro, loop).result(30)

            meta = cast("mcp_types.RequestParamsMeta", {META_KEY: "in-loop"})

            async def timed_call() -> None:
                started = time.perf_counter_ns()
                await client.call_tool(TOOL, {}, meta=meta)
                in_loop.add(time.perf_counter_ns() - started)

            async def nothing() -> None:
                return None

            kinds: dict[str, Callable[[], object]] = {
                ROUND_TRIP: lambda: calls.call(manager),
                IN_LOOP: lambda: on_loop(timed_call()),
                HOP: lambda: on_loop(nothing()),
                MANAGED_DIRECT: lambda: direct_calls.call(manager),
                RAW: raw.call,
                DIRECT: raw_direct.call,
                PIPE: lambda: echo.ask(echo_line.encode() + b"\n"),
            }
            together = time_together(list(kinds.values()), CALLS, WARMUP)
            timed = dict(zip(kinds, together, strict=True))
        # the servers have exited and written their times
        split = calls.split(server_times(noted[SERVER]))
        direct_split = direct_calls.split(server_times(noted["direct"]))
        raw_own = Samples([w - r for r, w in list(server_times(noted["raw"]).values())[-CALLS:]])
    del in_loop.ns[: len(in_loop) - CALLS]  # the warm-up calls are in it too
    rows = {
        ROUND_TRIP: split["trip"],
        THERE: split["there"],
        OWN: split["own"],
        BODY: split["body"],
        BACK: split["back"],
        OVERHEAD: split["over"],
        MANAGED_DIRECT: direct_split["trip"],
        DIRECT_OWN: direct_split["own"],
        DIRECT_OVERHEAD: direct_split["over"],
        IN_LOOP: in_loop,
        HOP: timed[HOP],
        RAW: timed[RAW],
        DIRECT: timed[DIRECT],
        PIPE: timed[PIPE],
    }
    table(
        f"4. An MCP tool call over stdio ({CALLS} calls of each kind, taking turns, after "
        f"{WARMUP} untimed; server: bench/mcp_server.py on the mcp SDK's MCPServer; its own "
        "time from its stdio boundary, on the clock this process reads)",
        ["operation", "p50", "p99", "mean"],
        [[name, ms(s.p50), ms(s.p99), ms(s.mean)] for name, s in rows.items()],
    )
    overhead = split["over"]
    hop = split["trip"].p50 - in_loop.p50
    client_sdk = in_loop.p50 - timed[RAW].p50
    pipes = timed[RAW].p50 - raw_own.p50
    print(
        f"The server's own time is everything its process does for a request, the SDK's "
        f"parsing, dispatch, validation and stdio threads included: {ms(split['own'].p50)} "
        f"p50, of which the tool's body {duration(split['body'].p50)}. Where the p50 "
        f"overhead of {ms(overhead.p50)} goes (differences of p50s, for information): "
        f"Cairn's thread hand-off, lock, deadline and result rendering {ms(hop)} (the empty "
        f"hop alone {ms(timed[HOP].p50)}); the SDK client (pydantic models, JSON, anyio "
        f"streams and tasks) {ms(client_sdk)}; the pipes and two process wake-ups, with a "
        f"hand-written client (its round trip - its server's own time) {ms(pipes)} (a line "
        f"echoed by a bare Python process: {ms(timed[PIPE].p50)}). A --direct server (no "
        f"stdio threads): its own time {ms(direct_split['own'].p50)}, the overhead "
        f"{ms(direct_split['over'].p50)}"
    )
    return [
        Target(
            "MCP stdio call p50 (round trip - server's own time, per call) (ms)",
            overhead.p50 / 1e6,
            LIMIT_MS,
            "ms",
        ),
        Target(
            "MCP stdio call p99 (round trip - server's own time, per call) (ms)",
            overhead.p99 / 1e6,
            None,
            "ms",
        ),
    ]
