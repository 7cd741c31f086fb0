"""What a step needs to know about its task: agents, their models and tools, the policy.

`TaskRecord` is stored with the task (document "spec") and read by every step; the
coordinator's user-facing `TaskSpec` produces it. Invalid input is refused with
`InvalidSpec` naming the field and the reason.
"""

from __future__ import annotations

import re
import urllib.parse
from typing import ClassVar, Literal, TypeVar, cast

import yaml
from pydantic import (
    BaseModel,
    Field,
    JsonValue,
    ValidationError,
    field_validator,
    model_validator,
)

from cairn.agents.accounting import MemberBudget, Price
from cairn.agents.mcp.names import MCP_REF
from cairn.agents.models.base import MAX_ARGS_BYTES, MAX_REPLY_CHARS, MAX_TOOL_CALLS, json_size
from cairn.agents.spec_errors import Strict, UserSpec, invalid
from cairn.agents.userfiles import load_yaml
from cairn.agents.workspace import (
    FILE_LIMIT,
    MAX_FILE_LIMIT,
    MAX_WORKSPACE_LIMIT,
    WORKSPACE_LIMIT,
    SizeLimits,
)
from cairn.errors import InvalidSpec
from cairn.storage.keys import check_name
from cairn.storage.public import public
from cairn.storage.records import Record

TOOL_NAMES = (  # the built-in tools (agents/tools.py), every agent's tools by default
    "list_files",
    "read_file",
    "write_file",
    "edit_file",
    "apply_patch",
    "run_command",
    "send_message",
    "finish",
)
# What every model API takes as a function name. A spec may name any such tool: whether a
# worker has it is checked on the worker, which alone knows its tools (agents/toolkit.py).
TOOL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")
LLM_KIND = "llm"  # the built-in kind: a model turn, then the tools it asked for
KIND_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$"  # a kind's name, as `cairn.agent` gives it
NO_MODEL = "none"  # the model of an agent in code that asks none
# How many members a task may hold, spawned ones too, unless its spec says (`max_agents`);
# a spec listing more agents holds that many.
DEFAULT_MAX_AGENTS = 32
MAX_AGENTS = 1_000
MAX_PROMPT_CHARS = 1_000_000  # of a task's goal or an agent's system prompt
MODEL_PATTERN = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}:\S{1,256}")
MODEL_CHOICES = (
    "'scripted' or '<provider>:<model name>' (openai:, anthropic:, or a provider a worker's "
    "package adds)"
)
KEY_VARIABLE_PATTERN = re.compile(r"[A-Z][A-Z0-9_]{0,120}_API_KEY")
RESERVED_PARAMS = ("model", "messages", "system", "tools", "stream", "stream_options")
MAX_PARAMS_BYTES = 64 * 1024
HEADER_NAME_PATTERN = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]{1,128}")
RESERVED_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "x-api-key",
        "api-key",
        "host",
        "content-length",
        "content-type",
        "transfer-encoding",
        "connection",
    }
)
MAX_HEADERS = 32
MAX_HEADER_CHARS = 4096
M = TypeVar("M", bound=BaseModel)


class FailSpec(Strict):
    """Make the scripted model raise on some attempts of a step."""

    attempts: list[int] = Field(min_length=1)
    error: Literal["retryable", "fatal"] = "retryable"
    message: str = "injected model failure"


class CrashSpec(Strict):
    """Make the worker SIGKILL itself mid-step, after `after_tools` tool calls ran."""

    attempts: list[int] = Field(min_length=1)
    after_tools: int = Field(default=1, ge=0)


class ContextPolicy(Strict):
    """How much of its history an agent's model is sent (`cairn.agents.compaction`).

    Before a model call whose prompt would pass `max_tokens` (estimated), the oldest turns
    are compacted: replaced by a summary (`summarize`, made by the agent's model or by
    `summary_model`, a model of the same provider) or dropped with a marker (`truncate`);
    the system prompt, the goal and the last `keep_last` turns are always sent whole.
    Unset, `max_tokens` is three quarters of the model's context window where Cairn knows
    it (`compaction.WINDOWS`), else compaction waits for the provider to say the prompt
    is too long. `off` sends the whole history, always.
    """

    max_tokens: int | None = Field(default=None, ge=1_000, le=100_000_000)
    keep_last: int = Field(default=4, ge=1, le=10_000)
    strategy: Literal["summarize", "truncate", "off"] = "summarize"
    summary_model: str | None = Field(default=None, pattern=r"^\S{1,256}$")


class ToolRequest(Strict):
    """A tool call a scripted turn makes."""

    name: str
    args: dict[str, JsonValue] = Field(default_factory=dict)

    @field_validator("args")
    @classmethod
    def _bounded_args(cls, value: dict[str, JsonValue]) -> dict[str, JsonValue]:
        # The scripted model must not make a call a real model's reply could not.
        size = json_size(value)
        if size > MAX_ARGS_BYTES:
            raise ValueError(f"{size} bytes as JSON; at most {MAX_ARGS_BYTES}")
        return value


