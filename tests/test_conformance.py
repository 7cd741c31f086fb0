"""One contract, every backend: the in-memory twins, Redis and the disk archive."""

from __future__ import annotations

import dataclasses
import time

import pytest

from cairn.errors import CommitRefused, FencedWrite, InvalidName, RecordNotFound
from cairn.storage.backends.memory import MemoryArchive, MemoryHotStore
from cairn.storage.backends.redis import RedisHotStore
from cairn.storage.base import ColdArchive, HotStore, LCEntry, NextSuperstep
from cairn.storage.chain import WorkingState, cut_lc
from cairn.storage.codec import canonical_bytes
from cairn.storage.records import (
    GCStatus,
    LCRef,
    Level,
    Message,
    Role,
    WorkspaceManifest,
    sha256_hex,
)
from cairn.storage.store import CheckpointStore
from tests.factories import make_gc, manifest, new_agent, next_superstep, take_step

TASK = "t1"


def test_lc_round_trip(store: CheckpointStore) -> None:
    """An LC written and read back rebuilds the same state."""
    state = new_agent(store, TASK, "coder")
    take_step(state, 1)
    ref = store.write_lc(state)
    again = store.read_state(TASK, "coder", ref.id, ref.checksum)
    assert state.messages == again.messages
    assert state.trace == again.trace
    assert state.base == again.base
    assert ref.checksum == store.read_lc(TASK, "coder", ref.id).checksum


def test_same_lc_written_twice_is_a_no_op(store: CheckpointStore) -> None:
    """A retried LC write (same id and bytes) succeeds and stores one LC."""
    state = new_agent(store, TASK, "coder")
    take_step(state, 1)
    lc = cut_lc(state, Level.STEP)
    sealed = store.codec.encode(lc)
    entry = LCEntry(lc, sealed)
    store.hot.write_lc(entry, vote=True)
    store.hot.write_lc(entry, vote=True)
    assert [sealed.data] == store.hot.read_chain(TASK, lc.id, 10)
    assert {"coder": LCRef(id=lc.id, checksum=sealed.checksum)} == store.hot.get_votes(TASK, 1, 1)


def test_other_bytes_under_an_existing_id_are_refused(store: CheckpointStore) -> None:
    """An LC id cannot be overwritten with different bytes."""
    state = new_agent(store, TASK, "coder")
    lc = cut_lc(state, Level.STEP)
    entry = LCEntry(lc, store.codec.encode(lc))
    store.hot.write_lc(entry)
    take_step(state, 1)
    grown = cut_lc(state, Level.STEP).model_copy(update={"id": lc.id})
    other = LCEntry(grown, store.codec.encode(grown))
    with pytest.raises(FencedWrite):
        store.hot.write_lc(other)


def test_stale_epoch_is_fenced(store: CheckpointStore) -> None:
    """After the epoch is raised, a write carrying the old epoch is refused and not stored."""
    state = new_agent(store, TASK, "coder")
    assert store.hot.raise_epoch(TASK, 2) == 2
    take_step(state, 1)
    with pytest.raises(FencedWrite, match="stale epoch 1"):
        store.write_lc(state)
    assert state.base is None
    assert store.hot.get_votes(TASK, 1, 1) == {}


def test_stale_attempt_is_fenced(store: CheckpointStore) -> None:
    """Once attempt 2 of a step is current, attempt 1 (a zombie) cannot write."""
    state = new_agent(store, TASK, "coder")
    store.hot.begin_attempt(TASK, "coder", 1, 2)
    take_step(state, 1)
    with pytest.raises(FencedWrite, match="stale attempt 1:1:1"):
        store.write_lc(state, vote=True)
    assert store.hot.get_votes(TASK, 1, 1) == {}
    state.attempt = 2
    ref = store.write_lc(state, vote=True)
    assert {"coder": ref} == store.hot.get_votes(TASK, 1, 1)


def test_an_lc_write_stores_its_blobs_and_a_refused_one_none(store: CheckpointStore) -> None:
    """The blobs an LC write carries are stored with it, and a fenced write stores none."""
    state = new_agent(store, TASK, "coder")
    take_step(state, 1)
    store.hot.begin_attempt(TASK, "coder", 1, 2)  # attempt 1 is a zombie now
    with pytest.raises(FencedWrite):
        store.write_lc(state, vote=True, blobs=[b"the zombie's file"])
    assert {} == store.hot.get_blobs(TASK, [sha256_hex(b"the zombie's file")])
    state.attempt = 2
    files = WorkspaceManifest(files={"a.txt": sha256_hex(b"a file")})
    blobs = [b"a file", canonical_bytes(files)]
    ref = store.write_lc(state, vote=True, blobs=blobs)
    assert {"coder": ref} == store.hot.get_votes(TASK, 1, 1)
    assert blobs == [store.get_blob(TASK, sha256_hex(content)) for content in blobs]
    assert files == store.read_manifest(TASK, sha256_hex(blobs[1]))
    assert {sha256_hex(content) for content in blobs} <= store.hot.blob_times(TASK).keys()


