"""The coordinator's spans: a task's own span, its supersteps' and its restores'.

Every span of a task's trace hangs under its task span, whose ids are derived from the
task id (`cairn.agents.tracing`): a superstep span is opened when the superstep's steps
are launched and ended when its GC is committed (with the GC's number and epoch), or, as
an error, when a restore leaves it behind or the task ends before it; a retried step is an
event on it. The task span is written when the task ends, from its submit to its end.
A restore is a span of its own, under the task span, in whichever process restores.

The open superstep spans are this process's only: a coordinator that takes over a task
begun by another writes the superstep's span at its commit, from the commit alone, and the
one the other opened is lost with it. A task that never ends (cancelled, or still paused)
has no task span: its trace's root is named by its children and missing, as backends show.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import redis

from cairn.agents import tracing
from cairn.agents.tracing import (
    add_event,
    carrier,
    end_span,
    remote,
    set_attributes,
    start_span,
    superstep_span_id,
    task_span_id,
    trace_id_of,
)
from cairn.storage import keys

if TYPE_CHECKING:  # the `otel` extra's: absent, no span is ever made
    from opentelemetry.trace import Span


@dataclass(slots=True)
class _Open:
    epoch: int
    superstep: int
    replayed: bool
    span: Span | None


_lock = threading.Lock()
_open: dict[str, _Open] = {}  # task → its superstep in flight, as this process began it
# The run's field saying the task's span was written (the task ended once): an end after a
# restore writes a span of its own.
TRACED_END = "traced_end"


def superstep_began(
    task: str, epoch: int, superstep: int, number: int, agents: Sequence[str], *, replayed: bool
) -> dict[str, str] | None:
    """Open superstep `superstep`'s span; the trace context its step jobs carry, if tracing.

    `number` is the GC it will commit as; `replayed` says it runs again what a restore
    discarded. A superstep of the task still open here is ended, left behind.
    """
    if not tracing.tracing():
        return None
    superstep_left(task, "left behind by a restore")
    attributes = {
        "cairn.task.id": task,
        "cairn.superstep": superstep,
        "cairn.epoch": epoch,
        "cairn.gc.number": number,
        "cairn.agents": list(agents),
        "cairn.replayed": replayed,
    }
    ids = (trace_id_of(task), superstep_span_id(task, epoch, superstep))
    span = start_span(f"superstep {superstep}", remote(task, task_span_id(task)), attributes,
                      ids=ids)  # fmt: skip
    with _lock:
        _open[task] = _Open(epoch, superstep, replayed, span)
    return carrier(task, epoch, superstep, replayed=replayed)


def steps_relaunched(
    task: str, epoch: int, superstep: int, attempts: dict[str, int]
) -> dict[str, str] | None:
    """Note retried steps as events of their superstep's span; the context their jobs carry."""
    if not tracing.tracing():
        return None
    with _lock:
        held = _open.get(task)
    replayed = False
    if held is not None and (held.epoch, held.superstep) == (epoch, superstep):
        replayed = held.replayed
        for agent, attempt in attempts.items():
            add_event(held.span, "step retried", {"cairn.agent": agent, "cairn.attempt": attempt})
    return carrier(task, epoch, superstep, replayed=replayed)


def superstep_committed(task: str, epoch: int, superstep: int, number: int) -> None:
    """End superstep `superstep`'s span: its GC `number` is committed under `epoch`."""
    if not tracing.tracing():
        return
    with _lock:
        held = _open.pop(task, None)
    span = held.span if held is not None and (held.epoch, held.superstep) == (
        epoch, superstep) else None  # fmt: skip
    if held is not None and span is None:
        end_span(held.span, "left behind")
    if span is None:  # begun by another coordinator: written from the commit alone
        ids = (trace_id_of(task), superstep_span_id(task, epoch, superstep))
        begun = {"cairn.task.id": task, "cairn.superstep": superstep}
        span = start_span(f"superstep {superstep}", remote(task, task_span_id(task)), begun,
                          ids=ids)  # fmt: skip
    set_attributes(span, {"cairn.gc.number": number, "cairn.epoch": epoch,
                          "cairn.superstep.outcome": "committed"})  # fmt: skip
    end_span(span)


def superstep_left(task: str, why: str) -> None:
    """End the task's open superstep span, if this process holds one, as an error: `why`."""
    with _lock:
        held = _open.pop(task, None)
    if held is not None:
        set_attributes(held.span, {"cairn.superstep.outcome": "aborted"})
        add_event(held.span, "superstep aborted", {"cairn.reason": why})
        end_span(held.span, "aborted")


def task_ended(client: redis.Redis, task: str, status: str, *, ok: bool) -> None:
    """Write task `task`'s span, from its submit to now, ending `status` (`ok`, or not).

    Its first end writes the task span itself (the trace's root); an end after a restore
    of an ended task is a span of no length under it, saying how the task ended again.
    """
    if not tracing.tracing():
        return
    superstep_left(task, f"the task ended {status}")
    start, first = None, True
    with contextlib.suppress(redis.RedisError, ValueError):  # its start unknown: now
        with client.pipeline(transaction=False) as batch:
            batch.hget(keys.run(task), "submitted_at")
            batch.hsetnx(keys.run(task), TRACED_END, "1")  # set once, by the first end
            submitted, first = batch.execute()
        start = None if submitted is None else int(float(submitted) * 1e9)
    attributes = {"cairn.task.id": task, "cairn.task.status": status}
    if first:
        span = start_span(f"task {task}", None, attributes, ids=(trace_id_of(task),
                          task_span_id(task)), start_time=start)  # fmt: skip
    else:
        span = start_span(f"task {task} ended again", remote(task, task_span_id(task)),
                          attributes)  # fmt: skip
    end_span(span, None if ok else status)


@dataclass(slots=True)
class RestoreSpan:
    """A restore's span, and what it found out (set by the restorer)."""

    span: Span | None

    def restored(self, to: int, number: int, epoch: int) -> None:
        """Say the task was restored to GC `to`, recorded as GC `number` under `epoch`."""
        set_attributes(self.span, {"cairn.restore.to": to, "cairn.gc.number": number,
                                   "cairn.epoch": epoch})  # fmt: skip


@contextlib.contextmanager
def restore_span(task: str, to: int | None, origin: str) -> Iterator[RestoreSpan]:
    """Run a restore of `task` (to GC `to`, else its latest) in a span under its task span.

    `origin` says who asked: `restore` (a person), `rollback` (a superstep given up).
    """
    attributes = {"cairn.task.id": task, "cairn.restore.target": to,
                  "cairn.restore.origin": origin}  # fmt: skip
    span = None
    if tracing.tracing():
        superstep_left(task, f"the task is restored ({origin})")
        span = start_span(f"restore {task}", remote(task, task_span_id(task)), attributes)
    with tracing.current(span):
        yield RestoreSpan(span)
