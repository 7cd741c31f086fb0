"""`cairn.AsyncClient` against a real redis-server, coordinator and worker process.

One `LocalCairn` (a private Redis, a coordinator and a worker process) serves the module;
each test drives it from `asyncio.run`, through `AsyncClient` and `AsyncTask` alone.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import re
import subprocess
import sys
import typing
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cairn import (
    AsyncClient,
    AsyncTask,
    CheckpointDetail,
    Client,
    Decision,
    Diff,
    RestoreResult,
    Task,
    TaskState,
    TaskStatus,
)
from cairn.errors import CheckpointNotFound, InvalidSpec, NoResult, TaskNotFound, Unavailable
from cairn.testing import LocalCairn
from cairn.testing.redis_server import free_port

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "python.md"
LIMIT = 30.0  # seconds any one task of these may take, at most


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCairn]:
    """A private Redis, a coordinator and one worker process for the module."""
    with LocalCairn(tmp_path_factory.mktemp("aio"), workers=1) as started:
        yield started


def run(local: LocalCairn, test: Callable[[AsyncClient], Awaitable[None]]) -> None:
    """Run `test` in an event loop of its own with a client of the module's deployment."""

    async def session() -> None:
        async with AsyncClient(local.url, settings=local.settings) as client:
            await test(client)

    asyncio.run(session())


def write(path: str, content: str) -> dict[str, object]:
    """A scripted `write_file` call."""
    return {"name": "write_file", "args": {"path": path, "content": content}}


def counter(name: str, latency: float = 0.0, approve: tuple[str, ...] = ()) -> dict[str, object]:
    """One scripted agent writing n.txt twice, then finishing: GCs 0 to 3, three supersteps."""
    script = [
        {"say": "One.", "latency": latency, "tools": [write("n.txt", "1\n")]},
        {"say": "Two.", "latency": latency, "tools": [write("n.txt", "2\n")]},
        {
            "say": "Done.",
            "latency": latency,
            "tools": [{"name": "finish", "args": {"summary": "two"}}],
        },
    ]
    agent = {"name": "counter", "model": "scripted", "script": script, "approve": list(approve)}
    return {"name": name, "goal": "Count to two.", "files": {"n.txt": "0\n"}, "agents": [agent]}


async def until(task: AsyncTask, state: TaskState) -> TaskStatus:
    """Read the task's status until it is `state`."""
    async with asyncio.timeout(LIMIT):
        while (status := await task.status()).state is not state:
            await asyncio.sleep(0.05)
        return status


# the shape ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("sync", "twin"), [(Client, AsyncClient), (Task, AsyncTask)])
def test_every_call_has_an_async_twin_with_its_arguments_and_results(
    sync: type, twin: type
) -> None:
    """Each public call of `Client` and `Task` has a coroutine twin of its name and shape.

    The same arguments and results (a `Task` becomes an `AsyncTask`); `close` is `aclose`.
    """
    swapped = {Task: AsyncTask, Client: AsyncClient}
    for name, call in inspect.getmembers(sync, inspect.isfunction):
        if name.startswith("_"):
            continue
        mine = getattr(twin, "aclose" if name == "close" else name)
        assert inspect.iscoroutinefunction(mine), name
        ours, theirs = (
            [(p.name, p.kind, p.default) for p in inspect.signature(f).parameters.values()]
            for f in (call, mine)
        )
        assert ours == theirs, name
        hints = typing.get_type_hints(call)
        expected = {k: swapped.get(v, v) for k, v in hints.items()}
        if "other" in expected:  # `diff`'s other task
            expected["other"] = AsyncTask | None
        assert expected == typing.get_type_hints(mine), name
        assert mine.__doc__, name


