"""The public Python API, `cairn`, against a real redis-server, coordinator and worker.

One private stack serves the module: a redis-server, a `cairn coordinator` and a
`cairn worker` process; the tests drive them only through `cairn.Client`.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import pkgutil
import re
import subprocess
import sys
import threading
import time
import types
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from pydantic import ValidationError

import cairn
import cairn.errors
from cairn import (
    AgentState,
    CheckpointDetail,
    CheckpointInfo,
    Client,
    RestoreResult,
    Task,
    TaskSpec,
    TaskState,
    TaskStatus,
    TraceEntry,
)
from cairn.errors import (
    CairnError,
    CheckpointNotFound,
    InvalidSpec,
    TaskNotFound,
    Timeout,
    Unavailable,
)
from cairn.storage.records import TraceRecord
from cairn.testing.redis_server import RedisServer, free_port
from tests.cli_harness import private_stack
from tests.cluster import TEAM

ROOT = Path(__file__).resolve().parents[1]
AGENTS = ["planner", "coder", "reviewer"]


class Stack:
    """The module's Redis, with a coordinator and a worker process on it."""

    def __init__(self, url: str, tmp: Path) -> None:
        self.url, self.tmp = url, tmp

    def spec(self, name: str, slow: float = 0.0) -> Path:
        """Write the three-agent team's spec (tests/cluster.py) and return its path."""
        path = self.tmp / f"{name}.yaml"
        ledger = self.tmp / f"{name}.ledger"
        path.write_text(TEAM.replace("LEDGER", str(ledger)).replace("SLOW", str(slow)))
        return path

    def client(self) -> Client:
        """A client of the stack's Redis and archive, configured by arguments alone."""
        return Client(redis_url=self.url, archive_dir=self.tmp / "archive")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A private redis-server, `cairn coordinator` and `cairn worker` for the module."""
    tmp = tmp_path_factory.mktemp("api")
    with private_stack(tmp, "api-test") as (url, _env):
        yield Stack(url, tmp)


@pytest.fixture
def client(stack: Stack) -> Iterator[Client]:
    """A client of the stack, closed after the test."""
    with stack.client() as opened:
        yield opened


@pytest.fixture(scope="module")
def finished(stack: Stack) -> tuple[Task, TaskStatus]:
    """The team's task, submitted from its file and waited for."""
    with stack.client() as opened:
        task = opened.submit(stack.spec("team"))
        return task, task.wait(timeout=60)


