"""`Client` and `Task`: what a user calls to submit, watch, restore and steer tasks.

A thin layer over the coordinator's user side (`cairn.coordinator.tasks.Tasks`), its read
models (`cairn.coordinator.views`), the restorer and the archive; the coordinator's loop and
the workers run elsewhere (`cairn up`, `cairn coordinator`, `cairn worker`). Every call
reads Redis (and the archive) afresh: a `Task` holds nothing but its id.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, ParamSpec, TypeVar, overload

import redis
from pydantic import BaseModel, JsonValue

from cairn.agents.accounting import Budget, MemberBudget, load_prices
from cairn.agents.live import LiveReply, read_live
from cairn.agents.spec import parse_model
from cairn.agents.tracing import start_tracing
from cairn.connection import client_for, ping
from cairn.coordinator import approvals, export, gcviews, views
from cairn.coordinator.approvals import Decision, PendingCall
from cairn.coordinator.diff import Diff, diff
from cairn.coordinator.failures import StepFailure, read_failures
from cairn.coordinator.gcviews import CheckpointDetail, CheckpointInfo
from cairn.coordinator.restore import Restorer
from cairn.coordinator.settings import (
    Settings,
    as_argument,
    display_url,
    open_store,
    read_settings,
)
from cairn.coordinator.spec import TaskSpec, load_spec
from cairn.coordinator.tasklogs import LogLine, read_logs
from cairn.coordinator.tasks import Tasks
from cairn.coordinator.timeline import Timeline, gather
from cairn.coordinator.views import (
    Export,
    RestoreResult,
    TaskStatus,
    TraceEntry,
)
from cairn.coordinator.wakes import wake
from cairn.errors import CheckpointNotFound, InvalidSpec, Timeout, Unavailable, one_line
from cairn.storage import keys
from cairn.storage.archive import ArchiveReport
from cairn.storage.public import public
from cairn.storage.records import AgentState

P = ParamSpec("P")
R = TypeVar("R")
M = TypeVar("M", bound=BaseModel)
WAIT_POLL = 0.2  # seconds between looks at a task `Task.wait` follows
# Seconds in a row `Task.wait` waits out a Redis that stopped answering: a failover or a
# restart takes seconds, and the task goes on meanwhile; an outage longer is said.
OUTAGE = 60.0
SpecSource = str | os.PathLike[str] | TaskSpec | Mapping[str, Any]


def _redis_errors(call: Callable[P, R]) -> Callable[P, R]:
    """Raise `Unavailable` for a Redis that stopped answering during `call`."""

    @functools.wraps(call)
    def checked(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return call(*args, **kwargs)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise Unavailable(f"Redis stopped answering: {one_line(exc)}") from exc

    return checked


def configure(
    redis_url: str | None,
    archive_dir: str | os.PathLike[str] | None,
    settings: Settings | None,
) -> Settings:
    """A client's settings: `settings` (else those read now) with the arguments given on top.

    Raises `InvalidSpec` for an invalid setting.
    """
    if settings is None:
        return read_settings({"redis_url": redis_url, "archive_dir": archive_dir}, as_argument)
    if redis_url is None and archive_dir is None:
        return settings
    given = (("redis_url", redis_url), ("archive_dir", archive_dir))
    return settings.given({name: value for name, value in given if value is not None}, as_argument)


@public
class Client:
    """A connection to one Cairn deployment: its Redis and its archive.

    Configured by the arguments, else `CAIRN_REDIS_URL` and `CAIRN_ARCHIVE_DIR` (and the
    other `CAIRN_*` settings), else the Redis a running `cairn up` in the state directory
    started. Raises `Unavailable` (naming the URL, its password hidden, and where it came
    from) when that Redis does not answer or none is configured, `InvalidSpec` when a
    setting is invalid.
    """

    def __init__(
        self,
        redis_url: str | None = None,
        archive_dir: str | os.PathLike[str] | None = None,
        *,
        settings: Settings | None = None,
    ) -> None:
        settings = configure(redis_url, archive_dir, settings)
        self.settings = settings
        url, origin = settings.redis()
        ping(url, origin)
        self.url = url
        # The plumbing: what a `Task` of this client reads and changes a task through.
        self._redis = client_for(url)
        self._store = open_store(settings, self._redis)
        self._control = Tasks(self._redis, self._store)  # the coordinator's user side

    def __repr__(self) -> str:
        return f"Client({display_url(self.url)!r})"

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections to Redis."""
        self._redis.close()

    @_redis_errors
    def submit(self, spec: SpecSource, *, base: str | os.PathLike[str] | None = None) -> Task:
        """Store a task and queue it for the coordinator; return its handle.

        `spec` is a YAML or JSON file, a `TaskSpec`, or a mapping of its fields; a spec's
        `workspace` directory is relative to `base` (default: the file's directory, else
        the current one). Raises `InvalidSpec` naming what is wrong.
        """
        parsed, where = _parse(spec, base)
        return Task(self, self._control.submit(self._priced(parsed), where))

    def _priced(self, spec: TaskSpec) -> TaskSpec:
        """`spec` with the configured price table (`CAIRN_PRICES`) under its own `prices`."""
        if self.settings.prices is None:
            return spec
        table = load_prices(self.settings.prices)
        return spec.model_copy(update={"prices": {**table, **spec.prices}})

    @_redis_errors
    def task(self, task_id: str) -> Task:
        """The handle of a task Cairn knows; `TaskNotFound` for any other id."""
        self._control.require(task_id)
        return Task(self, task_id)

    @_redis_errors
    def tasks(self) -> list[TaskStatus]:
        """The status of every task Redis knows, the most recently submitted first."""
        return self._control.list()

    @_redis_errors
    def approvals(self) -> list[PendingCall]:
        """Every tool call waiting for a person, across the tasks that have not ended.

        Newest task first, its agents in team order: the approval queue a person works
        through with `Task.approve` and `Task.reject`.
        """
        return [
            call
            for status in self.tasks()
            if not status.ended
            and any(a.status is AgentState.WAITING_APPROVAL for a in status.agents)
            for call in approvals.pending_approvals(self._store, status.task_id)
        ]

    @_redis_errors
    def has_coordinator(self) -> bool:
        """True while a coordinator holds the leader lease (tasks submitted now will run)."""
        return bool(self._redis.exists(keys.LEASE))


