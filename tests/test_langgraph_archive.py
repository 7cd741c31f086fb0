"""`CairnSaver.archive` while others write: nothing acknowledged is lost, in threads or processes.

A putter extends a thread (archiving down to `hot_keep` inside its puts), writers put pending
writes to the checkpoints an archive moves next, and archivers archive the same thread with
other `keep`s, all at once; afterwards every acknowledged checkpoint and write reads back.
Real redis-server, real archive directory, real processes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import redis
from langgraph.checkpoint.base import Checkpoint, empty_checkpoint

from cairn.storage.keys import ThreadKeys
from cairn.storage.langgraph import CairnSaver
from cairn.testing.redis_server import RedisServer
from tests.langgraph_hammer import Acked, config_of, run_roles

ROOT = Path(__file__).parent.parent
THREAD_ROUNDS = 2  # races per test; on unfixed code every round lost writes and ids
PROCESS_ROUNDS = 2
ERROR = "__error__"  # LangGraph's channel for a task's error: a write that replaces


def lost(saver: CairnSaver, thread: str, acked: Acked) -> dict[str, list[str]]:
    """What of `acked` the saver no longer gives back: by kind, the lost ids and writes."""
    found: dict[str, list[str]] = defaultdict(list)
    by_checkpoint: dict[tuple[str, str], set[tuple[str, str]]] = defaultdict(set)
    for ns, checkpoint_id, task, value in acked.writes:
        by_checkpoint[(ns, checkpoint_id)].add((task, value))
    listed = {
        (t.config["configurable"]["checkpoint_ns"], t.config["configurable"]["checkpoint_id"])
        for t in saver.list({"configurable": {"thread_id": thread}})
    }
    for ns, checkpoint_id in sorted(set(acked.checkpoints) | by_checkpoint.keys()):
        if (ns, checkpoint_id) not in listed:
            found["not listed"].append(f"{ns}|{checkpoint_id}")
        read = saver.get_tuple(config_of(thread, ns, checkpoint_id))
        if read is None:
            found["not read"].append(f"{ns}|{checkpoint_id}")
            continue
        pending = {(task, value) for task, _, value in read.pending_writes or []}
        found["writes"] += [f"{task} on {checkpoint_id}" for task, value in
                            sorted(by_checkpoint[(ns, checkpoint_id)] - pending)]  # fmt: skip
    return {kind: ids for kind, ids in found.items() if ids}


def test_archiving_while_threads_put_and_write_loses_nothing(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    """Three writers and two archivers beside the putter, on one saver: all reads back.

    `get_tuple` gives every acknowledged checkpoint with every write put to it, and `list`
    names every one.
    """
    for n in range(THREAD_ROUNDS):
        redis_client.flushall()
        archive = tmp_path / f"archive-{n}"
        saver = CairnSaver(redis_client, archive, hot_keep=2)
        roles = ["putter", "writer", "writer", "writer", "archiver", "archiver"]
        acked = run_roles(saver, redis_client, "busy", roles)
        assert [] == acked.errors
        assert len(acked.writes) > 300  # the writers ran while the putter did
        assert {} == lost(CairnSaver(redis_client, archive), "busy", acked)


def test_archiving_while_processes_put_and_write_loses_nothing(
    redis_server: RedisServer, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """As with threads, with a putter and two writing, archiving processes on one thread."""
    for n in range(PROCESS_ROUNDS):
        redis_client.flushall()
        archive = tmp_path / f"archive-{n}"
        roles = [["putter", "archiver"], ["writer", "writer", "archiver"],
                 ["writer", "writer", "archiver"]]  # fmt: skip
        command = [sys.executable, "-m", "tests.langgraph_hammer", redis_server.url,
                   str(archive), "busy", str(len(roles))]  # fmt: skip
        processes = [
            subprocess.Popen(
                [*command, *role], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
            for role in roles
        ]
        acked = Acked()
        for process in processes:
            out, err = process.communicate(timeout=100)
            assert 0 == process.returncode, err.decode()
            reported = json.loads(out)
            acked.merge(Acked(
                checkpoints=[tuple(c) for c in reported["checkpoints"]],
                writes=[tuple(w) for w in reported["writes"]],
            ))  # fmt: skip
        assert len(acked.writes) > 300
        assert {} == lost(CairnSaver(redis_client, archive), "busy", acked)


def counted(n: int) -> Checkpoint:
    """A checkpoint whose one channel, `count`, holds `n` at version n + 1."""
    checkpoint = empty_checkpoint()
    checkpoint["channel_versions"] = {"count": n + 1}
    checkpoint["channel_values"] = {"count": n}
    return checkpoint


def test_an_archive_cut_short_then_done_again_reads_the_write_replaced_meanwhile(
    redis_client: redis.Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An archiver dies between disk and Redis; an error write is replaced; another archives.

    The checkpoint reads back with the replacement, not the value the first put on disk.
    """

    def died(where: ThreadKeys, moving: object) -> int:
        raise ConnectionError("the archiver died here")  # on disk, before Redis loses them

    saver = CairnSaver(redis_client, tmp_path / "archive")
    first = saver.put(config_of("cut", ""), counted(0), {}, {"count": 1})
    saver.put(first, counted(1), {}, {"count": 2})
    saver.put_writes(first, [(ERROR, "first failure")], "task")
    cut_short = CairnSaver(redis_client, tmp_path / "archive")
    monkeypatch.setattr(cut_short._cold_tier, "_drop_archived", died)
    with pytest.raises(ConnectionError):
        cut_short.archive("cut", keep=1)
    saver.put_writes(first, [(ERROR, "second failure")], "task")
    assert 1 == saver.archive("cut", keep=1)
    read = CairnSaver(redis_client, tmp_path / "archive").get_tuple(first)
    assert read is not None
    assert [("task", ERROR, "second failure")] == read.pending_writes
