"""Which model an agent gets: providers, plug-ins, keys, the spec's model fields, the trace.

The plug-in provider is a real `cairn.models` entry point: a module and a `.dist-info`
directory written to a temporary directory put on `sys.path`, which `importlib.metadata`
reads exactly as it reads a package pip installed. That exercises the lookup a worker
makes without installing anything into the test environment (a tiny package installed
with pip would outlive the test and need a build backend and the network).
"""

from __future__ import annotations

import importlib
import os
import socket
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
from pydantic import JsonValue

from cairn.agents.models.anthropic import AnthropicModel
from cairn.agents.models.openai import OpenAIModel
from cairn.agents.models.registry import ENTRY_POINT_GROUP, build_model, default_key_variables
from cairn.agents.models.scripted import ScriptedModel
from cairn.agents.spec import AgentSpec, parse_model
from cairn.agents.step import build_model as step_build_model
from cairn.agents.task import start_task
from cairn.errors import InvalidSpec, MissingTool, ModelError
from cairn.storage.records import Usage
from cairn.storage.store import CheckpointStore
from tests.agent_harness import record, superstep
from tests.test_anthropic_model import message, text, tool_use
from tests.test_openai_model import ScriptedServer, ask, reply, serve_scripted

PLUGIN = """
from cairn.agents.models.base import ModelReply, ModelRequest
from cairn.storage.records import Usage


class EchoModel:
    def __init__(self, config):
        self.config = config

    def complete(self, request: ModelRequest) -> ModelReply:
        said = request.messages[-1].content
        return ModelReply(content=f"{self.config.name} echoes {said}", usage=Usage(prompt_tokens=1))


def build(config):
    if config.params.get("refuse"):
        raise ValueError("echo cannot refuse")
    return EchoModel(config)
"""


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[ScriptedServer]:
    """A scripted server on a free port of 127.0.0.1."""
    yield from serve_scripted(monkeypatch)


@pytest.fixture
def echo_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An installed-looking distribution whose `cairn.models` entry point `echo` builds a model."""
    site = tmp_path / "site"
    site.mkdir()
    module = f"cairn_echo_{tmp_path.name.replace('-', '_')}"  # unique: no stale import
    (site / f"{module}.py").write_text(PLUGIN)
    info = site / "cairn_echo-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: cairn-echo\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\necho = {module}:build\n")
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    yield module
    sys.modules.pop(module, None)


def agent(**fields: object) -> AgentSpec:
    """An agent spec named `a` with `fields` (a scripted one unless they name a model)."""
    return AgentSpec.model_validate({"name": "a", "model": "scripted", **fields})


def test_built_in_providers() -> None:
    """scripted, openai: and anthropic: need no plug-in."""
    assert isinstance(build_model(agent(), {}), ScriptedModel)
    assert isinstance(build_model(agent(model="openai:gpt-4o-mini"), {}), OpenAIModel)
    assert isinstance(build_model(agent(model="anthropic:claude-sonnet-4-5"), {}), AnthropicModel)


def test_step_build_model_takes_the_environment_given(server: ScriptedServer) -> None:
    """cairn.agents.step.build_model (what a worker binds its environment to) uses the registry."""
    spec = agent(model="anthropic:claude-test", base_url=server.root_url)
    server.script = [message(text("ok"))]
    step_build_model(spec, {"ANTHROPIC_API_KEY": "sk-ant-1"}).complete(ask())
    assert "sk-ant-1" == server.received[0].headers["x-api-key"]


def test_api_key_env_picks_each_agents_key(server: ScriptedServer) -> None:
    """Two agents on two providers, each with its own variable, send their own keys."""
    environ = {
        "OPENAI_API_KEY": "sk-default-openai",
        "ANTHROPIC_API_KEY": "sk-default-anthropic",
        "TEAM_A_API_KEY": "sk-team-a",
        "TEAM_B_API_KEY": "sk-team-b",
    }
    gpt = agent(model="openai:gpt-test", base_url=server.base_url, api_key_env="TEAM_A_API_KEY")
    claude = agent(
        model="anthropic:claude-test", base_url=server.root_url, api_key_env="TEAM_B_API_KEY"
    )
    plain = agent(model="anthropic:claude-test", base_url=server.root_url)
    server.script = [reply("a"), message(text("b")), message(text("c"))]
    for spec in (gpt, claude, plain):
        build_model(spec, environ).complete(ask())
    first, second, third = server.received
    assert "Bearer sk-team-a" == first.headers["Authorization"]
    assert "sk-team-b" == second.headers["x-api-key"]
    assert "sk-default-anthropic" == third.headers["x-api-key"]


def test_a_named_key_variable_that_is_unset_is_fatal() -> None:
    """An agent naming api_key_env the worker lacks fails at once, naming the variable."""
    spec = agent(model="anthropic:claude-test", api_key_env="TEAM_C_API_KEY")
    with pytest.raises(ModelError) as caught:
        build_model(spec, {"ANTHROPIC_API_KEY": "sk-other"})
    assert "api_key_env TEAM_C_API_KEY is not set on this worker" == str(caught.value)
    assert not caught.value.retryable


def test_default_key_variables_follow_the_provider_name() -> None:
    """CAIRN_<PROVIDER>_API_KEY first, then <PROVIDER>_API_KEY; a plug-in gets the same."""
    assert ("CAIRN_OPENAI_API_KEY", "OPENAI_API_KEY") == default_key_variables("openai")
    assert ("CAIRN_MY_LLM_API_KEY", "MY_LLM_API_KEY") == default_key_variables("my-llm")


def test_an_entry_point_provider_is_found(echo_plugin: str) -> None:
    """A `cairn.models` entry point named `echo` serves `model: echo:<name>` with its config."""
    spec = agent(model="echo:parrot-1", api_key_env="ECHO_TEAM_API_KEY", timeout=42)
    model = build_model(spec, {"ECHO_TEAM_API_KEY": "k-1", "ECHO_API_KEY": "k-default"})
    answer = model.complete(ask("hello"))
    assert "parrot-1 echoes hello" == answer.content
    config = model.config  # type: ignore[attr-defined]  # the plug-in's own model class
    assert ("echo", "parrot-1", "k-1", 42.0) == (
        config.provider,
        config.name,
        config.api_key,
        config.timeout,
    )
    default = build_model(agent(model="echo:x"), {"ECHO_API_KEY": "k-default"})
    assert "k-default" == default.config.api_key  # type: ignore[attr-defined]


def test_a_provider_refusing_its_config_is_fatal(echo_plugin: str) -> None:
    """A provider's ValueError becomes a fatal ModelError naming the model."""
    with pytest.raises(ModelError) as caught:
        build_model(agent(model="echo:x", params={"refuse": True}), {})
    assert "model echo:x: echo cannot refuse" == str(caught.value)
    assert not caught.value.retryable