class Waiting:
    """One `wait`'s account of a task: its deadline, the last status read, Redis's silence.

    `Task.wait` and `AsyncTask.wait` follow a task through it, each sleeping its own way.
    """

    def __init__(self, task_id: str, timeout: float | None, poll: float, outage: float) -> None:
        self.task_id, self.timeout, self.poll, self.outage = task_id, timeout, poll, outage
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.last: TaskStatus | None = None  # the latest status read
        self.lost: float | None = None  # since when Redis has not answered (monotonic)

    def saw(self, status: TaskStatus) -> None:
        """Note a status read: Redis answers again."""
        self.last, self.lost = status, None

    def gives_up(self, asked: float) -> bool:
        """Note a read begun at `asked` that Redis did not answer; true once silent `outage` s."""
        # Silent since the first read that failed began.
        self.lost = asked if self.lost is None else self.lost
        return time.monotonic() - self.lost >= self.outage

    def pause(self) -> float:
        """Seconds to sleep before the next read; `Timeout` once the deadline has passed."""
        if self.deadline is None:
            return self.poll
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise Timeout(self._not_ended())
        return min(self.poll, left)

    def _not_ended(self) -> str:
        """What `wait` says when its timeout ran out: the task's state, else Redis's silence."""
        timeout = self.timeout or 0.0  # set, with the deadline
        if self.lost is None and self.last is not None:
            return f"task {self.task_id} is still {self.last.state.value} after {timeout:g} s"
        silent = time.monotonic() - (self.lost or 0.0)
        return (
            f"task {self.task_id} did not end within {timeout:g} s: "
            f"Redis has not answered for {silent:.1f} s"
        )


