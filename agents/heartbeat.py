"""The heartbeat a step keeps alive, so a coordinator sees a dead worker within seconds.

Every step has a heartbeat of its own (its key, its token, its schedule); one thread per
process beats them all when each is due, so entering and leaving one costs a step no
thread of its own. That thread runs apart from the steps: a step busy on the CPU delays
the beats by the interpreter's switch interval, not by its work.
"""

from __future__ import annotations

import heapq
import itertools
import os
import socket
import threading
import time
from types import TracebackType
from typing import Protocol

import redis

from cairn.agents.logs import get_logger

log = get_logger(__name__)


def worker_token(epoch: int, superstep: int, attempt: int) -> str:
    """Name this process's attempt of a step: `host:pid:epoch:superstep:attempt`.

    The epoch is part of it: after a restore the same (superstep, attempt) runs again
    under a new epoch, and a zombie of the old one must not pass for it.
    """
    return f"{socket.gethostname()}:{os.getpid()}:{epoch}:{superstep}:{attempt}"


class Beats(Protocol):
    """Where a heartbeat is kept: `HotStore.beat` (a step's, fenced), or a verify's."""

    def beat(self, task: str, agent: str, token: str, ttl_ms: int) -> bool:
        """Keep `agent`'s beat alive with `token` for `ttl_ms`; False once it is fenced."""
        ...


class Heartbeat:
    """While entered, beat every `interval_ms` with a TTL of three intervals.

    The first beat happens on entry (unless the caller beat already). If a beat fails (a
    Redis blip) it is tried again next interval; a coordinator seeing the key lapse treats
    the step as dead, which is the safe reading. Once a beat is fenced (another attempt
    of the step is current) it stops: this one is a zombie. No beat starts after exit, and
    exit waits for one under way.
    """

    def __init__(
        self,
        hot: Beats,
        task: str,
        agent: str,
        token: str,
        interval_ms: int,
        *,
        beat_now: bool = True,
        first_wait_ms: int | None = None,
    ) -> None:
        self._hot, self._task, self._agent, self._token = hot, task, agent, token
        self._beat_now = beat_now
        # When the caller's own first beat had a shorter TTL, renew before it lapses.
        self._first_wait_ms = min(interval_ms, first_wait_ms or interval_ms)
        self._interval_ms = interval_ms
        self._guard = threading.Lock()  # held by a beat under way; exit waits for it
        self._entered = False

    def _beat(self) -> bool:
        return self._hot.beat(self._task, self._agent, self._token, 3 * self._interval_ms)

    def _renew(self) -> float | None:
        """Beat once (the beating thread's call); return seconds to the next, None to stop."""
        with self._guard:
            if not self._entered:
                return None
            try:
                if not self._beat():
                    log.info("heartbeat stopped: another attempt of the step is current")
                    return None
            except redis.RedisError as exc:
                log.warning("heartbeat failed", error=str(exc))
            return self._interval_ms / 1000

    def __enter__(self) -> Heartbeat:
        if self._beat_now:  # else the caller has just beaten (step_start does)
            self._beat()
        self._entered = True
        _BEATER.schedule(self, self._first_wait_ms / 1000)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with self._guard:
            self._entered = False  # the beating thread drops it when it comes due


class _Beater:
    """The process's heartbeat thread: renews each entered `Heartbeat` when it is due."""

    def __init__(self) -> None:
        self._reset()
        # A forked child has none of its parent's threads: it starts its own on first use.
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._wake = threading.Condition()
        self._due: list[tuple[float, int, Heartbeat]] = []  # (when, order, beat): a heap
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def schedule(self, beat: Heartbeat, after: float) -> None:
        """Renew `beat` in `after` seconds, and then as it asks."""
        with self._wake:
            entry = (time.monotonic() + after, next(self._order), beat)
            heapq.heappush(self._due, entry)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
                self._thread.start()
            elif self._due[0] is entry:
                self._wake.notify()  # due before whatever the thread waits for

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._due or self._due[0][0] > time.monotonic():
                    self._wake.wait(self._due[0][0] - time.monotonic() if self._due else None)
                _, _, beat = heapq.heappop(self._due)
            try:
                wait = beat._renew()
            except Exception as exc:  # noqa: BLE001 - one beat's bug must not stop the others
                log.warning("heartbeat stopped", error=f"{type(exc).__name__}: {exc}")
                wait = None
            if wait is not None:
                self.schedule(beat, wait)


_BEATER = _Beater()
