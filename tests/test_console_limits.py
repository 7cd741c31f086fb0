"""What a request may send the console: a body over the limit gets a 413, not a reset.

A real `cairn console` process (uvicorn) on a free loopback port over the tests' Redis; the
requests are written on raw sockets, so the test sees exactly what a client would: the
answer, then the server's clean close (end of stream), or a reset.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cairn.testing.redis_server import RedisServer, free_port
from tests.cli_harness import spawn, stop
from tests.cluster import ROOT

LIMIT = 64 * 1024  # cairn.console.limits.MAX_BODY_BYTES, as docs/console.md states it
BIG = 8 * 1024 * 1024
CHUNK = 64 * 1024
WAIT_S = 30.0
CSRF_MARKER = b'name="cairn-csrf" content="'


@dataclass
class Console:
    """A running console: its port and the CSRF secret its pages embed."""

    port: int
    csrf: str


@pytest.fixture
def console(redis_server: RedisServer, tmp_path: Path) -> Iterator[Console]:
    """`cairn console` on a free loopback port, over the session's Redis."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("CAIRN_")}
    env |= {
        "PYTHONPATH": str(ROOT),
        "CAIRN_REDIS_URL": redis_server.url,
        "CAIRN_STATE_DIR": str(tmp_path / "state"),
        "CAIRN_ARCHIVE_DIR": str(tmp_path / "archive"),
    }
    port = free_port()
    log = tmp_path / "console.log"
    process = spawn(["console", "--port", str(port)], env, log)
    try:
        page = _first_page(process, port, log)
        start = page.index(CSRF_MARKER) + len(CSRF_MARKER)
        yield Console(port, page[start : page.index(b'"', start)].decode())
    finally:
        stop(process)


def _first_page(process: subprocess.Popen[bytes], port: int, log: Path) -> bytes:
    """The console's home page, once it answers."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the console exited: {log.read_text()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as answer:
                return bytes(answer.read())
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"the console never answered: {log.read_text()}")


def post(console: Console, body: bytes, *, chunked: bool) -> bytes:
    """POST `body` to an action on a raw socket, all of it before reading; read to the end.

    Returns every byte the console sent until it closed the connection. A reset (while
    sending or reading) raises `ConnectionResetError` or `BrokenPipeError`.
    """
    length = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {len(body)}"
    head = (
        "POST /api/tasks/no-such-task/pause HTTP/1.1\r\n"
        f"Host: 127.0.0.1:{console.port}\r\n"
        "Content-Type: application/json\r\n"
        f"X-Cairn-CSRF: {console.csrf}\r\n"
        f"{length}\r\n"
        "Connection: close\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", console.port), timeout=WAIT_S) as sock:
        sock.sendall(head.encode())
        if chunked:
            for at in range(0, len(body), CHUNK):
                piece = body[at : at + CHUNK]
                sock.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            sock.sendall(b"0\r\n\r\n")
        else:
            sock.sendall(body)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return received


def split(answer: bytes) -> tuple[int, dict[str, str], bytes]:
    """An HTTP/1.1 answer with a Content-Length: its status, headers (lowercased) and body."""
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode().split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines)}
    return int(status_line.split()[1]), headers, body


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_an_8_mib_post_gets_a_413_in_json_and_a_clean_close(
    console: Console, chunked: bool
) -> None:
    """8 MiB to an action: a 413 with a one-line JSON error, then a clean close.

    The whole body is taken first, and the console ends the stream: no reset.
    """
    answer = post(console, b" " * BIG, chunked=chunked)
    status, headers, body = split(answer)
    assert 413 == status, answer[:300]
    assert "application/json" == headers["content-type"]
    assert "close" == headers["connection"]
    error = json.loads(body)["error"]
    assert f"over the console's limit of {LIMIT} bytes" in error
    assert len(body) < 200


def test_a_body_at_the_limit_is_read_and_one_byte_more_is_refused(console: Console) -> None:
    """A body of exactly 64 KiB reaches the action; 64 KiB and one byte is a 413.

    64 KiB of JSON whitespace is an empty action body (the task is then unknown: 404).
    """
    status, _, body = split(post(console, b" " * LIMIT, chunked=False))
    assert 404 == status, body
    assert "no-such-task" in json.loads(body)["error"]
    status, _, body = split(post(console, b" " * (LIMIT + 1), chunked=True))
    assert 413 == status, body
