"""The console's JSON API under `/api/`: what `cairn ... --json` prints, over HTTP.

Each answer is the JSON the matching command prints with `--json` (the same models,
through the same `plain`), and each failure `{"error": "<one line>"}`: the line `cairn`
would print, with an HTTP status for its kind (404 an unknown task, 400 bad input, 503
Redis not answering, 409 an operation that failed). Every read and change goes through
`cairn.Client` and `cairn.Task`; the calls block, so they run in Starlette's threads.
docs/console.md lists the endpoints.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import redis
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from cairn.agents.spec import parse_model
from cairn.cli.render import plain
from cairn.client import Client, Task
from cairn.coordinator.runs import TaskState
from cairn.errors import (
    CairnError,
    InvalidName,
    InvalidSpec,
    TaskNotFound,
    Timeout,
    Unavailable,
    one_line,
)

UNEXPECTED = 500  # a failure that is not one of Cairn's: a bug, said in one line
ACTIONS = ("approve", "reject", "pause", "resume", "cancel", "restore", "fork")
STATUS_OF = (  # the first kind an error is decides its HTTP status
    (TaskNotFound, 404),
    (InvalidSpec, 400),
    (InvalidName, 400),
    (ValidationError, 400),
    (Unavailable, 503),
    (redis.ConnectionError, 503),
    (redis.TimeoutError, 503),
    (Timeout, 504),
    (CairnError, 409),
)


class ActionBody(BaseModel):
    """What a POST to an action may carry (each action reads its own fields)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    agent: str | None = None  # approve, reject
    call: str | None = None  # approve, reject: default the first waiting
    reason: str | None = None  # reject
    to: int | None = None  # restore: default the latest committed
    at: int | None = None  # fork: default the latest committed


async def answer(call: Callable[[], object]) -> Response:
    """Run `call` in a thread; its result as the CLI's JSON, or its error in one line."""
    try:
        data = await run_in_threadpool(call)
    except Exception as exc:  # noqa: BLE001 - every failure is one line, as the CLI says it
        status = next((code for kind, code in STATUS_OF if isinstance(exc, kind)), UNEXPECTED)
        if status == UNEXPECTED:
            return error(status, f"unexpected {type(exc).__name__}: {one_line(exc)}")
        return error(status, one_line(exc))
    return JSONResponse(plain(data))


def error(status: int, reason: str) -> JSONResponse:
    """The API's error answer."""
    return JSONResponse({"error": reason}, status_code=status)


def _number(request: Request, name: str) -> int | None:
    """A checkpoint number from the query (`?a=3`), None when absent; `InvalidSpec` if bad."""
    text = request.query_params.get(name)
    if text in (None, ""):
        return None
    if not text.isdigit():
        raise InvalidSpec(f"{name}: {text!r} is not a checkpoint number")
    return int(text)


class Api:
    """The endpoints, over one `Client`."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def routes(self) -> list[BaseRoute]:
        """The API's routes, under `/api/`."""
        return [
            Route("/api/tasks", self.tasks),
            Route("/api/approvals", self.approvals),
            Route("/api/tasks/{task}", self.status),
            Route("/api/tasks/{task}/checkpoints", self.checkpoints),
            Route("/api/tasks/{task}/checkpoints/{number:int}", self.checkpoint),
            Route("/api/tasks/{task}/diff", self.diff),
            Route("/api/tasks/{task}/approvals", self.task_approvals),
            Route("/api/tasks/{task}/trace", self.trace),
            Route("/api/tasks/{task}/live", self.live),
            Route("/api/tasks/{task}/{action}", self.act, methods=["POST"]),
        ]

    def _task(self, request: Request) -> Task:
        return self.client.task(request.path_params["task"])

    async def tasks(self, request: Request) -> Response:
        """`cairn list --json`; `?state=` keeps the tasks in that state."""
        wanted = request.query_params.get("state") or None

        def listed() -> object:
            if wanted is not None and wanted not in {s.value for s in TaskState}:
                raise InvalidSpec(f"state: {wanted!r} is not one of the task states")
            return [s for s in self.client.tasks() if wanted in (None, s.state.value)]

        return await answer(listed)

    async def approvals(self, request: Request) -> Response:
        """`cairn approvals --json`: every waiting tool call of every task not ended."""
        return await answer(self.client.approvals)

    async def status(self, request: Request) -> Response:
        """`cairn status TASK --json`."""
        return await answer(lambda: self._task(request).status())

    async def checkpoints(self, request: Request) -> Response:
        """`cairn checkpoints TASK --json`."""
        return await answer(lambda: self._task(request).checkpoints())

    async def checkpoint(self, request: Request) -> Response:
        """`cairn checkpoint TASK N --json`."""
        number: int = request.path_params["number"]
        return await answer(lambda: self._task(request).checkpoint(number))

    async def diff(self, request: Request) -> Response:
        """`cairn diff TASK A B --json`; `?other=TASK` compares with another task's `b`."""

        def compared() -> object:
            task = self._task(request)
            other = request.query_params.get("other")
            theirs = None if not other else self.client.task(other)
            return task.diff(_number(request, "a"), _number(request, "b"), other=theirs)

        return await answer(compared)

    async def task_approvals(self, request: Request) -> Response:
        """`cairn approvals TASK --json`."""
        return await answer(lambda: self._task(request).approvals())

    async def trace(self, request: Request) -> Response:
        """`cairn trace TASK [--agent A] --json`."""
        agent = request.query_params.get("agent") or None
        return await answer(lambda: self._task(request).trace(agent))

    async def live(self, request: Request) -> Response:
        """The replies the task's agents are streaming now: `live` of `cairn watch --json`."""
        return await answer(lambda: self._task(request).live_replies())

    async def act(self, request: Request) -> Response:
        """POST an action; the answer is what the command prints with `--json`."""
        action = request.path_params["action"]
        if action not in ACTIONS:
            return error(404, f"no action {action!r}: one of {', '.join(ACTIONS)}")
        raw = await request.body()
        try:
            data: Any = json.loads(raw) if raw.strip() else {}
        except ValueError:
            return error(400, "the body is not JSON")
        return await answer(lambda: self._do(self._task(request), action, data))

    def _do(self, task: Task, action: str, data: object) -> object:
        """Do `action` as the command of that name does it; return its `--json` answer."""
        body = parse_model(ActionBody, data, action)
        if action in {"approve", "reject"}:
            if body.agent is None:
                raise InvalidSpec(f"{action}: name the agent")
            if action == "approve":
                return task.approve(body.agent, body.call)
            if not body.reason:
                raise InvalidSpec("reject: give a reason (the model reads it)")
            return task.reject(body.agent, body.call, reason=body.reason)
        if action == "restore":
            return task.restore(body.to)
        if action == "fork":
            new = task.fork(body.at)
            return {"task_id": new.id, "forked_from": new.status().forked_from}
        if action == "cancel" and (current := task.status()).ended:
            raise InvalidSpec(f"task {task.id} is {current.state.value} already")
        after = {"pause": task.pause, "resume": task.resume, "cancel": task.cancel}[action]()
        return {"task_id": task.id, "status": after.state}
