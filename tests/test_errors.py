"""What public calls raise: `cairn.errors` classes, in one line that says where and why."""

from __future__ import annotations

import json
import os
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import ValidationError

from cairn import AgentSpec, Client, TaskSpec, Team, errors
from cairn.errors import CheckpointNotFound, InvalidSpec, NotFound, Unavailable
from cairn.testing.redis_server import RedisServer, free_port
from tests.cli_harness import cairn as run_cairn

TYPO = "agents[coder]: unknown field 'modle' (did you mean 'model'?)"
SPEC_WITH_A_TYPO = """\
name: typo
goal: Write hello.txt.
agents:
  - name: planner
    model: scripted
  - name: coder
    modle: scripted
    tools: [write_file]
"""


def refusal(call: Callable[[], object]) -> InvalidSpec:
    """The `InvalidSpec` that calling `call` raised (and not pydantic's error)."""
    with pytest.raises(InvalidSpec) as caught:
        call()
    assert not isinstance(caught.value, ValidationError)
    assert "\n" not in str(caught.value)
    return caught.value


def test_a_bad_field_of_a_public_spec_is_invalid_spec_naming_the_agent() -> None:
    """`TaskSpec`, `Team` and `AgentSpec`, built or validated, say the field, the agent, a fix."""
    coder = {"name": "coder", "modle": "scripted"}
    fields = {"name": "t", "goal": "g", "agents": [{"name": "planner", "model": "scripted"}, coder]}
    built = refusal(lambda: TaskSpec(**fields))
    assert f"invalid task spec: {TYPO}" == str(built)
    assert ("agents", 1, "modle") == built.field
    assert f"invalid task spec: {TYPO}" == str(refusal(lambda: TaskSpec.model_validate(fields)))
    as_json = json.dumps(fields)
    assert f"invalid task spec: {TYPO}" == str(
        refusal(lambda: TaskSpec.model_validate_json(as_json))
    )
    assert f"invalid team: {TYPO}" == str(refusal(lambda: Team("g", [coder])))
    assert "invalid agent spec: unknown field 'tols' (did you mean 'tools'?)" == str(
        refusal(lambda: AgentSpec(name="a", model="scripted", tols=[]))  # type: ignore[call-arg]
    )
    assert isinstance(built, ValueError)  # code catching ValueError still catches it


def test_a_field_deep_in_an_agent_is_named_through_the_agent() -> None:
    """A bad value inside an agent is placed by the agent's name, lists by index."""
    agent = {"name": "coder", "model": "scripted", "script": [{"say": "x", "latency": -1}]}
    error = refusal(lambda: TaskSpec(name="t", goal="g", agents=[agent]))
    assert (
        "invalid task spec: agents[coder].script[0].latency: Input should be greater than or "
        "equal to 0"
    ) == str(error)
    nested = refusal(
        lambda: Team("g", [AgentSpec(name="c", model="scripted")], checkpoints={"evry": 2})
    )
    assert "invalid team: checkpoints: unknown field 'evry' (did you mean 'every'?)" == str(nested)
    unlike = refusal(lambda: AgentSpec(name="a", model="scripted", zzz=1))  # type: ignore[call-arg]
    assert "invalid agent spec: unknown field 'zzz'" == str(unlike)  # nothing close to suggest


def test_every_error_is_named_as_cairn_errors() -> None:
    """Tracebacks say `cairn.errors.Timeout`, whichever module raised it."""
    for name in errors.__all__:
        assert "cairn.errors" == getattr(errors, name).__module__, name
    told = traceback.format_exception_only(errors.Timeout("ran out"))
    assert ["cairn.errors.Timeout: ran out\n"] == told
    assert issubclass(errors.TaskNotFound, NotFound)
    assert issubclass(CheckpointNotFound, NotFound)
    assert issubclass(CheckpointNotFound, InvalidSpec)


