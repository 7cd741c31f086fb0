"""Every Redis key Cairn uses, built in one place.

All keys of a task share the hash tag `{task}` so that each Lua script and transaction
touches one Redis Cluster slot. Names are validated here, once, because they also become
directory names in the archive.
"""

from __future__ import annotations

import re

from storage.errors import InvalidName

PREFIX = "cairn"
SPEC_DOC = "spec"  # the task document every step reads
EPOCH_DOC = "epoch"  # the archive's record of the highest epoch a task ever handed out
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def check_name(kind: str, value: str) -> str:
    """Return `value` if it is a safe task, agent or record name, else raise `InvalidName`."""
    if not _NAME.fullmatch(value) or ".." in value:
        raise InvalidName(
            f"invalid {kind} name {value!r}: use 1-128 letters, digits, '_', '-', '.' "
            "starting with a letter or digit"
        )
    return value


def task_prefix(task: str) -> str:
    """The prefix of every key of `task`, hash tag included: `cairn:{task}:`."""
    return f"{PREFIX}:{{{check_name('task', task)}}}:"


def epoch(task: str) -> str:
    """String: the task's fencing epoch."""
    return task_prefix(task) + "epoch"


def audit(task: str) -> str:
    """Stream: with auditing on, every epoch raise, fence and accepted LC write, in order."""
    return task_prefix(task) + "audit"


def attempts(task: str) -> str:
    """Hash agent → "epoch:superstep:attempt": the only step attempt allowed to write."""
    return task_prefix(task) + "attempts"


def lc(task: str, lc_id: str) -> str:
    """Hash: one local checkpoint (sealed bytes plus the fields Lua needs)."""
    return task_prefix(task) + "lc:" + lc_id


def superstep_lcs(task: str, epoch_: int, superstep: int) -> str:
    """Hash lc_id → its parent, checksum and agent: one superstep's LCs, tentative until commit.

    The three are tab-separated; the parent is "" unless it is in the hash too, so a walk
    from a member stops where its chain leaves the superstep. Named apart from the set that
    held the ids before, so a superstep in flight across an upgrade meets a missing key,
    not one of the wrong type.
    """
    return f"{task_prefix(task)}tentative:{epoch_}:{superstep}"


def votes(task: str, epoch_: int, superstep: int) -> str:
    """Hash agent → "lc_id checksum": the votes cast for one superstep of one epoch."""
    return f"{task_prefix(task)}votes:{epoch_}:{superstep}"


def gc(task: str, number: int) -> str:
    """Hash: one global checkpoint (sealed bytes, status, superstep)."""
    return f"{task_prefix(task)}gc:{number}"


def gcs(task: str) -> str:
    """Sorted set: every global checkpoint number of the task, scored by number."""
    return task_prefix(task) + "gcs"


def latest(task: str) -> str:
    """String: the number of the task's latest committed global checkpoint."""
    return task_prefix(task) + "latest"


def blob(task: str, sha: str) -> str:
    """String: one content-addressed blob (a file or a manifest) in its envelope."""
    return task_prefix(task) + "blob:" + sha


def blobs(task: str) -> str:
    """Sorted set: blob sha → when it was last written (ms), for safe retention."""
    return task_prefix(task) + "blobs"


def progress(task: str, epoch_: int, superstep: int) -> str:
    """Hash agent → "lc_id checksum": the latest tool-level LC of the step, to resume from."""
    return f"{task_prefix(task)}progress:{epoch_}:{superstep}"


def heartbeat(task: str, agent: str) -> str:
    """String with a TTL: alive while a worker runs the agent's step."""
    return f"{task_prefix(task)}hb:{check_name('agent', agent)}"


def doc(task: str, name: str) -> str:
    """String: a task-level document in its envelope (the task's spec, an approval)."""
    return f"{task_prefix(task)}doc:{check_name('document', name)}"


def run(task: str) -> str:
    """Hash: the coordinator's view of a running task (status, superstep in flight, …)."""
    return task_prefix(task) + "run"


def steps(task: str) -> str:
    """Hash agent → JSON: the step of the superstep in flight (attempt, job, times)."""
    return task_prefix(task) + "steps"


def outcomes(task: str, epoch_: int, superstep: int) -> str:
    """Hash agent → JSON: why an attempt of a step ended without a vote (error kind, text)."""
    return f"{task_prefix(task)}outcomes:{epoch_}:{superstep}"


def owner(task: str) -> str:
    """String: the lease token of the coordinator that owns the task now (it only rises)."""
    return task_prefix(task) + "owner"


def restore_lock(task: str) -> str:
    """String with a TTL: held while a restore of the task runs (restores are serialized)."""
    return task_prefix(task) + "restore-lock"


# Not task-scoped on purpose: indexes across tasks, each on its own slot.
ACTIVE_TASKS = f"{PREFIX}:tasks:active"
LEASE = f"{PREFIX}:coordinator:lease"
LEASE_TOKEN = f"{PREFIX}:coordinator:token"
