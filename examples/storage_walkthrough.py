"""What Cairn's storage guarantees, shown end to end (`make demo` until the CLI lands).

A team of three agents checkpoints 6 supersteps into Redis; each global checkpoint is
committed atomically and archived to disk; then Redis loses everything and every agent's
state and every workspace file comes back from the archive, verified. With no
CAIRN_REDIS_URL a private redis-server is started (and stopped) under .cairn/.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import redis

from cairn.coordinator.settings import load_settings
from cairn.errors import CairnError
from cairn.storage.archive import archive_gc, trim_hot
from cairn.storage.backends.disk import DiskArchive
from cairn.storage.backends.memory import MemoryHotStore
from cairn.storage.backends.redis import RedisHotStore, connect
from cairn.storage.chain import WorkingState
from cairn.storage.codec import Codec
from cairn.storage.records import GlobalCheckpoint, Message, Role, WorkspaceManifest
from cairn.storage.store import CheckpointStore
from cairn.testing.redis_server import RedisServer

TEAM = ("planner", "coder", "reviewer")
SUPERSTEPS = 6


def run(store: CheckpointStore, task: str) -> None:
    """Run the team, committing and archiving a GC at every barrier."""
    epoch = store.hot.init_task(task)
    states = {a: WorkingState(task=task, agent=a, epoch=epoch) for a in TEAM}
    files: dict[str, str] = {}
    print(f"{'GC':>3}  {'superstep':>9}  {'agents':<24} {'files':>5}  {'archived':>9}")
    for s in range(1, SUPERSTEPS + 1):
        members = {}
        for name, state in states.items():
            store.hot.begin_attempt(task, name, s, 1)
            state.superstep, state.step = s, state.step + 1
            state.messages.append(Message(role=Role.ASSISTANT, content=f"{name} step {s}"))
            members[name] = store.write_lc(state, vote=True)
            files[f"{name}/notes_{s}.md"] = f"{name} was here in superstep {s}\n"
        manifest = WorkspaceManifest(
            files={p: store.put_blob(task, c.encode()) for p, c in files.items()}
        )
        gc = GlobalCheckpoint(
            task=task,
            number=s,
            superstep=s,
            epoch=epoch,
            members=members,
            workspace=store.put_manifest(task, manifest),
        )
        store.commit_gc(gc)
        report = archive_gc(store, task, s)
        print(f"{s:>3}  {s:>9}  {','.join(TEAM):<24} {len(files):>5}  {report.bytes:>8}B")
    trimmed = trim_hot(store, task, hot_keep=2, skew_margin=0)
    print(f"retention: GCs {trimmed.gcs} left Redis (they are on disk); 2 stay hot")


def recover(store: CheckpointStore, task: str) -> None:
    """Read every GC back with Redis gone, from the archive alone."""
    cold_only = CheckpointStore(MemoryHotStore(), store.cold, store.codec)
    latest = cold_only.latest_gc(task)
    assert latest is not None
    for agent, ref in latest.members.items():
        state = cold_only.read_state(task, agent, ref.id, ref.checksum)
        print(f"  {agent:<9} {len(state.messages)} messages, last: {state.messages[-1].content!r}")
    files = cold_only.read_manifest(task, latest.workspace).files
    print(f"  workspace: {len(files)} files, every one verified against its sha256")


def main() -> int:
    """Run the walkthrough; return the process exit code."""
    settings = load_settings()  # CAIRN_REDIS_URL, CAIRN_SIGNING_KEY
    url = settings.redis_url
    server = None
    archive = Path(tempfile.mkdtemp(prefix="cairn-archive-"))
    task = f"walkthrough-{int(time.time())}"
    try:
        if url is None:
            server = RedisServer(Path(".cairn/redis"), appendonly=True).start()
            url = server.url
            print(f"started a private redis-server at {url} (AOF on)")
        client = connect(url)
        client.ping()
        codec = Codec(signing_key=settings.key())
        store = CheckpointStore(RedisHotStore(client), DiskArchive(archive), codec)
        run(store, task)
        print(f"\nRedis loses task {task}; reading GC {SUPERSTEPS} from {archive}:")
        client.delete(*client.scan_iter(match=f"cairn:{{{task}}}:*"))
        recover(store, task)
        print("\nnothing committed was lost.")
    except (CairnError, redis.RedisError) as exc:
        print(f"cairn: {exc}", file=sys.stderr)
        return 1
    finally:
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
