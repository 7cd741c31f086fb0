"""A task's failed step attempts, recorded as they happen, and what the coordinator made of them.

A worker records an attempt that raised (`failed`: the error's class and one line); the
coordinator records what it decides about a failed step: run it again (`retried`), roll
the task back to its latest GC (`rolled_back`), or end the task (`gave_up`). So `status`,
`trace` and the timeline show a failing step while it fails, not only once the task has.

The events are one sorted set per task (`keys.failures`), scored by time: each member is
the event's JSON, built once before it is written, so a write redis-py sends again after
a lost reply adds nothing. Only the newest `KEEP` events are kept; `forget` removes the
set with the task's other keys. Counts read from it are of the events kept.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from enum import Enum
from typing import Any, cast

import redis
from pydantic import BaseModel, ConfigDict, ValidationError

from cairn.coordinator.viewbase import IsoTime
from cairn.storage import keys
from cairn.storage.public import public
from cairn.storage.redact import redact

KEEP = 500  # events kept per task: the newest
ERROR_CHARS = 500  # of an event's error line


class FailureEvent(str, Enum):
    """What happened to a step attempt that did not vote."""

    FAILED = "failed"  # a worker: the attempt raised
    RETRIED = "retried"  # the coordinator: the step runs again, as the next attempt
    ROLLED_BACK = "rolled_back"  # the coordinator: the superstep was aborted, the task rolled back
    GAVE_UP = "gave_up"  # the coordinator: the task failed


@public
class StepFailure(BaseModel):
    """One failed step attempt, or what the coordinator decided about it, as it happened."""

    model_config = ConfigDict(frozen=True)

    at: IsoTime
    agent: str
    superstep: int
    epoch: int
    attempt: int  # the attempt that failed
    event: FailureEvent
    error: str  # one line, secrets of known shapes redacted
    error_class: str | None = None  # the exception's class, when a worker recorded it
    process: str | None = None  # the worker or coordinator that recorded it

    def to_json(self) -> dict[str, Any]:
        """The JSON object scripts read (`--json`)."""
        return self.model_dump(mode="json")


def record_failure(
    client: redis.Redis,
    task: str,
    agent: str,
    superstep: int,
    epoch: int,
    attempt: int,
    event: FailureEvent,
    error: str,
    *,
    error_class: str | None = None,
    process: str | None = None,
) -> None:
    """Add one event to the task's failures, dropping the oldest past `KEEP`.

    Idempotent: the member is built here, once, so the same write sent again (redis-py's
    retry of the whole transaction) adds nothing and drops nothing more.
    """
    now = time.time()
    member = json.dumps(
        {
            "at": datetime.fromtimestamp(now, tz=UTC).isoformat(),
            "agent": agent,
            "superstep": superstep,
            "epoch": epoch,
            "attempt": attempt,
            "event": event.value,
            "error": redact(" ".join(error.split()))[:ERROR_CHARS],
            "error_class": error_class,
            "process": process,
        },
        sort_keys=True,
    )
    key = keys.failures(task)
    with client.pipeline(transaction=True) as pipe:
        pipe.zadd(key, {member: int(now * 1000)})
        pipe.zremrangebyrank(key, 0, -KEEP - 1)
        pipe.execute()


def record_quietly(client: redis.Redis, task: str, *args: Any, **kwargs: Any) -> None:  # noqa: ANN401 - `record_failure`'s
    """`record_failure`, where a Redis that fails must not change what happens next.

    The record is for people; the step's outcome and the coordinator's decision stand
    without it.
    """
    with contextlib.suppress(redis.RedisError):
        record_failure(client, task, *args, **kwargs)


def read_failures(client: redis.Redis, task: str, agent: str | None = None) -> list[StepFailure]:
    """The task's failure events kept (of `agent`, or every agent's), oldest first."""
    raw = cast(list[bytes], client.zrange(keys.failures(task), 0, -1))
    return list(_parsed(raw, agent))


def _parsed(raw: Iterable[bytes], agent: str | None) -> Iterable[StepFailure]:
    for member in raw:
        try:
            event = StepFailure.model_validate_json(member)
        except ValidationError:  # not one of ours: passed over, as a damaged line of a log
            continue
        if agent is None or event.agent == agent:
            yield event


def troubles(events: Iterable[StepFailure]) -> dict[str, tuple[int, StepFailure]]:
    """Agent → (its steps' retries, its latest failure) among `events`, oldest first.

    The latest failure is the latest event, but the worker's own account of an attempt
    (its error's class, when it failed) over what the coordinator decided about it.
    """
    found: dict[str, tuple[int, StepFailure]] = {}
    for event in events:
        retries, last = found.get(event.agent, (0, event))
        same = (last.epoch, last.superstep, last.attempt) == (
            event.epoch, event.superstep, event.attempt)  # fmt: skip
        if not (same and last.event is FailureEvent.FAILED):
            last = event
        found[event.agent] = (retries + (event.event is FailureEvent.RETRIED), last)
    return found