def test_an_lc_write_sent_again_with_its_blobs_is_a_no_op(store: CheckpointStore) -> None:
    """A retried write carrying blobs stores the LC and each blob once, as they were."""
    state = new_agent(store, TASK, "coder")
    take_step(state, 1)
    lc = cut_lc(state, Level.STEP)
    sealed, blob = store.codec.encode(lc), store.codec.seal(b"a file", keyed=False)
    entry = LCEntry(lc, sealed, {blob.checksum: blob.data})
    store.hot.write_lc(entry, vote=True)
    store.hot.write_lc(entry, vote=True)
    assert [sealed.data] == store.hot.read_chain(TASK, lc.id, 10)
    assert {blob.checksum: blob.data} == store.hot.get_blobs(TASK, [blob.checksum])


def test_stale_superstep_is_fenced(store: CheckpointStore) -> None:
    """A step of an earlier superstep cannot write once the next superstep began."""
    state = new_agent(store, TASK, "coder")
    store.hot.begin_attempt(TASK, "coder", 2, 1)
    with pytest.raises(FencedWrite):
        store.write_lc(state)


def test_attempts_only_move_forward(store: CheckpointStore) -> None:
    """A step is never handed back to an older attempt; the same one again is a no-op."""
    new_agent(store, TASK, "coder")
    store.hot.begin_attempt(TASK, "coder", 2, 3)
    store.hot.begin_attempt(TASK, "coder", 2, 3)
    for superstep, attempt in ((2, 2), (1, 9)):
        with pytest.raises(FencedWrite, match="older"):
            store.hot.begin_attempt(TASK, "coder", superstep, attempt)
    store.hot.raise_epoch(TASK, 2)
    store.hot.begin_attempt(TASK, "coder", 1, 1)  # a new epoch (a restore) starts over


def test_raise_epoch_never_lowers(store: CheckpointStore) -> None:
    """Raising the epoch is idempotent and monotonic (a retried call is harmless)."""
    store.hot.init_task(TASK)
    assert store.hot.raise_epoch(TASK, 3) == 3
    assert store.hot.raise_epoch(TASK, 3) == 3
    assert store.hot.raise_epoch(TASK, 2) == 3
    assert store.hot.init_task(TASK) == 3


def _one_agent_gc(store: CheckpointStore) -> tuple[CheckpointStore, LCRef, str]:
    state = new_agent(store, TASK, "coder")
    take_step(state, 1)
    ref = store.write_lc(state, vote=True)
    ws = manifest(store, TASK, {"main.py": b"print(1)\n"})
    return store, ref, ws


def test_commit_moves_latest(store: CheckpointStore) -> None:
    """A committed GC is readable as COMMITTED and becomes the latest."""
    _, ref, ws = _one_agent_gc(store)
    gc = make_gc(TASK, 1, 1, 1, {"coder": ref}, ws)
    store.prepare_gc(gc)
    committed = store.commit_gc(gc)
    assert store.hot.latest_gc(TASK) == 1
    read = store.read_gc(TASK, 1)
    assert read.status == GCStatus.COMMITTED
    assert committed.checksum == read.checksum
    assert {"coder": ref} == read.members
    assert store.hot.get_votes(TASK, 1, 1) == {}


def test_commit_twice_is_a_no_op(store: CheckpointStore) -> None:
    """The same committed GC sent again (a lost reply) commits once, without error."""
    _, ref, ws = _one_agent_gc(store)
    entry = store.seal_gc(
        make_gc(TASK, 1, 1, 1, {"coder": ref}, ws).model_copy(update={"status": GCStatus.COMMITTED})
    )
    store.hot.commit_gc(entry)
    store.hot.commit_gc(entry)
    assert [i.number for i in store.hot.list_gcs(TASK)] == [1]


