"""The records Cairn stores: local and global checkpoints, trace records, manifests.

Every record is a pydantic model with a `schema_version`. What is checksummed is the
record's canonical bytes (see `cairn.storage.codec`); `checksum` and `size` are filled in when
a record is read back and are never part of those bytes.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from enum import Enum
from typing import Annotated, Generic, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from cairn.storage.public import public

SCHEMA_VERSION = 7  # what this code writes; older records are read through storage/upcast.py


def utcnow() -> datetime:
    """Return the current time, timezone-aware, in UTC."""
    return datetime.now(UTC)


# NaN and infinities have no JSON form: refuse them when a record is built, not when read.
STRICT = ConfigDict(extra="forbid", allow_inf_nan=False)


class Record(BaseModel):
    """Base of stored records: strict about unknown fields, carries its schema version."""

    model_config = STRICT

    schema_version: int = SCHEMA_VERSION
    # Filled from the envelope on read; excluded so they never enter the checksummed bytes.
    checksum: Annotated[str, Field(exclude=True)] = ""
    size: Annotated[int, Field(exclude=True)] = 0


class Role(str, Enum):
    """Who speaks a message in the model-facing history."""

    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


@public
class AgentState(str, Enum):
    """Where an agent stands after a step."""

    ACTIVE = "active"
    HALTED = "halted"
    WAITING_APPROVAL = "waiting_approval"
    FINISHED = "finished"
    FAILED = "failed"


class Level(str, Enum):
    """Which event a local checkpoint was taken at."""

    STEP = "step"
    TOOL = "tool"


class EpochFloor(Record):
    """The highest epoch a task has handed out, kept in the archive (see `raise_epoch`)."""

    epoch: int


class Effects(str, Enum):
    """What a tool call may change, which decides whether a tool-level LC precedes it.

    `none` reads only; `workspace` writes the step's tree or outbox, which a retry
    discards and redoes; `external` reaches anything else (a command, an API).
    """

    NONE = "none"
    WORKSPACE = "workspace"
    EXTERNAL = "external"


@public
class GCStatus(str, Enum):
    """The two-phase-commit state of a global checkpoint."""

    PREPARING = "PREPARING"
    COMMITTED = "COMMITTED"
    ABORTED = "ABORTED"


@public
class GCOrigin(str, Enum):
    """What wrote a global checkpoint.

    `superstep`: a barrier (and a submit, whose GC 0 opens superstep 0); `restore`: a
    restore a person or a coordinator asked for; `rollback`: a superstep given up, the task
    rolled back to its latest committed GC; `fork`: GC 0 of a task forked from another's.
    """

    SUPERSTEP = "superstep"
    RESTORE = "restore"
    ROLLBACK = "rollback"
    FORK = "fork"


class ToolCall(BaseModel):
    """One tool call a model asked for."""

    model_config = STRICT

    id: str
    name: str
    args: dict[str, JsonValue] = Field(default_factory=dict)


class ImagePart(BaseModel):
    """An image a tool returned, kept for a model that takes images: its type and bytes.

    The message's text notes it too, so a model shown no images still reads what came back.
    """

    model_config = STRICT

    media_type: str  # image/png, image/jpeg, image/gif or image/webp
    data: str  # base64 of the image's bytes

    @property
    def size(self) -> int:
        """The image's size in bytes (decoded)."""
        return len(self.data.rstrip("=")) * 3 // 4


class Message(BaseModel):
    """One message of the model-facing history (chat-completions shaped)."""

    model_config = STRICT

    role: Role
    content: str | None = None
    name: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    # A tool result's images. Left out of the stored form when empty, so a message without
    # any is stored as it was before messages carried images.
    images: list[ImagePart] = Field(default_factory=list, exclude_if=lambda images: not images)
    # A tool result that says the call failed (its content is the error). Left out of the
    # stored form when False, as `images` is when empty.
    error: bool = Field(default=False, exclude_if=lambda error: not error)


class Usage(BaseModel):
    """Tokens a model call used (or many calls together) and, at known prices, its cost.

    `prompt_tokens` counts the whole prompt, `cached_tokens` the part of it the provider
    read from its prompt cache (billed at a discount), `cache_write_tokens` the part it
    wrote to that cache (billed at a premium, by Anthropic), `completion_tokens` the answer;
    `cost_usd` is what they cost at the task's prices (0 for a model without a price).
    """

    model_config = STRICT

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: float = Field(default=0.0, ge=0)
    # Left out of the stored form while 0, as for every call but an Anthropic cache write.
    cache_write_tokens: int = Field(default=0, exclude_if=lambda tokens: not tokens)

    @property
    def tokens(self) -> int:
        """Prompt plus completion tokens (cached ones are part of the prompt)."""
        return self.prompt_tokens + self.completion_tokens

    def plus(self, other: Usage) -> Usage:
        """The two usages together."""
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            cached_tokens=self.cached_tokens + other.cached_tokens,
            cost_usd=self.cost_usd + other.cost_usd,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
        )

    def minus(self, other: Usage) -> Usage:
        """`self` less `other`, never below zero (a float cost may round to -1e-18)."""
        return Usage(
            prompt_tokens=max(0, self.prompt_tokens - other.prompt_tokens),
            completion_tokens=max(0, self.completion_tokens - other.completion_tokens),
            cached_tokens=max(0, self.cached_tokens - other.cached_tokens),
            cost_usd=max(0.0, self.cost_usd - other.cost_usd),
            cache_write_tokens=max(0, self.cache_write_tokens - other.cache_write_tokens),
        )


