"""`AsyncClient` and `AsyncTask`: `Client` and `Task` for a program inside an event loop.

    from cairn import AsyncClient

    async with AsyncClient() as client:
        task = await client.submit("team.yaml")
        status = await task.wait(timeout=120)

The same calls, arguments, results and errors as `cairn.Client` and `cairn.Task`, awaited.
Each call runs its synchronous twin on a worker thread (`asyncio.to_thread`, the loop's
default executor), so the loop goes on while Redis and the archive answer. Cairn's read
models, restorer, archive, views and diff are synchronous code, and run on threads already
(a worker's steps, the console); a second copy on `redis.asyncio` would be a second code
path per question, free to drift. redis-py's synchronous client is safe to share between
threads: each call takes a connection of its own from the client's pool.

`AsyncTask.wait` holds no thread while it waits: it reads the status on a thread and
sleeps with `asyncio.sleep` between reads, so cancelling it stops it at once and leaves
the task as it was. Cancelling any other call stops the caller waiting at once, but a
call its thread has begun runs to its end there and its result is dropped: a cancelled
`restore`, `approve` or `cancel` may still happen (read the status to know). A call still
queued for a thread of a busy executor does not run.

`AsyncClient(...)` does no I/O but reading its settings (`InvalidSpec` at once for an
invalid one, `Unavailable` for none, as `Client`); it connects on `async with` or its
first call, which raise `Unavailable` when Redis does not answer.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Concatenate, ParamSpec, TypeVar, overload

from pydantic import JsonValue

from cairn.agents.accounting import Budget, MemberBudget
from cairn.agents.live import LiveReply
from cairn.client import OUTAGE, WAIT_POLL, Client, M, SpecSource, Task, Waiting, configure
from cairn.coordinator.approvals import Decision, PendingCall
from cairn.coordinator.diff import Diff
from cairn.coordinator.failures import StepFailure
from cairn.coordinator.gcviews import CheckpointDetail, CheckpointInfo
from cairn.coordinator.settings import Settings, display_url
from cairn.coordinator.tasklogs import LogLine
from cairn.coordinator.timeline import Timeline
from cairn.coordinator.views import (
    Export,
    RestoreResult,
    TaskStatus,
    TraceEntry,
)
from cairn.errors import Unavailable
from cairn.storage.archive import ArchiveReport
from cairn.storage.public import public

P = ParamSpec("P")
R = TypeVar("R")


@public
class AsyncClient:
    """`Client` for an event loop: every call awaited, run on a worker thread.

    Configured as `Client` is (`Unavailable` at once when no Redis is configured,
    `InvalidSpec` when a setting is invalid). It connects on `async with` or its first
    call, which raise `Unavailable` when that Redis does not answer.
    """

    def __init__(
        self,
        redis_url: str | None = None,
        archive_dir: str | os.PathLike[str] | None = None,
        *,
        settings: Settings | None = None,
    ) -> None:
        self.settings = configure(redis_url, archive_dir, settings)
        self.url = self.settings.redis()[0]
        self._client: Client | None = None  # the synchronous client, once connected

    def __repr__(self) -> str:
        return f"AsyncClient({display_url(self.url)!r})"

    async def __aenter__(self) -> AsyncClient:
        await self._opened()
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connections to Redis (a later call opens them again).

        A call still running on its thread may then fail (`Unavailable`): await the calls
        first.
        """
        client, self._client = self._client, None
        if client is not None:
            client.close()  # closes sockets, which does not block

    async def _opened(self) -> Client:
        """The synchronous client, connected (pinged) on a thread the first time."""
        if self._client is None:
            # No lock: two first calls at once each ping, and the later client is closed.
            # A cancelled opening drops a client whose pool has opened no connection yet.
            opened = await asyncio.to_thread(Client, settings=self.settings)
            if self._client is None:
                self._client = opened
            else:
                opened.close()
        return self._client

    async def _call(
        self, call: Callable[Concatenate[Client, P], R], *args: P.args, **kwargs: P.kwargs
    ) -> R:
        """`call(client, ...)` of the synchronous client, on a thread."""
        return await asyncio.to_thread(call, await self._opened(), *args, **kwargs)

    async def submit(
        self, spec: SpecSource, *, base: str | os.PathLike[str] | None = None
    ) -> AsyncTask:
        """Store a task and queue it for the coordinator; return its handle (`Client.submit`).

        `spec` is a YAML or JSON file, a `TaskSpec`, or a mapping of its fields; a spec's
        `workspace` directory is relative to `base` (default: the file's directory, else
        the current one). Raises `InvalidSpec` naming what is wrong.
        """
        task = await self._call(Client.submit, spec, base=base)
        return AsyncTask(self, task.id)

    async def task(self, task_id: str) -> AsyncTask:
        """The handle of a task Cairn knows; `TaskNotFound` for any other id."""
        await self._call(Client.task, task_id)
        return AsyncTask(self, task_id)

    async def tasks(self) -> list[TaskStatus]:
        """The status of every task Redis knows, the most recently submitted first."""
        return await self._call(Client.tasks)

    async def approvals(self) -> list[PendingCall]:
        """Every tool call waiting for a person, across the tasks that have not ended.

        Newest task first, its agents in team order (`Client.approvals`).
        """
        return await self._call(Client.approvals)

    async def has_coordinator(self) -> bool:
        """True while a coordinator holds the leader lease (tasks submitted now will run)."""
        return await self._call(Client.has_coordinator)


