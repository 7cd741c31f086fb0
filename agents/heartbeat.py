"""The heartbeat a step keeps alive, so a coordinator sees a dead worker within seconds."""

from __future__ import annotations

import os
import socket
import threading
from types import TracebackType

import redis

from agents.logs import get_logger
from storage.base import HotStore

log = get_logger(__name__)


def worker_token(epoch: int, superstep: int, attempt: int) -> str:
    """Name this process's attempt of a step: `host:pid:epoch:superstep:attempt`.

    The epoch is part of it: after a restore the same (superstep, attempt) runs again
    under a new epoch, and a zombie of the old one must not pass for it.
    """
    return f"{socket.gethostname()}:{os.getpid()}:{epoch}:{superstep}:{attempt}"


class Heartbeat:
    """While entered, beat every `interval_ms` with a TTL of three intervals.

    The first beat happens on entry (unless the caller beat already). If a beat fails (a
    Redis blip) the thread logs and tries again next interval; a coordinator seeing the
    key lapse treats the step as dead, which is the safe reading. Once a beat is fenced
    (another attempt of the step is current) it stops: this one is a zombie.
    """

    def __init__(
        self,
        hot: HotStore,
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
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{agent}", daemon=True)

    def _beat(self) -> bool:
        return self._hot.beat(self._task, self._agent, self._token, 3 * self._interval_ms)

    def _run(self) -> None:
        wait = self._first_wait_ms
        while not self._stop.wait(wait / 1000):
            wait = self._interval_ms
            try:
                if not self._beat():
                    log.info("heartbeat stopped: another attempt of the step is current")
                    return
            except redis.RedisError as exc:
                log.warning("heartbeat failed", error=str(exc))

    def __enter__(self) -> Heartbeat:
        if self._beat_now:  # else the caller has just beaten (step_start does)
            self._beat()
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()