class ContextView(BaseModel):
    """What an agent's model is sent of its history, once some of it was compacted.

    The history itself stays whole and append-only; the model is sent its first `head`
    messages (the system prompt and the goal), then `summary` as one message, then every
    message from `start` on. `folded` counts the messages left out, all compactions
    together. `counted` is the prompt the provider counted for the agent's last model call,
    which was sent the history up to message `counted_at`: the next call's size is that
    plus an estimate of what came since (0 when nothing was counted since the view changed).
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)

    head: int = 0
    start: int = 0
    summary: str | None = None
    folded: int = 0
    counted: int = 0
    counted_at: int = 0


class TraceRecord(Record):
    """What happened in one step (tool is None) or one tool call within it."""

    step: int
    superstep: int
    tool: str | None = None
    arguments: dict[str, JsonValue] = Field(default_factory=dict)
    result: JsonValue = None
    side_effect: bool = False  # the call's effects are external
    effects: Effects | None = None  # a tool call's; None for the model's turn
    # Recorded for an external call: the same on every retry and replay of this call.
    idempotency_key: str | None = None
    error: str | None = None
    started_at: datetime
    finished_at: datetime
    duration_ms: float
    usage: Usage | None = None
    # A compaction's record: how many messages it left out of what the model is sent.
    compacted: int | None = Field(default=None, exclude_if=lambda count: count is None)


class LCRef(BaseModel):
    """How a vote or a global checkpoint names a local checkpoint: id plus checksum."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)

    id: str
    checksum: str


class InboxMessage(BaseModel):
    """A message sent in one superstep and delivered at its barrier.

    `seq` numbers the messages of one recipient (1, 2, …): an agent's inbox cursor is the
    `seq` of the last message it has read.
    """

    model_config = STRICT

    id: str
    seq: int
    sender: str
    recipient: str
    superstep: int
    content: str


class SpawnRequest(BaseModel):
    """A member an agent's step asked to add to the team, joining at the step's barrier.

    `spec` is the new member's agent spec as JSON (`cairn.agents.spec.AgentSpec`),
    checked when the step recorded it; `brief` is its first message, from the spawner.
    `lc` is the new member's first LC, which the spawning step wrote before its vote (as
    every step writes its own LC before the commit), so the barrier only names it.
    """

    model_config = STRICT

    name: str
    spec: dict[str, JsonValue]
    brief: str
    # None in a step's tool-level LCs, and in records of code that wrote none.
    lc: LCRef | None = Field(default=None, exclude_if=lambda ref: ref is None)


class Spawned(BaseModel):
    """How a member spawned at run time joined: who spawned it, when, and its spec."""

    model_config = STRICT

    parent: str
    superstep: int  # the superstep whose barrier it joined at
    spec: dict[str, JsonValue]  # its `AgentSpec`, as JSON


class AgentResult(BaseModel):
    """The result an agent gave when it last finished: a value that fit the task's schema."""

    model_config = STRICT

    value: JsonValue
    superstep: int  # the superstep whose `finish` gave it: the latest is the task's


TraceT = TypeVar("TraceT")


class BaseLocalCheckpoint(Record, Generic[TraceT]):
    """The fields of a local checkpoint, generic in what its trace is parsed into.

    `LocalCheckpoint` is the record; a reader may parse the same JSON with other trace
    entries, such as ones that count a trace without building it.
    """

    id: str
    parent_id: str | None = None
    parent_checksum: str | None = None
    depth: int = 0
    full: bool = True
    created_at: datetime = Field(default_factory=utcnow)
    # execution context
    task: str
    agent: str
    step: int
    superstep: int
    status: AgentState = AgentState.ACTIVE
    epoch: int
    attempt: int
    level: Level = Level.STEP
    # history: a delta unless full
    message_base: int = 0
    trace_base: int = 0
    messages: list[Message] = Field(default_factory=list)
    trace: list[TraceT] = Field(default_factory=list)
    # environment
    workspace_before: str | None = None
    workspace_after: str | None = None
    inbox_cursor: int = 0
    # what this step did to the world so far, for the barrier: files (path → blob sha, or
    # None when deleted) and messages sent; both start empty at each step
    changes: dict[str, str | None] = Field(default_factory=dict)
    outbox: list[InboxMessage] = Field(default_factory=list)
    # Members the step spawned, joining at its barrier (as `outbox` is delivered there).
    # Left out of the stored form when empty, as it is for every step that spawns none.
    spawns: list[SpawnRequest] = Field(default_factory=list, exclude_if=lambda spawns: not spawns)
    # What the model calls of the agent's whole history used, up to this LC (None in
    # records of schema 1, which did not keep it: their trace has it, call by call).
    usage: Usage | None = None
    # The agent kind's own state, whole in every LC (`cairn.agents.kinds`). Left out of the
    # stored form when empty, as it is for every `llm` agent.
    kind_state: dict[str, JsonValue] = Field(
        default_factory=dict, exclude_if=lambda state: not state
    )
    # What the agent's model is sent of its history (`ContextView`); None: all of it, and
    # nothing counted yet. Left out of the stored form when None.
    context: ContextView | None = Field(default=None, exclude_if=lambda view: view is None)
    # The result the agent gave its task's `finish` (agents/results.py), whole in every LC
    # after. Left out of the stored form when unset, so an LC without one is as it was.
    result: AgentResult | None = Field(default=None, exclude_if=lambda result: result is None)

    @property
    def added_messages(self) -> list[Message]:
        """The messages this LC adds to its parent's history (a full LC holds them all)."""
        return self.messages[self.message_base :] if self.full else self.messages

    @property
    def added_trace(self) -> list[TraceT]:
        """The trace records this LC adds to its parent's (a full LC holds them all)."""
        return self.trace[self.trace_base :] if self.full else self.trace