@pytest.mark.parametrize("fault", ["missing", "mismatch", "wrong_agent", "no_manifest", "epoch"])
def test_refused_commit_writes_nothing(store: CheckpointStore, fault: str) -> None:
    """A GC naming a missing or mismatched LC (or a stale epoch) is refused, nothing written."""
    _, ref, ws = _one_agent_gc(store)
    members = {"coder": ref}
    if fault == "missing":
        members["planner"] = LCRef(id="0190a0a0-0000-7000-8000-000000000000", checksum="00" * 32)
    elif fault == "mismatch":
        members = {"coder": LCRef(id=ref.id, checksum="ab" * 32)}
    elif fault == "wrong_agent":
        members = {"reviewer": ref}
    elif fault == "no_manifest":
        ws = "cd" * 32
    gc = make_gc(TASK, 1, 1, 2 if fault == "epoch" else 1, members, ws)
    with pytest.raises(FencedWrite if fault == "epoch" else CommitRefused):
        store.commit_gc(gc)
    assert store.hot.latest_gc(TASK) is None
    assert store.hot.list_gcs(TASK) == []
    assert {"coder": ref} == store.hot.get_votes(TASK, 1, 1)
    # The LC was not marked committed: aborting the superstep still removes it.
    store.abort_gc(make_gc(TASK, 1, 1, 1, {}, ws))
    with pytest.raises(RecordNotFound):
        store.read_lc(TASK, "coder", ref.id)


def test_abort_drops_tentative_lcs_and_keeps_committed_ones(store: CheckpointStore) -> None:
    """Abort marks the GC ABORTED and deletes its superstep's LCs, not earlier committed ones."""
    state = new_agent(store, TASK, "coder")
    take_step(state, 1)
    first = store.write_lc(state, vote=True)
    ws = manifest(store, TASK, {"a.txt": b"a"})
    store.commit_gc(make_gc(TASK, 1, 1, 1, {"coder": first}, ws))
    next_superstep(store, state)
    take_step(state, 2)
    tool = store.write_lc(state, Level.TOOL)
    step = store.write_lc(state, vote=True)
    aborted = store.abort_gc(make_gc(TASK, 2, 2, 1, {"coder": step}, ws))
    assert GCStatus.ABORTED == store.read_gc(TASK, 2).status == aborted.status
    for gone in (tool, step):
        with pytest.raises(RecordNotFound):
            store.read_lc(TASK, "coder", gone.id)
    assert store.hot.get_votes(TASK, 1, 2) == {}
    assert len(store.read_state(TASK, "coder", first.id).messages) == 2
    assert store.hot.latest_gc(TASK) == 1
    with pytest.raises(CommitRefused, match="aborted"):
        store.commit_gc(make_gc(TASK, 2, 2, 1, {"coder": first}, ws))


def test_commit_drops_the_superstep_tool_lcs(store: CheckpointStore) -> None:
    """Tool-level LCs of a committed superstep are no longer needed and leave Redis."""
    state = new_agent(store, TASK, "coder")
    take_step(state, 1)
    tool = store.write_lc(state, Level.TOOL)
    step = store.write_lc(state, vote=True)
    ws = manifest(store, TASK, {"a.txt": b"a"})
    store.commit_gc(make_gc(TASK, 1, 1, 1, {"coder": step}, ws))
    with pytest.raises(RecordNotFound):
        store.read_lc(TASK, "coder", tool.id)
    assert step.checksum == store.read_lc(TASK, "coder", step.id).checksum


def test_prepare_with_a_stale_epoch_is_refused(store: CheckpointStore) -> None:
    """A coordinator of an older epoch cannot even prepare a GC."""
    _, ref, ws = _one_agent_gc(store)
    store.hot.raise_epoch(TASK, 2)
    with pytest.raises(FencedWrite, match="stale epoch 1"):
        store.prepare_gc(make_gc(TASK, 1, 1, 1, {"coder": ref}, ws))
    assert [] == store.hot.list_gcs(TASK)


def test_commit_keeps_every_step_of_a_superstep(store: CheckpointStore) -> None:
    """An agent that wrote several step LCs in one superstep keeps its whole chain."""
    state = new_agent(store, TASK, "coder")
    refs = []
    for i in range(1, 4):
        take_step(state, i)
        refs.append(store.write_lc(state, vote=True))
    ws = manifest(store, TASK, {"a.txt": b"a"})
    store.commit_gc(make_gc(TASK, 1, 1, 1, {"coder": refs[-1]}, ws))
    assert 4 == len(store.read_state(TASK, "coder", refs[-1].id).messages)
    assert refs[0].checksum == store.read_lc(TASK, "coder", refs[0].id).checksum


