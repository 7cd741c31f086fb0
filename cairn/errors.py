"""Every error Cairn raises on purpose: one tree, one root (`CairnError`).

Grouped by who catches them: a caller of `cairn.Client` (or of the CLI) meets the first
group, the engine handles storage faults (it stops a fenced writer, passes a damaged
record over), and a step's runtime decides from a step's errors whether to retry it.

CairnError
│   a caller's mistakes, and a deployment that cannot serve the call
├── InvalidSpec          bad input: a spec, a setting, an agent the task does not have
├── InvalidName          a task or agent name that cannot be a key or a path
├── NotFound             what a call names is not there
│   ├── TaskNotFound     no task of that id is known to Redis or the archive
│   └── CheckpointNotFound  the task has no (committed) checkpoint of that number
├── Unavailable          Redis does not answer, or no Redis is configured (worth retrying)
├── Timeout              a wait for a task ran out before the task ended
├── RestoreFailed        no committed checkpoint could be restored
├── RedisServerError     a private redis-server cannot be found or started
├── NoResult             a task declares no result, or no agent has given one yet
│   storage faults
├── FencedWrite          a write carried a stale epoch or attempt
├── CommitRefused        a global checkpoint named a missing or mismatched record
├── NotCommitted         a global checkpoint to archive is not committed
├── RecordNotFound       a record is in neither the hot store nor the archive
├── CorruptCheckpoint    stored bytes failed their checksum, framing or schema
├── RecordTooLarge       a record to write is over the size a record may have
├── ArchiveError         the disk archive could not be written
│   └── ArchiveConflict  the archive holds another record under that name
│   a step's errors
├── ModelError           a model call failed (retryable or not)
├── ToolError            a tool call cannot be done; the model reads why
│   ├── PatchError       a patch is malformed or does not apply
│   ├── SpawnRefused     a member cannot be spawned: its name, spec or the task's limit
│   └── ToolUnreachable  a tool's server cannot be reached (worth retrying)
├── InvalidWorkspace     a step's tree holds a file over its limit, or is not a tree
├── MissingTool          an agent names a tool, kind or provider its worker does not have
├── AgentCodeError       an agent written in Python raised (retried)
├── InvalidState         an agent in code left a state that is not JSON, or returned no outcome
│   └── Diverged         an agent's code, replayed after a crash, did something else
└── RefusedJob           a worker was handed a function that is not one of Cairn's jobs

`Unavailable` is also a `ConnectionError`, `Timeout` a `TimeoutError`, `NotFound` and
`RecordNotFound` `LookupError`s, `InvalidSpec` and `InvalidName` `ValueError`s, and
`ArchiveError` an `OSError`. `CheckpointNotFound` is an `InvalidSpec` too: a checkpoint's
number is input the caller gave, refused as any other.

Every class here says `cairn.errors` as its module, so a traceback names
`cairn.errors.Timeout`, wherever in Cairn it was raised.

A leaf: it imports nothing of Cairn's, so every layer imports its errors from here.
"""

from __future__ import annotations

__all__ = [
    "AgentCodeError",
    "ArchiveConflict",
    "ArchiveError",
    "CairnError",
    "CheckpointNotFound",
    "CommitRefused",
    "CorruptCheckpoint",
    "Diverged",
    "FencedWrite",
    "InvalidName",
    "InvalidSpec",
    "InvalidState",
    "InvalidWorkspace",
    "MissingTool",
    "ModelError",
    "NoResult",
    "NotCommitted",
    "NotFound",
    "PatchError",
    "RecordNotFound",
    "RecordTooLarge",
    "RedisServerError",
    "RefusedJob",
    "RestoreFailed",
    "SpawnRefused",
    "TaskNotFound",
    "Timeout",
    "ToolError",
    "ToolUnreachable",
    "Unavailable",
]


class CairnError(Exception):
    """Root of every error Cairn raises on purpose; catch it to catch them all."""


# A caller's mistakes, and a deployment that cannot serve the call ------------------------
class InvalidSpec(CairnError, ValueError):
    """Raised when a task or agent spec is invalid; the message names the field and why.

    `field` is where in the spec, as keys and list indexes (`("agents", 1, "modle")`);
    empty for the spec as a whole and for other bad input: an invalid setting, an agent
    the task lacks.
    """

    def __init__(self, message: str, *, field: tuple[str | int, ...] = ()) -> None:
        super().__init__(message)
        self.field = field


class InvalidName(CairnError, ValueError):
    """Raised when a task, agent or record name could escape a key or a directory."""


class NotFound(CairnError, LookupError):
    """Raised when what a call names (a task, a checkpoint) is not there."""


class TaskNotFound(NotFound):
    """Raised when no task of the id is known, in Redis or in the archive."""


class CheckpointNotFound(NotFound, InvalidSpec):
    """Raised when a task has no checkpoint of the number asked for (or none committed)."""


class Unavailable(CairnError, ConnectionError):
    """Raised when Redis does not answer; the message names it (password masked).

    Also when no Redis is configured and no `cairn up` runs in the state directory.
    Nothing was done: the same call may succeed once Redis is up.
    """


class Timeout(CairnError, TimeoutError):
    """Raised when a wait for a task ran out before the task ended; the task runs on."""


