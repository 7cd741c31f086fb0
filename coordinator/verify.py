"""Running a task's `verify` command on the workspace of a global checkpoint."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agents.spec import StepPolicy
from agents.tools import ToolContext, run_command
from agents.workspace import Workspace
from storage.errors import ToolError
from storage.records import GlobalCheckpoint
from storage.store import CheckpointStore

VERIFIER = "_verify"  # the workspace copy's name; "_" keeps it apart from agent names


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether verification passed, and what the command printed."""

    passed: bool
    output: str


def verify(
    store: CheckpointStore, gc: GlobalCheckpoint, command: str, cache: Path, timeout: float
) -> Verdict:
    """Run `command` in a copy of `gc`'s workspace, as `run_command` runs an agent's."""
    workspace = Workspace(cache, gc.task, "verify")
    workspace.sync(store, store.read_manifest(gc.task, gc.workspace).files)
    ctx = ToolContext(workspace, VERIFIER, [], gc.superstep, StepPolicy(command_timeout=timeout))
    try:
        output = run_command(ctx, {"command": command})
    except ToolError as exc:
        return Verdict(False, str(exc))
    return Verdict(output.startswith("exit code 0\n"), output)
