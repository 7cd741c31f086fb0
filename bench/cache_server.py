"""A local Messages API server that plays a model and bills like Anthropic's prompt cache.

The cache part of the benchmark (`bench.cache`) and its tests send an `anthropic:` agent's
requests here. `PromptCache` bills each request as Anthropic documents its prompt cache:
the request is a sequence of blocks, tools then system then messages' content blocks; a
block with `cache_control` is a breakpoint (at most 4; a top-level `cache_control` makes
the last block one); the prefix up to a breakpoint is written to the cache, billed at
1.25x input, when it is at least `min_tokens` long; a breakpoint reads the longest prefix
already in the cache that ends at it or up to 19 blocks before it (the 20-block lookback),
billed at 0.1x; what lies past the last breakpoint is input at 1x. A prefix is one
exact sequence of blocks (with the model), its blocks as sent but for `cache_control`, so
a key in another order is another prefix, as it is to the API. Tokens are estimated as
UTF-8 bytes / 4. Entries never expire: a run lasts seconds, the API keeps one 5 minutes.

`ModelServer` answers every POST with what its `play` function makes of the request (the
model's content blocks and stop reason) and the usage its cache bills, in the Messages
API's shape; a request with more than 4 breakpoints gets the API's 400.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

import orjson

MIN_CACHED_TOKENS = 1024  # the shortest prefix Anthropic caches (Sonnet; Opus 4.1 and older)
LOOKBACK = 20  # block boundaries a breakpoint checks for an entry: its own and 19 before
MAX_BREAKPOINTS = 4
WRITE_RATE, READ_RATE = 1.25, 0.1  # of the input price: a cache write, a cache read
MAX_BODY_BYTES = 64 * 1024 * 1024

Block = dict[str, Any]


class BadRequest(ValueError):
    """Raised for a request the API would refuse with a 400."""


@dataclass(frozen=True, slots=True)
class Bill:
    """What one request cost, in tokens, as Anthropic's `usage` reports them."""

    input_tokens: int  # past the last breakpoint, or all of it without one: 1x
    cache_creation_input_tokens: int  # written to the cache: 1.25x
    cache_read_input_tokens: int  # read from the cache: 0.1x
    output_tokens: int = 0

    @property
    def prompt(self) -> int:
        """Every token of the prompt, however billed."""
        return self.input_tokens + self.cache_creation_input_tokens + self.cache_read_input_tokens

    @property
    def billed(self) -> float:
        """The prompt's price in input tokens: writes at 1.25x, reads at 0.1x, the rest 1x."""
        return (
            self.input_tokens
            + WRITE_RATE * self.cache_creation_input_tokens
            + READ_RATE * self.cache_read_input_tokens
        )


