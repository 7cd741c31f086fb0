"""What the checker reads: the recorded history, and the task's checkpoints as stored.

`History` comes from the JSON log lines every Cairn process wrote (coordinators, workers,
the `cairn restore` commands) and from the harness's own event log. `Observed` is read
from the store after the run: every GC the task has, hot or archived, with each member's
state, plus the final workspace and the ledger. Both are plain data, so the checker can
be shown violations built by hand (tests/test_chaos_checker.py).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from cairn.errors import CairnError, CorruptCheckpoint
from cairn.storage.backends.redis import RedisHotStore
from cairn.storage.records import GCStatus, Message, Role
from cairn.storage.store import CheckpointStore

Turn = tuple[str, str | None, str | None, str]  # role, name, content, tool calls as JSON
# One entry of the task's audit stream: kind (epoch, fence, lc), agent, "e" or "e:s:a", LC id
Audit = tuple[str, str, str, str]


@dataclass(frozen=True, slots=True)
class Restore:
    """A restore as its process logged it: when, from which GC to which new one."""

    at: str  # ISO timestamp, UTC: every process on this machine reads one clock
    to: int
    to_epoch: int
    gc: int
    epoch: int


@dataclass
class History:
    """What the processes and the harness said happened, each event with its time."""

    launched: dict[tuple[int, int, str], int] = field(default_factory=dict)  # → latest attempt
    launches: list[tuple[str, tuple[int, int, str], int]] = field(default_factory=list)
    commits: list[tuple[str, int, int]] = field(default_factory=list)  # (at, gc, epoch)
    archives: list[tuple[str, int]] = field(default_factory=list)  # (at, through gc)
    flushes: list[str] = field(default_factory=list)  # when Redis lost everything
    failovers: list[str] = field(default_factory=list)  # when the old primary's reign ended
    splits: list[tuple[str, str]] = field(default_factory=list)  # two primaries: (from, to)
    replicated: list[tuple[str, int]] = field(default_factory=list)  # (at, through gc)
    restores: list[Restore] = field(default_factory=list)
    fenced: int = 0  # attempts refused because a newer epoch or attempt owned the step
    faults: Counter[str] = field(default_factory=Counter)  # injected, by kind
    corrupted: list[str] = field(default_factory=list)  # archive files the harness damaged

    def take(self, event: dict[str, Any]) -> None:
        """Fold one log event in."""
        name, at = event.get("event"), str(event.get("timestamp", ""))
        if name == "steps launched":
            for agent, attempt in event["attempts"].items():
                slot = (int(event["epoch"]), int(event["superstep"]), agent)
                self.launched[slot] = max(self.launched.get(slot, 0), int(attempt))
                self.launches.append((at, slot, int(attempt)))
        elif name in ("superstep committed", "verify failed; the team goes on"):
            self.commits.append((at, int(event["gc"]), int(event["epoch"])))
        elif name == "task restored":
            restore = Restore(at, int(event["to"]), int(event["to_epoch"]), int(event["gc"]),
                              int(event["epoch"]))  # fmt: skip
            self.restores.append(restore)
            self.commits.append((at, restore.gc, restore.epoch))
        elif name == "checkpoints archived":
            self.archives.append((at, int(event["through"])))
        elif name == "checkpoints replicated":
            self.replicated.append((at, int(event["through"])))
        elif name == "attempt fenced":
            self.fenced += 1
        elif name == "fault injected":
            self.faults[str(event["fault"])] += 1
            if event.get("file"):
                self.corrupted.append(str(event["file"]))
            if event["fault"] == "flushall":
                self.flushes.append(str(event.get("flushed_at", at)))
            if event["fault"] in ("failover", "split_primary"):
                # After a split the old primary may take writes until every process left it.
                self.failovers.append(str(event.get("left_by") or event.get("promoted_at", at)))
            if event["fault"] == "split_primary":
                self.splits.append((str(event["promoted_at"]), str(event["left_by"])))

    def current(self, slot: tuple[int, int, str]) -> set[int]:
        """The attempts of step `slot` (epoch, superstep, agent) that may have been current.

        The latest launched, if no launch of it fell while two primaries took writes (a
        split). Else any from the latest launched outside such a window on: which primary
        a launch in a split reached, no log says (either fenced the attempt it launched
        on its own), so any of them may be the surviving primary's current attempt. That
        primary's audit stream, checked apart, records which.
        """
        mine = [(at, attempt) for at, s, attempt in self.launches if s == slot]
        outside = [a for at, a in mine if not any(lo <= at <= hi for lo, hi in self.splits)]
        latest = self.launched.get(slot)
        if len(outside) == len(mine) or latest is None:
            return set() if latest is None else {latest}
        floor = max(outside, default=0)
        return {a for _, a in mine if a >= floor}


def read_history(logs: Path, task: str) -> History:
    """Read every `*.log` and `*.jsonl` under `logs`: the events of `task`, in file order."""
    history = History()
    for path in sorted([*logs.glob("*.log"), *logs.glob("*.jsonl")]):
        for line in path.read_text(errors="replace").splitlines():
            if not line.startswith("{"):
                continue  # RQ's own log lines, tracebacks of killed processes
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a SIGKILL
            if isinstance(event, dict) and event.get("task") in (task, None):
                history.take(event)
    return history


@dataclass
class MemberView:
    """One member of a GC: where its LC came from, what the agent said and did."""

    epoch: int
    attempt: int
    superstep: int
    messages: list[Turn]
    keys: list[str]  # idempotency keys of the side-effecting calls it ran, task id cut


@dataclass(frozen=True, slots=True)
class Joined:
    """How a member spawned at run time joined, as a GC keeps it (`GlobalCheckpoint.spawned`)."""

    parent: str
    superstep: int  # the superstep whose barrier it joined at
    spec: str  # its spec as canonical JSON


@dataclass
class GCView:
    """One committed GC as read back; `error` when it could not be read whole."""

    number: int
    superstep: int = 0
    epoch: int = 0
    workspace: str = ""
    members: dict[str, MemberView] = field(default_factory=dict)
    error: str | None = None
    corrupt: bool = False  # the error was a detected corruption
    spawned: dict[str, Joined] = field(default_factory=dict)  # member spawned → how it joined


@dataclass
class Observed:
    """The task after the run: its end, its checkpoints, its workspace, the ledger."""

    status: str
    reason: str
    gcs: dict[int, GCView]
    files: dict[str, bytes]
    ledger: list[str]  # applied keys of this task, task id cut, in order
    ledger_calls: int  # every call the ledger saw, applied or not
    audit: list[Audit] = field(default_factory=list)  # Redis's order of fences and writes


@dataclass
class ForkSeen:
    """A fork the harness made of the run's task at GC `at`, and how it ended."""

    fork: str
    at: int
    source: GCView  # the run's GC `at`, as read back once the run ended
    observed: Observed  # the fork's own checkpoints and end
    ended: bool  # it ended within its bound


