"""Every sealed record is bound to its place: a sound record copied elsewhere is refused.

The attacker writes to Redis and the archive directory (not holding `CAIRN_SIGNING_KEY`)
and copies validly sealed records from one place to another: another task's spec, limits
or epoch floor, an approval under another call's name, an LC under another task, agent
or id, a GC into another number's slot, a LangGraph record into another thread. Each copy
is refused as damaged bytes are (`CorruptCheckpoint`), so a read falls back to a sound
copy where there is one. Every test runs on a real redis-server and a real archive
directory, signed (`CAIRN_SIGNING_KEY`) and unsigned: the binding is in the plain SHA-256
too.
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import empty_checkpoint
from structlog.testing import capture_logs

from cairn.agents.approval import Approval
from cairn.agents.barrier import read_outputs
from cairn.agents.models.base import ModelReply, ModelRequest
from cairn.agents.spec import AgentSpec, TaskRecord
from cairn.agents.step import run_step
from cairn.agents.task import start_task
from cairn.coordinator.coordinator import Coordinator
from cairn.coordinator.restore import Restorer
from cairn.coordinator.spec import LIMITS_DOC, Limits
from cairn.errors import CorruptCheckpoint
from cairn.storage import keys
from cairn.storage.archive import archive_gc
from cairn.storage.backends.disk import DiskArchive
from cairn.storage.backends.redis import RedisHotStore
from cairn.storage.chain import WorkingState
from cairn.storage.codec import BINDING_TAG, FLAG_BOUND, Codec, Place, canonical_bytes
from cairn.storage.keys import EPOCH_DOC, SPEC_DOC, ThreadKeys
from cairn.storage.langgraph import CairnSaver
from cairn.storage.langgraph.places import cold_name, cold_task
from cairn.storage.records import LCRef, LocalCheckpoint, Message, Record, Role, ToolCall, Usage
from cairn.storage.store import CheckpointStore
from cairn.testing.redis_server import RedisServer
from tests.agent_harness import files_of, record, scripted, superstep
from tests.cluster import Cluster, team_spec

KEY = b"binding-test-key"  # a key for these tests only


@pytest.fixture(params=["signed", "unsigned"])
def codec(request: pytest.FixtureRequest) -> Codec:
    """A codec signing with `KEY`, and one that only hashes."""
    return Codec(KEY) if request.param == "signed" else Codec()


@pytest.fixture
def store(redis_client: redis.Redis, tmp_path: Path, codec: Codec) -> CheckpointStore:
    """Redis and a disk archive, what users run."""
    return CheckpointStore(
        RedisHotStore(redis_client), DiskArchive(tmp_path / "archive"), codec, full_every=3
    )


def archived(tmp_path: Path, task: str, *parts: str) -> Path:
    """The archive file of a record of `task` (`doc/spec.rec`, `lc/coder/<id>.rec`, …)."""
    return tmp_path.joinpath("archive", "tasks", task, *parts)


# task documents ------------------------------------------------------------------------


def spec_of(task: str, goal: str) -> TaskRecord:
    """A one-agent task record with `goal`."""
    return TaskRecord(task=task, goal=goal, agents=[AgentSpec(name="a", model="scripted")])


def approval(reason: str) -> Approval:
    """A decision whose `reason` tells it apart."""
    return Approval(agent="a", at="lc", tool_call_id="c", tool="t", digest="d",
                    approved=True, reason=reason)  # fmt: skip


DOCS: dict[str, tuple[type[Record], tuple[str, str, Record], tuple[str, str, Record]]] = {
    # kind: (model, (the victim's task, name, record), (the source's task, name, record))
    "spec from another task": (
        TaskRecord,
        ("x", SPEC_DOC, spec_of("x", "X's goal")),
        ("y", SPEC_DOC, spec_of("y", "Y's goal")),
    ),
    "limits from another task": (
        Limits,
        ("x", LIMITS_DOC, Limits(max_supersteps=3)),
        ("y", LIMITS_DOC, Limits(max_supersteps=500)),
    ),
    "approval from another task": (
        Approval,
        ("x", "approval-1", approval("X's")),
        ("y", "approval-1", approval("Y's")),
    ),
    "approval of another call": (
        Approval,
        ("x", "approval-1", approval("this call's")),
        ("x", "approval-2", approval("another call's")),
    ),
}


@pytest.mark.parametrize("kind", DOCS)
def test_a_document_copied_from_another_place_is_refused_like_a_damaged_one(
    store: CheckpointStore, redis_client: redis.Redis, tmp_path: Path, kind: str
) -> None:
    """Y's spec, limits or decision over X's: the sound archived copy is read, else refused.

    Copied into Redis only, the read falls back to the archive's sound copy; copied into
    both, it is refused, naming X's document.
    """
    model, (task, name, own), (source, source_name, foreign) = DOCS[kind]
    store.put_doc(task, name, own)
    store.put_doc(source, source_name, foreign)
    redis_client.set(
        keys.doc(task, name), cast(bytes, redis_client.get(keys.doc(source, source_name)))
    )
    assert canonical_bytes(own) == canonical_bytes(store.read_doc(task, name, model))
    archived(tmp_path, task, "doc", f"{name}.rec").write_bytes(
        archived(tmp_path, source, "doc", f"{source_name}.rec").read_bytes()
    )
    with pytest.raises(CorruptCheckpoint, match=f"doc {task}/{name}: checksum mismatch"):
        store.read_doc(task, name, model)


def test_the_epoch_floor_of_another_task_is_refused(store: CheckpointStore, tmp_path: Path) -> None:
    """Y's lower epoch floor copied over X's: neither read nor raised from, never believed."""
    store.raise_epoch("x", 9)
    store.raise_epoch("y", 2)
    archived(tmp_path, "x", "doc", f"{EPOCH_DOC}.rec").write_bytes(
        archived(tmp_path, "y", "doc", f"{EPOCH_DOC}.rec").read_bytes()
    )
    with pytest.raises(CorruptCheckpoint, match=f"doc x/{EPOCH_DOC}"):
        store.epoch_floor("x")
    with pytest.raises(CorruptCheckpoint, match=f"doc x/{EPOCH_DOC}"):
        store.raise_epoch("x", 10)
    assert 2 == store.epoch_floor("y")


# local checkpoints -----------------------------------------------------------------------


def write_lc(store: CheckpointStore, task: str, agent: str, said: str) -> LCRef:
    """Write a first step LC of `agent` saying `said`; return its ref."""
    store.hot.init_task(task)
    store.hot.begin_attempt(task, agent, 1, 1)
    state = WorkingState(task=task, agent=agent, epoch=1, superstep=1, attempt=1)
    state.messages.append(Message(role=Role.ASSISTANT, content=said))
    return store.write_lc(state)


LC_MOVES = ["another task", "another agent", "another id"]


@pytest.mark.parametrize("move", LC_MOVES)
@pytest.mark.parametrize("tier", ["redis", "archive"])
def test_an_lc_read_from_another_place_is_refused_like_a_damaged_one(
    store: CheckpointStore, redis_client: redis.Redis, tmp_path: Path, move: str, tier: str
) -> None:
    """A vote naming a sound LC of another task, agent or id (copied in) is refused.

    Votes are plain entries in Redis: a writer can name any LC id and checksum, and copy the
    LC's bytes under X's key or into X's archive directory. The barrier reads the voted LC
    (`read_outputs`) and a reader of the LC itself (`read_lc`) both refuse it.
    """
    own = write_lc(store, "x", "coder", "X's coder")
    reviewer = write_lc(store, "x", "reviewer", "X's reviewer")
    foreign = write_lc(store, "y", "coder", "Y's coder")
    source, ref = {
        "another task": ("y", foreign),
        "another agent": ("x", reviewer),
        "another id": ("x", own),
    }[move]
    lc_id = "01942a3c-0000-7000-8000-0000000000ff" if move == "another id" else ref.id
    for task, who, lc in (
        ("x", "coder", own),
        ("x", "reviewer", reviewer),
        ("y", "coder", foreign),
    ):
        store.cold.put_lc(task, who, lc.id, store.hot.read_lcs(task, [lc.id])[lc.id])
    data = store.hot.read_lcs(source, [ref.id])[ref.id]
    if tier == "redis":
        if (source, ref.id) != ("x", lc_id):  # the reviewer's LC is under its key already
            redis_client.copy(keys.lc(source, ref.id), keys.lc("x", lc_id), replace=True)
        archived(tmp_path, "x", "lc", "coder", f"{lc_id}.rec").unlink(missing_ok=True)
    else:
        redis_client.delete(keys.lc("x", lc_id))
        archived(tmp_path, "x", "lc", "coder", f"{lc_id}.rec").write_bytes(data)
    vote = {"coder": LCRef(id=lc_id, checksum=ref.checksum)}
    with pytest.raises(CorruptCheckpoint, match=f"lc x/coder/{lc_id}: checksum mismatch"):
        read_outputs(store, "x", vote)
    with pytest.raises(CorruptCheckpoint, match=f"lc x/coder/{lc_id}"):
        store.read_lc("x", "coder", lc_id)


# global checkpoints ----------------------------------------------------------------------

BUSY = [{"say": f"turn {n}", "tools": [{"name": "write_file",
                                        "args": {"path": f"f{n}", "content": str(n)}}]}
        for n in range(6)]  # fmt: skip


def start_busy(store: CheckpointStore, task: str, cache: Path, supersteps: int) -> None:
    """Start a one-agent task whose agent writes a file every step; run `supersteps`."""
    start_task(store, record(task, scripted("a", BUSY)), {})
    for _ in range(supersteps):
        assert superstep(store, task, cache) is not None


def copy_gc(
    redis_client: redis.Redis, tmp_path: Path, source: tuple[str, int], target: tuple[str, int]
) -> None:
    """Put GC `source`'s sealed bytes in GC `target`'s slot, in Redis and in the archive."""
    data = cast(bytes, redis_client.hget(keys.gc(*source), "data"))
    redis_client.hset(keys.gc(*target), "data", data)
    task, number = target
    archived(tmp_path, task, "gc", f"{number:012d}.rec").write_bytes(data)


@pytest.mark.parametrize("source", [("x", 0), ("y", 1)], ids=["older-number", "other-task"])
def test_a_gc_in_another_slot_is_refused_and_a_restore_falls_back_to_an_older_one(
    store: CheckpointStore,
    redis_client: redis.Redis,
    tmp_path: Path,
    source: tuple[str, int],
) -> None:
    """GC 0 of X, or GC 1 of Y, in X's slot 1 (Redis and archive): refused; restore takes 0."""
    for task in ("x", "y"):
        start_busy(store, task, tmp_path / "cache", 2)
        for number in range(3):
            archive_gc(store, task, number)
    copy_gc(redis_client, tmp_path, source, ("x", 1))
    with pytest.raises(CorruptCheckpoint, match="gc x/1: checksum mismatch"):
        store.read_gc("x", 1)
    restored = Restorer(redis_client, store, workers=False).restore("x", to=1, reason="test")
    assert 0 == restored.restored_to
    latest = store.latest_gc("x")
    assert latest is not None
    assert {} == files_of(store, latest)  # the workspace of GC 0; GC 1's holds f0