class Turn(Strict):
    """One scripted model turn."""

    say: str | None = Field(default=None, max_length=MAX_REPLY_CHARS)
    tools: list[ToolRequest] = Field(default_factory=list, max_length=MAX_TOOL_CALLS)
    latency: float = Field(default=0.0, ge=0.0, le=3600.0)
    fail: FailSpec | None = None
    crash: CrashSpec | None = None


@public
class AgentSpec(UserSpec):
    """One member of the team.

    `kind` says what runs its steps: `llm` (the model loop: a turn, then the tools it asked
    for) or the name of an agent written in Python (`cairn.agent`) that its workers load.
    An invalid one raises `InvalidSpec` ("invalid agent spec: ...").
    """

    described_as: ClassVar[str] = "agent spec"
    name: str
    kind: str = Field(default=LLM_KIND, pattern=KIND_PATTERN)
    system: str = Field(default="", max_length=MAX_PROMPT_CHARS)
    # "scripted", "<provider>:<model name>", or "none" (an agent in code that asks no model)
    model: str  # no default for an `llm` agent (see _names_a_model)
    script: list[Turn] = Field(default_factory=list)
    base_url: str | None = None
    api_key_env: str | None = None
    timeout: float = Field(default=600.0, gt=0, le=24 * 3600)
    stream: bool = False  # ask for the reply streamed, shown live as it comes (docs/models.md)
    params: dict[str, JsonValue] = Field(default_factory=dict)
    headers: dict[str, str] = Field(default_factory=dict, max_length=MAX_HEADERS)
    tools: list[str] = Field(default_factory=lambda: list(TOOL_NAMES))
    approve: list[str] = Field(default_factory=list)
    max_retries: int = Field(default=3, ge=0, le=100)
    context: ContextPolicy = Field(default_factory=ContextPolicy)
    # What this member and the members it spawns may spend (coordinator/budgets.py).
    budget: MemberBudget | None = None

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        return check_name("agent", value)

    @model_validator(mode="before")
    @classmethod
    def _names_a_model(cls, data: object) -> object:
        # A default model would run a team on a script it does not have, or bill an API
        # nobody chose: every agent says which model it thinks with.
        if isinstance(data, dict) and "model" not in data:
            if data.get("kind", LLM_KIND) != LLM_KIND:  # code may ask no model: it says so
                return {**data, "model": NO_MODEL}
            if set(data) - set(cls.model_fields):  # a misspelt `modle`: the mistake to tell
                return data
            name = data.get("name")
            # The name is the user's and not yet checked: shown only when it keeps one line.
            shown = name if isinstance(name, str) and name.isprintable() and name else "?"
            raise ValueError(f"agent {shown[:64]} names no model: give {MODEL_CHOICES}")
        return data

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        if value not in ("scripted", NO_MODEL) and not MODEL_PATTERN.fullmatch(value):
            raise ValueError(f"must be {MODEL_CHOICES}")
        return value

    @model_validator(mode="after")
    def _llm_has_a_model(self) -> AgentSpec:
        if self.kind == LLM_KIND and self.model == NO_MODEL:
            raise ValueError(f"agent {self.name} is an llm agent: it needs a model, not none")
        return self

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None:
            split = urllib.parse.urlsplit(value)
            if split.scheme not in {"http", "https"} or not split.hostname:
                raise ValueError("must be an http:// or https:// URL with a host")
        return value

    @field_validator("api_key_env")
    @classmethod
    def _key_variable(cls, value: str | None) -> str | None:
        # Only *_API_KEY variables: a spec must not be able to send a worker's other
        # secrets (its signing key, a cloud credential) to a server of its choosing.
        if value is not None and not KEY_VARIABLE_PATTERN.fullmatch(value):
            raise ValueError("must be an environment variable name ending in _API_KEY")
        return value

    @field_validator("params")
    @classmethod
    def _passable_params(cls, value: dict[str, JsonValue]) -> dict[str, JsonValue]:
        reserved = sorted(set(value) & set(RESERVED_PARAMS))
        if reserved:
            raise ValueError(f"{reserved} are set by Cairn, not by params")
        size = json_size(value)
        if size > MAX_PARAMS_BYTES:
            raise ValueError(f"{size} bytes as JSON; at most {MAX_PARAMS_BYTES}")
        return value

    @field_validator("headers")
    @classmethod
    def _sendable_headers(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            if not HEADER_NAME_PATTERN.fullmatch(name):
                raise ValueError(f"{name!r} is not a header name")
            if name.lower() in RESERVED_HEADERS:
                raise ValueError(f"{name} is set by Cairn (a key goes in api_key_env)")
            if len(text) > MAX_HEADER_CHARS or not (text.isascii() and text.isprintable()):
                raise ValueError(
                    f"the value of {name} must be printable ASCII, at most {MAX_HEADER_CHARS}"
                )
        return value

    @field_validator("tools", "approve")
    @classmethod
    def _tool_names(cls, value: list[str]) -> list[str]:
        bad = [n for n in value if not (TOOL_NAME.fullmatch(n) or MCP_REF.fullmatch(n))]
        if bad:
            raise ValueError(
                f"{bad[0]!r} is not a tool name: letters, digits, _ and -, at most 64, "
                "or mcp:<server> or mcp:<server>/<tool>"
            )
        return list(dict.fromkeys(value))  # a tool named twice is offered once

    @model_validator(mode="after")
    def _approve_only_own_tools(self) -> AgentSpec:
        # `mcp:<server>/<tool>` may be approved where the agent has all of `mcp:<server>`.
        servers = {n for n in self.tools if MCP_REF.fullmatch(n)}
        missing = sorted(
            n for n in set(self.approve) - set(self.tools) if n.split("/")[0] not in servers
        )
        if missing:
            raise ValueError(f"approve names tools the agent does not have: {missing}")
        return self


class CheckpointTriggers(Strict):
    """Which events inside a step take a tool-level LC (the step's LC is always taken).

    `tool_call` is the design's `tool_level` policy: `none`, `side_effects` (before each
    tool that changes the world) or `all` (before every tool). `model_reply` takes one
    right after the model answers, so a crash never pays for that model call twice.
    """

    model_reply: bool = False
    tool_call: Literal["none", "side_effects", "all"] = "side_effects"


class StepPolicy(Strict):
    """How steps run and checkpoint."""

    triggers: CheckpointTriggers = Field(default_factory=CheckpointTriggers)
    full_every: int = Field(default=20, ge=1, le=10_000)
    command_timeout: float = Field(default=60.0, gt=0, le=24 * 3600)
    output_limit: int = Field(default=16_000, ge=256, le=10_000_000)
    heartbeat_ms: int = Field(default=1_000, ge=50, le=60_000)
    network: bool = False  # whether agents' commands may use the network (agents/sandbox.py)
    max_file_bytes: int = Field(default=FILE_LIMIT, ge=1, le=MAX_FILE_LIMIT)
    max_workspace_bytes: int = Field(default=WORKSPACE_LIMIT, ge=1, le=MAX_WORKSPACE_LIMIT)

    def size_limits(self) -> SizeLimits:
        """What the workspace's files may hold, one by one and together."""
        return SizeLimits(self.max_file_bytes, self.max_workspace_bytes)


class TaskRecord(Record):
    """A task as its steps see it: the goal, the team, the policy and its result's schema."""

    task: str
    goal: str
    agents: list[AgentSpec] = Field(min_length=1)
    policy: StepPolicy = Field(default_factory=StepPolicy)
    prices: dict[str, Price] = Field(default_factory=dict)  # model → its prices
    # The JSON Schema of the task's result (agents/results.py), checked when the spec was.
    # Left out of the stored form when unset, so a record without one is as it was.
    result: dict[str, JsonValue] | None = Field(
        default=None, exclude_if=lambda schema: schema is None
    )
    # How many members the task may hold, spawned ones too (`member_limit`). Left out of
    # the stored form when unset, so a record without one is as it was.
    max_agents: int | None = Field(
        default=None, ge=1, le=MAX_AGENTS, exclude_if=lambda limit: limit is None
    )

    @field_validator("task")
    @classmethod
    def _safe_task(cls, value: str) -> str:
        return check_name("task", value)

    @model_validator(mode="after")
    def _unique_agents(self) -> TaskRecord:
        names = [a.name for a in self.agents]
        if len(names) != len(set(names)):
            raise ValueError(f"agent names must be unique: {names}")
        return self

    @property
    def member_limit(self) -> int:
        """How many members the task may hold: `max_agents`, else the default or its team's size."""
        if self.max_agents is not None:
            return self.max_agents
        return max(DEFAULT_MAX_AGENTS, len(self.agents))

    def agent(self, name: str) -> AgentSpec:
        """Return the spec of submitted agent `name`, or raise `InvalidSpec`.

        A member spawned at run time has its spec in the GC: `cairn.agents.team.member_spec`.
        """
        for spec in self.agents:
            if spec.name == name:
                return spec
        raise InvalidSpec(f"task {self.task} has no agent {name!r}")


def parse_model(model: type[M], data: object, what: str) -> M:
    """Validate `data` as `model`, or raise `InvalidSpec` naming the first bad field of `what`.

    `field` of the error is where the bad field is in `data`.
    """
    try:
        # pydantic's validator itself: a `UserSpec`'s own `model_validate` would name it
        # by its class, not as `what`.
        return cast(M, model.__pydantic_validator__.validate_python(data))
    except ValidationError as exc:
        raise invalid(exc, what, data, model) from None


def load_policy(text: str) -> StepPolicy:
    """Parse a step policy from YAML (e.g. `triggers: {model_reply: true}`)."""
    try:
        data = load_yaml(text) or {}
    except yaml.YAMLError as exc:
        raise InvalidSpec(f"invalid policy YAML: {exc}".splitlines()[0]) from None
    return parse_model(StepPolicy, data, "policy")
