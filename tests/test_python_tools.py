"""Python functions as tools (`cairn.tool`), workers' tool registries, and tools' effects.

Steps run on a real redis-server; the tool package of `tests/toolpkg` is found through a
real `cairn.tools` entry point: the fixture lays it out as pip installs it (the module and
a dist-info beside it) in a temporary directory put on `sys.path`, which importlib.metadata
scans. Installing it into the venv instead (`pip install -e`) would outlive the test
session and hand its tools to every worker the venv runs (bench, chaos, a developer's own).
"""

from __future__ import annotations

import asyncio
import importlib
import os
import shutil
import signal
import socket
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, cast

import pytest
import redis
from pydantic import Field
from rq.exceptions import NoSuchJobError
from rq.job import Job
from rq.serializers import JSONSerializer

from cairn import tool
from cairn.agents.spec import StepPolicy
from cairn.agents.step import run_step
from cairn.agents.task import start_task
from cairn.agents.toolkit import ToolRegistry, builtin_tools, load_tools
from cairn.agents.tools import Tool, ToolContext, idempotency_key
from cairn.agents.workspace import Workspace
from cairn.coordinator.spec import TaskSpec
from cairn.errors import InvalidSpec, MissingTool, ToolError
from cairn.storage import keys
from cairn.storage.records import AgentState, Effects, Role
from cairn.storage.store import CheckpointStore
from tests.agent_harness import files_of, record, scripted
from tests.cluster import ROOT, Cluster

TOOLPKG = Path(__file__).parent / "toolpkg"


@pytest.fixture(scope="module")
def tool_package(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """`tests/toolpkg` as installed: its module and a dist-info of its entry points."""
    site = tmp_path_factory.mktemp("site-packages")
    project = tomllib.loads((TOOLPKG / "pyproject.toml").read_text())["project"]
    info = site / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
    )
    groups = project["entry-points"]
    (info / "entry_points.txt").write_text(
        "".join(
            f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in points.items())
            for group, points in groups.items()
        )
    )
    for module in ("cairn_test_tools.py", "cairn_test_agents.py"):
        shutil.copy(TOOLPKG / module, site)
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    yield site
    sys.path.remove(str(site))
    sys.modules.pop("cairn_test_tools", None)
    sys.modules.pop("cairn_test_agents", None)
    importlib.invalidate_caches()


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    """A tool context over an empty workspace."""
    workspace = Workspace(tmp_path / "cache", "t", "coder")
    return ToolContext(workspace, "coder", ["coder"], 1, StepPolicy(), task="t")


@tool
def forecast(city: str, days: Annotated[int, Field(ge=1, le=7)] = 1) -> str:
    """Tell the weather in a city.

    Only for the days to come.

    Args:
        city: the city's name, as
            people write it
        days: how many days ahead

    Returns:
        the forecast, a line a day

    """
    return "\n".join(f"{city}: sunny" for _ in range(days))


@tool(effects="external", name="stamp")
def stamp_ledger(ctx: ToolContext, label: str) -> dict[str, str]:
    """Record a label in an outside ledger, once per idempotency key.

    Args:
        ctx: the call's context
        label: what to record

    """
    return {"label": label, "key": ctx.idempotency_key, "agent": ctx.agent, "task": ctx.task}


@tool(effects="none")
async def pause(seconds: float) -> str:
    """Wait a while, without blocking an event loop.

    Args:
        seconds: how long

    """
    await asyncio.sleep(seconds)
    return f"waited {seconds:g} s"


@tool(effects="none")
def divide(a: int, b: int) -> float:
    """Divide a by b.

    Args:
        a: the dividend
        b: the divisor

    """
    return a / b


def with_tools(*tools: Tool) -> ToolRegistry:
    """The built-ins plus `tools`, as a worker told to load them has them."""
    registry = builtin_tools()
    for each in tools:
        registry.add(each, "this test")
    return registry