def turns(messages: list[Message]) -> list[Turn]:
    """A history as compared across runs: restore notes (from `cairn`) left out."""
    return [
        (m.role.value, m.name, m.content,
         json.dumps([[c.name, c.args] for c in m.tool_calls], sort_keys=True))
        for m in messages
        if not (m.role is Role.USER and m.name == "cairn")
    ]  # fmt: skip


def view_gc(store: CheckpointStore, task: str, number: int) -> GCView:
    """GC `number` of `task` read back whole (hot, else archived), or why it could not be."""
    try:
        gc = store.read_gc(task, number)
        if gc.status is not GCStatus.COMMITTED:
            return GCView(number, error=f"status {gc.status.value}")
        members = {}
        for agent, ref in gc.members.items():
            state = store.read_state(task, agent, ref.id, ref.checksum)
            keys = [
                r.idempotency_key.removeprefix(f"{task}:")
                for r in state.trace
                if r.idempotency_key and r.tool == "run_command" and r.error is None
            ]
            members[agent] = MemberView(
                state.epoch, state.attempt, state.superstep, turns(state.messages), keys
            )
        manifest = store.read_manifest(task, gc.workspace)
        store.get_blobs(task, manifest.files.values())
    except CairnError as exc:
        return GCView(number, error=str(exc), corrupt=isinstance(exc, CorruptCheckpoint))
    spawned = {name: Joined(j.parent, j.superstep, json.dumps(j.spec, sort_keys=True))
               for name, j in gc.spawned.items()}  # fmt: skip
    return GCView(number, gc.superstep, gc.epoch, gc.workspace, members, spawned=spawned)


def read_audit(client: redis.Redis, task: str) -> list[Audit]:
    """The task's audit stream (written with CAIRN_AUDIT=1), oldest first."""
    return [
        (e["kind"], e.get("agent", ""), e["at"], e.get("lc", ""))
        for e in RedisHotStore(client, audit=False).read_audit(task)
    ]


def observe(
    store: CheckpointStore, client: redis.Redis, task: str, run: dict[str, str], ledger: Path
) -> Observed:
    """Read the task's end, every GC it has (hot or cold), its files, audit and ledger."""
    numbers = {info.number for info in store.hot.list_gcs(task)} | set(store.cold.list_gcs(task))
    gcs = {n: view_gc(store, task, n) for n in sorted(numbers)}
    files: dict[str, bytes] = {}
    try:
        latest = store.latest_gc(task)
        if latest is not None:
            manifest = store.read_manifest(task, latest.workspace)
            found = store.get_blobs(task, manifest.files.values())
            files = {path: found[sha] for path, sha in manifest.files.items()}
    except CairnError:
        pass  # the status says why the task could not end well
    applied, calls = _ledger(ledger, task)
    return Observed(run.get("status", ""), run.get("reason", ""), gcs, files, applied, calls,
                    read_audit(client, task))  # fmt: skip


def _ledger(directory: Path, task: str) -> tuple[list[str], int]:
    def mine(name: str) -> list[str]:
        path = directory / name
        lines = path.read_text().splitlines() if path.exists() else []
        return [ln.split("\t", 1)[0].removeprefix(f"{task}:") for ln in lines
                if ln.startswith(f"{task}:")]  # fmt: skip

    return mine("applied.log"), len(mine("calls.log"))
