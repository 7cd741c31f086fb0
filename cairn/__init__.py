"""Cairn: crash-proof teams of LLM agents on Redis and RQ. The public Python API.

    from cairn import Client

    with Client() as client:  # CAIRN_REDIS_URL, else a running `cairn up`
        task = client.submit("team.yaml")
        status = task.wait(timeout=120)
        print(status.state, [a.status for a in status.agents])
        task.restore(to=1)

Everything promised is named in `__all__`; errors are in `cairn.errors`, the LangGraph
checkpointer is `cairn.langgraph.CairnSaver` (the `langgraph` extra), the command line
is `cairn.cli`, and `tool` (with `ToolContext`) makes a Python function a tool that
workers load (docs/tools.md).
"""

import importlib.metadata as _metadata

from cairn import errors
from cairn.agents.accounting import Budget, Price
from cairn.agents.toolkit import tool
from cairn.agents.tools import ToolContext
from cairn.client import Client, Task
from cairn.coordinator.diff import Diff
from cairn.coordinator.runs import TaskState
from cairn.coordinator.settings import Settings
from cairn.coordinator.spec import TaskSpec
from cairn.coordinator.timeline import Timeline
from cairn.coordinator.views import (
    AgentStatus,
    CheckpointInfo,
    Decision,
    Export,
    Lineage,
    PendingCall,
    RestoreResult,
    TaskStatus,
)
from cairn.storage.archive import ArchiveReport
from cairn.storage.records import AgentState, GCStatus

try:
    __version__ = _metadata.version("cairn-agents")
except _metadata.PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "AgentState",
    "AgentStatus",
    "ArchiveReport",
    "Budget",
    "CheckpointInfo",
    "Client",
    "Decision",
    "Diff",
    "Export",
    "GCStatus",
    "Lineage",
    "PendingCall",
    "Price",
    "RestoreResult",
    "Settings",
    "Task",
    "TaskSpec",
    "TaskState",
    "TaskStatus",
    "Timeline",
    "ToolContext",
    "__version__",
    "errors",
    "tool",
]