def test_an_unknown_provider_is_a_missing_tool_naming_the_worker_and_what_is_known() -> None:
    """A provider no package on the worker offers fails at once, listing the known ones."""
    with pytest.raises(MissingTool) as caught:
        build_model(agent(model="nosuch:model"), {})
    worker = f"{socket.gethostname()}:{os.getpid()}"
    said = f"unknown model provider 'nosuch' on worker {worker}; known:"
    assert str(caught.value).startswith(said)
    assert "'anthropic'" in str(caught.value)


@pytest.mark.parametrize(
    ("fields", "message_"),
    [
        ({"model": "gpt-4o"}, "model: must be 'scripted' or '<provider>:<model"),
        ({"model": "openai:"}, "model: must be 'scripted'"),
        ({"base_url": "file:///etc/passwd"}, "base_url: must be an http://"),
        ({"api_key_env": "CAIRN_SIGNING_KEY"}, "api_key_env: must be an environment"),
        ({"api_key_env": "aws_secret_API_KEY"}, "api_key_env: must be an environment"),
        ({"timeout": 0}, "timeout: Input should be greater than 0"),
        ({"params": {"model": "other"}}, "params: ['model'] are set by Cairn"),
        ({"params": {"stream": True}}, "params: ['stream'] are set by Cairn"),
        ({"headers": {"Authorization": "Bearer x"}}, "headers: Authorization is set"),
        ({"headers": {"X-A": "one\r\nX-B: two"}}, "headers: the value of X-A must"),
        ({"headers": {"bad name": "x"}}, "headers: 'bad name' is not a header name"),
    ],
)
def test_model_fields_are_checked_in_one_line_naming_the_field(
    fields: dict[str, object], message_: str
) -> None:
    """A bad model, base_url, api_key_env, timeout, params or headers is refused in one line."""
    with pytest.raises(InvalidSpec) as caught:
        parse_model(AgentSpec, {"name": "a", "model": "scripted", **fields}, "agent")
    error = str(caught.value)
    assert error.startswith(f"invalid agent: {message_}"), error
    assert "\n" not in error


def test_usage_of_each_call_is_in_the_trace(
    server: ScriptedServer, real_store: CheckpointStore, tmp_path: Path
) -> None:
    """An anthropic: agent's two tool calls run, and each model turn's usage is traced."""
    spec = agent(
        model="anthropic:claude-test",
        base_url=server.root_url,
        api_key_env="TEAM_B_API_KEY",
        tools=["write_file", "finish"],
    )
    start_task(real_store, record("claude", spec), {})
    first_usage: dict[str, JsonValue] = {
        "input_tokens": 50,
        "output_tokens": 9,
        "cache_read_input_tokens": 400,
    }
    server.script = [
        message(
            tool_use("toolu_1", "write_file", {"path": "a.txt", "content": "A"}),
            tool_use("toolu_2", "write_file", {"path": "b.txt", "content": "B"}),
            usage=first_usage,
        ),
        message(
            tool_use("toolu_3", "finish", {"summary": "wrote both"}),
            usage={"input_tokens": 80, "output_tokens": 4},
        ),
    ]
    models = partial(step_build_model, environ={"TEAM_B_API_KEY": "sk-team-b"})
    superstep(real_store, "claude", tmp_path / "cache", models)
    gc = superstep(real_store, "claude", tmp_path / "cache", models)
    assert gc is not None
    state = real_store.read_state("claude", "a", gc.members["a"].id)
    turns = [t.usage for t in state.trace if t.tool is None]
    assert [
        Usage(prompt_tokens=450, completion_tokens=9, cached_tokens=400),
        Usage(prompt_tokens=80, completion_tokens=4),
    ] == turns
    second = server.received[1].body["messages"][-1]
    assert ["toolu_1", "toolu_2"] == [b["tool_use_id"] for b in second["content"]]
    assert {"sk-team-b"} == {r.headers["x-api-key"] for r in server.received}
    manifest = real_store.read_manifest("claude", gc.workspace)
    assert {"a.txt", "b.txt"} <= set(manifest.files)
