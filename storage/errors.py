"""Cairn's exceptions, one tree with one root.

CairnError
├── InvalidName          a task or agent name that cannot be a key or a path
├── FencedWrite          a write carried a stale epoch or attempt
├── CommitRefused        a global checkpoint named a missing or mismatched record
├── RecordNotFound       a record is in neither the hot store nor the archive
├── CorruptCheckpoint    stored bytes failed their checksum, framing or schema
├── RecordTooLarge       a record to write is over the size a record may have
└── ArchiveError         the disk archive could not be written
"""

from __future__ import annotations


class CairnError(Exception):
    """Root of every error Cairn raises on purpose; catch it to catch them all."""


class InvalidName(CairnError, ValueError):
    """Raised when a task, agent or record name could escape a key or a directory."""


class FencedWrite(CairnError):
    """Raised when a write carries an epoch or attempt that is no longer current.

    The writer is a zombie (its step was retried elsewhere, or the task was restored):
    nothing was written, and the caller must stop rather than retry.
    """


class CommitRefused(CairnError):
    """Raised when a global checkpoint cannot be committed; nothing was written."""


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


class InvalidSpec(CairnError, ValueError):
    """Raised when a task or agent spec is invalid; the message names the field and why."""


class ModelError(CairnError):
    """Raised when a model call fails.

    `retryable` is True for what may pass on a retry (timeout, 429, 5xx, a dropped
    connection) and False for what will not (bad credentials, a malformed request).
    """

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


class ToolError(CairnError):
    """Raised inside a tool when its call cannot be done; the model reads the message."""