def test_commit_keeps_a_step_chain_and_drops_its_tool_lcs(store: CheckpointStore) -> None:
    """Step LCs resting on each other in one superstep stay; the tool LCs between them go."""
    state = new_agent(store, TASK, "coder")
    steps, tools = [], []
    for i in range(1, 4):
        take_step(state, i)
        tools.append(store.write_lc(state, Level.TOOL))
        steps.append(store.write_lc(state, vote=True))
    ws = manifest(store, TASK, {"a.txt": b"a"})
    store.commit_gc(make_gc(TASK, 1, 1, 1, {"coder": steps[-1]}, ws))
    for gone in tools:
        with pytest.raises(RecordNotFound):
            store.read_lc(TASK, "coder", gone.id)
    assert [s.checksum for s in steps] == [
        store.read_lc(TASK, "coder", s.id).checksum for s in steps
    ]
    assert 4 == len(store.read_state(TASK, "coder", steps[-1].id).messages)


def test_commit_names_an_lc_whose_vote_a_retry_replaced(store: CheckpointStore) -> None:
    """A member naming attempt 1's LC commits after attempt 2 voted; attempt 2's LC goes."""
    first_try = new_agent(store, TASK, "coder")
    retry = dataclasses.replace(first_try, messages=list(first_try.messages), trace=[])
    take_step(first_try, 1)
    first = store.write_lc(first_try, vote=True)
    store.hot.begin_attempt(TASK, "coder", 1, 2)
    retry.attempt = 2
    take_step(retry, 2)
    second = store.write_lc(retry, vote=True)
    assert {"coder": second} == store.hot.get_votes(TASK, 1, 1)
    ws = manifest(store, TASK, {"a.txt": b"a"})
    store.commit_gc(make_gc(TASK, 1, 1, 1, {"coder": first}, ws))
    assert 1 == store.hot.latest_gc(TASK)
    assert first.checksum == store.read_lc(TASK, "coder", first.id).checksum
    with pytest.raises(RecordNotFound):
        store.read_lc(TASK, "coder", second.id)


def test_carried_over_member_whose_lc_is_gone_is_refused(store: CheckpointStore) -> None:
    """A member kept from an earlier GC is checked on its own LC: gone, nothing commits."""
    coder, planner = new_agent(store, TASK, "coder"), new_agent(store, TASK, "planner")
    take_step(coder, 1)
    take_step(planner, 1)
    members = {"coder": store.write_lc(coder, vote=True)}
    members["planner"] = store.write_lc(planner, vote=True)
    ws = manifest(store, TASK, {"a.txt": b"a"})
    store.commit_gc(make_gc(TASK, 1, 1, 1, members, ws))
    next_superstep(store, coder)
    take_step(coder, 2)
    members["coder"] = store.write_lc(coder, vote=True)  # the planner halted: carried over
    store.hot.delete_lcs(TASK, [members["planner"].id])
    with pytest.raises(CommitRefused, match="of planner is missing"):
        store.commit_gc(make_gc(TASK, 2, 2, 1, members, ws))
    assert 1 == store.hot.latest_gc(TASK)
    assert [1] == [info.number for info in store.hot.list_gcs(TASK)]
    assert {"coder": members["coder"]} == store.hot.get_votes(TASK, 1, 2)


def test_voted_member_whose_lc_was_deleted_is_refused(store: CheckpointStore) -> None:
    """A vote does not vouch for an LC deleted since it was cast: the commit is refused."""
    _, ref, ws = _one_agent_gc(store)
    store.hot.delete_lcs(TASK, [ref.id])
    with pytest.raises(CommitRefused, match="of coder is missing"):
        store.commit_gc(make_gc(TASK, 1, 1, 1, {"coder": ref}, ws))
    assert store.hot.latest_gc(TASK) is None
    assert [] == store.hot.list_gcs(TASK)


def test_gc_writes_of_a_coordinator_that_lost_the_task_are_refused(store: CheckpointStore) -> None:
    """After a newer coordinator's claim, the older one's GC writes fail, the newer's pass."""
    _, ref, ws = _one_agent_gc(store)
    store.hot.claim(TASK, 5)
    store.hot.claim(TASK, 7)
    with pytest.raises(FencedWrite, match="owned by coordinator token 7"):
        store.hot.claim(TASK, 6)
    gc = make_gc(TASK, 1, 1, 1, {"coder": ref}, ws)
    for write in (store.prepare_gc, store.commit_gc, store.abort_gc):
        with pytest.raises(FencedWrite, match="token 5 no longer owns"):
            write(gc, 5)
    assert [] == store.hot.list_gcs(TASK)
    store.prepare_gc(gc, 7)
    store.commit_gc(gc, 7)
    assert 1 == store.hot.latest_gc(TASK)