def test_a_client_of_no_redis_is_unavailable_naming_the_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Redis that does not answer, or none configured: `Unavailable`, its password hidden."""
    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    with pytest.raises(Unavailable) as caught:
        Client(url, archive_dir=tmp_path / "archive")
    said = str(caught.value)
    assert said.startswith("cannot reach Redis at redis://:***@127.0.0.1:"), said
    assert "(from argument redis_url)" in said
    assert "hunter2" not in said
    monkeypatch.delenv("CAIRN_REDIS_URL", raising=False)
    monkeypatch.setenv("CAIRN_STATE_DIR", str(tmp_path / "state"))
    with pytest.raises(Unavailable, match=r"^no Redis configured: set CAIRN_REDIS_URL"):
        Client()


def test_a_missing_checkpoint_is_checkpoint_not_found(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """Reading, restoring, forking or comparing a checkpoint a task lacks: `CheckpointNotFound`."""
    with Client(redis_server.url, archive_dir=tmp_path / "archive") as client:
        task = client.submit(Team("Say hi.", [AgentSpec(name="writer", model="scripted")]))
        calls: dict[str, Callable[[], object]] = {
            "workspace": lambda: task.workspace(checkpoint=99),
            "checkpoint": lambda: task.checkpoint(99),
            "restore": lambda: task.restore(to=99),
            "fork": lambda: task.fork(at=99),
            "diff": lambda: task.diff(99, None),
        }
        for name, call in calls.items():
            with pytest.raises(CheckpointNotFound, match=f"task {task.id} has no") as caught:
                call()
            assert isinstance(caught.value, LookupError), name


# the command line, as a person runs it --------------------------------------------------
def cli_env(tmp_path: Path) -> dict[str, str]:
    """A process environment with no Redis configured from outside."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAIRN_")}
    return {**env, "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
            "CAIRN_STATE_DIR": str(tmp_path / "state")}  # fmt: skip


def test_a_misspelt_field_exits_2_with_its_line_and_the_field_meant(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """`modle:` in a YAML spec: one line with file:line:column, the agent and `model`."""
    spec = tmp_path / "task.yaml"
    spec.write_text(SPEC_WITH_A_TYPO)
    done = run_cairn("submit", str(spec), "--redis-url", redis_server.url, env=cli_env(tmp_path))
    assert 2 == done.returncode
    assert [f"cairn: {spec}:7:5: invalid task spec: {TYPO}"] == done.stderr.splitlines()


def test_bad_yaml_exits_2_with_its_line_and_column(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """YAML that does not parse: where, as `file:line:column`, and why, in one line."""
    spec = tmp_path / "task.yaml"
    spec.write_text("name: x\ngoal: y\nagents:\n  - name: a\n    model: scripted\n     tools: []\n")
    done = run_cairn("submit", str(spec), "--redis-url", redis_server.url, env=cli_env(tmp_path))
    assert 2 == done.returncode
    assert [
        f"cairn: {spec}:6:11: task spec is not valid YAML: mapping values are not allowed here"
    ] == done.stderr.splitlines()


def test_a_redis_url_flag_is_named_as_the_flag(tmp_path: Path) -> None:
    """An unreachable `--redis-url` is reported as coming from `--redis-url`: exit 3."""
    url = f"redis://127.0.0.1:{free_port()}"
    done = run_cairn("list", "--redis-url", url, env=cli_env(tmp_path))
    assert 3 == done.returncode
    [line] = done.stderr.splitlines()
    assert line.startswith(f"cairn: cannot reach Redis at {url} (from --redis-url): "), line
    from_env = run_cairn("list", env={**cli_env(tmp_path), "CAIRN_REDIS_URL": url})
    assert "(from CAIRN_REDIS_URL)" in from_env.stderr
    nothing = run_cairn("list", env=cli_env(tmp_path))
    assert 3 == nothing.returncode
    assert nothing.stderr.startswith("cairn: no Redis configured: set CAIRN_REDIS_URL")
    assert "Traceback" not in done.stderr + from_env.stderr + nothing.stderr
