"""Every Redis key Cairn uses, built in one place.

All keys of a task share the hash tag `{task}` so that each Lua script and transaction
touches one Redis Cluster slot. Names are validated here, once, because they also become
directory names in the archive.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass

from cairn.errors import InvalidName

PREFIX = "cairn"
SPEC_DOC = "spec"  # the task document every step reads
EPOCH_DOC = "epoch"  # the archive's record of the highest epoch a task ever handed out
ABORTED_DOC = "aborted"  # the archive's note of aborted GCs whose records left Redis
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def check_name(kind: str, value: str) -> str:
    """Return `value` if it is a safe task, agent or record name, else raise `InvalidName`."""
    if not _NAME.fullmatch(value) or ".." in value:
        raise InvalidName(
            f"invalid {kind} name {value!r}: use 1-128 letters, digits, '_', '-', '.' "
            "starting with a letter or digit"
        )
    return value


@functools.lru_cache(maxsize=4096)  # a step builds a dozen keys of its task
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
    from a member stops where its chain leaves the superstep.
    """
    return f"{task_prefix(task)}tentative:{epoch_}:{superstep}"


def votes(task: str, epoch_: int, superstep: int) -> str:
    """Hash agent → "lc_id checksum": the votes cast for one superstep of one epoch."""
    return f"{task_prefix(task)}votes:{epoch_}:{superstep}"


def spend(task: str) -> str:
    """Hash "agent:kind" → what the agent's model calls spent (tokens, cost_usd, calls).

    Only rises. "inherited:agent:kind" (a fork's) is what its history held when forked.
    """
    return task_prefix(task) + "spend"


def attempt_spend(task: str, epoch_: int, superstep: int) -> str:
    """Hash "agent:attempt" → "prompt completion cached cost": each attempt's model call."""
    return f"{task_prefix(task)}spend:{epoch_}:{superstep}"


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


def live(task: str, agent: str) -> str:
    """String with a TTL: the reply the agent's model is streaming now, as far as it got.

    Written while a streamed model call runs (`cairn.agents.live`), deleted when it ends.
    """
    return f"{task_prefix(task)}live:{check_name('agent', agent)}"


def doc(task: str, name: str) -> str:
    """String: a task-level document in its envelope (the task's spec, an approval)."""
    return f"{task_prefix(task)}doc:{check_name('document', name)}"


def member_budgets(task: str) -> str:
    """Hash member → its budget as last raised (`MemberBudget` JSON), over its spec's."""
    return task_prefix(task) + "member-budgets"


def run(task: str) -> str:
    """Hash: the coordinator's view of a running task (status, superstep in flight, …)."""
    return task_prefix(task) + "run"


def steps(task: str) -> str:
    """Hash agent → JSON: the step of the superstep in flight (attempt, job, times)."""
    return task_prefix(task) + "steps"


def outcomes(task: str, epoch_: int, superstep: int) -> str:
    """Hash agent → JSON: why an attempt of a step ended without a vote (error kind, text)."""
    return f"{task_prefix(task)}outcomes:{epoch_}:{superstep}"


def failures(task: str) -> str:
    """Sorted set, scored by time (ms): the task's failed step attempts and what came of them.

    Each member is one event as JSON (`cairn.coordinator.failures`), the newest few hundred
    kept: written by workers as attempts fail and by the coordinator as it retries a step
    or rolls the task back, so they show while the task runs.
    """
    return task_prefix(task) + "failures"


def logs(task: str) -> str:
    """Stream, capped: the task's log lines from every process (`cairn.agents.logship`)."""
    return task_prefix(task) + "logs"


def verdict(task: str, epoch_: int, number: int) -> str:
    """String with a TTL: JSON, what the task's verify command said of GC `number`'s files.

    Written by the worker that ran it; per epoch, so a verify of an epoch a restore left
    behind is never read for the one after.
    """
    return f"{task_prefix(task)}verdict:{epoch_}:{number}"


def verify_beat(task: str, epoch_: int, number: int, attempt: int) -> str:
    """String with a TTL: alive while a worker runs that try of the verify of GC `number`.

    One per try: a try still running after another was launched (its worker was judged
    dead, or a restore left it behind) must not pass for that one, nor hide it.
    """
    return f"{task_prefix(task)}hb-verify:{epoch_}:{number}:{attempt}"