def test_an_epoch_raise_by_a_coordinator_that_lost_the_task_is_refused(
    store: CheckpointStore,
) -> None:
    """A stale coordinator cannot fence the new owner's steps; the owner and a person can."""
    _one_agent_gc(store)
    before = store.hot.get_epoch(TASK)
    store.hot.claim(TASK, 5)
    store.hot.claim(TASK, 7)
    with pytest.raises(FencedWrite, match="token 5 no longer owns"):
        store.hot.raise_epoch(TASK, before + 1, 5)
    assert before == store.hot.get_epoch(TASK)
    assert before + 1 == store.hot.raise_epoch(TASK, before + 1, 7)
    assert before + 2 == store.hot.raise_epoch(TASK, before + 2)  # no token: a person


def test_committed_gc_cannot_be_aborted(store: CheckpointStore) -> None:
    """Once committed, a GC stays committed."""
    _, ref, ws = _one_agent_gc(store)
    gc = make_gc(TASK, 1, 1, 1, {"coder": ref}, ws)
    store.commit_gc(gc)
    with pytest.raises(CommitRefused):
        store.abort_gc(gc)
    with pytest.raises(CommitRefused):
        store.prepare_gc(gc)
    assert store.read_gc(TASK, 1).status == GCStatus.COMMITTED


def test_blobs_are_content_addressed_and_deduplicated(store: CheckpointStore) -> None:
    """Equal content is stored once under its sha256; reads verify it."""
    a = store.put_blob(TASK, b"same")
    b = store.put_blob(TASK, b"same")
    assert a == b
    assert store.get_blob(TASK, a) == b"same"
    assert [a] == list(store.hot.blob_times(TASK))
    with pytest.raises(RecordNotFound):
        store.get_blob(TASK, "ef" * 32)


def test_list_gcs_shows_every_status(store: CheckpointStore) -> None:
    """Listing shows prepared, committed and aborted GCs with where they live."""
    _, ref, ws = _one_agent_gc(store)
    store.commit_gc(make_gc(TASK, 1, 1, 1, {"coder": ref}, ws))
    store.prepare_gc(make_gc(TASK, 2, 2, 1, {"coder": ref}, ws))
    statuses = [(s.number, s.status, s.hot, s.cold) for s in store.list_gcs(TASK)]
    assert statuses == [(1, GCStatus.COMMITTED, True, False), (2, GCStatus.PREPARING, True, False)]


@pytest.mark.parametrize("name", ["../etc", "a/b", "", ".hidden", "x" * 200, "a..b"])
def test_hostile_names_are_refused(hot: HotStore, name: str) -> None:
    """A task name that could escape a key or a directory is refused."""
    with pytest.raises(InvalidName):
        hot.init_task(name)


def _chain(store: CheckpointStore, agent: str, steps: int) -> list[str]:
    """Write `steps` step LCs of a new agent; return their ids, oldest first."""
    state = new_agent(store, TASK, agent)
    ids = []
    for i in range(steps):
        take_step(state, i)
        ids.append(store.write_lc(state).id)
    return ids


def test_walk_chains_follows_parents_to_a_full_lc(hot: HotStore) -> None:
    """Walks go back from each head through parents and stop after a full LC."""
    store = CheckpointStore(hot, MemoryArchive(), full_every=3)
    a, b = _chain(store, "planner", 5), _chain(store, "coder", 2)  # a[3] is full
    assert {*a[3:], *b} == hot.walk_chains(TASK, [a[4], b[1]])
    assert set(a[:3]) == hot.walk_chains(TASK, [a[2], a[1], a[2]])
    assert set() == hot.walk_chains(TASK, [])


def test_walk_chains_stops_before_known_and_missing_lcs(hot: HotStore) -> None:
    """A walk leaves out and stops at a known id, and stops at an LC that is not hot."""
    store = CheckpointStore(hot, MemoryArchive(), full_every=10)
    a = _chain(store, "planner", 5)
    assert {a[4], a[3]} == hot.walk_chains(TASK, [a[4]], known={a[2]})
    assert set() == hot.walk_chains(TASK, [a[4]], known=[a[4]])
    hot.delete_lcs(TASK, [a[2]])
    assert {a[4], a[3]} == hot.walk_chains(TASK, [a[4], "0" * 36])
    assert {a[1], a[0]} == hot.walk_chains(TASK, [a[1]])