def tokens(data: bytes) -> int:
    """Tokens of `data`, estimated as a quarter of its bytes, rounded up."""
    return -(-len(data) // 4)


def blocks_of(body: Mapping[str, Any]) -> Iterator[tuple[bytes, bytes, bool]]:
    """Each block of a request in the cache's order: where it is, its bytes, if a breakpoint.

    Where: a tool, the system prompt, or a message of a role (its first block apart), so
    that a block moved across a message's boundary starts another prefix. Its bytes: the
    block as sent without its `cache_control`.
    """
    for tool in body.get("tools") or []:
        yield _block(b"tool", tool)
    system = body.get("system")
    for block in [{"type": "text", "text": system}] if isinstance(system, str) else system or []:
        yield _block(b"system", block)
    for message in body["messages"]:
        content = message["content"]
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        for index, block in enumerate(blocks):
            yield _block(f"{message['role']}{'' if index else ' starts'}".encode(), block)


def _block(where: bytes, block: Block) -> tuple[bytes, bytes, bool]:
    plain = {key: value for key, value in block.items() if key != "cache_control"}
    return where, orjson.dumps(plain), block.get("cache_control") is not None


class PromptCache:
    """Anthropic's prompt cache as it bills, shared by every request it is asked to bill."""

    def __init__(self, min_tokens: int = MIN_CACHED_TOKENS) -> None:
        self.min_tokens = min_tokens
        self._entries: set[bytes] = set()
        self._lock = threading.Lock()

    def bill(self, body: Mapping[str, Any]) -> Bill:
        """Bill the prompt of `body`, reading and writing the cache; raise `BadRequest`."""
        prefixes: list[bytes] = []
        sizes: list[int] = []  # tokens up to and including each block
        points: list[int] = []  # the breakpoints' blocks
        running = hashlib.sha256(str(body.get("model")).encode())
        total = 0
        for index, (where, data, marked) in enumerate(blocks_of(body)):
            running.update(where + b"\0" + len(data).to_bytes(8, "big") + data)
            prefixes.append(running.digest())
            total += tokens(data)
            sizes.append(total)
            if marked:
                points.append(index)
        automatic = len(prefixes) - 1  # a top-level cache_control marks the last block
        if body.get("cache_control") is not None and automatic >= 0 and automatic not in points:
            points.append(automatic)
        if len(points) > MAX_BREAKPOINTS:  # the API counts the automatic one too
            found = len(points)
            raise BadRequest(f"A maximum of 4 blocks with cache_control may be provided. "
                             f"Found {found}.")  # fmt: skip
        with self._lock:
            read_at = max((self._hit(prefixes, point) for point in points), default=-1)
            for point in points:
                if sizes[point] >= self.min_tokens:
                    self._entries.add(prefixes[point])
        read = sizes[read_at] if read_at >= 0 else 0
        last = max(points, default=-1)
        written = sizes[last] - read if last > read_at and sizes[last] >= self.min_tokens else 0
        return Bill(total - read - written, written, read)

    def _hit(self, prefixes: list[bytes], point: int) -> int:
        """The block the longest cached prefix within the lookback of `point` ends at, or -1."""
        for index in range(point, max(-1, point - LOOKBACK), -1):
            if prefixes[index] in self._entries:
                return index
        return -1


@dataclass(frozen=True, slots=True)
class Reply:
    """What the played model answers: its content blocks and why it stopped."""

    content: list[Block]
    stop_reason: str = "end_turn"


Play = Callable[[Mapping[str, Any]], Reply]


class ModelServer(ThreadingHTTPServer):
    """Answers each POST with `play`'s reply and the usage `cache` bills; keeps every bill.

    `received` holds each request's body as its bytes, in order.
    """

    daemon_threads = False  # server_close() joins the handlers: a clean teardown

    def __init__(self, play: Play, cache: PromptCache | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.play = play
        self.cache = cache or PromptCache()
        self.bills: list[Bill] = []
        self.received: list[bytes] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05})

    @property
    def url(self) -> str:
        """The `base_url` an `anthropic:` agent is given."""
        return f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self) -> ModelServer:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.shutdown()
        self._thread.join()
        self.server_close()

    def answer(self, raw: bytes) -> tuple[int, bytes]:
        """The status and body answering the request `raw`."""
        with self._lock:
            self.received.append(raw)
        try:
            body = orjson.loads(raw)
            bill = self.cache.bill(body)
            reply = self.play(body)
        except (BadRequest, ValueError, LookupError, TypeError) as error:
            detail = {"type": "invalid_request_error", "message": str(error)}
            return 400, orjson.dumps({"type": "error", "error": detail})
        output = sum(tokens(orjson.dumps(block)) for block in reply.content)
        bill = Bill(bill.input_tokens, bill.cache_creation_input_tokens,
                    bill.cache_read_input_tokens, output)  # fmt: skip
        with self._lock:
            self.bills.append(bill)
            number = len(self.bills)
        message = {
            "id": f"msg_{number:06d}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model"),
            "content": reply.content,
            "stop_reason": reply.stop_reason,
            "stop_sequence": None,
            "usage": {
                "input_tokens": bill.input_tokens,
                "output_tokens": output,
                "cache_creation_input_tokens": bill.cache_creation_input_tokens,
                "cache_read_input_tokens": bill.cache_read_input_tokens,
            },
        }
        return 200, orjson.dumps(message)


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        server = cast(ModelServer, self.server)
        length = int(self.headers.get("Content-Length", "0"))
        if not 0 <= length <= MAX_BODY_BYTES:
            status, answer = 413, b'{"type":"error","error":{"type":"request_too_large"}}'
        else:
            status, answer = server.answer(self.rfile.read(length))
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: object) -> None:
        """Keep the benchmark's output quiet."""