def _parse(spec: SpecSource, base: str | os.PathLike[str] | None) -> tuple[TaskSpec, Path]:
    """A spec source as a `TaskSpec`, with the directory its `workspace` is relative to."""
    where = Path() if base is None else Path(base)
    if isinstance(spec, TaskSpec):
        return spec, where
    if isinstance(spec, Mapping):
        return parse_model(TaskSpec, dict(spec), "task spec"), where
    return load_spec(spec), Path(spec).parent if base is None else where


@public
class Task:
    """One task: its id, and calls that read or change it (see `Client.task`)."""

    def __init__(self, client: Client, task_id: str) -> None:
        self.client = client
        self.id = task_id

    def __repr__(self) -> str:
        return f"Task({self.id!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Task) and (other.client, other.id) == (self.client, self.id)

    def __hash__(self) -> int:
        return hash(self.id)

    @_redis_errors
    def status(self) -> TaskStatus:
        """The task's status now."""
        return self.client._control.status(self.id)

    def wait(
        self,
        timeout: float | None = None,
        *,
        poll: float = WAIT_POLL,
        on_status: Callable[[TaskStatus], None] | None = None,
        outage: float = OUTAGE,
    ) -> TaskStatus:
        """Poll the status until the task ends; return the final status, whatever it is.

        `on_status` sees every status read. Raises `Timeout` when `timeout` seconds pass
        first (the task runs on). A Redis that stops answering (a failover, a restart) is
        waited out; one that has not answered for `outage` seconds raises `Unavailable`.
        """
        waiting = Waiting(self.id, timeout, poll, outage)
        while True:
            asked = time.monotonic()
            try:
                status = self.status()
            except Unavailable:
                if waiting.gives_up(asked):
                    raise
            else:
                waiting.saw(status)
                if on_status is not None:
                    on_status(status)
                if status.ended:
                    return status
            time.sleep(waiting.pause())

    @_redis_errors
    def live_replies(self, agents: Iterable[str] | None = None) -> dict[str, LiveReply]:
        """The replies the task's agents (or `agents`) are streaming now, by agent.

        Only agents with `stream: true` whose model is answering have one; it is gone once
        the answer is whole (read it in the trace then).
        """
        names = [a.name for a in self.status().agents] if agents is None else agents
        return read_live(self.client._store.hot, self.id, names)

    @_redis_errors
    def checkpoints(self) -> list[CheckpointInfo]:
        """Every global checkpoint, hot or cold, oldest first."""
        return gcviews.checkpoints(self.client._store, self.id)

    @_redis_errors
    def checkpoint(self, number: int) -> CheckpointDetail:
        """One global checkpoint in detail: members, their steps, files, undelivered inbox."""
        return gcviews.checkpoint(self.client._store, self.id, number)

    @_redis_errors
    def restore(self, to: int | None = None, *, on_workers: bool = False) -> RestoreResult:
        """Put every agent and file back to checkpoint `to` (default: the latest committed).

        All or nothing: when the target cannot be restored whole, older committed
        checkpoints are tried; with none left, `RestoreFailed` (the task is unrecoverable).
        `on_workers` stages the agents on the workers; by default it is done here, so no
        worker need be up. A staging job that fails for another reason, or that no worker
        runs within a minute, is `RestoreFailed` too: the task stays `restoring` and its
        coordinator restores it again, to its latest committed checkpoint. An absent
        checkpoint `to` is `CheckpointNotFound`; a damaged one is passed over like any target that
        cannot be restored whole.
        """
        if to is not None and to not in {g.number for g in self.client._store.list_gcs(self.id)}:
            raise CheckpointNotFound(f"task {self.id} has no checkpoint {to}")
        with contextlib.suppress(InvalidSpec):  # an OTEL_* setting never stops a restore
            start_tracing(self.client.settings.traces("client"))  # the restore's span
        restorer = Restorer(self.client._redis, self.client._store, workers=on_workers)
        done = restorer.restore(self.id, to)
        return RestoreResult(restored_to=done.restored_to, epoch=done.epoch, checkpoint=done.number)

    @_redis_errors
    def fork(self, at: int | None = None, spec: SpecSource | None = None) -> Task:
        """A new task starting from checkpoint `at` (default: the latest committed).

        Its agents (histories, inboxes, statuses), workspace and superstep are those of the
        checkpoint; this task is untouched. `spec` may change the team's configuration
        (models, prompts, limits) but must name the same agents. Raises `CheckpointNotFound`
        for an absent checkpoint, `InvalidSpec` for another team.
        """
        parsed = None if spec is None else self.client._priced(_parse(spec, None)[0])
        return Task(self.client, self.client._control.fork(self.id, at, parsed))

    @_redis_errors
    def diff(self, a: int | None, b: int | None, *, other: Task | None = None) -> Diff:
        """What checkpoint `b` of `other` (default: this task) adds to checkpoint `a` of this.

        Per agent the messages and tool calls added, and the files added, removed and
        changed (unified diffs). None means the latest committed checkpoint.
        """
        theirs = self if other is None else other
        return diff(self.client._store, self.id, a, theirs.id, b)

    @_redis_errors
    def workspace(self, checkpoint: int | None = None) -> dict[str, bytes]:
        """The files of a checkpoint (default: the latest committed): path → contents."""
        return export.workspace_files(self.client._store, self.id, checkpoint)

    @_redis_errors
    def export(
        self,
        out_dir: str | os.PathLike[str],
        checkpoint: int | None = None,
        *,
        include_git: bool = False,
    ) -> Export:
        """Write a checkpoint's files into `out_dir`, a new or empty directory.

        Files that would make git take a directory for a repository (`.git`, a bare
        repository's `HEAD`) are left out, and listed as such, unless `include_git`: git
        runs what a repository's config and hooks name. A checkpoint whose files are not
        a tree is `InvalidSpec`.
        """
        return export.export_workspace(
            self.client._store, self.id, checkpoint, Path(out_dir), include_git=include_git
        )

    @overload
    def result(self, model: None = None, *, checkpoint: int | None = None) -> JsonValue: ...

    @overload
    def result(self, model: type[M], *, checkpoint: int | None = None) -> M: ...

    @_redis_errors
    def result(self, model: type[M] | None = None, *, checkpoint: int | None = None) -> object:
        """The task's result at a checkpoint (default: the latest committed), as JSON.

        With `model`, a pydantic model class, the value validated into it (pydantic's
        `ValidationError` when it does not fit). The result is the value the agent that
        finished last gave `finish` (docs/task-spec.md); while the task runs, a later one
        may replace it. Raises `NoResult` when the task declares no `result`, or no agent
        has finished with one by that checkpoint.
        """
        value = views.task_result(self.client._store, self.id, checkpoint).value
        return value if model is None else model.model_validate(value)

    @_redis_errors
    def trace(self, agent: str | None = None) -> list[TraceEntry]:
        """What the agents (or one) did, model turn by tool call, in the order it happened."""
        return views.trace(self.client._store, self.id, agent)

    @_redis_errors
    def failures(self, agent: str | None = None) -> list[StepFailure]:
        """The failed step attempts of the agents (or one) and what came of them, oldest first.

        Recorded as they happen, so a step that keeps failing shows while it fails: each
        failed attempt, each retry, rollback and the giving up. The newest few hundred are
        kept.
        """
        return read_failures(self.client._redis, self.id, agent)

    @_redis_errors
    def logs(
        self, agent: str | None = None, *, after: str | None = None, wait: float = 0.0
    ) -> list[LogLine]:
        """The task's log lines from every worker and coordinator (or one agent's), oldest first.

        In the order they reached Redis: time order, to within the moment a process takes
        to ship a line. `after` (the last line's `id`) reads only the lines shipped after
        it; `wait` waits up to that many seconds (at most 2) for one to arrive when none
        has. Shipping is best effort: a process whose Redis failed may have lost some, and
        the stream keeps about the newest 5,000 lines.
        """
        return read_logs(self.client._redis, self.id, agent, after, wait)

    @_redis_errors
    def timeline(self) -> Timeline:
        """Steps, checkpoints, retries and restores, as the HTML timeline draws them."""
        return gather(self.client._redis, self.client._store, self.id)

    @_redis_errors
    def approvals(self) -> list[PendingCall]:
        """The task's tool calls waiting for a person (agents in team order)."""
        return approvals.pending_approvals(self.client._store, self.id)

    @_redis_errors
    def approve(self, agent: str, call: str | None = None) -> Decision:
        """Let `agent` make its tool call that waits for a person (`call`, or the first)."""
        decision = approvals.record_decision(
            self.client._store, self.id, agent, call, approved=True
        )
        wake(self.client._redis, self.id)  # the agent runs on now, not at the coordinator's look
        return decision

    @_redis_errors
    def reject(self, agent: str, call: str | None = None, *, reason: str) -> Decision:
        """Refuse `agent`'s waiting tool call; the model reads `reason` as its result."""
        decision = approvals.record_decision(
            self.client._store, self.id, agent, call, approved=False, reason=reason
        )
        wake(self.client._redis, self.id)
        return decision

    @_redis_errors
    def pause(self) -> TaskStatus:
        """Start no more supersteps (the one in flight finishes); return the status."""
        self.client._control.pause(self.id)
        return self.status()

    @_redis_errors
    def resume(self) -> TaskStatus:
        """Start supersteps again; return the status."""
        self.client._control.resume(self.id)
        return self.status()

    @_redis_errors
    def budget(self, *, tokens: int | None = None, cost_usd: float | None = None) -> Budget:
        """Set the budget (the limits given; the others kept); return it.

        Checked at every barrier: reaching it pauses the task with reason `budget`;
        `resume` goes on (and pauses again at the next barrier unless raised). What was
        spent stays spent through retries and restores.
        """
        return self.client._control.budget(self.id, tokens, cost_usd)

    @_redis_errors
    def member_budget(
        self,
        agent: str,
        *,
        tokens: int | None = None,
        cost_usd: float | None = None,
        steps: int | None = None,
    ) -> MemberBudget:
        """Set the budget of `agent` and the members it spawned (the limits given); return it.

        Checked at every barrier: a subtree at its budget takes no more steps while the
        rest of the team goes on; when only it has work left, the task pauses (`resume`
        goes on once the budget is raised). Replayed spend counts (docs/teams.md).
        """
        return self.client._control.member_budget(self.id, agent, tokens, cost_usd, steps)

    @_redis_errors
    def cancel(self) -> TaskStatus:
        """End the task now (its running steps are fenced); return the status."""
        self.client._control.cancel(self.id)
        return self.status()

    @_redis_errors
    def archive(self) -> list[ArchiveReport]:
        """Archive every committed checkpoint still only in Redis, oldest first."""
        return self.client._control.archive(self.id)

    @_redis_errors
    def forget(self) -> int:
        """Remove this ended task from Redis, archived first; return how many keys went.

        Its checkpoints stay in the archive (`workspace`, `export` and `Task.fork` read
        them there); `status` then raises `TaskNotFound`. Refused (`InvalidSpec`) while the
        task runs or is being restored; nothing is removed when a checkpoint cannot be
        archived (`ArchiveError`, `CorruptCheckpoint`).
        """
        return self.client._control.forget(self.id)