def test_archive_contract(cold: ColdArchive) -> None:
    """The archive stores write-once records, lists and deletes them."""
    sha = "ab" * 32
    cold.put_blob(sha, b"blob")
    cold.put_blob(sha, b"other")  # write-once: the first bytes stay
    assert cold.get_blob(sha) == b"blob"
    assert cold.has_blob(sha)
    assert [sha] == list(cold.blob_times())
    cold.put_lc("t", "a", "id1", b"lc")
    assert cold.has_lc("t", "a", "id1")
    assert cold.get_lc("t", "a", "id1") == b"lc"
    assert cold.list_lcs("t") == [("a", "id1")]
    cold.put_gc("t", 3, b"gc3")
    cold.put_gc("t", 1, b"gc1")
    assert cold.list_gcs("t") == [1, 3]
    assert cold.tasks() == ["t"]
    cold.delete_gc("t", 1)
    cold.delete_lc("t", "a", "id1")
    cold.delete_blob(sha)
    assert cold.list_gcs("t") == [3]
    assert cold.get_lc("t", "a", "id1") is None
    assert not cold.has_blob(sha)
    assert cold.get_gc("t", 1) is None


def test_tool_lcs_record_progress_for_a_retry(store: CheckpointStore) -> None:
    """The latest tool-level LC of a step is findable by a retry; the commit clears it."""
    state = new_agent(store, TASK, "coder")
    take_step(state, 1)
    assert store.hot.get_progress(TASK, 1, 1, "coder") is None
    store.write_lc(state, Level.TOOL)
    take_step(state, 2)
    second = store.write_lc(state, Level.TOOL)
    assert second == store.hot.get_progress(TASK, 1, 1, "coder")
    step = store.write_lc(state, vote=True)
    assert second == store.hot.get_progress(TASK, 1, 1, "coder")  # step LCs do not move it
    store.commit_gc(make_gc(TASK, 1, 1, 1, {"coder": step}, manifest(store, TASK, {})))
    assert store.hot.get_progress(TASK, 1, 1, "coder") is None


def test_heartbeats_lapse(store: CheckpointStore) -> None:
    """A heartbeat is visible while its TTL runs and gone after."""
    store.hot.beat(TASK, "coder", "worker-1:attempt-1", ttl_ms=150)
    assert "worker-1:attempt-1" == store.hot.beating(TASK, "coder")
    time.sleep(0.3)
    assert store.hot.beating(TASK, "coder") is None


def test_documents_are_stored_hot_and_cold(store: CheckpointStore) -> None:
    """A task document reads back from Redis, and from the archive once Redis lost it."""
    doc = WorkspaceManifest(files={"spec": "0" * 64})
    store.put_doc(TASK, "spec", doc)
    assert doc.files == store.read_doc(TASK, "spec", WorkspaceManifest).files
    assert store.cold.get_doc(TASK, "spec") is not None
    newer = WorkspaceManifest(files={"spec": "1" * 64})
    store.put_doc(TASK, "spec", newer)
    assert newer.files == store.read_doc(TASK, "spec", WorkspaceManifest).files
    cold_only = CheckpointStore(MemoryHotStore(), store.cold, store.codec)
    assert newer.files == cold_only.read_doc(TASK, "spec", WorkspaceManifest).files


def test_a_fence_for_an_epoch_no_longer_current_is_refused(hot: HotStore) -> None:
    """A coordinator retrying a step of epoch 1 after a restore raised it to 2 writes no fence.

    Its fence, stamped with the new epoch, would have blocked the restore's own (found by
    `make chaos`, seed 218: the restore failed and left the task restoring).
    """
    hot.init_task("t")
    hot.raise_epoch("t", 2)
    with pytest.raises(FencedWrite, match="stale epoch 1"):
        hot.begin_attempt("t", "a", 3, 2, epoch=1)
    hot.begin_attempt("t", "a", 2, 1, epoch=2)  # the restore's staging goes through


def test_a_superstep_begins_in_one_call_and_a_refusal_is_raised(store: CheckpointStore) -> None:
    """`begin_superstep` prepares the GC and fences every agent's attempt, or raises.

    A coordinator that lost the task gets `FencedWrite`; a fence for a stale epoch too; an
    attempt older than the current one is refused as `begin_attempt` refuses it. The same
    call again is a no-op, and on Redis it goes through after the scripts were flushed.
    """
    _, ref, ws = _one_agent_gc(store)
    new_agent(store, TASK, "reviewer")
    gc = make_gc(TASK, 1, 1, 1, {"coder": ref}, ws)
    store.hot.claim(TASK, 7)
    with pytest.raises(FencedWrite, match="token 5 no longer owns"):
        store.begin_superstep(gc, {"coder": 1, "reviewer": 1}, owner=5)
    store.hot.raise_epoch(TASK, 2)
    with pytest.raises(FencedWrite, match="stale epoch"):
        store.begin_superstep(gc, {"coder": 1}, owner=7)
    intent = gc.model_copy(update={"epoch": 2})
    if isinstance(store.hot, RedisHotStore):
        store.hot.redis.script_flush()  # a restarted Redis: the scripts are sent again
    for _ in range(2):
        prepared = store.begin_superstep(intent, {"coder": 2, "reviewer": 1}, owner=7)
    assert GCStatus.PREPARING is prepared.status
    assert [(1, GCStatus.PREPARING)] == [(g.number, g.status) for g in store.hot.list_gcs(TASK)]
    with pytest.raises(FencedWrite, match="older"):
        store.hot.begin_attempts(TASK, {"coder": 1}, 1, epoch=2)
    store.hot.begin_attempts(TASK, {"coder": 2, "reviewer": 2}, 1, epoch=2)


