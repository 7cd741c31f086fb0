"""Time-ordered identifiers (UUIDv7, RFC 9562) and the names people read."""

from __future__ import annotations

import os
import threading
import time
import uuid

_lock = threading.Lock()
_last_ms = 0
_counter = 0
_COUNTER_MAX = 0xFFF  # rand_a is 12 bits


def new_id() -> str:
    """Return a UUIDv7 string; ids made later in one process sort after earlier ones."""
    global _last_ms, _counter  # noqa: PLW0603 - a process-wide monotonic clock is the point
    with _lock:
        now_ms = time.time_ns() // 1_000_000
        if now_ms <= _last_ms:
            # Same millisecond (or the clock stepped back): keep order with a 12-bit counter,
            # borrowing the next millisecond when it runs out, as RFC 9562 method 1 allows.
            _counter += 1
            if _counter > _COUNTER_MAX:
                _last_ms += 1
                _counter = 0
            now_ms = _last_ms
        else:
            _last_ms = now_ms
            _counter = -1  # replaced by random bits below, leaving room to count up
        entropy = int.from_bytes(os.urandom(10), "big")
        if _counter < 0:
            _counter = (entropy >> 64) & 0x3FF
        rand_b = entropy & ((1 << 62) - 1)
        value = (now_ms << 80) | (0x7 << 76) | (_counter << 64) | (0b10 << 62) | rand_b
    return str(uuid.UUID(int=value))


def record_name(task: str, superstep: int, agent: str, level: str) -> str:
    """Return the human-readable name `{task}_{superstep}_{agent}_{level}` of a checkpoint."""
    return f"{task}_{superstep}_{agent}_{level}"