def owner(task: str) -> str:
    """String: the lease token of the coordinator that owns the task now (it only rises)."""
    return task_prefix(task) + "owner"


def replica_probe(task: str) -> str:
    """String: the GC number last confirmed on a replica; writing it is what WAIT waits for."""
    return task_prefix(task) + "replica-probe"


def restore_lock(task: str) -> str:
    """String with a TTL: held while a restore of the task runs (restores are serialized)."""
    return task_prefix(task) + "restore-lock"


# Not task-scoped on purpose: indexes across tasks, each on its own slot.
ACTIVE_TASKS = f"{PREFIX}:tasks:active"
LEASE = f"{PREFIX}:coordinator:lease"
LEASE_TOKEN = f"{PREFIX}:coordinator:token"
RUNS = f"{PREFIX}:{{*}}:run"  # a SCAN pattern: the run hash of every task Redis knows
WORKERS = f"{PREFIX}:workers"  # Set: the names of workers that said what they have
WAKES = f"{PREFIX}:coordinator:wakes"  # List: tasks with news (`cairn.coordinator.wakes`)
WAKES_CAP = 10_000  # wakes kept waiting at most: far more tasks than one look reads at once


def wake_commands(*tasks: str) -> list[tuple[str | int, ...]]:
    """The commands that push `tasks` on `WAKES` and keep it within `WAKES_CAP`."""
    return [("RPUSH", WAKES, *tasks), ("LTRIM", WAKES, -WAKES_CAP, -1)]


def worker_offer(worker: str) -> str:
    """String with a TTL: what live worker `worker` has (`cairn.coordinator.offers`)."""
    return f"{PREFIX}:worker:{worker}"


def task_of_run(key: str) -> str:
    """The task whose run hash is `key` (a key that `RUNS` matched)."""
    return key.removeprefix(f"{PREFIX}:{{").removesuffix("}:run")


# The LangGraph saver's keys (cairn.storage.langgraph): one hash slot per thread ----------------
LANGGRAPH_PREFIX = f"{PREFIX}:lg"
_PLAIN = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def langgraph_slot(name: str) -> str:
    """A name safe inside a hash tag and a file name: itself if plain, else its digest.

    A digest starts with "h-", so a plain name never does: no two names share a slot.
    "_" (the root namespace's slot) is never a plain name either.
    """
    plain = _PLAIN.fullmatch(name) and not name.startswith((".", "-", "h-")) and name != "_"
    if plain:
        return name
    return "h-" + hashlib.sha256(name.encode(errors="surrogatepass")).hexdigest()[:40]


@dataclass(frozen=True, slots=True)
class ThreadKeys:
    """The keys of one namespace of a LangGraph thread, all under the thread's hash tag."""

    thread: str
    ns: str

    @property
    def base(self) -> str:
        """The prefix of every key of the thread: `cairn:lg:{thread}:`."""
        return f"{LANGGRAPH_PREFIX}:{{{langgraph_slot(self.thread)}}}:"

    @property
    def ns_key(self) -> str:
        """The namespace's part of a key ("_" for the root namespace)."""
        return langgraph_slot(self.ns) if self.ns else "_"

    def head(self) -> str:
        """String: the id of the namespace's newest checkpoint (what a put must extend)."""
        return f"{self.base}head:{self.ns_key}"

    def ids(self) -> str:
        """Sorted set (all scores 0, ordered by id): the namespace's checkpoints in Redis."""
        return f"{self.base}ids:{self.ns_key}"

    def namespaces(self) -> str:
        """Set: the thread's namespaces."""
        return f"{self.base}nss"

    def name(self) -> str:
        """String: the thread's id as given (its slot may be a digest of it)."""
        return f"{self.base}name"

    def checkpoint(self, checkpoint_id: str) -> str:
        """String: one checkpoint's sealed record."""
        return f"{self.base}cp:{self.ns_key}:{checkpoint_id}"

    def writes(self, checkpoint_id: str) -> str:
        """Hash of sealed writes, one field per task and index: a checkpoint's pending writes."""
        return f"{self.base}w:{self.ns_key}:{checkpoint_id}"

    def blob(self, channel: str, ref: str) -> str:
        """String: one channel value (or a piece of a list) in its envelope.

        `ref` names the blob within its channel: its version and the put that wrote it.
        """
        return f"{self.base}b:{self.ns_key}:{langgraph_slot(channel)}:{ref}"
