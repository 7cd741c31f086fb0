"""`TaskSpec`: a collaborative task as a user writes it, in YAML or JSON.

Loading refuses an invalid spec with `InvalidSpec` naming the field and the reason; the
spec then becomes the `TaskRecord` every step reads, the initial workspace files, and the
limits the coordinator enforces.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field, model_validator

from agents.accounting import Budget, Price
from agents.spec import (
    MAX_PROMPT_CHARS,
    AgentSpec,
    CheckpointTriggers,
    StepPolicy,
    Strict,
    TaskRecord,
    parse_model,
)
from agents.workspace import check_path
from storage.errors import InvalidSpec, RecordNotFound, ToolError
from storage.records import Record
from storage.store import CheckpointStore

MAX_WORKSPACE_BYTES = 256 * 1024 * 1024


class CheckpointPolicy(Strict):
    """How a task checkpoints: the design's `checkpoints` block."""

    every: int = Field(default=1, ge=1, le=1_000)  # commit a GC every N supersteps
    hot_keep: int = Field(default=3, ge=1, le=10_000)
    cold_keep: int = Field(default=50, ge=1, le=1_000_000)
    archive_every: int = Field(default=1, ge=1, le=1_000)
    durability: Literal["async", "sync", "replicated"] = "async"
    # Under `replicated`: how long a commit waits for a Redis replica to hold its GC.
    replica_timeout: float = Field(default=1.0, gt=0, le=60)
    tool_level: Literal["none", "side_effects", "all"] = "side_effects"
    full_every: int = Field(default=20, ge=1, le=10_000)
    model_reply: bool = False


class TaskSpec(Strict):
    """A task: its goal, its team, its workspace, how it is verified, its limits."""

    name: str = Field(min_length=1, max_length=200)
    goal: str = Field(min_length=1, max_length=MAX_PROMPT_CHARS)
    workspace: str | None = None  # a directory, relative to the spec's own
    files: dict[str, str] = Field(default_factory=dict)  # or inline files
    agents: list[AgentSpec] = Field(min_length=1, max_length=1_000)
    verify: str | None = None
    verify_timeout: float = Field(default=300.0, gt=0, le=24 * 3600)
    max_supersteps: int = Field(default=50, ge=1, le=100_000)
    # Above a model call's default `timeout` (600 s), with room for the step's tools: a
    # step still running at `step_timeout` is retried, and its model call paid again.
    step_timeout: float = Field(default=900.0, gt=0, le=24 * 3600)
    checkpoints: CheckpointPolicy = Field(default_factory=CheckpointPolicy)
    budget: Budget | None = None
    prices: dict[str, Price] = Field(default_factory=dict)  # model → USD per million tokens

    @model_validator(mode="after")
    def _one_workspace(self) -> TaskSpec:
        if self.workspace is not None and self.files:
            raise ValueError("give either `workspace` (a directory) or `files`, not both")
        names = [a.name for a in self.agents]
        if len(names) != len(set(names)):
            raise ValueError(f"agent names must be unique: {names}")
        for path in self.files:
            try:
                check_path(path)
            except ToolError as exc:
                raise ValueError(f"files: {exc}") from None
        for agent in self.agents:
            calls_out = agent.model.split(":")[0] != "scripted"  # a script waits on nothing
            if calls_out and agent.timeout >= self.step_timeout:
                raise ValueError(
                    f"agent {agent.name}: timeout ({agent.timeout:g} s) must be below "
                    f"step_timeout ({self.step_timeout:g} s): a step still running at "
                    "step_timeout is retried, and its model call paid again"
                )
        total = sum(len(c.encode(errors="surrogatepass")) for c in self.files.values())
        if total > MAX_WORKSPACE_BYTES:  # as a `workspace` directory is, in workspace_files
            raise ValueError(f"files: {total} bytes in all; at most {MAX_WORKSPACE_BYTES}")
        return self

    def policy(self) -> StepPolicy:
        """The policy steps follow."""
        triggers = CheckpointTriggers(
            model_reply=self.checkpoints.model_reply, tool_call=self.checkpoints.tool_level
        )
        return StepPolicy(
            triggers=triggers,
            full_every=self.checkpoints.full_every,
            command_timeout=min(self.step_timeout, 3600),
        )

    def record(self, task: str) -> TaskRecord:
        """The record of task `task` that every step reads."""
        return TaskRecord(
            task=task, goal=self.goal, agents=self.agents, policy=self.policy(), prices=self.prices
        )

    def limits(self) -> Limits:
        """The limits the coordinator enforces."""
        return Limits(
            verify=self.verify,
            verify_timeout=self.verify_timeout,
            max_supersteps=self.max_supersteps,
            step_timeout=self.step_timeout,
            checkpoints=self.checkpoints,
            budget=self.budget,
        )

    def workspace_files(self, base: Path) -> dict[str, bytes]:
        """Return the initial workspace: inline files, or the directory's regular files."""
        if self.workspace is None:
            return {path: content.encode() for path, content in self.files.items()}
        root = (base / self.workspace).resolve()
        if not root.is_dir():
            raise InvalidSpec(
                f"invalid task spec: workspace: {self.workspace!r} is not a directory"
            )
        files: dict[str, bytes] = {}
        total = 0
        for directory, dirs, names in os.walk(root):
            dirs[:] = sorted(d for d in dirs if not Path(directory, d).is_symlink())
            for name in sorted(names):
                path = Path(directory, name)
                if path.is_symlink() or not path.is_file():
                    continue  # links may lead anywhere; only real files are the workspace
                content = path.read_bytes()
                total += len(content)
                if total > MAX_WORKSPACE_BYTES:
                    raise InvalidSpec(
                        f"invalid task spec: workspace is over {MAX_WORKSPACE_BYTES} bytes"
                    )
                files[path.relative_to(root).as_posix()] = content
        return files


