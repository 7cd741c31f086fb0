"""A worker process's environment: what its job functions need, built once per process.

RQ job functions get names and numbers only (JSON), so a job finds the rest here: the
process's settings (`process_settings`: those the worker's entry point read, else read on
first use), a Redis client, the metered checkpoint store, the lanes of the process's cache
slot (a workspace tree for each step running at once), the model factory with the
process's credentials, its tools (built-ins, installed entry points, `CAIRN_TOOLS`
modules), its MCP servers (`CAIRN_MCP_CONFIG`, sessions kept across steps and closed at
exit) and the sandbox its agents' commands run in (`CAIRN_SANDBOX`, probed once). Building
it serves the worker's metrics, if a port is configured, and starts its traces, if
configured (`cairn.agents.tracing`); a worker builds it before its
first job, so a bad tool module or MCP file stops the worker with its reason instead of
failing every step, and a worker that cannot sandbox says so as it starts.
"""

from __future__ import annotations

import atexit
import os
import socket
import sys
import threading
from dataclasses import dataclass
from functools import cache, partial
from typing import TYPE_CHECKING

import redis

from cairn.agents.logs import get_logger
from cairn.agents.logship import ship_logs
from cairn.agents.mcp.config import load_mcp_config
from cairn.agents.models.registry import provider_names
from cairn.agents.sandbox import Sandbox, sandbox_for, use_sandbox
from cairn.agents.step import ModelFactory, build_model
from cairn.agents.toolkit import ToolRegistry, load_tools
from cairn.agents.tools import Tool
from cairn.agents.tracing import start_tracing
from cairn.coordinator import metrics
from cairn.coordinator.offers import Offer
from cairn.coordinator.settings import Settings, open_store, process_settings
from cairn.coordinator.slots import Lanes, slot_number, worker_slot
from cairn.errors import MissingTool
from cairn.storage.backends.redis import connect
from cairn.storage.store import CheckpointStore

if TYPE_CHECKING:
    from cairn.agents.mcp.manager import McpManager


@dataclass(frozen=True, slots=True)
class Environment:
    """What a worker process needs to run steps and stage restores."""

    settings: Settings
    redis: redis.Redis
    store: CheckpointStore
    lanes: Lanes
    models: ModelFactory
    tools: ToolRegistry
    mcp: McpManager | None
    sandbox: Sandbox


_BUILDING = threading.Lock()
log = get_logger(__name__)
COMMAND_TOOLS = frozenset({"run_command"})  # the tools a worker that cannot sandbox refuses


def environment() -> Environment:
    """Return the process's environment, built on first use (and its metrics served)."""
    with _BUILDING:  # the first steps of a concurrent worker may ask at once
        return _environment()


def built_environment() -> Environment | None:
    """The process's environment if it was built, else None (nothing is built here)."""
    return _environment() if _environment.cache_info().currsize else None


@cache
def _environment() -> Environment:
    settings = process_settings()
    url, _origin = settings.redis()
    client = connect(url)
    ship_logs(client, "worker")  # `cairn logs TASK` reads a task's lines from Redis
    store = open_store(settings, client, metered=True)
    serve_worker_metrics(settings)
    start_tracing(settings.traces("worker"))
    models = partial(build_model, environ=settings.environ)
    sandbox = open_sandbox(settings)
    tools = load_tools(settings.tools)
    if sandbox.refusal is not None:
        tools = RefusingTools(tools, sandbox.refusal)
    mcp = None
    if settings.mcp_config is not None:
        from cairn.agents.mcp.manager import McpManager  # noqa: PLC0415 - the SDK loads only where used

        mcp = McpManager(load_mcp_config(settings.mcp_config, settings.environ))
        atexit.register(mcp.close)  # a stdio server's process ends with the worker
    lanes = Lanes(worker_slot(settings.cache))
    return Environment(settings, client, store, lanes, models, tools, mcp, sandbox)


def offer_of(env: Environment) -> Offer:
    """What the worker of `env` has, as its offer in Redis says (`cairn.coordinator.offers`)."""
    refused = {}
    if isinstance(env.tools, RefusingTools):
        refused = {name: env.tools.refusal for name in COMMAND_TOOLS if name in env.tools}
    return Offer(
        worker=f"{socket.gethostname()}:{os.getpid()}",
        tools=[name for name in env.tools if name not in refused],
        kinds=sorted(env.tools.kinds),
        mcp=sorted(env.mcp.servers) if env.mcp is not None else [],
        providers=sorted(provider_names()),
        refused=refused,
    )


def open_sandbox(settings: Settings) -> Sandbox:
    """Probe the sandbox `settings.sandbox` asks for and make it the process's.

    A sandbox that is off or cannot run is said at once, in a warning and on stderr: the
    first is a risk the deployment chose, the second fails every step that runs commands.
    """
    sandbox = sandbox_for(settings.sandbox, settings.environ.get("PATH", os.defpath))
    use_sandbox(sandbox)
    warning = sandbox.refusal
    if sandbox.mode == "off":
        warning = (
            "CAIRN_SANDBOX=off: agents' commands run unsandboxed, as this worker's user, "
            "with its files and network"
        )
    if warning is not None:
        log.warning("agents' commands are not sandboxed", sandbox=sandbox.mode, reason=warning)
        sys.stderr.write(f"cairn worker: warning: {warning}\n")
    return sandbox


class RefusingTools(ToolRegistry):
    """A worker's tools when it cannot sandbox: asking for a command tool fails the step.

    `get` raises `MissingTool` with the reason for `COMMAND_TOOLS`, so a step whose agent
    has one fails, fatally and before its model is asked, saying why.
    """

    def __init__(self, tools: ToolRegistry, refusal: str) -> None:
        super().__init__()
        for name in tools:
            self.add(tools[name], tools.source(name))
        self.refusal = refusal

    def get(self, name: str) -> Tool | None:
        """Return the tool called `name`, or None; `MissingTool` for a command tool."""
        if name in COMMAND_TOOLS:
            raise MissingTool(self.refusal)
        return super().get(name)


def serve_worker_metrics(settings: Settings) -> None:
    """Serve this worker's metrics on the metrics port + 1 + its slot, if a port is set."""
    if settings.metrics_port is not None:
        slot = slot_number(worker_slot(settings.cache))
        metrics.serve(metrics.worker_port(settings.metrics_port, slot), "worker")