@public
class AsyncTask:
    """One task: its id, and awaitable calls that read or change it (`Task`'s)."""

    def __init__(self, client: AsyncClient, task_id: str) -> None:
        self.client = client
        self.id = task_id

    def __repr__(self) -> str:
        return f"AsyncTask({self.id!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AsyncTask) and (other.client, other.id) == (self.client, self.id)

    def __hash__(self) -> int:
        return hash(self.id)

    async def _handle(self) -> Task:
        """The task's synchronous handle, on its client connected."""
        return Task(await self.client._opened(), self.id)

    async def _call(
        self, call: Callable[Concatenate[Task, P], R], *args: P.args, **kwargs: P.kwargs
    ) -> R:
        """`call(task, ...)` of the synchronous handle, on a thread."""
        return await asyncio.to_thread(call, await self._handle(), *args, **kwargs)

    async def status(self) -> TaskStatus:
        """The task's status now."""
        return await self._call(Task.status)

    async def wait(
        self,
        timeout: float | None = None,
        *,
        poll: float = WAIT_POLL,
        on_status: Callable[[TaskStatus], None] | None = None,
        outage: float = OUTAGE,
    ) -> TaskStatus:
        """Poll the status until the task ends; return the final status, whatever it is.

        `on_status` sees every status read, called in the loop. Raises `Timeout` when
        `timeout` seconds pass first (the task runs on). A Redis that stops answering is
        waited out; one that has not answered for `outage` seconds raises `Unavailable`.
        Between reads it sleeps in the loop: cancelling it stops it at once.
        """
        waiting = Waiting(self.id, timeout, poll, outage)
        while True:
            asked = time.monotonic()
            try:
                status = await self.status()
            except Unavailable:
                if waiting.gives_up(asked):
                    raise
            else:
                waiting.saw(status)
                if on_status is not None:
                    on_status(status)
                if status.ended:
                    return status
            await asyncio.sleep(waiting.pause())

    async def live_replies(self, agents: Iterable[str] | None = None) -> dict[str, LiveReply]:
        """The replies the task's agents (or `agents`) are streaming now, by agent.

        Only agents with `stream: true` whose model is answering have one.
        """
        return await self._call(Task.live_replies, agents)

    async def checkpoints(self) -> list[CheckpointInfo]:
        """Every global checkpoint, hot or cold, oldest first."""
        return await self._call(Task.checkpoints)

    async def checkpoint(self, number: int) -> CheckpointDetail:
        """One global checkpoint in detail: members, their steps, files, undelivered inbox."""
        return await self._call(Task.checkpoint, number)

    async def restore(self, to: int | None = None, *, on_workers: bool = False) -> RestoreResult:
        """Put every agent and file back to checkpoint `to` (default: the latest committed).

        All or nothing, as `Task.restore`: `RestoreFailed` when no committed checkpoint can
        be restored, `CheckpointNotFound` for an absent checkpoint `to`. Cancelled once its thread
        has begun it, it still runs to its end there.
        """
        return await self._call(Task.restore, to, on_workers=on_workers)

    async def fork(self, at: int | None = None, spec: SpecSource | None = None) -> AsyncTask:
        """A new task starting from checkpoint `at` (default: the latest committed).

        This task is untouched; `spec` may change the same team's configuration. Raises
        `CheckpointNotFound` for an absent checkpoint, `InvalidSpec` for another team
        (`Task.fork`).
        """
        forked = await self._call(Task.fork, at, spec)
        return AsyncTask(self.client, forked.id)

    async def diff(self, a: int | None, b: int | None, *, other: AsyncTask | None = None) -> Diff:
        """What checkpoint `b` of `other` (default: this task) adds to checkpoint `a` of this.

        Per agent the messages and tool calls added, and the files added, removed and
        changed (unified diffs). None means the latest committed checkpoint.
        """
        theirs = None if other is None else await other._handle()
        return await self._call(Task.diff, a, b, other=theirs)

    async def workspace(self, checkpoint: int | None = None) -> dict[str, bytes]:
        """The files of a checkpoint (default: the latest committed): path → contents."""
        return await self._call(Task.workspace, checkpoint)

    async def export(
        self,
        out_dir: str | os.PathLike[str],
        checkpoint: int | None = None,
        *,
        include_git: bool = False,
    ) -> Export:
        """Write a checkpoint's files into `out_dir`, a new or empty directory (`Task.export`).

        Files that would make git take a directory for a repository are left out, and
        listed as such, unless `include_git`. A checkpoint whose files are not a tree is
        `InvalidSpec`.
        """
        return await self._call(Task.export, out_dir, checkpoint, include_git=include_git)

    @overload
    async def result(self, model: None = None, *, checkpoint: int | None = None) -> JsonValue: ...

    @overload
    async def result(self, model: type[M], *, checkpoint: int | None = None) -> M: ...

    async def result(
        self, model: type[M] | None = None, *, checkpoint: int | None = None
    ) -> object:
        """The task's result at a checkpoint (default: the latest committed), as JSON.

        With `model`, a pydantic model class, the value validated into it (`Task.result`).
        Raises `NoResult` when the task declares no `result`, or no agent has finished
        with one by that checkpoint.
        """
        task = await self._handle()
        return await asyncio.to_thread(functools.partial(task.result, model, checkpoint=checkpoint))

    async def trace(self, agent: str | None = None) -> list[TraceEntry]:
        """What the agents (or one) did, model turn by tool call, in the order it happened."""
        return await self._call(Task.trace, agent)

    async def failures(self, agent: str | None = None) -> list[StepFailure]:
        """`Task.failures`."""
        return await self._call(Task.failures, agent)

    async def logs(
        self, agent: str | None = None, *, after: str | None = None, wait: float = 0.0
    ) -> list[LogLine]:
        """`Task.logs`: a `wait` holds a thread while Redis blocks (2 s at most)."""
        return await self._call(Task.logs, agent, after=after, wait=wait)

    async def timeline(self) -> Timeline:
        """Steps, checkpoints, retries and restores, as the HTML timeline draws them."""
        return await self._call(Task.timeline)

    async def approvals(self) -> list[PendingCall]:
        """The task's tool calls waiting for a person (agents in team order)."""
        return await self._call(Task.approvals)

    async def approve(self, agent: str, call: str | None = None) -> Decision:
        """Let `agent` make its tool call that waits for a person (`call`, or the first)."""
        return await self._call(Task.approve, agent, call)

    async def reject(self, agent: str, call: str | None = None, *, reason: str) -> Decision:
        """Refuse `agent`'s waiting tool call; the model reads `reason` as its result."""
        return await self._call(Task.reject, agent, call, reason=reason)

    async def pause(self) -> TaskStatus:
        """Start no more supersteps (the one in flight finishes); return the status."""
        return await self._call(Task.pause)

    async def resume(self) -> TaskStatus:
        """Start supersteps again; return the status."""
        return await self._call(Task.resume)

    async def budget(self, *, tokens: int | None = None, cost_usd: float | None = None) -> Budget:
        """Set the budget (the limits given; the others kept); return it (`Task.budget`)."""
        return await self._call(Task.budget, tokens=tokens, cost_usd=cost_usd)

    async def member_budget(
        self,
        agent: str,
        *,
        tokens: int | None = None,
        cost_usd: float | None = None,
        steps: int | None = None,
    ) -> MemberBudget:
        """Set the budget of `agent`'s subtree; return it (`Task.member_budget`)."""
        return await self._call(Task.member_budget, agent, tokens=tokens, cost_usd=cost_usd,
                                steps=steps)  # fmt: skip

    async def cancel(self) -> TaskStatus:
        """End the task now (its running steps are fenced); return the status."""
        return await self._call(Task.cancel)

    async def archive(self) -> list[ArchiveReport]:
        """Archive every committed checkpoint still only in Redis, oldest first."""
        return await self._call(Task.archive)

    async def forget(self) -> int:
        """Remove this ended task from Redis, archived first; return how many keys went.

        Its checkpoints stay in the archive; `status` then raises `TaskNotFound`. Refused
        (`InvalidSpec`) while the task runs or is being restored (`Task.forget`).
        """
        return await self._call(Task.forget)