# the decorator -----------------------------------------------------------------------------
def test_the_schema_comes_from_the_signature_and_the_description_from_the_docstring() -> None:
    """Types, defaults and constraints make the schema; `Args:` lines describe arguments."""
    assert "forecast" == forecast.name
    assert "Tell the weather in a city.\n\nOnly for the days to come." == forecast.description
    assert Effects.EXTERNAL == forecast.effects  # the default: a tool that does not say
    assert {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "the city's name, as people write it"},
            "days": {
                "type": "integer",
                "description": "how many days ahead",
                "default": 1,
                "minimum": 1,
                "maximum": 7,
            },
        },
        "required": ["city"],
        "additionalProperties": False,
    } == forecast.parameters
    assert "Paris: sunny" == forecast("Paris")  # still the function when called


def test_name_and_effects_given_and_the_context_is_no_argument() -> None:
    """`@tool(name=..., effects=...)` is honoured; a `ToolContext` is not in the schema."""
    assert ("stamp", Effects.EXTERNAL) == (stamp_ledger.name, stamp_ledger.effects)
    assert ["label"] == list(stamp_ledger.parameters["properties"])  # type: ignore[arg-type]
    assert Effects.NONE == pause.effects


def test_a_tool_needs_a_description_typed_arguments_and_a_model_safe_name() -> None:
    """What a model could not use is refused when the tool is made, naming the culprit."""

    def undocumented(x: int) -> int:
        return x

    def untyped(x) -> int:  # type: ignore[no-untyped-def]  # noqa: ANN001 - the point
        """Untyped."""
        return 1

    with pytest.raises(TypeError, match="docstring"):
        tool(undocumented)
    with pytest.raises(TypeError, match="argument x has no type annotation"):
        tool(untyped)
    with pytest.raises(ValueError, match="tool name 'two words'"):
        tool(name="two words")(undocumented)
    with pytest.raises(ValueError, match="'sometimes'"):
        tool(effects="sometimes")(undocumented)  # type: ignore[call-overload]


def test_invalid_arguments_are_a_tool_error_naming_each_one(ctx: ToolContext) -> None:
    """Missing, wrong-typed, out-of-range and unknown arguments: one line for the model."""
    with pytest.raises(ToolError) as raised:
        forecast.run(ctx, {"days": 9, "town": "Paris"})
    assert (
        "invalid arguments for forecast: city: Field required; days: Input should be less "
        "than or equal to 7; town: Extra inputs are not permitted"
    ) == str(raised.value)
    assert "Lyon: sunny\nLyon: sunny" == forecast.run(ctx, {"city": "Lyon", "days": "2"})


def test_an_async_tool_runs_with_or_without_a_running_loop(ctx: ToolContext) -> None:
    """A coroutine function is awaited; called from inside a loop it gets a loop of its own."""
    assert "waited 0.01 s" == pause.run(ctx, {"seconds": 0.01})

    async def inside_a_loop() -> str:
        return pause.run(ctx, {"seconds": 0.01})

    assert "waited 0.01 s" == asyncio.run(inside_a_loop())


def test_what_a_tool_raises_or_returns_reaches_the_model_as_text(ctx: ToolContext) -> None:
    """An exception is a ToolError with its type and message; a non-str result is JSON."""
    assert "2.5" == divide.run(ctx, {"a": 5, "b": 2})
    with pytest.raises(ToolError, match="ZeroDivisionError: division by zero"):
        divide.run(ctx, {"a": 1, "b": 0})


# tools in a step ---------------------------------------------------------------------------
def run_first_step(
    store: CheckpointStore, tmp_path: Path, task: str, turns: list[dict[str, object]],
    registry: ToolRegistry, policy: StepPolicy | None = None, tools: list[str] | None = None,
) -> None:  # fmt: skip
    """Start `task` with one scripted coder and run its first step on `registry`."""
    extra = {} if tools is None else {"tools": tools}
    start_task(store, record(task, scripted("coder", turns, **extra), policy=policy),
               {"notes.txt": b"alpha\nbeta\n"})  # fmt: skip
    store.hot.begin_attempt(task, "coder", 1, 1)
    run_step(task, "coder", 1, 1, 1, store=store, cache=tmp_path / "cache", tools=registry)


def voted_state(store: CheckpointStore, task: str) -> list[tuple[Role, str | None]]:
    """The tool results of the coder's step of superstep 1, as its vote names them."""
    vote = store.hot.get_votes(task, 1, 1)["coder"]
    state = store.read_state(task, "coder", vote.id, vote.checksum)
    return [(m.role, m.content) for m in state.messages if m.role is Role.TOOL]