def test_a_commit_begins_the_next_superstep_in_the_same_write(store: CheckpointStore) -> None:
    """`commit_and_begin` commits GC n and prepares GC n+1 with the next attempts fenced in.

    A step of the next superstep may then write; the superstep just committed is closed to
    its zombies. Sent again (a lost reply), it is a no-op that begins nothing more.
    """
    _, ref, ws = _one_agent_gc(store)
    gc = make_gc(TASK, 1, 1, 1, {"coder": ref}, ws)
    store.prepare_gc(gc)
    committed, prepared = store.commit_and_begin(gc, {"coder": 1}, None)
    assert prepared is not None
    assert (1, GCStatus.COMMITTED) == (committed.number, committed.status)
    assert (2, 2, 1, GCStatus.PREPARING) == (
        prepared.number,
        prepared.superstep,
        prepared.epoch,
        prepared.status,
    )
    listed = [(g.number, g.status, g.superstep) for g in store.hot.list_gcs(TASK)]
    assert [(1, GCStatus.COMMITTED, 1), (2, GCStatus.PREPARING, 2)] == listed
    assert 1 == store.hot.latest_gc(TASK)
    assert prepared.checksum == store.load_gc(TASK, 2)[0].checksum
    state = store.read_state(TASK, "coder", ref.id, ref.checksum)
    state.superstep, state.attempt = 2, 1
    take_step(state, 2)
    store.write_lc(state, vote=True)  # attempt 1 of superstep 2 is current
    zombie = store.read_state(TASK, "coder", ref.id, ref.checksum)
    take_step(zombie, 9)
    with pytest.raises(FencedWrite, match="stale attempt 1:1:1"):
        store.write_lc(zombie, vote=True)
    assert 2 == len(store.hot.list_gcs(TASK))


def test_a_commit_and_begin_sent_again_begins_nothing_more(store: CheckpointStore) -> None:
    """The same commit with its begin sent twice (a lost reply) is a no-op the second time."""
    _, ref, ws = _one_agent_gc(store)
    gc = make_gc(TASK, 1, 1, 1, {"coder": ref}, ws)
    entry = store.seal_gc(gc.model_copy(update={"status": GCStatus.COMMITTED}))
    intent = gc.model_copy(update={"number": 2, "superstep": 2, "status": GCStatus.PREPARING})
    then = NextSuperstep(store.seal_gc(intent), {"coder": 1})
    assert store.hot.commit_gc(entry, None, then)
    store.hot.begin_attempt(TASK, "coder", 2, 2)  # meanwhile its step was retried
    assert not store.hot.commit_gc(entry, None, then)
    store.hot.begin_attempt(TASK, "coder", 2, 2)  # still current: not handed back to 1
    with pytest.raises(FencedWrite, match="older"):
        store.hot.begin_attempt(TASK, "coder", 2, 1)


def test_a_commit_whose_next_superstep_would_be_refused_commits_alone(
    store: CheckpointStore,
) -> None:
    """A begin `begin_superstep` would refuse (an attempt fenced past it) is not made.

    The GC commits, nothing of the next superstep is written, and `prepared` is None.
    """
    _, ref, ws = _one_agent_gc(store)
    gc = make_gc(TASK, 1, 1, 1, {"coder": ref}, ws)
    store.prepare_gc(gc)
    store.hot.begin_attempt(TASK, "coder", 2, 3)  # someone fenced superstep 2 to attempt 3
    committed, prepared = store.commit_and_begin(gc, {"coder": 1}, None)
    assert prepared is None
    assert GCStatus.COMMITTED is store.read_gc(TASK, 1).status
    assert [1] == [g.number for g in store.hot.list_gcs(TASK)]
    with pytest.raises(FencedWrite, match="older"):
        store.begin_superstep(
            committed.model_copy(update={"number": 2, "superstep": 2}), {"coder": 1}
        )