def test_a_step_refuses_an_older_gc_put_in_the_latest_slot(
    store: CheckpointStore, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """After a restore to GC 1 (GC 3, superstep 1), GC 1's bytes in slot 3: no step runs.

    Read as it stands, GC 1 follows superstep 1 too, and would start the agent from its
    state before the restore (without the restore's summary, at the old epoch).
    """
    cache = tmp_path / "cache"
    start_busy(store, "x", cache, 2)
    restored = Restorer(redis_client, store, workers=False).restore("x", to=1, reason="test")
    assert (1, 3) == (restored.restored_to, restored.number)
    archive_gc(store, "x", 3)
    copy_gc(redis_client, tmp_path, ("x", 1), ("x", 3))
    epoch = restored.epoch
    store.hot.begin_attempt("x", "a", 2, 1)
    with pytest.raises(CorruptCheckpoint, match="gc x/3: checksum mismatch"):
        run_step("x", "a", 2, epoch, 1, store=store, cache=cache)
    assert {} == store.hot.get_votes("x", epoch, 2)


# a spec swapped in: the step and the coordinator -----------------------------------------

WRITE = ToolCall(id="call_0", name="write_file", args={"path": "deploy.sh", "content": "curl x|sh"})


class Writer:
    """A model asking for one write, then halting; it counts the calls it was asked."""

    def __init__(self) -> None:
        self.calls = 0

    def complete(self, request: ModelRequest) -> ModelReply:
        """Ask for `WRITE` on the first turn, then answer without tools."""
        self.calls += 1
        if any(m.role is Role.ASSISTANT for m in request.messages):
            return ModelReply(content="done", usage=Usage())
        return ModelReply(content="writing", usage=Usage(), tool_calls=[WRITE])


def test_a_step_refuses_to_run_an_agent_from_another_tasks_spec(
    store: CheckpointStore, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """Y's spec (no approval gate) over X's (every write approved by a person): no step runs.

    Read as it stands, X's agent would write deploy.sh without anyone approving it.
    """
    gated = AgentSpec(name="a", model="scripted", tools=["write_file"], approve=["write_file"])
    ungated = AgentSpec(name="a", model="scripted", tools=["write_file"])
    start_task(store, TaskRecord(task="x", goal="g", agents=[gated]), {})
    start_task(store, TaskRecord(task="y", goal="g", agents=[ungated]), {})
    redis_client.set(
        keys.doc("x", SPEC_DOC), cast(bytes, redis_client.get(keys.doc("y", SPEC_DOC)))
    )
    archived(tmp_path, "x", "doc", "spec.rec").write_bytes(
        archived(tmp_path, "y", "doc", "spec.rec").read_bytes()
    )
    model = Writer()
    store.hot.begin_attempt("x", "a", 1, 1)
    epoch = store.hot.get_epoch("x")
    with pytest.raises(CorruptCheckpoint, match=f"doc x/{SPEC_DOC}: checksum mismatch"):
        run_step("x", "a", 1, epoch, 1, store=store, cache=tmp_path / "cache",
                 models=lambda _: model)  # fmt: skip
    assert 0 == model.calls
    assert {} == store.hot.get_votes("x", epoch, 1)
    latest = store.latest_gc("x")
    assert latest is not None
    assert {} == files_of(store, latest)


def test_the_coordinator_refuses_a_task_whose_spec_and_limits_were_swapped(
    own_redis: RedisServer, tmp_path: Path
) -> None:
    """X's spec and limits replaced by Y's, sound ones: X runs no superstep, Y runs its own.

    The coordinator reads each from Redis, else the archive; both copies are Y's, so it
    logs that X's record fails its check and launches nothing of X.
    """
    cluster = Cluster(own_redis, tmp_path)
    try:
        cluster.store = CheckpointStore(
            RedisHotStore(cluster.client), DiskArchive(tmp_path / "archive"), Codec(KEY)
        )
        cluster.coordinator = Coordinator(cluster.client, cluster.store, heartbeat_grace=1.0)
        x = cluster.tasks.submit(team_spec(tmp_path / "x-ledger"))
        hostile = team_spec(tmp_path / "y-ledger")
        hostile.max_supersteps = 500
        y = cluster.tasks.submit(hostile)
        for name in (SPEC_DOC, LIMITS_DOC):
            data = cast(bytes, cluster.client.get(keys.doc(y, name)))
            cluster.client.set(keys.doc(x, name), data)
            archived(tmp_path, x, "doc", f"{name}.rec").write_bytes(data)
        with capture_logs() as logs:
            cluster.tick_until(lambda: launched(cluster.client, y), timeout=30)
        assert not launched(cluster.client, x)
        refused = [e for e in logs if e.get("task") == x and "error" in e]
        assert refused, logs
        assert "CorruptCheckpoint" in refused[0]["error"]
        assert f"doc {x}/" in refused[0]["error"]
    finally:
        cluster.close()


def launched(client: redis.Redis, task: str) -> bool:
    """True once the task has a superstep in flight or behind it."""
    return int(cast(bytes, client.hget(keys.run(task), "superstep") or b"0")) > 0


# LangGraph's saver -----------------------------------------------------------------------


def put_note(saver: CairnSaver, thread: str, note: str) -> str:
    """Store a one-channel checkpoint holding `note` in `thread`; return its id."""
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"note": note}
    checkpoint["channel_versions"] = {"note": 1}
    config: RunnableConfig = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    saved = saver.put(config, checkpoint, {"source": "input", "step": 0}, {"note": 1})
    return str(saved["configurable"]["checkpoint_id"])


def note_of(saver: CairnSaver, thread: str, checkpoint_id: str) -> Any:
    """The note the checkpoint reads back with."""
    config: RunnableConfig = {
        "configurable": {"thread_id": thread, "checkpoint_ns": "", "checkpoint_id": checkpoint_id}
    }
    found = saver.get_tuple(config)
    assert found is not None
    return found.checkpoint["channel_values"]["note"]


@pytest.mark.parametrize("tier", ["redis", "archive"])
def test_a_langgraph_record_of_another_thread_is_refused(
    redis_client: redis.Redis, tmp_path: Path, codec: Codec, tier: str
) -> None:
    """Thread a's checkpoint and its blob copied over thread b's: b's read refuses them."""
    saver = CairnSaver(redis_client, tmp_path / "lg", codec=codec)
    a_id, b_id = put_note(saver, "a", "a's note"), put_note(saver, "b", "b's note")
    a, b = ThreadKeys("a", ""), ThreadKeys("b", "")
    moves: dict[str, str] = {a.checkpoint(a_id): b.checkpoint(b_id)}
    for key in redis_client.scan_iter(match=f"{a.base}b:*"):
        moves[key.decode()] = key.decode().replace(a.base, b.base, 1)
    if tier == "redis":
        for source, target in moves.items():
            redis_client.set(target, cast(bytes, redis_client.get(source)))
    else:
        saver.archive("a", keep=0)
        saver.archive("b", keep=0)
        for source, target in moves.items():
            found = tmp_path / "lg" / "tasks" / cold_task("a") / "doc" / f"{cold_name(source)}.rec"
            into = tmp_path / "lg" / "tasks" / cold_task("b") / "doc" / f"{cold_name(target)}.rec"
            into.write_bytes(found.read_bytes())
    with pytest.raises(CorruptCheckpoint, match=f"langgraph checkpoint b//{b_id}"):
        note_of(saver, "b", b_id)
    assert "a's note" == note_of(saver, "a", a_id)


def test_a_copied_thread_reads_back_in_its_new_place(
    redis_client: redis.Redis, tmp_path: Path, codec: Codec
) -> None:
    """`copy_thread` seals each record again for the thread it copies into."""
    saver = CairnSaver(redis_client, tmp_path / "lg", codec=codec)
    checkpoint_id = put_note(saver, "from", "the note")
    saver.copy_thread("from", "to")
    assert "the note" == note_of(saver, "to", checkpoint_id)


# records sealed before records were bound --------------------------------------------------


def test_a_signed_document_sealed_without_a_binding_is_refused_with_a_key(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    """A signed spec with no binding (as sealed before) is refused; unsigned, it still reads.

    A forger holding old signed records could otherwise replay them anywhere; an unsigned
    one proves nothing either way, and is read as before where no key is configured.
    """
    spec = spec_of("x", "the goal")
    for codec, stores in ((Codec(KEY), True), (Codec(), False)):
        data = codec.seal(canonical_bytes(spec)).data  # no place: the form before binding
        assert not data[4] & FLAG_BOUND
        redis_client.set(keys.doc("x", SPEC_DOC), data)
        store = CheckpointStore(RedisHotStore(redis_client), DiskArchive(tmp_path / "a"), codec)
        if stores:
            with pytest.raises(CorruptCheckpoint, match="signed without a binding to its place"):
                store.read_doc("x", SPEC_DOC, TaskRecord)
        else:
            read = store.read_doc("x", SPEC_DOC, TaskRecord)
            assert canonical_bytes(spec) == canonical_bytes(read)


def test_a_signed_lc_sealed_without_a_binding_reads_only_where_its_fields_place_it(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    """An old signed LC reads at its own task, agent and id; named as another agent's, refused."""
    codec = Codec(KEY)
    store = CheckpointStore(RedisHotStore(redis_client), DiskArchive(tmp_path / "a"), codec)
    lc = LocalCheckpoint(id="01942a3c-0000-7000-8000-000000000001", task="x", agent="coder",
                         step=1, superstep=1, epoch=1, attempt=1)  # fmt: skip
    old = codec.seal(canonical_bytes(lc)).data  # signed, no place: the form before binding
    store.cold.put_lc("x", "coder", lc.id, old)
    store.cold.put_lc("x", "reviewer", lc.id, old)
    assert lc.id == store.read_lc("x", "coder", lc.id).id
    ref = LCRef(id=lc.id, checksum=old[5:37].hex())
    with pytest.raises(CorruptCheckpoint, match="signed without a binding, for another place"):
        read_outputs(store, "x", {"reviewer": ref})


# the bytes ---------------------------------------------------------------------------------


def expected_digest(key: bytes | None, place: tuple[str, ...], payload: bytes) -> bytes:
    """The digest as docs/storage.md defines it, computed here independently of the codec."""
    parts = [p.encode() for p in (BINDING_TAG, *place)]
    binding = len(parts).to_bytes(2, "big") + b"".join(len(p).to_bytes(4, "big") + p for p in parts)
    if key is None:
        return hashlib.sha256(binding + payload).digest()
    return hmac.new(key, binding + payload, hashlib.sha256).digest()


@pytest.mark.parametrize("key", [None, KEY], ids=["unsigned", "signed"])
@pytest.mark.parametrize(
    ("place", "parts"),
    [
        (Place.lc("t", "coder", "01942a3c"), ("lc", "t", "coder", "01942a3c")),
        (Place.gc("t", 12), ("gc", "t", "12")),
        (Place.doc("t", "spec"), ("doc", "t", "spec")),
    ],
    ids=["lc", "gc", "doc"],
)
def test_the_digest_covers_the_place_then_the_bytes(
    key: bytes | None, place: Place, parts: tuple[str, ...]
) -> None:
    """The stored digest is the documented one; a bare name cannot open a bound record."""
    payload = b'{"schema_version":2}'
    sealed = Codec(key).seal(payload, place)
    assert expected_digest(key, parts, payload).hex() == sealed.checksum
    assert sealed.data[4] & FLAG_BOUND
    assert payload == Codec(key).open(sealed.data, place)
    with pytest.raises(CorruptCheckpoint, match="bound to a place, but read without one"):
        Codec(key).open(sealed.data, place.name)


def test_places_that_differ_in_any_part_never_share_a_binding() -> None:
    """Length-prefixed parts: moving a character between parts makes another binding."""
    places = [
        Place.doc("ab", "c"),
        Place.doc("a", "bc"),
        Place.lc("t", "a", "b"),
        Place("lc", "t", ("ab",)),
        Place.gc("t", 1),
        Place.doc("t", "1"),
    ]
    assert len(places) == len({p.binding() for p in places})
