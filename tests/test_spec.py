"""Task specs from YAML and JSON: what loads, and how a bad one is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cairn.agents.spec import AgentSpec, parse_model
from cairn.coordinator.spec import TaskSpec, load_spec
from cairn.errors import InvalidSpec

GOOD = """
name: demo
goal: fix it
workspace: project
verify: make test
max_supersteps: 12
checkpoints: {hot_keep: 2, durability: sync, tool_level: all}
agents:
  - name: coder
    model: scripted
    tools: [read_file, write_file, run_command]
    approve: [run_command]
    script:
      - say: hi
        tools: [{name: read_file, args: {path: a.py}}]
"""


def test_a_yaml_spec_loads_with_its_workspace_directory(tmp_path: Path) -> None:
    """A spec and the directory next to it give the record, the files and the limits."""
    (tmp_path / "project" / "src").mkdir(parents=True)
    (tmp_path / "project" / "src" / "a.py").write_text("x = 1\n")
    (tmp_path / "project" / "escape").symlink_to("/etc")
    (tmp_path / "spec.yaml").write_text(GOOD)
    spec = load_spec(tmp_path / "spec.yaml")
    assert {"src/a.py": b"x = 1\n"} == spec.workspace_files(tmp_path)
    record = spec.record("demo-1")
    assert "all" == record.policy.triggers.tool_call
    assert ["run_command"] == record.agent("coder").approve
    assert (12, "sync", 2) == (
        spec.max_supersteps,
        spec.checkpoints.durability,
        spec.checkpoints.hot_keep,
    )


def test_a_json_spec_with_inline_files_loads(tmp_path: Path) -> None:
    """JSON works too, and inline files are the workspace."""
    path = tmp_path / "spec.json"
    path.write_text(
        json.dumps(
            {
                "name": "j",
                "goal": "g",
                "files": {"a.txt": "A"},
                "agents": [{"name": "a", "model": "scripted"}],
            }
        )
    )
    assert {"a.txt": b"A"} == load_spec(path).workspace_files(tmp_path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: x\ngoal: g\nagents: []\n", "agents: List should have at least 1 item"),
        (
            "name: x\ngoal: g\nagents: [{name: a, model: gpt}]\n",
            r"spec.yaml:3:20: .*agents\[a\]\.model",
        ),
        (
            "name: x\ngoal: g\nagents: [{name: a, model: scripted}]\nmax_supersteps: 0\n",
            "max_supersteps",
        ),
        (
            "name: x\ngoal: g\nagents: [{name: a, model: scripted}]\n"
            "checkpoints: {durability: maybe}\n",
            "checkpoints.durability",
        ),
        (
            "name: x\ngoal: g\nagents: [{name: a, model: scripted}]\nfiles: {../x: y}\n",
            "leaves the workspace",
        ),
        (
            "name: x\ngoal: g\nagents: [{name: a, model: scripted}, {name: a, model: scripted}]\n",
            "unique",
        ),
        ("name: x\ngoal: g\nagents: [{name: a, model: scripted}]\ncolour: red\n", "colour"),
        ("name: [unclosed\n", "not valid YAML"),
        ("- a list\n", "mapping"),
    ],
)
def test_invalid_specs_are_refused_naming_the_field(
    tmp_path: Path, text: str, message: str
) -> None:
    """Every mistake is one InvalidSpec line that says where and why."""
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    with pytest.raises(InvalidSpec, match=message) as caught:
        load_spec(path)
    assert "\n" not in str(caught.value)


def test_an_agent_naming_no_model_is_refused_naming_it() -> None:
    """No model is assumed: `TaskSpec` and `AgentSpec` refuse an agent without one."""
    data = {"name": "x", "goal": "g", "agents": [{"name": "writer", "script": [{"say": "hi"}]}]}
    with pytest.raises(InvalidSpec, match="agent writer names no model: give 'scripted' or"):
        TaskSpec.model_validate(data)
    with pytest.raises(InvalidSpec) as caught:
        parse_model(TaskSpec, data, "task spec")
    assert str(caught.value).startswith("invalid task spec: agents[writer]: agent writer names")
    assert "\n" not in str(caught.value)
    with pytest.raises(InvalidSpec, match="agent a names no model"):
        AgentSpec.model_validate({"name": "a"})
    assert (
        "scripted"
        == TaskSpec.model_validate({**data, "agents": [{"name": "writer", "model": "scripted"}]})
        .agents[0]
        .model
    )


def test_a_missing_spec_or_workspace_is_a_clear_error(tmp_path: Path) -> None:
    """An unreadable file or a workspace that is not a directory says so."""
    with pytest.raises(InvalidSpec, match="cannot read task spec"):
        load_spec(tmp_path / "nope.yaml")
    (tmp_path / "spec.yaml").write_text(
        "name: x\ngoal: g\nworkspace: missing\nagents: [{name: a, model: scripted}]\n"
    )
    with pytest.raises(InvalidSpec, match="not a directory"):
        load_spec(tmp_path / "spec.yaml").workspace_files(tmp_path)


def test_an_agents_model_timeout_must_be_below_the_step_timeout(tmp_path: Path) -> None:
    """A model call allowed to outlast its step would be retried, and paid for, twice."""
    spec = {
        "name": "t",
        "goal": "g",
        "step_timeout": 120,
        "agents": [{"name": "slow", "model": "openai:gpt-4o-mini", "timeout": 600}],
    }
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    with pytest.raises(InvalidSpec, match=r"agent slow: timeout \(600 s\) must be below"):
        load_spec(path)
    path.write_text(json.dumps({**spec, "step_timeout": 900}))
    assert 900.0 == load_spec(path).step_timeout
    scripted = {**spec, "agents": [{"name": "s", "model": "scripted", "script": []}]}
    path.write_text(json.dumps(scripted))
    assert 120.0 == load_spec(path).step_timeout  # a script calls nothing that could take long
