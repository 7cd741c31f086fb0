"""`durability: replicated`: a GC is acknowledged once a Redis replica holds it.

After a GC commits, Redis's WAIT asks for one replica to hold it (and every write before
it), for at most the task's `checkpoints.replica_timeout`. Held: the GC is acknowledged in
the run state (`replicated`: this GC and every older one) and the log (`checkpoints
replicated`). Not held in time (no replica connected, or one too far behind): the GC stays
committed but unacknowledged, and the task pauses with the reason `replication: ...`. The
coordinator looks again every `RECHECK_EVERY` seconds, with a short wait, and resumes the
task once a replica holds its latest GC. A person's `cairn resume` asks again at once.

Sentinel promotes, of the replicas it reaches, the one with the most of the primary's
writes: so a GC one replica held survives a failover that promotes one of them.
"""

from __future__ import annotations

import time

from cairn.agents.logs import get_logger
from cairn.coordinator.runs import RunState, TaskState
from cairn.coordinator.spec import CheckpointPolicy
from cairn.errors import Unavailable
from cairn.storage.base import HotStore

log = get_logger(__name__)
REPLICAS = 1  # replicas that must hold a GC before it is acknowledged
REPLICATION_REASON = "replication"  # how a paused task's reason begins when it waits here
RECHECK_EVERY = 1.0  # seconds between looks at a task paused for replication
RECHECK_WAIT_MS = 100  # a replica that is back and in sync answers WAIT well within this


def confirm(runs: RunState, hot: HotStore, task: str, number: int, timeout: float) -> bool:
    """Acknowledge GC `number` of `task` if a replica holds it within `timeout` seconds.

    True when acknowledged (in the run state's `replicated` and the log); else False,
    with nothing written.
    """
    held = hot.confirm_replicas(task, number, REPLICAS, max(1, int(timeout * 1000)))
    if held < REPLICAS:
        return False
    runs.write(task, {"replicated": number})
    log.info("checkpoints replicated", task=task, through=number, replicas=held)
    return True


def require(runs: RunState, hot: HotStore, task: str, number: int, timeout: float) -> None:
    """Acknowledge GC `number` now, or raise `Unavailable` (a submit or fork waits so)."""
    if not confirm(runs, hot, task, number, timeout):
        raise Unavailable(
            f"no Redis replica acknowledged GC {number} of task {task} within {timeout:g} s "
            "(durability: replicated needs a replica connected to the primary)"
        )


class Replication:
    """What a coordinator does for its `replicated` tasks after each commit."""

    def __init__(self, runs: RunState) -> None:
        self.runs = runs
        self._looked: dict[str, float] = {}  # task → when it was last looked at, paused

    def after_commit(self, task: str, number: int, policy: CheckpointPolicy) -> bool:
        """True when the task may go on after committing GC `number`; else it is paused.

        Any durability other than `replicated` goes on at once.
        """
        if policy.durability != "replicated":
            return True
        if confirm(self.runs, self.runs.hot, task, number, policy.replica_timeout):
            return True
        reason = (
            f"{REPLICATION_REASON}: no replica acknowledged GC {number} within "
            f"{policy.replica_timeout:g} s"
        )
        self.runs.write(task, {"status": TaskState.PAUSED, "reason": reason})
        self._looked[task] = time.monotonic()
        log.warning("task paused: no replica", task=task, gc=number)
        return False

    def resume_if_replicated(self, task: str, run: dict[str, str], latest: int | None) -> bool:
        """Resume a task paused for replication once a replica holds its latest GC.

        True when it was resumed. Looks at most every `RECHECK_EVERY` seconds per task.
        """
        if not run.get("reason", "").startswith(REPLICATION_REASON) or latest is None:
            return False
        now = time.monotonic()
        if now - self._looked.get(task, 0.0) < RECHECK_EVERY:
            return False
        self._looked[task] = now
        if not confirm(self.runs, self.runs.hot, task, latest, RECHECK_WAIT_MS / 1000):
            return False
        self._looked.pop(task, None)
        self.runs.write(task, {"status": TaskState.RUNNING}, forget=["reason"])
        log.info("task resumed: a replica holds its checkpoints", task=task, gc=latest)
        return True

    def forget(self, task: str) -> None:
        """Drop what is kept of a task that ended."""
        self._looked.pop(task, None)
