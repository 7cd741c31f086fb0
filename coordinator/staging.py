"""The workers' side of a coordinated restore: stage one agent's state of a GC, with a vote.

`cairn.coordinator.restore.Restorer` asks for it (one control job per agent, or inline), then
commits the restore once every agent voted. Staging writes a new LC under the restore's
epoch and changes nothing live: the restore's commit is what swaps the staged states in.
"""

from __future__ import annotations

import redis

from cairn.agents.barrier import pending_calls
from cairn.agents.logs import get_logger
from cairn.agents.summary import context_summary
from cairn.errors import (
    ArchiveError,
    CairnError,
    CorruptCheckpoint,
    FencedWrite,
    RecordNotFound,
    Unavailable,
)
from cairn.storage.records import LCRef, Level
from cairn.storage.store import CheckpointStore

log = get_logger(__name__)
# Failures of `stage` that pass (Redis failing, the archive's disk, a newer epoch fencing
# the write): they say nothing of the checkpoint being restored, so no older one is tried.
PASSING = (redis.RedisError, FencedWrite, Unavailable, ArchiveError)


def refusal(exc: Exception, task: str, agent: str) -> str:
    """Why `exc`, raised by `stage` and not `PASSING`, refuses the target GC.

    A record damaged or missing everywhere, a state too large for one record, anything
    else that stops it: the restore falls back to an older GC. What is no damaged or
    missing record is logged with its traceback.
    """
    if not isinstance(exc, (CorruptCheckpoint, RecordNotFound)):
        log.error("staging refused", task=task, agent=agent, exc_info=exc)
    return str(exc) if isinstance(exc, CairnError) else f"{type(exc).__name__}: {exc}"


def stage(
    store: CheckpointStore, task: str, agent: str, target: int, epoch: int, reason: str
) -> LCRef:
    """Stage `agent`'s state of GC `target` as a new LC of `epoch`, with its vote.

    The staged LC is full (it still names the target's LC as its parent, the history it
    grew from): reading anything the agent checkpoints after the restore stops there,
    needing no LC from before it. The target's chain may be only on disk (Redis lost it,
    or trimmed it), where a later delta's walk from Redis would not see that it is still
    needed, and a record damaged there would break the task's latest GC.

    Raises `CorruptCheckpoint` or `RecordNotFound` when its chain cannot be read whole.
    """
    gc = store.read_gc(task, target)
    ref = gc.members[agent]
    state = store.read_state(task, agent, ref.id, ref.checksum)
    if not pending_calls(state.messages):  # a summary may not split a call from its result
        state.messages.append(context_summary(state, reason, target))
    state.epoch, state.attempt, state.superstep = epoch, 1, gc.superstep
    state.changes, state.outbox, state.spawns = {}, [], []
    return store.write_lc(state, Level.STEP, vote=True, full=True)
