"""Shipping a process's task-scoped log lines into the task's capped stream in Redis.

Workers and coordinators may run on other hosts than the person asking what a task did:
`cairn logs TASK` reads the lines of every process from Redis (`keys.logs`). A process
ships each event that names a task (bound per step, or given) once structlog rendered
its fields: redacted, its traceback made text.

Best effort, and never in a step's way: an event is put on a bounded in-memory queue
(dropped when full) and a thread of its own writes queued lines in batches, each gathered
for up to `LINGER` after its first line (a step's line or two would otherwise each take a
round trip of their own); a Redis that fails loses those lines, and nothing else. A
process that exits normally sends what it queued first (`flush`, at exit). Each stream
keeps about `MAXLEN` lines, and is written only while the task's run state is in Redis
(`ship_log.lua`): a line logged after `forget` brings no key of the task back. Each line
carries an id of its own: a write redis-py sends again after a lost reply may store a
line twice, and readers drop the repeat (`cairn.coordinator.tasklogs`).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import queue
import socket
import threading
import time
import uuid
from datetime import UTC, datetime

import redis
import structlog
from redis.exceptions import NoScriptError
from structlog.typing import EventDict, WrappedLogger

from cairn.errors import CairnError
from cairn.storage import keys
from cairn.storage.backends.redis.scripts import Lua

MAXLEN = 5_000  # lines kept per task (approximately: Redis trims whole stream nodes)
QUEUED = 10_000  # lines waiting to be shipped, at most; more are dropped
BATCH = 200  # lines written in one round trip
LINGER = 0.05  # seconds a batch waits for more lines after its first
FLUSH_WAIT = 1.0  # seconds a process's exit waits for its queued lines to be sent
# The fields a line shows as such; the others are its "key fields".
OWN_FIELDS = frozenset({"task", "agent", "timestamp", "level", "event", "exception", "logger"})

_WHO = f"{socket.gethostname()}:{os.getpid()}"


def process_name(role: str = "") -> str:
    """The name log lines give this process: `worker@host:pid` (or `host:pid`)."""
    return f"{role}@{_WHO}" if role else _WHO


class LogShipper:
    """A structlog processor that queues task-scoped events, and the thread that ships them."""

    def __init__(self, client: redis.Redis, process: str) -> None:
        self.client, self.process = client, process
        self.dropped = 0  # lines lost: the queue was full, or Redis refused them
        self._queue: queue.Queue[tuple[str, dict[str, str]]] = queue.Queue(QUEUED)
        # A bare EVALSHA in the batch's pipeline: redis-py's registered scripts ask Redis
        # whether it has them (SCRIPT EXISTS) in a round trip of every batch.
        self._add = Lua(lambda: client, "ship_log")
        self._unsent = 0  # lines queued and not yet sent (or dropped)
        self._sent = threading.Condition()  # guards `_unsent`; notified as batches go
        self._hurry = threading.Event()  # set by `flush`: batches no longer linger
        self._thread = threading.Thread(target=self._ship, name="cairn-log-shipper", daemon=True)
        self._thread.start()

    def __call__(self, _logger: WrappedLogger, method: str, event: EventDict) -> EventDict:
        """Queue `event` if it names a task; hand it on unchanged either way."""
        task = event.get("task")
        if isinstance(task, str):
            try:
                self._queue.put_nowait((task, self._line(method, event)))
            except queue.Full:
                self.dropped += 1
            else:
                with self._sent:
                    self._unsent += 1
        return event

    def flush(self, timeout: float = FLUSH_WAIT) -> bool:
        """Send every line queued so far without lingering; False if `timeout` s did not do."""
        self._hurry.set()
        deadline = time.monotonic() + timeout
        try:
            with self._sent:
                while self._unsent > 0:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._sent.wait(left)
            return True
        finally:
            self._hurry.clear()

    def _line(self, method: str, event: EventDict) -> dict[str, str]:
        """The stream entry of one event: strings only, as Redis keeps them."""
        extra = {name: value for name, value in event.items() if name not in OWN_FIELDS}
        stamp = event.get("timestamp")
        return {
            "id": uuid.uuid4().hex,
            "at": stamp if isinstance(stamp, str) else datetime.now(UTC).isoformat(),
            "level": str(event.get("level", method)),
            "process": self.process,
            "agent": str(event.get("agent") or ""),
            "message": str(event.get("event", "")),
            "fields": json.dumps(extra, default=str, sort_keys=True),
            "exception": str(event.get("exception") or ""),
        }

    def _ship(self) -> None:
        while True:
            batch = [self._queue.get()]
            until = time.monotonic() + LINGER
            with contextlib.suppress(queue.Empty):
                while len(batch) < BATCH:
                    wait = 0.0 if self._hurry.is_set() else until - time.monotonic()
                    batch.append(self._queue.get(timeout=max(wait, 0.0)))
            self._ship_batch(batch)
            with self._sent:
                self._unsent -= len(batch)
                self._sent.notify_all()

    def _ship_batch(self, batch: list[tuple[str, dict[str, str]]]) -> None:
        """Write `batch`'s lines in one round trip; count those lost in `dropped`."""
        commands = []
        for task, line in batch:
            try:
                where = [keys.run(task), keys.logs(task)]
            except CairnError:  # not a task's name: no stream of its own
                self.dropped += 1
                continue
            fields = [item for pair in line.items() for item in pair]
            commands.append(self._add.command(where, [MAXLEN, *fields]))
        try:
            unsent = self._send(commands)
            if unsent:  # Redis lost the script (a restart): those lines never ran
                self._add.load(self.client)
                unsent = self._send(unsent)
            self.dropped += len(unsent)
        except (redis.RedisError, OSError):  # lost lines, nothing more
            self.dropped += len(commands)

    def _send(self, commands: list[tuple[object, ...]]) -> list[tuple[object, ...]]:
        """Send `commands` in one round trip; those Redis ran nothing of (NOSCRIPT)."""
        with self.client.pipeline(transaction=False) as pipe:
            for command in commands:
                pipe.execute_command(*command)  # type: ignore[no-untyped-call]
            replies = pipe.execute(raise_on_error=False)
        failed = next((r for r in replies if isinstance(r, redis.RedisError)
                       and not isinstance(r, NoScriptError)), None)  # fmt: skip
        if failed is not None:
            raise failed
        return [c for c, r in zip(commands, replies, strict=True) if isinstance(r, NoScriptError)]


def ship_logs(client: redis.Redis, role: str) -> LogShipper | None:
    """Ship this process's task-scoped log lines to Redis from now on, as `role`.

    Runs once configured (`configure_logging`): None while structlog is not, and the
    shipper already installed when called again.
    """
    if not structlog.is_configured():
        return None
    processors = list(structlog.get_config()["processors"])
    for processor in processors:
        if isinstance(processor, LogShipper):
            return processor
    shipper = LogShipper(client, process_name(role))
    processors.insert(len(processors) - 1, shipper)  # the last one renders the event
    structlog.configure(processors=processors)
    atexit.register(shipper.flush)
    return shipper
