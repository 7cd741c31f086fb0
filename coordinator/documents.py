"""A task's documents as the coordinator reads them: its record and its limits.

Neither changes once the task is submitted, so each is read from the store once per task
and kept until the task ends (`forget`). Who is on the team is not read here but from
each GC (`team`, `cairn.agents.team`): the record only orders the members and gives
their specs.
"""

from __future__ import annotations

from typing import TypeVar

from cairn.agents.spec import TaskRecord
from cairn.agents.team import team
from cairn.coordinator.spec import LIMITS_DOC, Limits
from cairn.storage.keys import SPEC_DOC
from cairn.storage.records import GlobalCheckpoint, Record
from cairn.storage.store import CheckpointStore

R = TypeVar("R", bound=Record)


class TaskDocuments:
    """The record and limits of each task a coordinator drives, read once each."""

    def __init__(self, store: CheckpointStore) -> None:
        self._store = store
        self._docs: dict[tuple[str, str], Record] = {}

    def record(self, task: str) -> TaskRecord:
        """The task's record as its steps see it: the goal, the team in order, the policy."""
        return self._doc(task, SPEC_DOC, TaskRecord)

    def team(self, task: str, gc: GlobalCheckpoint) -> list[str]:
        """The task's members at `gc`, in team order."""
        return team(gc, self.record(task))

    def limits(self, task: str) -> Limits:
        """The part of the task's spec the coordinator enforces (`Limits`)."""
        return self._doc(task, LIMITS_DOC, Limits)

    def forget(self, task: str) -> None:
        """Drop the documents kept of a task that ended."""
        self._docs = {key: doc for key, doc in self._docs.items() if key[0] != task}

    def _doc(self, task: str, name: str, model: type[R]) -> R:
        found = self._docs.get((task, name))
        if found is None:
            found = self._store.read_doc(task, name, model)
            self._docs[(task, name)] = found
        assert isinstance(found, model)
        return found
