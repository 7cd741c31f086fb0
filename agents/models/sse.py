"""Server-Sent Events, as the built-in providers' streamed replies arrive in them.

`EventDecoder` turns the bytes of a `text/event-stream` body, in whatever pieces the socket
gives them, into events, as the WHATWG HTML standard's "event stream interpretation" says:
lines end in CRLF, LF or CR, a line starting with `:` is a comment, `data:` lines of one
event are joined with newlines, and a blank line dispatches the event. A provider reads
the events with a `StreamReader` of its own, which assembles the body the same request
would have had unstreamed (`cairn.agents.models.http.Endpoint.stream`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from cairn.errors import ModelError

MAX_EVENT_BYTES = 16 * 1024 * 1024  # of one event's lines: an event holds one small part
BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True, slots=True)
class Event:
    """One event: its type (`message` unless the stream named one) and its data."""

    data: str
    event: str = "message"


class StreamBroken(Exception):
    """Raised by a `StreamReader` when the stream fails before its last event.

    An `error` event (Anthropic's `overloaded_error`, an OpenAI-compatible server's
    `{"error": ...}`): `Endpoint.stream` retries it as it retries a dropped connection. It
    never leaves the endpoint, which raises `ModelError` once no retry is left.
    """


class StreamReader(Protocol):
    """What makes one provider's events into the body its unstreamed answer would have."""

    def feed(self, event: Event) -> bool:
        """Take the next event; True when it was the stream's last.

        Raises `StreamBroken` for an error the stream reports, `ModelError` (retryable)
        for an event that is not what the provider sends.
        """

    def body(self) -> bytes:
        """The JSON body the request would have had unstreamed, once `feed` said done."""


class EventDecoder:
    """Bytes of an event stream in, whole events out; holds at most one event's bytes."""

    def __init__(self, limit: int = MAX_EVENT_BYTES) -> None:
        self._limit = limit
        self._rest = b""  # a line not yet ended
        self._started = False
        self._type = ""
        self._data: list[str] = []
        self._size = 0  # bytes of the event being read

    def feed(self, chunk: bytes) -> list[Event]:
        """The events `chunk` completes, in order; raise `ModelError` if one is malformed."""
        data = self._rest + chunk
        if not self._started and len(data) >= len(BOM):
            self._started = True
            data = data.removeprefix(BOM)
        lines = data.splitlines(keepends=True)  # at b"\r\n", b"\n" and b"\r" alike
        self._rest = b""
        # A last line without its end waits for more; so does one ending in CR, whose LF
        # may come in the next chunk.
        if lines and (not lines[-1].endswith((b"\n", b"\r")) or lines[-1].endswith(b"\r")):
            self._rest = lines.pop()
        events = [event for line in lines if (event := self._line(line)) is not None]
        if self._size + len(self._rest) > self._limit:
            raise _too_big(self._limit)
        return events

    def _line(self, raw: bytes) -> Event | None:
        """Take one line; the event it dispatches, if it is the blank line ending one."""
        line = raw.rstrip(b"\r\n")
        if not line:
            event = Event("\n".join(self._data), self._type or "message") if self._data else None
            self._type, self._data, self._size = "", [], 0
            return event
        self._size += len(raw)
        if self._size > self._limit:
            raise _too_big(self._limit)
        try:
            text = line.decode()
        except UnicodeDecodeError as error:
            why = f"malformed stream: a line is not UTF-8 ({error})"
            raise ModelError(why, retryable=True) from error
        name, colon, value = text.partition(":")
        if not name and colon:
            return None  # a comment (a keep-alive)
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._type = value
        # `id` and `retry` serve a browser's reconnection: a model call is not resumed.
        return None


def _too_big(limit: int) -> ModelError:
    """The retryable error for an event past `limit` bytes (a runaway, as `check_reply` says)."""
    return ModelError(f"an event of the stream is over {limit} bytes", retryable=True)


def string(part: Mapping[str, Any], key: str) -> str:
    """The string `part[key]` of an event's JSON ("" when absent or null).

    A retryable `ModelError` when it is no string: the event is not what a provider sends.
    """
    value = part.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ModelError(f"malformed stream: {key} is {type(value).__name__}", retryable=True)
    return value