# a task, awaited ---------------------------------------------------------------------------
def test_submit_wait_restore_fork_and_diff_awaited(local: LocalCairn, tmp_path: Path) -> None:
    """The sync calls' results, awaited: restore, fork and diff agree with each other.

    A restore to GC 1 plays on to the same end, a fork of GC 1 too, and `diff` finds no
    file between them; a task that declares no result says so (`NoResult`).
    """

    async def test(client: AsyncClient) -> None:
        task = await client.submit(counter("awaited"))
        final = await task.wait(timeout=LIMIT)
        assert (TaskState.SUCCEEDED, 3, 1) == (final.state, final.latest_checkpoint, final.epoch)
        assert task == await client.task(task.id)
        assert [0, 1, 2, 3] == [c.number for c in await task.checkpoints()]
        detail = await task.checkpoint(1)
        assert isinstance(detail, CheckpointDetail)
        assert b"1\n" == (await task.workspace(1))["n.txt"]

        restored = await task.restore(to=1)
        assert RestoreResult(restored_to=1, epoch=2, checkpoint=4) == restored
        again = await task.wait(timeout=LIMIT)
        assert (TaskState.SUCCEEDED, 2) == (again.state, again.epoch)
        assert b"2\n" == (await task.workspace())["n.txt"]

        fork = await task.fork(at=1)
        assert isinstance(fork, AsyncTask)
        assert fork.id != task.id
        forked, mine = await asyncio.gather(fork.wait(timeout=LIMIT), task.status())
        assert TaskState.SUCCEEDED == forked.state
        assert forked.forked_from is not None
        assert (task.id, 1) == (forked.forked_from.task_id, forked.forked_from.checkpoint)
        assert again == mine  # the fork left this task as it was

        changed = await task.diff(1, 2)
        assert isinstance(changed, Diff)
        assert ["n.txt"] == list(changed.files.changed)
        assert changed.agents["counter"].tool_calls_added
        same = await task.diff(None, None, other=fork)
        assert ({}, [], []) == (same.files.changed, same.files.added, same.files.removed)

        exported = await task.export(tmp_path / "out", checkpoint=2)
        assert b"2\n" == (tmp_path / "out" / "n.txt").read_bytes()
        assert ["n.txt"] == exported.files
        assert ["write_file", "write_file", "finish"] == [
            entry.tool for entry in await task.trace("counter") if entry.tool
        ][:3]
        assert (await task.timeline()).cells
        assert {} == await task.live_replies()
        with pytest.raises(NoResult):
            await task.result()
        assert task.id in [status.task_id for status in await client.tasks()]

    run(local, test)


def test_an_approval_awaited_and_a_rejection(local: LocalCairn) -> None:
    """A write in `approve` waits for a person: approved it runs, rejected it does not."""

    async def test(client: AsyncClient) -> None:
        task = await client.submit(counter("approved", approve=("write_file",)))
        await until(task, TaskState.WAITING_APPROVAL)
        queue = await client.approvals()
        assert [(task.id, "counter", "write_file")] == [
            (c.task_id, c.agent, c.tool) for c in queue if c.task_id == task.id
        ]
        assert [c for c in queue if c.task_id == task.id] == await task.approvals()
        decision = await task.approve("counter")
        assert isinstance(decision, Decision)
        assert (True, "n.txt") == (decision.approved, decision.arguments["path"])
        async with asyncio.timeout(LIMIT):  # the first write runs; the second waits
            while [] == (waiting := await task.approvals()) or decision.call == waiting[0].call:
                await asyncio.sleep(0.05)
        assert "2\n" == waiting[0].arguments["content"]
        refused = await task.reject("counter", reason="one is enough")
        assert not refused.approved
        final = await task.wait(timeout=LIMIT)
        assert TaskState.SUCCEEDED == final.state
        assert b"1\n" == (await task.workspace())["n.txt"]
        assert [] == await task.approvals()

    run(local, test)


def test_wait_leaves_the_loop_free(local: LocalCairn) -> None:
    """While `wait` follows a slow task, another coroutine of the loop goes on ticking."""

    async def test(client: AsyncClient) -> None:
        task = await client.submit(counter("slow", latency=0.5))
        ticks = 0
        at_reads: list[int] = []  # the ticks counted by each status read of `wait`

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        ticking = asyncio.create_task(tick())
        final = await task.wait(timeout=LIMIT, on_status=lambda _: at_reads.append(ticks))
        ticking.cancel()
        assert TaskState.SUCCEEDED == final.state
        assert len(at_reads) > 2
        assert at_reads[-1] - at_reads[0] > 0  # ticks counted between the first and last read

    run(local, test)


def test_a_cancelled_wait_stops_at_once_and_leaves_the_task_running(local: LocalCairn) -> None:
    """A cancelled `wait` raises `CancelledError` at once; the task runs on, unchanged.

    Sleeping 60 s between reads, the wait holds no thread: with one thread for the loop,
    other calls run meanwhile. Only `cancel` ends the task.
    """

    async def test(client: AsyncClient) -> None:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(1))
        task = await client.submit(counter("waited", latency=2.0))
        waiter = asyncio.create_task(task.wait(poll=60.0))
        await asyncio.sleep(0.3)  # the wait has read once and sleeps
        async with asyncio.timeout(5.0):  # the one thread is free
            before = await task.status()
        waiter.cancel()
        done, _ = await asyncio.wait({waiter}, timeout=2.0)
        assert {waiter} == done
        with pytest.raises(asyncio.CancelledError):
            waiter.result()
        after = await task.status()
        assert (TaskState.RUNNING, TaskState.RUNNING) == (before.state, after.state)
        assert (before.epoch, before.reason, False) == (after.epoch, after.reason, after.restoring)
        cancelled = await task.cancel()
        assert (TaskState.CANCELLED, True) == (cancelled.state, cancelled.ended)
        assert TaskState.CANCELLED == (await task.wait(timeout=LIMIT)).state

    run(local, test)


