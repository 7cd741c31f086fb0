"""Writers and archivers on one LangGraph thread at once, in threads or processes.

A putter extends the thread's two namespaces checkpoint by checkpoint (its saver archives
down to `hot_keep` as it goes), writers put pending writes to the newest checkpoints (the
ones an archive moves next), archivers archive the thread with one `keep` or another.
Each role returns what the saver acknowledged, for a test to read back afterwards.

As a process: `python -m tests.langgraph_hammer URL ARCHIVE THREAD PROCESSES ROLE...` (ROLE
is `putter`, `writer` or `archiver`, each run on a thread of its own; the putter starts once
PROCESSES processes are ready) prints the acknowledgements as JSON and exits 1 if a role
raised.
"""

from __future__ import annotations

import json
import random
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import redis
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import ChannelVersions, empty_checkpoint
from langgraph.checkpoint.base.id import uuid6

from cairn.storage.backends.redis import connect
from cairn.storage.langgraph import CairnSaver

NAMESPACES = ("", "inner")
PUTS = 60  # checkpoints per namespace
HOT_KEEP = 2
RECENT = 6  # a writer picks one of the newest checkpoints this many
PACE = 4  # a writer puts at most this many writes per checkpoint put so far: work that
# keeps pace with the putter on a loaded machine as on an idle one
DEADLINE = 90.0  # seconds: writers and archivers stop even if the putter never finishes
ACKED = "hammer:acked"  # Redis list of "ns|id", newest last (outside the saver's keys)
DONE = "hammer:done"
READY = "hammer:ready"  # how many processes have their saver and wait for the putter


@dataclass
class Acked:
    """What the saver acknowledged: checkpoints (ns, id) and writes (ns, id, task, value)."""

    checkpoints: list[tuple[str, str]] = field(default_factory=list)
    writes: list[tuple[str, str, str, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def merge(self, other: Acked) -> None:
        """Add another role's acknowledgements to these."""
        self.checkpoints += other.checkpoints
        self.writes += other.writes
        self.errors += other.errors


def config_of(thread: str, ns: str, checkpoint_id: str | None = None) -> RunnableConfig:
    """The config naming a thread's namespace, and one of its checkpoints if given."""
    conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ns}
    if checkpoint_id is not None:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


def put_chain(saver: CairnSaver, client: redis.Redis, thread: str, processes: int) -> Acked:
    """Extend both namespaces by `PUTS` checkpoints each, one channel inherited for a while.

    Starts once `processes` processes are ready, so none of them misses the race.
    """
    stop = time.monotonic() + DEADLINE
    while int(client.get(READY) or 0) < processes:
        if time.monotonic() > stop:
            raise TimeoutError(f"fewer than {processes} processes got ready")
        time.sleep(0.01)
    acked = Acked()
    heads: dict[str, str | None] = dict.fromkeys(NAMESPACES)
    versions: dict[str, ChannelVersions] = {ns: {} for ns in NAMESPACES}
    for n in range(PUTS):
        for ns in NAMESPACES:
            checkpoint = empty_checkpoint()
            checkpoint["id"] = str(uuid6(clock_seq=n))
            # "count" changes every put; "slow" every fourth, so checkpoints share its blob.
            written = ["count", "slow"] if n % 4 == 0 else ["count"]
            new: ChannelVersions = {ch: int(versions[ns].get(ch, 0)) + 1 for ch in written}
            versions[ns] |= new
            checkpoint["channel_versions"] = dict(versions[ns])
            checkpoint["channel_values"] = {"count": n, "slow": f"{ns}-{n // 4}"}
            metadata: Any = {"source": "loop", "step": n, "parents": {}}
            stored = saver.put(config_of(thread, ns, heads[ns]), checkpoint, metadata, new)
            head = str(stored["configurable"]["checkpoint_id"])
            heads[ns] = head
            acked.checkpoints.append((ns, head))
            client.rpush(ACKED, f"{ns}|{head}")
    return acked


def put_writes(saver: CairnSaver, client: redis.Redis, thread: str, name: str) -> Acked:
    """Put one write at a time to one of the newest checkpoints until the putter is done.

    At most `PACE` per checkpoint put so far: the writes spread over the putter's run.
    """
    acked = Acked()
    rng = random.Random(name)
    stop = time.monotonic() + DEADLINE
    n = 0
    while not client.exists(DONE) and time.monotonic() < stop:
        put = client.llen(ACKED)
        recent = [r.decode() for r in cast(list[bytes], client.lrange(ACKED, -RECENT, -1))]
        if not recent or n >= PACE * put:
            time.sleep(0.001)
            continue
        ns, checkpoint_id = rng.choice(recent).split("|")
        task, value = f"{name}-{n}", f"value {name} {n}"
        saver.put_writes(config_of(thread, ns, checkpoint_id), [("notes", value)], task)
        acked.writes.append((ns, checkpoint_id, task, value))
        n += 1
    return acked


def archive(saver: CairnSaver, client: redis.Redis, thread: str, name: str) -> Acked:
    """Archive the thread, keeping 1, 2 or 3 checkpoints in turn, until the putter is done."""
    keeps = [1, 2, 3]
    random.Random(name).shuffle(keeps)
    stop = time.monotonic() + DEADLINE
    n = 0
    while not client.exists(DONE) and time.monotonic() < stop:
        saver.archive(thread, keep=keeps[n % len(keeps)])
        n += 1
    return Acked()


def run_roles(
    saver: CairnSaver, client: redis.Redis, thread: str, roles: list[str], processes: int = 0
) -> Acked:
    """Run each role on a thread of its own, to its end; what they acknowledged, merged.

    The putter sets `DONE` when it finishes (or fails), which ends the other roles.
    """
    results: list[Acked] = []
    lock = threading.Lock()

    def run(role: str, index: int) -> None:
        name = f"{role}-{threading.get_native_id()}-{index}"
        calls: dict[str, Callable[[], Acked]] = {
            "putter": lambda: put_chain(saver, client, thread, processes),
            "writer": lambda: put_writes(saver, client, thread, name),
            "archiver": lambda: archive(saver, client, thread, name),
        }
        try:
            found = calls[role]()
        except Exception:  # noqa: BLE001 - reported to the test, which fails on it
            found = Acked(errors=[f"{role}: {traceback.format_exc()}"])
        finally:
            if role == "putter":
                client.set(DONE, 1)
        with lock:
            results.append(found)

    workers = [threading.Thread(target=run, args=(r, i)) for i, r in enumerate(roles)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    total = Acked()
    for found in results:
        total.merge(found)
    return total


def main(argv: list[str]) -> int:
    """Run the roles named in `argv` on a saver of this process; print what was acknowledged."""
    url, archive_dir, thread, processes, *roles = argv
    client = connect(url)
    saver = CairnSaver(client, archive_dir, hot_keep=HOT_KEEP)
    client.incr(READY)
    acked = run_roles(saver, client, thread, roles, int(processes))
    client.close()
    json.dump({"checkpoints": acked.checkpoints, "writes": acked.writes,
               "errors": acked.errors}, sys.stdout)  # fmt: skip
    return 1 if acked.errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