def test_a_step_gives_the_model_the_tools_errors_and_results(
    real_store: CheckpointStore, tmp_path: Path
) -> None:
    """Bad arguments and a raising tool are results the model reads; the step goes on."""
    turn: dict[str, object] = {"tools": [
        {"name": "forecast", "args": {"town": "Paris"}},
        {"name": "divide", "args": {"a": 1, "b": 0}},
        {"name": "stamp", "args": {"label": "done"}},
    ]}  # fmt: skip
    run_first_step(real_store, tmp_path, "errs", [turn], with_tools(forecast, divide, stamp_ledger),
                   tools=["forecast", "divide", "stamp"])  # fmt: skip
    key = idempotency_key("errs", "coder", 1, 2, "stamp", {"label": "done"})
    assert [
        "error: forecast: unknown argument 'town'; missing required argument 'city' (did you "
        "mean 'city'?)",
        "error: ZeroDivisionError: division by zero",
        f'{{"label":"done","key":"{key}","agent":"coder","task":"errs"}}',
    ] == [content for _, content in voted_state(real_store, "errs")]


def tool_lcs(client: redis.Redis, task: str) -> int:
    """How many tool-level LCs superstep 1 of `task` wrote, as Redis holds them."""
    ids = cast(list[bytes], client.hkeys(keys.superstep_lcs(task, 1, 1)))
    return [client.hget(keys.lc(task, i.decode()), "level") for i in ids].count(b"tool")


EDITS: list[dict[str, object]] = [
    {"name": "read_file", "args": {"path": "notes.txt"}},
    {"name": "write_file", "args": {"path": "a.txt", "content": "a\n"}},
    {"name": "edit_file", "args": {"path": "notes.txt", "old": "beta", "new": "gamma"}},
    {"name": "list_files", "args": {}},
]


@pytest.mark.parametrize(
    ("calls", "level", "expected"),
    [
        (EDITS, "side_effects", 0),  # nothing external: a retry redoes it all
        ([*EDITS, {"name": "stamp", "args": {"label": "x"}}], "side_effects", 1),
        (
            [{"name": "stamp", "args": {"label": "x"}}, *EDITS],  # then one after it
            "side_effects",
            2,
        ),
        (
            [*EDITS[:2], {"name": "stamp", "args": {"label": "x"}}, *EDITS[2:],
             {"name": "stamp", "args": {"label": "y"}}],
            "side_effects",
            3,
        ),
        ([*EDITS, {"name": "stamp", "args": {"label": "x"}}], "all", 5),
        ([*EDITS, {"name": "stamp", "args": {"label": "x"}}], "none", 0),
    ],
    ids=["workspace-only", "external-last", "external-first", "two-external", "all", "none"],
)  # fmt: skip
def test_a_tool_level_lc_precedes_external_calls_and_what_follows_them(
    real_store: CheckpointStore,
    redis_client: redis.Redis,
    tmp_path: Path,
    calls: list[dict[str, object]],
    level: str,
    expected: int,
) -> None:
    """Only an external call, and the first call after one, get a tool-level LC first."""
    policy = StepPolicy.model_validate({"triggers": {"tool_call": level}})
    names = ["read_file", "write_file", "edit_file", "list_files", "stamp"]
    turn: dict[str, object] = {"tools": calls}
    run_first_step(real_store, tmp_path, "lcs", [turn], with_tools(stamp_ledger), policy, names)
    assert expected == tool_lcs(redis_client, "lcs")
    results = [content for _, content in voted_state(real_store, "lcs")]
    assert "replaced the text at line 2 of notes.txt" in results


def test_the_trace_records_each_calls_effects_and_the_key_of_external_ones(
    real_store: CheckpointStore, tmp_path: Path
) -> None:
    """`effects` per call; `side_effect` and the idempotency key for external calls only."""
    turn: dict[str, object] = {"tools": [*EDITS[1:3], {"name": "stamp", "args": {"label": "x"}}]}
    run_first_step(real_store, tmp_path, "trace", [turn], with_tools(stamp_ledger),
                   tools=["write_file", "edit_file", "stamp"])  # fmt: skip
    vote = real_store.hot.get_votes("trace", 1, 1)["coder"]
    state = real_store.read_state("trace", "coder", vote.id, vote.checksum)
    key = idempotency_key("trace", "coder", 1, 2, "stamp", {"label": "x"})
    assert [
        (None, None, False, None),
        ("write_file", Effects.WORKSPACE, False, None),
        ("edit_file", Effects.WORKSPACE, False, None),
        ("stamp", Effects.EXTERNAL, True, key),
    ] == [(r.tool, r.effects, r.side_effect, r.idempotency_key) for r in state.trace]
    dumped = state.trace[-1].model_dump(mode="json")
    assert (True, "external") == (dumped["side_effect"], dumped["effects"])


