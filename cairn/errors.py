"""Every error Cairn raises on purpose: one tree, one root (`CairnError`).

CairnError
├── InvalidSpec          bad input: a spec, a setting, a checkpoint or agent that is not there
├── InvalidName          a task or agent name that cannot be a key or a path
├── TaskNotFound         no task of that id is known to Redis or the archive
├── Unavailable          Redis does not answer (worth retrying)
├── Timeout              a wait for a task ran out before the task ended
├── RestoreFailed        no committed checkpoint could be restored
├── FencedWrite          a write carried a stale epoch or attempt
├── CommitRefused        a global checkpoint named a missing or mismatched record
├── NotCommitted         a global checkpoint to archive is not committed
├── RecordNotFound       a record is in neither the hot store nor the archive
├── CorruptCheckpoint    stored bytes failed their checksum, framing or schema
├── RecordTooLarge       a record to write is over the size a record may have
├── ArchiveError         the disk archive could not be written
│   └── ArchiveConflict  the archive holds another record under that name
├── ModelError           a model call failed (retryable or not)
├── ToolError            a tool call cannot be done; the model reads why
│   ├── PatchError       a patch is malformed or does not apply
│   └── ToolUnreachable  a tool's server cannot be reached (worth retrying)
├── InvalidWorkspace     a step's tree holds a file over its limit, or is not a tree
├── MissingTool          an agent names a tool its worker does not have
├── RefusedJob           a worker was handed a function that is not one of Cairn's jobs
└── RedisServerError     a private redis-server cannot be found or started

`Unavailable` is also a `ConnectionError`, `Timeout` a `TimeoutError`, `TaskNotFound` and
`RecordNotFound` `LookupError`s, `InvalidSpec` and `InvalidName` `ValueError`s, and
`ArchiveError` an `OSError`.
"""

from __future__ import annotations

from cairn.storage.errors import (
    ArchiveConflict,
    ArchiveError,
    CairnError,
    CommitRefused,
    CorruptCheckpoint,
    FencedWrite,
    InvalidName,
    InvalidSpec,
    InvalidWorkspace,
    MissingTool,
    ModelError,
    NotCommitted,
    PatchError,
    RecordNotFound,
    RecordTooLarge,
    RedisServerError,
    RefusedJob,
    RestoreFailed,
    TaskNotFound,
    Timeout,
    ToolError,
    ToolUnreachable,
    Unavailable,
)

__all__ = [
    "ArchiveConflict",
    "ArchiveError",
    "CairnError",
    "CommitRefused",
    "CorruptCheckpoint",
    "FencedWrite",
    "InvalidName",
    "InvalidSpec",
    "InvalidWorkspace",
    "MissingTool",
    "ModelError",
    "NotCommitted",
    "PatchError",
    "RecordNotFound",
    "RecordTooLarge",
    "RedisServerError",
    "RefusedJob",
    "RestoreFailed",
    "TaskNotFound",
    "Timeout",
    "ToolError",
    "ToolUnreachable",
    "Unavailable",
]