# the facade -------------------------------------------------------------------------------
def test_the_facade_promises_exactly_its_all() -> None:
    """Every name in `cairn.__all__` exists and `dir` lists it; no other public name is there."""
    assert set(cairn.__all__) <= set(dir(cairn))
    for name in cairn.__all__:
        assert hasattr(cairn, name), name
    public = {
        name
        for name, value in vars(cairn).items()  # every name of `__all__` imported by now
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public | {"__version__", "errors"} == set(cairn.__all__)
    assert isinstance(cairn.__version__, str)
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = cairn.Nope  # type: ignore[attr-defined]


# What a fresh interpreter reports of the facade's names once their defining modules, and
# nothing else of Cairn's, are imported: each name's module, and a model's schema title.
NAMES_WHEREVER_FIRST_REACHED = """
import importlib, json, sys
homes = json.loads(sys.argv[1])
found = {}
for name, home in homes.items():
    value = getattr(importlib.import_module(home), name)
    title = value.model_json_schema()["title"] if hasattr(value, "model_json_schema") else None
    found[name] = [value.__module__, repr(value), title]
print(json.dumps(found))
"""


def test_every_name_of_the_facade_says_cairn_however_it_is_first_reached() -> None:
    """`cairn.TaskStatus`, not its engine module, in reprs, even before the facade names it."""
    homes = dict(cairn._HOMES)
    done = subprocess.run(
        [sys.executable, "-c", NAMES_WHEREVER_FIRST_REACHED, json.dumps(homes)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    found = json.loads(done.stdout)
    assert set(cairn.__all__) - {"__version__", "errors"} == found.keys()
    for name, (module, shown, title) in found.items():
        assert "cairn" == module, name
        said = (f"<class 'cairn.{name}'>", f"<enum '{name}'>", f"<function {name} ")
        assert shown.startswith(said), f"{name}: {shown}"
        assert title in (None, name), name
    assert "cairn.errors" == cairn.errors.InvalidSpec.__module__


def test_the_models_the_facade_names_still_validate_and_resolve_their_types() -> None:
    """A validation error names the model; type hints resolve; a subclass is a model."""
    with pytest.raises(ValidationError, match=r"validation error for RestoreResult"):
        RestoreResult.model_validate({"restored_to": "x", "epoch": 1, "checkpoint": 2})
    assert TaskState == typing.get_type_hints(TaskStatus)["state"]
    assert typing.get_type_hints(cairn.ToolContext)  # a dataclass's, from its own module
    assert TaskSpec.model_json_schema()["$defs"]

    class Mine(RestoreResult):
        note: str = ""

    assert "x" == Mine(restored_to=1, epoch=2, checkpoint=3, note="x").note


def test_the_trace_entry_is_the_trace_record_with_its_agent() -> None:
    """`TraceEntry` has a stored trace record's fields, in order, after the agent's name."""
    stored = [n for n, f in TraceRecord.model_fields.items() if not f.exclude]
    assert ["agent", *(n for n in stored if n != "schema_version")] == list(TraceEntry.model_fields)


def test_the_clients_plumbing_is_private(client: Client) -> None:
    """A `Client` promises its settings and URL; its Redis connection and store are its own."""
    for name in ("redis", "store", "control", "priced"):
        assert not hasattr(client, name), name


def _classes(hint: object) -> Iterator[type]:
    """The classes a type hint names, through unions and generics."""
    if isinstance(hint, type) and not typing.get_args(hint):
        yield hint
    for arg in typing.get_args(hint):
        yield from _classes(arg)
    origin = typing.get_origin(hint)
    if isinstance(origin, type):
        yield origin


def test_every_type_the_api_hands_out_is_exported() -> None:
    """The results and arguments of the clients' and tasks' calls are types `cairn` exports."""
    exported = {id(getattr(cairn, name)) for name in cairn.__all__}
    ours = ("cairn",)
    for cls in (Client, Task, cairn.AsyncClient, cairn.AsyncTask):
        for name, method in inspect.getmembers(cls, inspect.isfunction):
            if name.startswith("_"):
                continue
            for hint in typing.get_type_hints(method).values():
                for found in _classes(hint):
                    if found.__module__.split(".")[0] in ours:
                        assert id(found) in exported, f"{cls.__name__}.{name}: {found}"


def _all_modules() -> Iterator[types.ModuleType]:
    """`cairn` and every module under it (the engine's layers too) but the optional ones."""
    yield cairn
    for info in pkgutil.walk_packages(cairn.__path__, "cairn."):
        if info.name in {"cairn.langgraph", "cairn.cli.demo.project"}:
            continue  # an optional extra; the demo's bundled project
        try:
            yield importlib.import_module(info.name)
        except ImportError:  # an optional extra's module
            continue


def test_the_error_tree_has_one_root_one_home_and_is_drawn_whole() -> None:
    """Every error Cairn defines is a `CairnError` in `cairn.errors`, drawn in its tree.

    `TaskNotFound` is not bad spec input; the errors keep their builtin bases.
    """
    modules = list(_all_modules())
    defined = {
        value
        for module in modules
        for value in vars(module).values()
        if isinstance(value, type)
        and issubclass(value, CairnError)
        and value.__module__.split(".")[0] == "cairn"
    }
    assert {CairnError, InvalidSpec, TaskNotFound, Unavailable, Timeout} <= defined
    for error in defined:
        assert "cairn.errors" == error.__module__, error
        assert error is getattr(cairn.errors, error.__name__), error
        assert re.search(rf"(^|\s){error.__name__}\s", cairn.errors.__doc__ or "", re.MULTILINE)
    assert set(cairn.errors.__all__) == {error.__name__ for error in defined}
    assert not issubclass(TaskNotFound, InvalidSpec)
    assert issubclass(Unavailable, ConnectionError)
    assert issubclass(Timeout, TimeoutError)
    assert issubclass(cairn.errors.ArchiveError, OSError)
    assert issubclass(cairn.errors.RecordNotFound, LookupError)
    assert issubclass(cairn.errors.InvalidName, ValueError)


def test_the_langgraph_saver_is_the_storage_one_signing_with_the_settings_key(
    monkeypatch: pytest.MonkeyPatch, redis_client: redis.Redis
) -> None:
    """`cairn.langgraph.CairnSaver` is `cairn.storage.langgraph`'s, signing with the key."""
    pytest.importorskip("langgraph.checkpoint.base")
    saver = importlib.import_module("cairn.langgraph").CairnSaver
    assert issubclass(saver, importlib.import_module("cairn.storage.langgraph").CairnSaver)
    monkeypatch.setenv("CAIRN_SIGNING_KEY", "s3cret-" + "k" * 32)
    assert saver(redis_client).codec.signs
    monkeypatch.delenv("CAIRN_SIGNING_KEY")
    assert not saver(redis_client).codec.signs


# a task, through the API -----------------------------------------------------------------
def test_submit_a_file_and_wait_for_a_typed_status(finished: tuple[Task, TaskStatus]) -> None:
    """`wait` returns the final status: a model with a `TaskState`, agents and checkpoint."""
    task, status = finished
    assert (task.id, TaskState.SUCCEEDED, True) == (status.task_id, status.state, status.ended)
    assert set(AGENTS) == {agent.name for agent in status.agents}
    assert all(isinstance(agent.status, AgentState) for agent in status.agents)
    assert (3, 3, 1) == (status.superstep, status.latest_checkpoint, status.epoch)
    assert "succeeded" == status.model_dump(mode="json")["status"]  # the JSON name
    assert "state" not in status.model_dump(mode="json")


def test_checkpoints_workspace_export_and_trace(
    finished: tuple[Task, TaskStatus], client: Client, tmp_path: Path
) -> None:
    """A handle from `client.task` reads every GC, any GC's files, and the trace."""
    task = client.task(finished[0].id)
    checkpoints = task.checkpoints()
    assert all(isinstance(c, CheckpointInfo) for c in checkpoints)
    assert [0, 1, 2, 3] == [c.number for c in checkpoints]
    assert all(c.cold and c.status == "COMMITTED" for c in checkpoints)
    assert {"greet.py": b"print('hi')\n"} == task.workspace(checkpoint=0)
    assert b"Looks good.\n" == task.workspace()["REVIEW.md"]
    export = task.export(tmp_path / "out", checkpoint=2)
    assert (2, ["PLAN.md", "greet.py"]) == (export.checkpoint, export.files)
    assert b"1. say Hello\n" == (tmp_path / "out" / "PLAN.md").read_bytes()
    trace = task.trace()
    assert all(isinstance(r, TraceEntry) for r in trace)
    assert ("coder", "write_file") in [(r.agent, r.tool) for r in trace if r.tool]
    assert all(r.agent == "reviewer" for r in task.trace("reviewer"))
    detail = task.checkpoint(2)
    assert isinstance(detail, CheckpointDetail)
    assert (2, ["PLAN.md", "greet.py"]) == (detail.number, list(detail.files))
    assert set(AGENTS) == {m.name for m in detail.agents}
    assert all(isinstance(m.status, AgentState) for m in detail.agents)
    with pytest.raises(CheckpointNotFound, match="no checkpoint 9"):
        task.workspace(checkpoint=9)


def test_restore_then_the_task_plays_on_to_the_same_end(stack: Stack, client: Client) -> None:
    """`restore(to=1)` raises the epoch and records a new GC; the task ends as before."""
    task = client.submit(stack.spec("restored"))
    assert TaskState.SUCCEEDED == task.wait(timeout=60).state
    restored = task.restore(to=1)
    assert RestoreResult(restored_to=1, epoch=2, checkpoint=4) == restored
    final = task.wait(timeout=60)
    assert (TaskState.SUCCEEDED, 2) == (final.state, final.epoch)
    assert b"Looks good.\n" == task.workspace()["REVIEW.md"]


def test_pause_resume_cancel_and_a_wait_that_runs_out(stack: Stack, client: Client) -> None:
    """A slow task waits past its timeout (`Timeout`), pauses, resumes and is cancelled."""
    task = client.submit(stack.spec("steered", slow=1.0))
    with pytest.raises(Timeout, match=r"after 0\.2 s"):
        task.wait(timeout=0.2)
    assert TaskState.PAUSED == task.pause().state
    with pytest.raises(InvalidSpec, match="is paused, not running"):
        task.pause()
    assert TaskState.RUNNING == task.resume().state
    cancelled = task.cancel()
    assert (TaskState.CANCELLED, "cancelled by a person") == (cancelled.state, cancelled.reason)
    assert cancelled.ended


def test_a_wait_outlives_redis_gone_for_seconds_and_says_a_longer_outage(tmp_path: Path) -> None:
    """`wait` waits out a Redis SIGKILLed and started again 5 s later; gone `outage` s, it says so.

    5 s is past redis-py's own retries (4.3 s at most), so status reads fail meanwhile. No
    coordinator runs: the task ends when a person cancels it, once Redis is back.
    """
    server = RedisServer(tmp_path / "redis", appendonly=True, fsync="always").start()
    spec = Stack("", tmp_path).spec("waited")
    client = Client(redis_url=server.url, archive_dir=tmp_path / "archive")
    task = client.submit(spec)

    def outage() -> None:
        server.kill()
        time.sleep(5.0)
        server.start()
        task.cancel()

    seen: list[TaskState] = []
    thread = threading.Thread(target=outage)
    try:
        assert TaskState.RUNNING == task.status().state
        thread.start()
        final = task.wait(timeout=120, on_status=lambda s: seen.append(s.state))
        assert TaskState.CANCELLED == final.state
        assert TaskState.CANCELLED == seen[-1]
        other = client.submit(spec)
        server.kill()
        with pytest.raises(Unavailable, match="Redis stopped answering"):
            other.wait(timeout=120, outage=1.0)
    finally:
        if thread.is_alive():
            thread.join()  # it starts Redis again: only then is the server killed for good
        server.kill()


def test_forget_removes_an_ended_task_from_redis_and_its_archive_stays(
    stack: Stack, client: Client
) -> None:
    """`forget`: refused while the task runs or is restored; after, no key of it is left.

    What it committed is read from the archive, and a fork of it runs to the same end. A
    key a late step wrote afterwards goes when the task is forgotten again.
    """
    task = client.submit(stack.spec("forgotten", slow=0.5))
    with pytest.raises(InvalidSpec, match="only an ended task can be forgotten"):
        task.forget()
    final = task.wait(timeout=60)
    assert TaskState.SUCCEEDED == final.state
    files = task.workspace()
    raw = redis.Redis.from_url(stack.url)
    prefix = f"cairn:{{{task.id}}}:*"
    assert raw.exists(f"cairn:{{{task.id}}}:run")
    raw.set(f"cairn:{{{task.id}}}:restore-lock", "someone", px=60_000)
    with pytest.raises(InvalidSpec, match="is being restored"):
        task.forget()
    assert raw.exists(f"cairn:{{{task.id}}}:run")
    raw.delete(f"cairn:{{{task.id}}}:restore-lock")
    removed = task.forget()
    assert removed > 10  # run state, GCs, LCs, blobs, spend, trace, ...
    assert [] == list(raw.scan_iter(match=prefix, count=1_000))
    assert task.id not in [s.task_id for s in client.tasks()]
    with pytest.raises(TaskNotFound, match="only its archive is left"):
        task.status()
    assert files == task.workspace(final.latest_checkpoint)
    fork = client.task(task.id).fork(at=final.latest_checkpoint)
    assert TaskState.SUCCEEDED == fork.wait(timeout=60).state
    assert files == fork.workspace()
    assert [] == sorted(raw.scan_iter(match=prefix, count=1_000))
    raw.hincrby(f"cairn:{{{task.id}}}:spend", "coder:calls", 1)  # a late step's count
    assert 1 == task.forget()
    with pytest.raises(TaskNotFound, match="only its archive is left"):
        task.forget()


def test_a_spec_as_a_model_or_a_mapping_and_the_list_of_tasks(stack: Stack, client: Client) -> None:
    """`submit` takes a `TaskSpec` or a dict; `tasks()` lists the newest first."""
    fields = {
        "name": "Inline",
        "goal": "Say hello.",
        "files": {"a.txt": "a\n"},
        "agents": [{"name": "solo", "model": "scripted", "script": [{"say": "Done."}]}],
    }
    first = client.submit(fields)
    second = client.submit(TaskSpec.model_validate(fields))
    for task in (first, second):
        assert TaskState.SUCCEEDED == task.wait(timeout=60).state
    listed = [status.task_id for status in client.tasks()]
    assert listed.index(second.id) < listed.index(first.id)
    assert all(isinstance(status, TaskStatus) for status in client.tasks())
    with pytest.raises(InvalidSpec, match="agents"):
        client.submit({**fields, "agents": []})


def test_unknown_tasks_and_an_unreachable_redis_raise_their_errors(
    client: Client, stack: Stack
) -> None:
    """An unknown id is `TaskNotFound`; a Redis that does not answer is `Unavailable`."""
    with pytest.raises(TaskNotFound, match="unknown task 'no-such-task'"):
        client.task("no-such-task")
    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    with pytest.raises(Unavailable, match=r"redis://:\*\*\*@127\.0\.0\.1") as raised:
        Client(redis_url=url, archive_dir=stack.tmp / "archive")
    assert "hunter2" not in str(raised.value)


def test_a_client_configured_by_the_environment(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, finished: tuple[Task, TaskStatus]
) -> None:
    """`Client()` reads CAIRN_REDIS_URL and CAIRN_ARCHIVE_DIR."""
    monkeypatch.setenv("CAIRN_REDIS_URL", stack.url)
    monkeypatch.setenv("CAIRN_ARCHIVE_DIR", str(stack.tmp / "archive"))
    with Client() as configured:
        assert TaskState.SUCCEEDED == configured.task(finished[0].id).status().state
        assert configured.has_coordinator()


SESSION = """
import logging, sys
url, archive, spec, mode = sys.argv[1:]
if mode == "logging":  # the program asks for its libraries' logs, as it would for httpx's
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
from cairn import Client
with Client(redis_url=url, archive_dir=archive) as client:
    task = client.submit(spec)
    task.restore(to=0)
    task.cancel()
"""


def test_the_client_in_a_python_session_prints_no_logs(stack: Stack) -> None:
    """A library stays quiet: `Client` logs nothing until the program configures logging.

    Asked for (`logging.basicConfig`), its events come through `logging`, by module.
    """

    def session(mode: str) -> subprocess.CompletedProcess[str]:
        spec = stack.spec(f"quiet-{mode}", slow=5.0)  # still running when it is cancelled
        argv = [stack.url, str(stack.tmp / "archive"), str(spec), mode]
        done = subprocess.run(
            [sys.executable, "-c", SESSION, *argv],
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert 0 == done.returncode, done.stderr
        return done

    quiet = session("plain")
    assert ("", "") == (quiet.stdout, quiet.stderr)
    told = session("logging")
    assert "" == told.stdout
    assert "cairn.coordinator.tasks: task submitted task=" in told.stderr
    assert "cairn.coordinator.restore: task restored task=" in told.stderr