def test_steering_pause_resume_and_budget_awaited(local: LocalCairn) -> None:
    """`pause`, `resume` and `budget` return what the sync calls return; the task ends."""

    async def test(client: AsyncClient) -> None:
        task = await client.submit(counter("steered", latency=0.3))
        assert TaskState.PAUSED == (await task.pause()).state
        with pytest.raises(InvalidSpec, match="is paused, not running"):
            await task.pause()
        assert 1_000_000 == (await task.budget(tokens=1_000_000)).tokens
        assert TaskState.RUNNING == (await task.resume()).state
        assert TaskState.SUCCEEDED == (await task.wait(timeout=LIMIT)).state

    run(local, test)


# errors and the connection -----------------------------------------------------------------
def test_the_sync_errors_come_from_the_awaited_calls(local: LocalCairn) -> None:
    """An unknown task is `TaskNotFound` and an absent checkpoint `CheckpointNotFound`, awaited.

    Two first calls at once of a client not yet connected both succeed.
    """

    async def test(client: AsyncClient) -> None:
        with pytest.raises(TaskNotFound, match="unknown task 'no-such-task'"):
            await client.task("no-such-task")
        with pytest.raises(TaskNotFound, match="unknown task 'no-such-task'"):
            await AsyncTask(client, "no-such-task").status()
        task = await client.submit(counter("errors"))
        with pytest.raises(CheckpointNotFound, match="no checkpoint 99"):
            await task.restore(to=99)
        fresh = AsyncClient(local.url, settings=local.settings)
        lists = await asyncio.gather(fresh.tasks(), fresh.tasks(), fresh.has_coordinator())
        assert task.id in [s.task_id for s in lists[0]]
        await fresh.aclose()
        await task.wait(timeout=LIMIT)

    run(local, test)


def test_an_unreachable_redis_is_unavailable_on_connecting(
    local: LocalCairn, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`async with` says the Redis does not answer (`Unavailable`), its password hidden.

    Building the client does no I/O; no Redis configured at all is `Unavailable` at once,
    as for `Client`.
    """
    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    client = AsyncClient(redis_url=url, archive_dir=tmp_path / "archive")
    assert url == client.url
    assert repr(client).startswith("AsyncClient('redis://:***@127.0.0.1:")
    for name in ("redis", "store", "control", "client"):  # its plumbing is its own
        assert not hasattr(client, name), name

    async def enter() -> None:
        async with client:
            raise AssertionError("connected to no Redis")

    with pytest.raises(Unavailable, match=r"redis://:\*\*\*@127\.0\.0\.1") as raised:
        asyncio.run(enter())
    assert "hunter2" not in str(raised.value)
    monkeypatch.delenv("CAIRN_REDIS_URL", raising=False)
    monkeypatch.setenv("CAIRN_STATE_DIR", str(tmp_path / "state"))
    with pytest.raises(Unavailable, match="no Redis configured"):
        AsyncClient()


# the docs ----------------------------------------------------------------------------------
def docs_example() -> str:
    """The Python block of docs/python.md's "In an event loop" section."""
    section = DOC.read_text().split("## In an event loop", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```python\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)
    assert blocks, f"{DOC} shows no example in an event loop"
    return str(blocks[0])


def test_the_docs_example_runs(local: LocalCairn) -> None:
    """docs/python.md's example, run as a program, prints its task's end and checkpoints.

    Configured by the environment alone; it prints nothing else.
    """
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "CAIRN_REDIS_URL": local.url,
        "CAIRN_STATE_DIR": str(local.directory),
    }
    done = subprocess.run(
        [sys.executable, "-c", docs_example()],
        env=env,
        capture_output=True,
        text=True,
        timeout=LIMIT,
        check=False,
    )
    assert (0, "") == (done.returncode, done.stderr)
    assert "succeeded [0, 1]\n" == done.stdout
