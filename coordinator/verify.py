"""A task's `verify` command, the worker's side: run it, say its verdict.

The coordinator never runs anything a spec names. When every agent rests after GC n, it
enqueues a verify job (`cairn.coordinator.jobs.verify_job`) on the steps queue; a worker runs
the command as `run_command` runs an agent's (in its sandbox, with the task's output
limit, `verify_timeout` as its time limit), on a copy of GC n's files, beating while it
runs, and writes its verdict (passed or not, the redacted tail of the output) under the
epoch and n (`keys.verdict`). The coordinator, at each look of the task, reads the
verdict; it tries a job that is over without one (its worker died, it vanished, it ran
past `verify_timeout`) again after a backoff, `TRIES` times in all, then gives up and
the task fails with the reason (`cairn.coordinator.verifier`). A verify in flight is the run
hash's `verify` field.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import redis

from cairn.agents.logs import get_logger
from cairn.agents.spec import TaskRecord
from cairn.agents.tools import ToolContext, run_command
from cairn.agents.workspace import Workspace
from cairn.coordinator.runs import Entry
from cairn.coordinator.spec import LIMITS_DOC, Limits
from cairn.errors import ToolError
from cairn.storage import keys
from cairn.storage.redact import redact
from cairn.storage.store import CheckpointStore

log = get_logger(__name__)
JOB = "cairn.coordinator.jobs.verify_job"  # the function a worker runs (`cairn.coordinator.jobs`)
VERIFIER = "_verify"  # the caller a verify's command runs as; "_" keeps it apart from agents
TRIES = 3  # verify jobs tried for one GC before the task fails
OUTPUT_KEPT = 4_000  # characters of a verify's output kept (its tail: where tests say why)
VERDICT_TTL = 86_400  # seconds a verdict is kept: the coordinator reads it within a tick
FIELD = "verify"  # the run hash's field holding the verify in flight
BACKOFF = (0.25, 1.0, 4.0)  # seconds before try 2, 3, …: a verify is rarely worth hurrying


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether a verify passed, and the tail of what its command printed (redacted)."""

    passed: bool
    output: str

    def dump(self) -> str:
        """The JSON kept in Redis."""
        return json.dumps(asdict(self))

    @classmethod
    def load(cls, raw: bytes) -> Verdict:
        """Read the JSON kept in Redis; `ValueError` or `TypeError` if it is not a verdict."""
        found = json.loads(raw)
        if not isinstance(found, dict) or not isinstance(found.get("passed"), bool):
            raise TypeError(f"not a verdict: {raw[:80]!r}")
        return cls(found["passed"], str(found.get("output", "")))


@dataclass(frozen=True, slots=True)
class VerifyRun(Entry):
    """The verify in flight, the run hash's `verify` field: its GC, epoch, try, job, backoff."""

    epoch: int
    gc: int
    attempt: int
    job: str = ""
    retry_at: float = 0.0  # > 0: waiting for its backoff before being launched


# the worker's side ------------------------------------------------------------------------
def run_verify(
    store: CheckpointStore, task: str, number: int, cache: Path, record: TaskRecord
) -> Verdict:
    """Run the task's verify command on a copy of GC `number`'s files; return its verdict.

    The command runs as an agent's `run_command` does, with the task's policy and
    `verify_timeout` as its time limit: a command that times out or cannot start fails.
    """
    limits = store.read_doc(task, LIMITS_DOC, Limits)
    gc = store.read_gc(task, number)
    if limits.verify is None:
        return Verdict(True, "")
    workspace = Workspace(cache, task, "verify")
    workspace.sync(store, store.read_manifest(task, gc.workspace).files)
    policy = record.policy.model_copy(update={"command_timeout": limits.verify_timeout})
    ctx = ToolContext(workspace, VERIFIER, [], gc.superstep, policy, task=task)
    try:
        output = run_command(ctx, {"command": limits.verify})
    except ToolError as exc:
        return Verdict(False, redact(str(exc))[-OUTPUT_KEPT:])
    return Verdict(output.startswith("exit code 0\n"), redact(output)[-OUTPUT_KEPT:])


class VerifyBeats:
    """Where a verify's heartbeat is kept: a key of its own try (`keys.verify_beat`)."""

    def __init__(self, client: redis.Redis, run: VerifyRun) -> None:
        self.redis, self.run = client, run

    def beat(self, task: str, agent: str, token: str, ttl_ms: int) -> bool:
        """Keep this try's beat alive (never fenced: no other try shares its key)."""
        run = self.run
        self.redis.set(keys.verify_beat(task, run.epoch, run.gc, run.attempt), token, px=ttl_ms)
        return True
