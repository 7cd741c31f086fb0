"""Cairn: crash-proof teams of LLM agents on Redis and RQ. The public Python API.

    from cairn import Client

    with Client() as client:  # CAIRN_REDIS_URL, else a running `cairn up`
        task = client.submit("team.yaml")
        status = task.wait(timeout=120)
        print(status.state, [a.status for a in status.agents])
        task.restore(to=1)

In an event loop, `AsyncClient` makes the same calls, awaited (`async with AsyncClient()`).
Everything promised is named in `__all__`; errors are in `cairn.errors`, the LangGraph
checkpointer is `cairn.langgraph.CairnSaver` (the `langgraph` extra), the command line
is `cairn.cli`, and `tool` (with `ToolContext`) makes a Python function a tool that
workers load (docs/tools.md).

Each name is imported from where it is defined when first asked for: importing an engine
module (`cairn.coordinator.worker`, say) or `cairn.errors` does not import the client.
"""

import importlib as _importlib
import typing as _typing

from cairn import errors

if _typing.TYPE_CHECKING:  # what mypy and editors see; at run time `__getattr__` imports each name
    from cairn.agents.accounting import Budget, MemberBudget, Price
    from cairn.agents.kinds.code import AgentContext, Outcome, Reply
    from cairn.agents.kinds.python import CodeAgent, agent
    from cairn.agents.live import LiveCall, LiveReply
    from cairn.agents.spec import AgentSpec
    from cairn.agents.toolkit import tool
    from cairn.agents.tools import ToolContext
    from cairn.aio import AsyncClient, AsyncTask
    from cairn.client import Client, Task
    from cairn.coordinator.approvals import Decision, PendingCall
    from cairn.coordinator.diff import Diff
    from cairn.coordinator.failures import StepFailure
    from cairn.coordinator.gcviews import CheckpointDetail, CheckpointInfo
    from cairn.coordinator.runs import TaskState
    from cairn.coordinator.settings import Settings
    from cairn.coordinator.spec import TaskSpec, Team
    from cairn.coordinator.tasklogs import LogLine
    from cairn.coordinator.timeline import Timeline
    from cairn.coordinator.views import (
        AgentStatus,
        Export,
        Lineage,
        RestoreResult,
        TaskResult,
        TaskStatus,
        TraceEntry,
    )
    from cairn.storage.archive import ArchiveReport
    from cairn.storage.records import AgentState, GCOrigin, GCStatus

    __version__: str

# Where each name is defined: the module `__getattr__` imports it from.
_HOMES = {
    "AgentContext": "cairn.agents.kinds.code",
    "AgentSpec": "cairn.agents.spec",
    "CodeAgent": "cairn.agents.kinds.python",
    "Outcome": "cairn.agents.kinds.code",
    "Reply": "cairn.agents.kinds.code",
    "agent": "cairn.agents.kinds.python",
    "AgentState": "cairn.storage.records",
    "AgentStatus": "cairn.coordinator.views",
    "ArchiveReport": "cairn.storage.archive",
    "AsyncClient": "cairn.aio",
    "AsyncTask": "cairn.aio",
    "Budget": "cairn.agents.accounting",
    "CheckpointDetail": "cairn.coordinator.gcviews",
    "CheckpointInfo": "cairn.coordinator.gcviews",
    "Client": "cairn.client",
    "Decision": "cairn.coordinator.approvals",
    "Diff": "cairn.coordinator.diff",
    "Export": "cairn.coordinator.views",
    "GCOrigin": "cairn.storage.records",
    "GCStatus": "cairn.storage.records",
    "Lineage": "cairn.coordinator.views",
    "MemberBudget": "cairn.agents.accounting",
    "LiveCall": "cairn.agents.live",
    "LiveReply": "cairn.agents.live",
    "PendingCall": "cairn.coordinator.approvals",
    "Price": "cairn.agents.accounting",
    "RestoreResult": "cairn.coordinator.views",
    "Settings": "cairn.coordinator.settings",
    "StepFailure": "cairn.coordinator.failures",
    "LogLine": "cairn.coordinator.tasklogs",
    "Task": "cairn.client",
    "TaskResult": "cairn.coordinator.views",
    "TaskSpec": "cairn.coordinator.spec",
    "Team": "cairn.coordinator.spec",
    "TaskState": "cairn.coordinator.runs",
    "TaskStatus": "cairn.coordinator.views",
    "Timeline": "cairn.coordinator.timeline",
    "ToolContext": "cairn.agents.tools",
    "TraceEntry": "cairn.coordinator.views",
    "tool": "cairn.agents.toolkit",
}

__all__ = [
    "AgentContext",
    "AgentSpec",
    "AgentState",
    "AgentStatus",
    "ArchiveReport",
    "AsyncClient",
    "AsyncTask",
    "Budget",
    "CheckpointDetail",
    "CheckpointInfo",
    "Client",
    "CodeAgent",
    "Decision",
    "Diff",
    "Export",
    "GCOrigin",
    "GCStatus",
    "Lineage",
    "LiveCall",
    "LiveReply",
    "LogLine",
    "MemberBudget",
    "Outcome",
    "PendingCall",
    "Price",
    "Reply",
    "RestoreResult",
    "Settings",
    "StepFailure",
    "Task",
    "TaskResult",
    "TaskSpec",
    "TaskState",
    "TaskStatus",
    "Team",
    "Timeline",
    "ToolContext",
    "TraceEntry",
    "__version__",
    "agent",
    "errors",
    "tool",
]


def _version() -> str:
    """The installed distribution's version; `0+unknown` in a source tree never installed."""
    import importlib.metadata  # noqa: PLC0415 - ~50 ms that only `cairn.__version__` pays

    try:
        return importlib.metadata.version("cairn-agents")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


if not _typing.TYPE_CHECKING:  # hidden from mypy, which would accept any attribute name after it

    def __getattr__(name: str) -> object:
        # Called only for a name not imported yet: import it, and keep it for next time.
        if name == "__version__":
            value: object = _version()
        elif name in _HOMES:
            value = getattr(_importlib.import_module(_HOMES[name]), name)
        else:
            raise AttributeError(f"module 'cairn' has no attribute {name!r}")
        globals()[name] = value
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
