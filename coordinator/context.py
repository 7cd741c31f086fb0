"""What the parts of one coordinator share (`cairn.coordinator.coordinator` draws the parts).

One `Context` per `Coordinator`: its Redis, store, queue and lease, the helpers built on
them, the task documents, the phase at hand (named in a task's faults), and the four
parts themselves, through which each part calls another.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import redis
from rq import Queue

from cairn.agents.logs import get_logger
from cairn.coordinator.archiver import Archiver
from cairn.coordinator.documents import TaskDocuments
from cairn.coordinator.isolation import TaskFaults
from cairn.coordinator.jobstate import TakenJobs
from cairn.coordinator.lease import Lease
from cairn.coordinator.numbering import ArchiveFloor
from cairn.coordinator.replication import Replication
from cairn.coordinator.restore import Restorer
from cairn.coordinator.runs import RunState
from cairn.coordinator.verifier import Verifier
from cairn.coordinator.wakes import Timers
from cairn.storage.store import CheckpointStore

if TYPE_CHECKING:  # the parts hold this context: imported for their types only
    from cairn.coordinator.committer import Committer
    from cairn.coordinator.finisher import Finisher
    from cairn.coordinator.launcher import Launcher
    from cairn.coordinator.watcher import Watcher

# Every part logs as the coordinator: one name in each event's `logger`, whichever part.
log = get_logger("cairn.coordinator.coordinator")


class Context:
    """One coordinator's shared state; `Coordinator.__init__` builds it and its parts."""

    # Set by `Coordinator.__init__` once the parts exist, as each takes this context.
    launcher: Launcher
    watcher: Watcher
    committer: Committer
    finisher: Finisher
    archiver: Archiver  # reports to the committer
    faults: TaskFaults  # pauses through the finisher

    def __init__(
        self,
        client: redis.Redis,
        store: CheckpointStore,
        queue: Queue,
        lease: Lease,
        runs: RunState,
        restorer: Restorer,
        verifier: Verifier,
        heartbeat_grace: float,
    ) -> None:
        self.redis = client
        self.store = store
        self.queue = queue
        self.lease = lease
        self.runs = runs
        self.restorer = restorer
        self.verifier = verifier
        self.heartbeat_grace = heartbeat_grace
        self.docs = TaskDocuments(store)
        self.taken = TakenJobs(heartbeat_grace)  # jobs taken from their queue, not started
        self.archived = ArchiveFloor(store)  # a GC number is never reused: see numbering.py
        self.replication = Replication(runs)
        # task → (restores of it that failed in a row, when the next may begin: monotonic)
        self.restore_due: dict[str, tuple[int, float]] = {}
        # task → (its latest GC, when a look found it waiting there for a person's decision,
        # monotonic): nothing is due until a decision wakes it or, were that wake lost, the
        # next idle look
        self.waiting: dict[str, tuple[int, float]] = {}
        self.timers = Timers()  # looks due when a retry's backoff ends
        self.phase = ""  # what `tick` is doing for the task at hand, named in its faults