def test_a_step_whose_agent_names_a_tool_its_worker_lacks_fails_before_the_model(
    real_store: CheckpointStore, tmp_path: Path
) -> None:
    """`MissingTool` names the tools and the worker; no model turn is taken, nothing voted."""
    with pytest.raises(MissingTool) as raised:
        run_first_step(real_store, tmp_path, "lacks", [{"say": "hi"}], builtin_tools(),
                       tools=["read_file", "weather", "stamp"])  # fmt: skip
    where = f"{socket.gethostname()}:{os.getpid()}"
    expected = f"agent coder names tools 'weather', 'stamp', which worker {where} does not have"
    assert expected == str(raised.value)
    assert {} == real_store.hot.get_votes("lacks", 1, 1)


# registries --------------------------------------------------------------------------------
def test_entry_points_and_named_modules_give_a_worker_its_tools(
    tool_package: Path, ctx: ToolContext
) -> None:
    """Installed entry points (a module, a tool) and a module named add to the built-ins."""
    found = load_tools(())
    assert {"shout", "tally"} <= set(found)
    assert found.source("shout").startswith("entry point ")
    assert "of cairn-test-tools" in found.source("shout")
    assert "built-in" == found.source("read_file")
    named = load_tools(["cairn_test_tools"], entry_points=False)
    assert "module cairn_test_tools" == named.source("tally")
    assert Effects.WORKSPACE == named["tally"].effects
    assert "shout" not in load_tools((), entry_points=False)
    assert "HI!" == named["shout"].run(ctx, {"text": "hi"})
    # An agent kind in the `cairn.agents` group, as a worker's (`kind: echoer` in a spec).
    assert "echoer" == found.kinds["echoer"].name
    assert "echoer" not in load_tools((), entry_points=False).kinds