def load_spec(path: str | os.PathLike[str]) -> TaskSpec:
    """Read a task spec from a YAML or JSON file, or raise `InvalidSpec` saying what is wrong."""
    source = Path(path)
    try:
        text = source.read_text()
    except OSError as exc:
        raise InvalidSpec(f"cannot read task spec {source}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise InvalidSpec(
            f"task spec {source} is not UTF-8 text (byte {exc.start}: {exc.reason})"
        ) from None
    try:
        data = json.loads(text) if source.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError, RecursionError) as exc:  # RecursionError: too deep
        kind = "JSON" if source.suffix == ".json" else "YAML"
        first = str(exc).splitlines()[0]
        raise InvalidSpec(f"task spec {source} is not valid {kind}: {first}") from None
    if not isinstance(data, dict):
        raise InvalidSpec(f"task spec {source} must be a mapping of fields")
    spec = parse_model(TaskSpec, data, "task spec")
    try:  # a JSON or YAML escape can make a lone surrogate, which no record can store
        spec.model_dump_json()
    except ValueError:
        raise InvalidSpec(
            f"task spec {source} holds text that is not valid Unicode (a lone surrogate)"
        ) from None
    return spec


LIMITS_DOC = "limits"  # the task document holding its `Limits`


class Limits(Record):
    """The part of a task's spec the coordinator (and a restore) enforces."""

    verify: str | None = None
    verify_timeout: float = 300.0
    max_supersteps: int = 50
    step_timeout: float = 900.0
    checkpoints: CheckpointPolicy = CheckpointPolicy()
    budget: Budget | None = None


def read_limits(store: CheckpointStore, task: str) -> Limits:
    """The task's limits, as `Tasks.submit` stores them.

    A task started without a coordinator (`agents.task.start_task`, as embedders and the
    benchmarks do), or whose submit died before its limits were stored, has none: nothing
    asked it for `sync` (under `sync` the limits are stored before the submit acknowledges
    anything) nor for a budget, so it gets the defaults. A limits document that is there
    but damaged raises `CorruptCheckpoint`.
    """
    try:
        return store.read_doc(task, LIMITS_DOC, Limits)
    except RecordNotFound:
        return Limits()


def read_policy(store: CheckpointStore, task: str) -> CheckpointPolicy:
    """The task's checkpoint policy (`read_limits`)."""
    return read_limits(store, task).checkpoints