class RestoreFailed(CairnError):
    """Raised when a restore did not complete, nothing committed changed.

    Either no committed checkpoint could be restored (the task is unrecoverable), or
    staging failed for a reason that says nothing of the checkpoints (a job that failed or
    never ran): the task then stays `restoring`, and its coordinator restores it again.
    """


class RedisServerError(CairnError):
    """Raised when a private redis-server cannot be found or started."""


class NoResult(CairnError):
    """Raised when a task's result is asked for and there is none to give.

    The task declares no `result`, or no agent has finished with one by the checkpoint
    read (a task still running may give one later; a restore may take one away).
    """


# Storage faults ---------------------------------------------------------------------------
class FencedWrite(CairnError):
    """Raised when a write carries an epoch or attempt that is no longer current.

    The writer is a zombie (its step was retried elsewhere, or the task was restored):
    nothing was written, and the caller must stop rather than retry.
    """


class CommitRefused(CairnError):
    """Raised when a global checkpoint cannot be committed; nothing was written."""


class NotCommitted(CairnError):
    """Raised when asked to archive a global checkpoint that is not committed."""


class RecordNotFound(CairnError, LookupError):
    """Raised when a record is neither hot nor cold."""


class CorruptCheckpoint(CairnError):
    """Raised when stored bytes fail verification; the record is named and never used."""

    def __init__(self, record: str, reason: str) -> None:
        super().__init__(f"corrupt record {record}: {reason}")
        self.record = record
        self.reason = reason


class RecordTooLarge(CairnError):
    """Raised when a record to be written is over the bound on records; nothing was written.

    Reading a record back must hold all of it in memory, and so must every restore: a
    record past the bound would make its task impossible to resume on a modest worker.
    """

    def __init__(self, record: str, size: int, limit: int) -> None:
        super().__init__(f"record {record} is {size} bytes; a record may have at most {limit}")
        self.record = record
        self.size = size
        self.limit = limit


class ArchiveError(CairnError, OSError):
    """Raised when the archive cannot be written (full or read-only disk, bad directory).

    Whatever was archived before stays whole: files appear only by atomic rename.
    """


class ArchiveConflict(ArchiveError):
    """Raised when the archive holds another record under the name being archived.

    A global checkpoint's number was handed out twice (the Redis in use lacks writes the
    archive had seen: lost with a restart, or made on a primary since replaced): the
    archived one stays, nothing is replaced, and the new one stays in Redis.
    """


# A step's errors --------------------------------------------------------------------------
class ModelError(CairnError):
    """Raised when a model call fails.

    `retryable` is True for what may pass on a retry (timeout, 429, 5xx, a dropped
    connection) and False for what will not (bad credentials, a malformed request).
    `refused` says the provider judged the request itself invalid (HTTP 400, 404, 413,
    422): the same request sent again fails the same way, so no rollback sends it again.
    `overflow` says why: the prompt is longer than the model's context window (a step
    compacts the history and asks once more).
    """

    def __init__(
        self, message: str, *, retryable: bool, refused: bool = False, overflow: bool = False
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.refused = refused and not retryable
        self.overflow = overflow and self.refused


class ToolError(CairnError):
    """Raised inside a tool when its call cannot be done; the model reads the message."""


class PatchError(ToolError):
    """Raised when a patch is malformed or does not apply; nothing was changed."""


class SpawnRefused(ToolError):
    """Raised when a spawn is refused: a name taken or invalid, a bad spec, the task full.

    The spawning agent reads why (a tool's error, or the exception in its own code); the
    team is as it was.
    """


class ToolUnreachable(ToolError):
    """Raised when a tool's server cannot be reached: the connection failed, not the request.

    A new connection may do better, so a step that meets it before the model is asked is
    retried (elsewhere, or later) rather than failed.
    """


class InvalidWorkspace(CairnError):
    """Raised when a step's tree holds what no workspace may: nothing of it is stored.

    A file over the task's `max_file_bytes` (found by its size, never read), or a path
    that is both a file and a directory. The built-in tools refuse to make either, and a
    command's oversize files are removed when it ends, so a worker's own tool made it: the
    step fails, and is not retried (another attempt would do the same).
    """


class MissingTool(CairnError):
    """Raised when an agent names a tool (or a kind, MCP server, model provider) its worker lacks.

    The step fails fatally, and its task at once, with no retry and no rollback: another
    attempt on a worker like this one would find it missing again. The message names what
    is missing and the worker (`host:pid`).
    """


class AgentCodeError(CairnError):
    """Raised when an agent written in Python raises: the step fails, not the worker.

    Its traceback is in the agent's trace; the step is retried as its spec's `max_retries`
    says, replaying what the code did before (nothing is paid for or run twice).
    """


class InvalidState(CairnError):
    """Raised when an agent kind leaves a value in its state that is not JSON.

    Checked before every checkpoint the step writes; the step fails fatally (the same
    code would do the same again), the message naming where the value is (`plan[2].when`).
    """


class Diverged(InvalidState):
    """Raised when an agent's code, replayed after a crash, does something else than before.

    A step retried from a tool-level checkpoint replays the code's actions from a journal;
    code that decides from the clock or chance cannot be replayed. The step fails, and the
    task is rolled back to its last global checkpoint, where there is nothing to replay.
    """


class RefusedJob(CairnError):
    """Raised when a worker is handed a function that is not one of Cairn's jobs."""


def one_line(exc: BaseException) -> str:
    """What Cairn says of an error: the first line of its message (else its type's name)."""
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