def test_what_cannot_be_a_workers_tools_is_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two tools of one name, a module that fails or holds no tool: one line each."""
    (tmp_path / "clash_tools.py").write_text(
        "from cairn import tool\n\n@tool(name='read_file')\n"
        "def mine(path: str) -> str:\n    'Read differently.'\n    return path\n"
    )
    (tmp_path / "no_tools.py").write_text("X = 1\n")
    (tmp_path / "broken_tools.py").write_text("raise RuntimeError('no config')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(InvalidSpec, match="two tools are named 'read_file': built-in and module"):
        load_tools(["clash_tools"], entry_points=False)
    with pytest.raises(InvalidSpec, match="module no_tools holds no tool"):
        load_tools(["no_tools"], entry_points=False)
    with pytest.raises(InvalidSpec, match="'broken_tools': RuntimeError: no config"):
        load_tools(["broken_tools"], entry_points=False)
    with pytest.raises(InvalidSpec, match="'not_a_module_anywhere': ModuleNotFoundError"):
        load_tools(["not_a_module_anywhere"], entry_points=False)
    registry = with_tools(forecast)
    registry.add(forecast, "somewhere else")  # the same tool again is no clash
    assert "this test" == registry.source("forecast")
    assert ["weather"] == registry.missing(["forecast", "weather", "read_file"])


# on real workers ---------------------------------------------------------------------------
def test_a_missing_tool_fails_the_task_with_the_reason_and_no_retry(
    cluster: Cluster, tmp_path: Path
) -> None:
    """An agent naming a tool no worker has: the task fails, naming tool and worker.

    The step error is fatal: no attempt 2 is launched, and no rollback is tried. (Submitted
    before any worker is live: a live worker's offer would have it refused at submit.)
    """
    spec = TaskSpec.model_validate({
        "name": "needs weather", "goal": "Say the weather.",
        "agents": [{"name": "forecaster", "model": "scripted", "tools": ["read_file", "weather"],
                    "script": [{"say": "Looking.", "tools": [{"name": "weather"}]}]}],
    })  # fmt: skip
    task = cluster.tasks.submit(spec)
    worker = cluster.start_worker()
    status = cluster.drive(task, timeout=90)
    assert "failed" == status["status"]
    reason = str(status["reason"])
    assert "\n" not in reason
    where = f"{socket.gethostname()}:{worker.pid}"
    assert f"MissingTool: agent forecaster names tool 'weather', which worker {where}" in reason
    outcome = cluster.client.hget(keys.outcomes(task, 1, 1), "forecaster")
    assert outcome is not None
    assert b'"kind": "missing"' in outcome
    assert cluster.client.hget(keys.run(task), "rollbacks") is None
    with pytest.raises(NoSuchJobError):
        Job.fetch(f"cairn-{task}-1-1-forecaster-2", connection=cluster.client,
                  serializer=JSONSerializer)  # fmt: skip


def test_a_worker_runs_an_installed_packages_tools(
    cluster: Cluster, tool_package: Path, tmp_path: Path
) -> None:
    """A worker whose environment has the package offers its tools; the task uses them."""
    cluster.env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(tool_package)])
    cluster.start_worker()
    spec = TaskSpec.model_validate({
        "name": "count", "goal": "Count words.",
        "agents": [{"name": "counter", "model": "scripted", "tools": ["shout", "tally", "finish"],
                    "script": [
            {"tools": [{"name": "shout", "args": {"text": "hi"}},
                       {"name": "tally", "args": {"word": "x", "times": 2}},
                       {"name": "tally", "args": {"word": "x", "times": "many"}}]},
            {"tools": [{"name": "finish", "args": {"summary": "counted"}}]},
        ]}],
    })  # fmt: skip
    task = cluster.tasks.submit(spec)
    assert "succeeded" == cluster.drive(task, timeout=60)["status"]
    gc = cluster.store.latest_gc(task)
    assert gc is not None
    assert b"x\nx\n" == files_of(cluster.store, gc)["tally.txt"]
    state = cluster.store.read_state(task, "counter", gc.members["counter"].id)
    results = [m.content or "" for m in state.messages if m.role is Role.TOOL]
    assert ["HI!", '{"x":2}'] == results[:2]
    assert results[2].startswith("error: invalid arguments for tally: times: Input should be")
    assert AgentState.FINISHED == state.status


def test_a_worker_killed_after_a_packages_external_tool_does_not_call_it_again(
    cluster: Cluster, tool_package: Path, tmp_path: Path
) -> None:
    """SIGKILL after the package's external `stamp`, before the step's LC.

    The retry, on the other worker, resumes from the tool-level LC taken before the next
    tool: `stamp` is called once, and the ledger (keyed by idempotency key) holds it once.
    """
    ledger = tmp_path / "ledger"
    cluster.env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(tool_package)])
    cluster.env["CAIRN_TEST_LEDGER"] = str(ledger)
    workers = [cluster.start_worker(), cluster.start_worker()]
    spec = TaskSpec.model_validate({
        "name": "stamp", "goal": "Stamp once.", "files": {"README.md": "hi\n"},
        "agents": [{"name": "clerk", "model": "scripted", "tools": ["stamp", "read_file", "finish"],
                    "script": [
            {"say": "Stamping.", "tools": [{"name": "stamp", "args": {"label": "paid"}},
                                           {"name": "read_file", "args": {"path": "README.md"}}],
             "crash": {"attempts": [1], "after_tools": 1}},  # dies as the read starts
            {"tools": [{"name": "finish", "args": {"summary": "stamped"}}]},
        ]}],
    })  # fmt: skip
    task = cluster.tasks.submit(spec)
    assert "succeeded" == cluster.drive(task, timeout=90)["status"]
    died = [w for w in workers if w.poll() == -signal.SIGKILL]
    assert 1 == len(died)  # attempt 1's worker, killed after `stamp`
    key = idempotency_key(task, "clerk", 1, 0, "stamp", {"label": "paid"})
    assert [f"{key}\tpaid"] == ledger.with_suffix(".calls").read_text().splitlines()
    assert [f"{key}\tpaid"] == ledger.read_text().splitlines()