def test_a_refused_commit_begins_nothing(store: CheckpointStore) -> None:
    """A commit refused for its epoch or its owner writes neither GC n nor GC n+1."""
    _, ref, ws = _one_agent_gc(store)
    gc = make_gc(TASK, 1, 1, 1, {"coder": ref}, ws)
    store.prepare_gc(gc)
    store.hot.claim(TASK, 7)
    with pytest.raises(FencedWrite, match="token 5 no longer owns"):
        store.commit_and_begin(gc, {"coder": 1}, owner=5)
    store.hot.raise_epoch(TASK, 2)
    with pytest.raises(FencedWrite, match="stale epoch"):
        store.commit_and_begin(gc, {"coder": 1}, owner=7)
    assert [(1, GCStatus.PREPARING)] == [(g.number, g.status) for g in store.hot.list_gcs(TASK)]
    assert store.hot.latest_gc(TASK) is None


def test_first_lcs_of_joining_members_are_fenced_and_written_at_once(
    store: CheckpointStore,
) -> None:
    """`write_first_lcs` begins each new member's attempt and writes its LC, or refuses.

    Each LC reads back as written and its attempt is the current one (an older one is
    fenced out); the same call again (a lost reply) is a no-op; a stale epoch writes
    nothing and raises `FencedWrite`, as `write_lc` would.
    """
    store.hot.init_task(TASK)

    def first(name: str) -> WorkingState:
        said = [Message(role=Role.SYSTEM, content=f"You are {name}.")]
        return WorkingState(task=TASK, agent=name, epoch=1, superstep=3, messages=said)

    states = [first("m0"), first("m1")]
    refs = store.write_first_lcs(states)
    for state, ref in zip(states, refs, strict=True):
        assert state.base is not None
        assert ref.id == state.base.id
        again = store.read_state(TASK, state.agent, ref.id, ref.checksum)
        assert (state.messages, 3) == (again.messages, again.superstep)
    with pytest.raises(FencedWrite, match="older"):
        store.hot.begin_attempt(TASK, "m0", 2, 1, epoch=1)
    lcs = [cut_lc(first(name), Level.STEP) for name in ("m2", "m3")]
    entries = [LCEntry(lc, store.codec.encode(lc)) for lc in lcs]
    for _ in range(2):
        store.hot.write_first_lcs(entries)
    assert [[e.sealed.data] for e in entries] == [
        store.hot.read_chain(TASK, lc.id, 10) for lc in lcs
    ]
    store.hot.raise_epoch(TASK, 2)
    with pytest.raises(FencedWrite, match="stale epoch"):
        store.write_first_lcs([first("m4")])
    late = cut_lc(first("m5"), Level.STEP)
    with pytest.raises(FencedWrite, match="stale epoch"):
        store.hot.write_first_lcs([LCEntry(late, store.codec.encode(late))])
    assert [] == store.hot.read_chain(TASK, late.id, 10)


def test_a_spawning_steps_first_lcs_are_fenced_by_its_own_attempt(
    store: CheckpointStore,
) -> None:
    """The spawner's current attempt writes its members' first LCs; a zombie writes none.

    They read back as written, a lost reply's second send is a no-op, and they are
    tentative in the spawner's superstep (what a commit checks its members against).
    """
    store.hot.init_task(TASK)
    store.hot.begin_attempt(TASK, "lead", 3, 1, epoch=1)

    def first(name: str) -> WorkingState:
        said = [Message(role=Role.SYSTEM, content=f"You are {name}.")]
        return WorkingState(task=TASK, agent=name, epoch=1, superstep=3, messages=said)

    states = [first("m0"), first("m1")]
    refs = store.write_first_lcs(states, spawner=("lead", 1))
    for state, ref in zip(states, refs, strict=True):
        again = store.read_state(TASK, state.agent, ref.id, ref.checksum)
        assert (state.messages, 3, 1) == (again.messages, again.superstep, again.epoch)
    lc = cut_lc(first("m2"), Level.STEP)
    entry = LCEntry(lc, store.codec.encode(lc))
    for _ in range(2):
        store.hot.write_spawned_lcs([entry], "lead", 1)
    assert [[entry.sealed.data]] == [store.hot.read_chain(TASK, lc.id, 10)]
    store.hot.begin_attempt(TASK, "lead", 3, 2, epoch=1)  # attempt 1 is a zombie now
    late = cut_lc(first("m3"), Level.STEP)
    with pytest.raises(FencedWrite, match="stale attempt"):
        store.hot.write_spawned_lcs([LCEntry(late, store.codec.encode(late))], "lead", 1)
    assert [] == store.hot.read_chain(TASK, late.id, 10)
    store.hot.raise_epoch(TASK, 2)
    with pytest.raises(FencedWrite, match="stale epoch"):
        store.write_first_lcs([first("m4")], spawner=("lead", 2))