class LocalCheckpoint(BaseLocalCheckpoint[TraceRecord]):
    """An agent's state after a step (level step) or before a tool call (level tool).

    Stored incrementally: unless `full`, `messages` and `trace` hold only what the parent
    lacked, and `message_base`/`trace_base` say how many the parent had. `depth` counts
    step checkpoints since the agent's first; a checkpoint is full when depth is a multiple
    of `full_every`, which bounds the chain a read must walk, and when a restore staged it.
    """

    @property
    def name(self) -> str:
        """The name a person reads: `{task}_{superstep}_{agent}_{level}`."""
        return f"{self.task}_{self.superstep}_{self.agent}_{self.level.value}"


class GlobalCheckpoint(Record):
    """The coordinator's record of a barrier: one LC per agent, the workspace, the inbox."""

    task: str
    number: int
    superstep: int
    status: GCStatus = GCStatus.PREPARING
    epoch: int
    members: dict[str, LCRef] = Field(default_factory=dict)
    # agent → its status in its member LC, so a coordinator can pick who runs next
    statuses: dict[str, AgentState] = Field(default_factory=dict)
    workspace: str
    inbox: list[InboxMessage] = Field(default_factory=list)
    # agent → seq of the last message ever delivered to it (the next one gets seq + 1)
    delivered: dict[str, int] = Field(default_factory=dict)
    # member → how it joined, for each member spawned at run time (not in the task's spec):
    # its spec lives here, so a restore, a fork and a diff carry it with the membership.
    # Left out of the stored form when empty.
    spawned: dict[str, Spawned] = Field(
        default_factory=dict, exclude_if=lambda spawned: not spawned
    )
    # When this record was written (an aborted GC's: when it was marked aborted).
    created_at: datetime = Field(default_factory=utcnow)
    committed_at: datetime | None = None
    # What wrote it; None in records of schema 6 and older, which did not say (every
    # writer of schema 7 on names it).
    origin: GCOrigin | None = None
    # The GC a restore, a rollback or a fork started from (a fork's is of `source_task`).
    # Left out of the stored form when unset, as for every superstep's GC.
    source: int | None = Field(default=None, exclude_if=lambda number: number is None)
    source_task: str | None = Field(default=None, exclude_if=lambda task: task is None)

    def written(self, origin: GCOrigin, source: int | None = None, **update: object) -> Self:
        """A copy of this GC as a new record written now by `origin` (`update` on top).

        Its `created_at` is the present: a restore's GC is written now, whatever GC it
        copies. `source` is the GC a restore, rollback or fork started from.
        """
        fields = {"created_at": utcnow(), "committed_at": None, "origin": origin}
        return self.model_copy(update={**fields, "source": source, "source_task": None, **update})

    @property
    def name(self) -> str:
        """The name a person reads: `{task}_{superstep}_gc{number}`."""
        return f"{self.task}_{self.superstep}_gc{self.number}"


class AbortedGC(BaseModel):
    """What is kept of an aborted GC once its record left Redis: where it stood, and when."""

    model_config = STRICT

    number: int
    superstep: int
    epoch: int
    created_at: datetime
    origin: GCOrigin | None = None


class AbortedGCs(Record):
    """A task's aborted GCs whose records left Redis, kept in the archive, oldest first.

    An aborted GC is never archived (it committed nothing), so without this note its
    number would be a gap in the task's checkpoints that nothing explains.
    """

    gcs: list[AbortedGC] = Field(default_factory=list)


class WorkspaceManifest(Record):
    """A version of a task's workspace: path → sha256 of the file's blob."""

    files: dict[str, str] = Field(default_factory=dict)


def sha256_hex(data: bytes) -> str:
    """Return the hex SHA-256 of `data`: the address of a content-addressed blob."""
    return hashlib.sha256(data).hexdigest()
