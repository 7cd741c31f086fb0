"""Which model an agent thinks with: its spec's `model: "<provider>:<name>"` made a `Model`.

Built in: `scripted`, `openai:` and `anthropic:`. Any other provider is found through the
`cairn.models` entry point group: the entry point's name is the provider, its object a
`ModelProvider` (docs/models.md). The worker's environment is passed in, never read here:
it holds the API keys, read from the agent's `api_key_env`, else the provider's default
variables (`CAIRN_<PROVIDER>_API_KEY`, then `<PROVIDER>_API_KEY`).
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from importlib.metadata import entry_points

from cairn.agents.models.anthropic import build_anthropic
from cairn.agents.models.base import Model, ModelConfig, ModelProvider, ModelReply, ModelRequest
from cairn.agents.models.openai import build_openai
from cairn.agents.models.scripted import ScriptedModel
from cairn.agents.spec import NO_MODEL, AgentSpec
from cairn.errors import MissingTool, ModelError

ENTRY_POINT_GROUP = "cairn.models"
BUILT_IN: dict[str, ModelProvider] = {"openai": build_openai, "anthropic": build_anthropic}


def build_model(spec: AgentSpec, environ: Mapping[str, str]) -> Model:
    """The model `spec` names, its key taken from `environ`; raise a fatal error if none.

    `MissingTool` for a provider the worker lacks, else a `ModelError`. Fatal, because
    another attempt on a worker with the same installation and environment fails the same
    way: an unknown provider, a key variable that is not set, a provider that refuses the
    agent's options.
    """
    if spec.model == "scripted":
        return ScriptedModel(spec.script)
    if spec.model == NO_MODEL:
        return NoModel(spec.name)
    provider_name, _, name = spec.model.partition(":")
    provider = find_provider(provider_name)
    config = ModelConfig(
        provider=provider_name,
        name=name,
        base_url=spec.base_url,
        api_key=api_key(provider_name, spec.api_key_env, environ),
        timeout=spec.timeout,
        params=spec.params,
        headers=spec.headers,
        environ=environ,
        stream=spec.stream,
    )
    try:
        return provider(config)
    except ValueError as exc:
        raise ModelError(f"model {spec.model}: {exc}", retryable=False) from exc


def api_key(provider: str, variable: str | None, environ: Mapping[str, str]) -> str | None:
    """The key for `provider`: `variable`'s value (which must be set), else a default's."""
    if variable is not None:
        value = environ.get(variable)
        if not value:
            raise ModelError(f"api_key_env {variable} is not set on this worker", retryable=False)
        return value
    return next((environ[v] for v in default_key_variables(provider) if environ.get(v)), None)


def default_key_variables(provider: str) -> tuple[str, str]:
    """Where a key is looked for when the agent names none, first match winning."""
    stem = re.sub(r"[^A-Z0-9]", "_", provider.upper())
    return f"CAIRN_{stem}_API_KEY", f"{stem}_API_KEY"


def provider_names() -> set[str]:
    """The providers this installation offers: `scripted`, the built-ins, the entry points'."""
    return {"scripted", *BUILT_IN, *(e.name for e in entry_points(group=ENTRY_POINT_GROUP))}


def find_provider(name: str) -> ModelProvider:
    """The built-in provider `name`, else the `cairn.models` entry point of that name.

    Raises `MissingTool` for a provider the worker does not have (every worker with the
    same installation lacks it), a fatal `ModelError` for one it cannot load.
    """
    if name in BUILT_IN:
        return BUILT_IN[name]
    found = sorted(entry_points(group=ENTRY_POINT_GROUP, name=name), key=lambda e: e.value)
    if not found:
        known = sorted(provider_names())
        worker = f"{socket.gethostname()}:{os.getpid()}"
        raise MissingTool(f"unknown model provider {name!r} on worker {worker}; known: {known}")
    if len({e.value for e in found}) > 1:
        where = [e.value for e in found]
        raise ModelError(
            f"model provider {name!r} is claimed by several entry points: {where}",
            retryable=False,
        )
    try:
        provider = found[0].load()
    except Exception as exc:
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        raise ModelError(
            f"model provider {name!r} ({found[0].value}) failed to load: {reason}",
            retryable=False,
        ) from exc
    if not callable(provider):
        raise ModelError(
            f"model provider {name!r} ({found[0].value}) is not callable", retryable=False
        )
    return provider  # type: ignore[no-any-return]  # an entry point's object is untyped


class NoModel:
    """The model of an agent in code that names none: asking it fails the step, saying so."""

    def __init__(self, agent: str) -> None:
        self.agent = agent

    def complete(self, request: ModelRequest) -> ModelReply:
        """Raise a fatal `ModelError`: the spec must name a model for the agent to ask one."""
        raise ModelError(f"agent {self.agent} names no model (model: none); give it one to "
                         "ask", retryable=False)  # fmt: skip
