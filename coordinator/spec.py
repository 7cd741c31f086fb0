"""`TaskSpec`: a collaborative task as a user writes it, in YAML or JSON.

Loading refuses an invalid spec with `InvalidSpec` naming the field and the reason; the
spec then becomes the `TaskRecord` every step reads, the initial workspace files, and the
limits the coordinator enforces.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeAlias

import yaml
from pydantic import (
    BaseModel,
    Field,
    JsonValue,
    field_validator,
    model_validator,
)

from cairn.agents.accounting import Budget, Price
from cairn.agents.kinds.python import CodeAgent
from cairn.agents.results import check_schema, schema_of
from cairn.agents.spec import (
    MAX_AGENTS,
    MAX_PROMPT_CHARS,
    AgentSpec,
    CheckpointTriggers,
    StepPolicy,
    TaskRecord,
    parse_model,
)
from cairn.agents.spec_errors import Strict, UserSpec
from cairn.agents.userfiles import Marks, load_json, load_yaml_marked, read_bounded
from cairn.agents.workspace import (
    FILE_LIMIT,
    MAX_FILE_LIMIT,
    MAX_WORKSPACE_LIMIT,
    WORKSPACE_LIMIT,
    check_path,
    tree_clashes,
)
from cairn.errors import InvalidSpec, RecordNotFound, ToolError
from cairn.storage.public import public
from cairn.storage.records import Record
from cairn.storage.store import CheckpointStore

MAX_WORKSPACE_BYTES = 256 * 1024 * 1024
MAX_SPEC_BYTES = 16 * 1024 * 1024  # of a spec file; a larger workspace goes in `workspace`

if TYPE_CHECKING:  # in Python, a pydantic model class too: `_result_schema` makes it its schema
    ResultSchema: TypeAlias = dict[str, JsonValue] | type[BaseModel]
else:  # what pydantic validates, once a class was made its schema (and what the spec holds)
    ResultSchema = dict[str, JsonValue]


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


@public
class TaskSpec(UserSpec):
    """A task: its goal, its team, its workspace, how it is verified, its limits.

    An invalid one raises `InvalidSpec` ("invalid task spec: ..."), as `load_spec` does.
    """

    described_as: ClassVar[str] = "task spec"

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
    network: bool = False  # agents' commands and `verify` reach the network (else none)
    max_file_bytes: int = Field(default=FILE_LIMIT, ge=1, le=MAX_FILE_LIMIT)
    max_workspace_bytes: int = Field(default=WORKSPACE_LIMIT, ge=1, le=MAX_WORKSPACE_LIMIT)
    # The JSON Schema of the task's result, which the agent that finishes gives `finish`
    # (agents/results.py); None: the task's outcome is its files and summaries alone.
    result: ResultSchema | None = None
    # How many members the task may hold, the spec's agents and those they spawn
    # (`spawn_agent`); None: 32, or as many as the spec lists if it lists more.
    max_agents: int | None = Field(default=None, ge=1, le=MAX_AGENTS)

    @field_validator("result", mode="before")
    @classmethod
    def _result_schema(cls, value: object) -> object:
        return schema_of(value)

    @field_validator("result")
    @classmethod
    def _checkable_result(cls, value: dict[str, JsonValue] | None) -> dict[str, JsonValue] | None:
        return None if value is None else check_schema(value)

    @model_validator(mode="after")
    def _one_workspace(self) -> TaskSpec:
        if self.workspace is not None and self.files:
            raise ValueError("give either `workspace` (a directory) or `files`, not both")
        names = [a.name for a in self.agents]
        if len(names) != len(set(names)):
            raise ValueError(f"agent names must be unique: {names}")
        if self.max_agents is not None and len(names) > self.max_agents:
            raise ValueError(
                f"max_agents ({self.max_agents}) is below the {len(names)} agents listed"
            )
        _check_files(self.files, self.max_file_bytes)
        for agent in self.agents:
            calls_out = agent.model.split(":")[0] != "scripted"  # a script waits on nothing
            if calls_out and agent.timeout >= self.step_timeout:
                raise ValueError(
                    f"agent {agent.name}: timeout ({agent.timeout:g} s) must be below "
                    f"step_timeout ({self.step_timeout:g} s): a step still running at "
                    "step_timeout is retried, and its model call paid again"
                )
        if self.result is not None and not any("finish" in a.tools for a in self.agents):
            raise ValueError("result: no agent has the `finish` tool, which gives it")
        total = sum(len(c.encode(errors="surrogatepass")) for c in self.files.values())
        if total > self._initial_limit():  # as a `workspace` directory is, in workspace_files
            raise ValueError(f"files: {total} bytes in all; at most {self._initial_limit()}")
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
            network=self.network,
            max_file_bytes=self.max_file_bytes,
            max_workspace_bytes=self.max_workspace_bytes,
        )

    def record(self, task: str) -> TaskRecord:
        """The record of task `task` that every step reads."""
        schema = self.result
        assert not isinstance(schema, type)  # `_result_schema` made a model class its schema
        return TaskRecord(task=task, goal=self.goal, agents=self.agents, policy=self.policy(),
                          prices=self.prices, result=schema,
                          max_agents=self.max_agents)  # fmt: skip

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

    def _initial_limit(self) -> int:
        """The bytes the initial workspace may hold: its limit, within what a submit holds."""
        return min(MAX_WORKSPACE_BYTES, self.max_workspace_bytes)

    def workspace_files(self, base: Path) -> dict[str, bytes]:
        """Return the initial workspace: inline files, or the directory's regular files.

        Each file is held to `max_file_bytes` (its size read before its content), all of them
        to `max_workspace_bytes` and to what a submit holds in memory.
        """
        if self.workspace is None:
            return {check_path(path): content.encode() for path, content in self.files.items()}
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
                relative = path.relative_to(root).as_posix()
                size = path.stat().st_size
                if size > self.max_file_bytes:
                    raise InvalidSpec(
                        f"invalid task spec: workspace: {relative} is {size} bytes; a file may "
                        f"have at most {self.max_file_bytes} (max_file_bytes)"
                    )
                content = path.read_bytes()
                total += len(content)
                if total > self._initial_limit():
                    raise InvalidSpec(
                        f"invalid task spec: workspace is over {self._initial_limit()} bytes"
                    )
                files[relative] = content
        return files


def _check_files(files: dict[str, str], max_file: int) -> None:
    """Raise `ValueError` unless inline `files` are a tree of files of `max_file` bytes or less."""
    named: dict[str, str] = {}  # canonical path → as the spec wrote it
    for path, content in files.items():
        try:
            normal = check_path(path)
        except ToolError as exc:
            raise ValueError(f"files: {exc}") from None
        if normal == ".":
            raise ValueError(f"files: {path!r} is the workspace itself, not a file")
        if normal in named:
            raise ValueError(f"files: {named[normal]!r} and {path!r} name one file")
        named[normal] = path
        size = len(content.encode(errors="surrogatepass"))
        if size > max_file:
            raise ValueError(
                f"files: {normal} is {size} bytes; a file may have at most {max_file} "
                "(max_file_bytes)"
            )
    for above, below in tree_clashes(named)[:1]:
        raise ValueError(f"files: {above} is a file and a directory ({below})")


def load_spec(path: str | os.PathLike[str]) -> TaskSpec:
    """Read a task spec from a YAML or JSON file, or raise `InvalidSpec` saying what is wrong.

    And where: the file, and the line and column of a YAML or JSON syntax error, or of a
    bad field of a YAML file (`task.yaml:12:5: invalid task spec: agents[coder]: ...`).
    """
    source = Path(path)
    raw = read_bounded(source, MAX_SPEC_BYTES, f"task spec {source}")
    try:
        text = raw.decode()
    except UnicodeDecodeError as exc:
        raise InvalidSpec(
            f"task spec {source} is not UTF-8 text (byte {exc.start}: {exc.reason})"
        ) from None
    marks: Marks = {}
    try:
        if source.suffix == ".json":
            data = load_json(text)
        else:
            data, marks = load_yaml_marked(text)
    except json.JSONDecodeError as exc:
        raise InvalidSpec(
            f"{source}:{exc.lineno}:{exc.colno}: task spec is not valid JSON: {exc.msg}"
        ) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or str(exc).splitlines()[0]
        at = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else str(source)
        raise InvalidSpec(f"{at}: task spec is not valid YAML: {problem}") from None
    except (ValueError, yaml.YAMLError) as exc:
        kind = "JSON" if source.suffix == ".json" else "YAML"
        first = str(exc).splitlines()[0]
        raise InvalidSpec(f"task spec {source} is not valid {kind}: {first}") from None
    if not isinstance(data, dict):
        raise InvalidSpec(f"task spec {source} must be a mapping of fields")
    try:
        spec = parse_model(TaskSpec, data, "task spec")
    except InvalidSpec as exc:
        raise InvalidSpec(f"{_located(source, marks, exc.field)}: {exc}", field=exc.field) from None
    try:  # a JSON or YAML escape can make a lone surrogate, which no record can store
        spec.model_dump_json()
    except ValueError:
        raise InvalidSpec(
            f"task spec {source} holds text that is not valid Unicode (a lone surrogate)"
        ) from None
    return spec


def _located(source: Path, marks: Marks, field: tuple[str | int, ...]) -> str:
    """`task.yaml:12:5`: where in the file `field` is (or the nearest value holding it)."""
    for end in range(len(field), 0, -1):
        if field[:end] in marks:
            line, column = marks[field[:end]]
            return f"{source}:{line}:{column}"
    return str(source)


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

    A task started without a coordinator (`cairn.agents.task.start_task`, as embedders and the
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


@public
class Team(TaskSpec):
    """A task declared in Python: `client.submit(Team("goal", [planner, coder]))`.

    `agents` may hold agents written in Python (`cairn.agent`: a member of that kind, by
    the kind's name, asking no model) beside `AgentSpec`s and mappings of their fields.
    The task's name is the goal's first line unless given; every other `TaskSpec` field
    is a keyword. Validated as a YAML spec is: `InvalidSpec` names the first bad field.
    """

    described_as: ClassVar[str] = "team"

    def __init__(
        self, goal: str, agents: Sequence[AgentSpec | CodeAgent | Mapping[str, Any]],
        **fields: Any,  # noqa: ANN401 - `TaskSpec`'s fields, validated as a spec's are
    ) -> None:  # fmt: skip
        members = [a.spec() if isinstance(a, CodeAgent) else a for a in agents]
        name = fields.pop("name", None) or (goal.strip().splitlines() or ["team"])[0][:200]
        super().__init__(name=name, goal=goal, agents=members, **fields)

    # `Team.model_validate` takes the fields (`name` too) as `TaskSpec.model_validate` does.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]
