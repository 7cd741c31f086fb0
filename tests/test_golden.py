"""Records written by earlier releases stay readable: the golden files under tests/golden/.

Each version directory holds one stored record of every kind, sealed by the code of its
release, and `expected.json`, what each decoded to then. Every test reads them with today's
code through the paths Cairn reads them by (Redis first, then the archive; the LangGraph
saver's own), and checks what they decode to, not only that they parse.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
from langchain_core.runnables import RunnableConfig
from pydantic_core import to_jsonable_python

from cairn.errors import CorruptCheckpoint
from cairn.storage.backends.disk import DiskArchive
from cairn.storage.backends.redis import RedisHotStore
from cairn.storage.base import GCEntry, LCEntry
from cairn.storage.chain import rebuild
from cairn.storage.codec import DIGEST_END, HEADER_SIZE, Codec, Sealed
from cairn.storage.keys import ThreadKeys
from cairn.storage.langgraph import CairnSaver
from cairn.storage.records import (
    SCHEMA_VERSION,
    AgentState,
    Effects,
    GCOrigin,
    GlobalCheckpoint,
    InboxMessage,
    LCRef,
    LocalCheckpoint,
    Record,
    Role,
    ToolCall,
    Usage,
)
from cairn.storage.store import CheckpointStore

GOLDEN = Path(__file__).parent / "golden"
# The key tests/golden/generate.py signed `lc_signed` with: a test key, never a real one.
SIGNING_KEY = b"golden-test-key"
VERSIONS = sorted(
    (p for p in GOLDEN.iterdir() if p.is_dir() and re.fullmatch(r"v\d+", p.name)),
    key=lambda p: int(p.name[1:]),
)
LCS = ("lc_full", "lc_delta", "lc_signed")
MISSING = "<missing from the decoded record>"


@dataclass(frozen=True, slots=True)
class Golden:
    """One version directory: each record's stored bytes by role, and expected.json."""

    version: int
    data: dict[str, bytes]
    expected: dict[str, Any]

    def fields(self, role: str) -> dict[str, Any]:
        """The decoded fields expected.json records for the record of `role`."""
        return dict(self.expected["records"][role]["record"])

    def checksum(self, role: str) -> str:
        """The checksum the envelope of `role` carries."""
        return str(self.expected["records"][role]["checksum"])

    def codec(self, role: str) -> Codec:
        """A codec that opens `role`: with the test key when it was signed."""
        signed = role in self.expected["records"] and self.expected["records"][role]["signed"]
        return Codec(signing_key=SIGNING_KEY) if signed else Codec()


def load(directory: Path) -> Golden:
    """Read one version directory."""
    expected = json.loads((directory / "expected.json").read_text())
    data = {role: (directory / name).read_bytes() for role, name in expected["files"].items()}
    return Golden(int(directory.name[1:]), data, expected)


@pytest.fixture(params=VERSIONS, ids=[p.name for p in VERSIONS])
def golden(request: pytest.FixtureRequest) -> Golden:
    """Each version directory present."""
    directory: Path = request.param
    return load(directory)


def as_stored(actual: Any, expected: Any) -> Any:
    """`actual` cut to the fields `expected` names, at every depth.

    Fields a later schema added are left out; one the golden record has and the reader
    lost shows as missing; a list keeps its length, so an item lost or gained shows.
    """
    if isinstance(expected, dict) and isinstance(actual, dict):
        return {key: as_stored(actual.get(key, MISSING), value) for key, value in expected.items()}
    if isinstance(expected, list) and isinstance(actual, list):
        cut = [as_stored(a, e) for a, e in zip(actual, expected, strict=False)]
        return cut + actual[len(expected) :]
    return actual


def dumped(record: Record) -> dict[str, Any]:
    """A decoded record as JSON, to compare with expected.json."""
    return record.model_dump(mode="json")


def decode_lc(golden: Golden, role: str) -> LocalCheckpoint:
    """The golden LC of `role`, decoded by the codec alone."""
    return golden.codec(role).decode(golden.data[role], LocalCheckpoint, role)


def put_in_redis(hot: RedisHotStore, golden: Golden) -> None:
    """Store the golden records in Redis as Cairn's writers do: fenced LCs, blobs, a commit.

    The stored bytes are the golden ones; the records are decoded only for the fields the
    writes are fenced and indexed by.
    """
    task = golden.fields("gc")["task"]
    hot.init_task(task)
    for role in ("manifest", "file_blob"):
        hot.put_blob(task, address(golden, role), golden.data[role])
    write_hot_lc(hot, golden, "lc_full")
    write_hot_lc(hot, golden, "lc_delta")
    gc = Codec().decode(golden.data["gc"], GlobalCheckpoint, "gc")
    hot.commit_gc(GCEntry(gc, Sealed(golden.data["gc"], gc.checksum)))
    # After the commit: a commit drops the tentative LCs of its superstep it does not name.
    write_hot_lc(hot, golden, "lc_signed")


def write_hot_lc(hot: RedisHotStore, golden: Golden, role: str) -> None:
    """Write the golden LC of `role` as its step's attempt would, at its epoch."""
    lc = decode_lc(golden, role)
    hot.raise_epoch(lc.task, lc.epoch)
    hot.begin_attempt(lc.task, lc.agent, lc.superstep, lc.attempt)
    hot.write_lc(LCEntry(lc, Sealed(golden.data[role], lc.checksum)))


def put_in_archive(cold: DiskArchive, golden: Golden) -> None:
    """Store the golden records as archive files, the GC last, as archiving does."""
    for role in ("manifest", "file_blob"):
        cold.put_blob(address(golden, role), golden.data[role])
    for role in LCS:
        lc = golden.fields(role)
        cold.put_lc(lc["task"], lc["agent"], lc["id"], golden.data[role])
    gc = golden.fields("gc")
    cold.put_gc(gc["task"], gc["number"], golden.data["gc"])


def address(golden: Golden, role: str) -> str:
    """A blob's address: the manifest's id, or the file's sha256."""
    if role == "manifest":
        return golden.checksum("manifest")
    return str(golden.expected["file_blob"]["address"])


@pytest.fixture(params=["redis", "archive"])
def store(
    request: pytest.FixtureRequest, golden: Golden, redis_client: redis.Redis, tmp_path: Path
) -> CheckpointStore:
    """A store on a real Redis and archive, the golden records in one of them only."""
    hot, cold = RedisHotStore(redis_client), DiskArchive(tmp_path / "archive")
    if request.param == "redis":
        put_in_redis(hot, golden)
    else:
        put_in_archive(cold, golden)
    return CheckpointStore(hot, cold, Codec())


# the records -------------------------------------------------------------------------------


def test_the_current_schema_version_has_golden_files() -> None:
    """Every schema version this code writes has its golden files, none newer than it."""
    assert (GOLDEN / f"v{SCHEMA_VERSION}").is_dir()
    assert all(int(p.name[1:]) <= SCHEMA_VERSION for p in VERSIONS)


def test_golden_records_carry_their_directorys_version(golden: Golden) -> None:
    """Each record says the schema version of the directory it is kept in."""
    assert golden.version == golden.expected["schema_version"]
    for role in golden.expected["records"]:
        assert golden.version == golden.fields(role)["schema_version"]


@pytest.mark.parametrize("role", ["lc_full", "lc_delta"])
def test_local_checkpoints_read_back_as_written(
    golden: Golden, store: CheckpointStore, role: str
) -> None:
    """A full LC (stored compressed) and a delta read back field for field, envelope too."""
    expected = golden.expected["records"][role]
    fields = golden.fields(role)
    lc = store.read_lc(fields["task"], fields["agent"], fields["id"])
    assert fields == as_stored(dumped(lc), fields)
    assert (expected["checksum"], expected["size"]) == (lc.checksum, lc.size)


def test_the_full_lc_decodes_to_typed_values(golden: Golden) -> None:
    """Tool calls, their results, usage, effects, times and the outbox decode typed, not raw."""
    lc = decode_lc(golden, "lc_full")
    fields = golden.fields("lc_full")
    assert golden.expected["records"]["lc_full"]["compressed"]
    calls = {c.id: c for m in lc.messages for c in m.tool_calls}
    assert {m.tool_call_id: m.name for m in lc.messages if m.role is Role.TOOL} == {
        i: c.name for i, c in calls.items()
    }
    assert all(isinstance(c, ToolCall) for c in calls.values())
    for decoded, stored in zip(lc.trace, fields["trace"], strict=True):
        usage = stored["usage"]
        assert (None if usage is None else Usage(**usage)) == decoded.usage
        assert (
            None if stored["effects"] is None else Effects(stored["effects"])
        ) is decoded.effects
        assert decoded.started_at.tzinfo is not None
        assert datetime.fromisoformat(stored["started_at"]) == decoded.started_at
    assert [InboxMessage(**m) for m in fields["outbox"]] == lc.outbox
    assert lc.status is AgentState(fields["status"])


def test_the_delta_rebuilds_on_its_full_parent(golden: Golden, store: CheckpointStore) -> None:
    """The chain delta → full rebuilds the whole history, by `rebuild` and by `read_state`."""
    full, delta = golden.fields("lc_full"), golden.fields("lc_delta")
    messages = full["messages"] + delta["messages"]
    trace = full["trace"] + delta["trace"]
    context = ("status", "step", "superstep", "inbox_cursor", "changes", "outbox")
    by_codec = rebuild([decode_lc(golden, "lc_delta"), decode_lc(golden, "lc_full")])
    by_store = store.read_state(
        delta["task"], delta["agent"], delta["id"], golden.checksum("lc_delta")
    )
    for state in (by_codec, by_store):
        assert messages == as_stored([m.model_dump(mode="json") for m in state.messages], messages)
        assert trace == as_stored([t.model_dump(mode="json") for t in state.trace], trace)
        assert state.base is not None
        assert golden.expected["rebuilt"]["base"] == asdict(state.base)
        at_delta = {k: delta[k] for k in context}
        got = {k: to_jsonable_python(getattr(state, k)) for k in context}
        assert at_delta == as_stored(got, at_delta)


def test_the_global_checkpoint_reads_back_committed(golden: Golden, store: CheckpointStore) -> None:
    """The GC reads back field for field, the latest committed, naming the delta LC."""
    fields = golden.fields("gc")
    gc = store.read_gc(fields["task"], fields["number"])
    assert fields == as_stored(dumped(gc), fields)
    assert golden.checksum("gc") == gc.checksum
    latest = store.latest_gc(fields["task"])
    assert latest is not None
    assert (fields["number"], "COMMITTED") == (latest.number, latest.status.value)
    delta = golden.fields("lc_delta")
    head = LCRef(id=delta["id"], checksum=golden.checksum("lc_delta"))
    assert {delta["agent"]: head} == gc.members


def test_a_gc_says_what_wrote_it_from_schema_7_and_is_unknown_before(golden: Golden) -> None:
    """Schema 6 and older did not say what wrote a GC: it reads as None, never a guess."""
    gc = golden.codec("gc").decode(golden.data["gc"], GlobalCheckpoint, "gc")
    if golden.version < 7:
        assert (None, None, None) == (gc.origin, gc.source, gc.source_task)
    else:
        assert (GCOrigin.RESTORE, 0, None) == (gc.origin, gc.source, gc.source_task)


def test_the_manifest_and_its_file_read_back(golden: Golden, store: CheckpointStore) -> None:
    """The workspace manifest (a blob) names the file blob, whose content reads back."""
    task = golden.fields("gc")["task"]
    manifest_id = golden.fields("gc")["workspace"]
    assert golden.checksum("manifest") == manifest_id
    manifest = store.read_manifest(task, manifest_id)
    assert golden.fields("manifest") == as_stored(dumped(manifest), golden.fields("manifest"))
    file_blob = golden.expected["file_blob"]
    assert file_blob["address"] in manifest.files.values()
    assert file_blob["content"].encode() == store.get_blob(task, file_blob["address"])


@pytest.mark.parametrize("tier", ["redis", "archive"])
def test_the_langgraph_checkpoint_reads_back_through_the_saver(
    golden: Golden, redis_client: redis.Redis, tmp_path: Path, tier: str
) -> None:
    """The saver's record and channel blob, as `lg_put` stored them, read back by `get_tuple`.

    In Redis, and once the saver itself has moved them to its archive.
    """
    expected = golden.expected["langgraph"]
    where = ThreadKeys(expected["thread"], expected["ns"])
    checkpoint_id = expected["checkpoint_id"]
    redis_client.set(where.checkpoint(checkpoint_id), golden.data["lg_checkpoint"])
    for channel, ref in expected["blobs"].items():
        redis_client.set(where.blob(channel, ref), golden.data["lg_blob"])
    redis_client.zadd(where.ids(), {checkpoint_id: 0})
    redis_client.sadd(where.namespaces(), expected["ns"])
    saver = CairnSaver(redis_client, tmp_path / "lg-archive")
    if tier == "archive":
        assert 1 == saver.archive(expected["thread"], keep=0)
        assert redis_client.get(where.checkpoint(checkpoint_id)) is None
    config: RunnableConfig = {
        "configurable": {
            "thread_id": expected["thread"],
            "checkpoint_ns": expected["ns"],
            "checkpoint_id": checkpoint_id,
        }
    }
    found = saver.get_tuple(config)
    assert found is not None
    assert expected["checkpoint"] == json.loads(json.dumps(found.checkpoint))
    assert expected["metadata"] == json.loads(json.dumps(found.metadata))
    assert found.parent_config is not None
    assert expected["parent_id"] == found.parent_config["configurable"]["checkpoint_id"]
    assert expected["pending_writes"] == list(found.pending_writes or [])


# signatures, versions, damage --------------------------------------------------------------


def test_the_signed_lc_verifies_with_its_key_only(golden: Golden, store: CheckpointStore) -> None:
    """The HMAC-signed LC reads back with the key; without it or with another, it is refused."""
    fields = golden.fields("lc_signed")
    where = (fields["task"], fields["agent"], fields["id"])
    assert golden.expected["records"]["lc_signed"]["signed"]
    signing = CheckpointStore(store.hot, store.cold, Codec(signing_key=SIGNING_KEY))
    lc = signing.read_lc(*where)
    assert fields == as_stored(dumped(lc), fields)
    assert golden.checksum("lc_signed") == lc.checksum
    with pytest.raises(CorruptCheckpoint, match="no CAIRN_SIGNING_KEY is configured"):
        store.read_lc(*where)
    other = CheckpointStore(store.hot, store.cold, Codec(signing_key=b"another-key"))
    with pytest.raises(CorruptCheckpoint, match="checksum mismatch"):
        other.read_lc(*where)


def test_a_signing_reader_refuses_unsigned_lcs_and_reads_blobs(
    golden: Golden, store: CheckpointStore
) -> None:
    """With a key configured, an unsigned LC is refused; blobs, proved by their address, read."""
    full = golden.fields("lc_full")
    signing = CheckpointStore(store.hot, store.cold, Codec(signing_key=SIGNING_KEY))
    with pytest.raises(CorruptCheckpoint, match="CAIRN_SIGNING_KEY requires a signature"):
        signing.read_lc(full["task"], full["agent"], full["id"])
    manifest = signing.read_manifest(full["task"], golden.checksum("manifest"))
    assert golden.fields("manifest")["files"] == manifest.files


def raise_version(golden: Golden, role: str, version: int) -> bytes:
    """A copy of the golden record of `role` claiming `version`, sealed anew (sound bytes)."""
    codec = golden.codec(role)
    record = orjson.loads(codec.open(golden.data[role], role))
    record["schema_version"] = version
    return codec.seal(orjson.dumps(record, option=orjson.OPT_SORT_KEYS)).data


@pytest.mark.parametrize(
    ("role", "model"),
    [("lc_full", LocalCheckpoint), ("lc_signed", LocalCheckpoint), ("gc", GlobalCheckpoint)],
)
def test_a_record_of_a_newer_schema_is_refused_naming_its_version(
    golden: Golden, role: str, model: type[Record]
) -> None:
    """A golden record re-sealed with a schema version above this reader's is refused."""
    newer = SCHEMA_VERSION + 1
    data = raise_version(golden, role, newer)
    with pytest.raises(CorruptCheckpoint, match=f"schema version {newer} is newer than"):
        golden.codec(role).decode(data, model, role)


def test_an_lc_of_a_newer_schema_in_the_archive_is_refused_by_a_read(
    golden: Golden, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """Read through the store, the newer LC is refused too, naming both versions."""
    fields = golden.fields("lc_full")
    cold = DiskArchive(tmp_path / "archive")
    newer = SCHEMA_VERSION + 1
    cold.put_lc(
        fields["task"], fields["agent"], fields["id"], raise_version(golden, "lc_full", newer)
    )
    store = CheckpointStore(RedisHotStore(redis_client), cold, Codec())
    with pytest.raises(
        CorruptCheckpoint, match=f"schema version {newer} is newer than {SCHEMA_VERSION}"
    ):
        store.read_state(fields["task"], fields["agent"], fields["id"])


def flip(data: bytes, at: int) -> bytes:
    """`data` with one bit of the byte at `at` changed."""
    changed = bytearray(data)
    changed[at] ^= 0x10
    return bytes(changed)


@pytest.mark.parametrize(
    "where", ["magic", "flags", "digest", "crc", "body start", "body middle", "last byte"]
)
def test_a_golden_record_with_one_byte_changed_is_refused(golden: Golden, where: str) -> None:
    """Every golden file, one byte changed anywhere in it, is refused by the codec."""
    for role, data in golden.data.items():
        at = {
            "magic": 0,
            "flags": 4,
            "digest": DIGEST_END - 1,
            "crc": HEADER_SIZE - 1,
            "body start": HEADER_SIZE,
            "body middle": (HEADER_SIZE + len(data)) // 2,
            "last byte": len(data) - 1,
        }[where]
        blob = role in {"manifest", "file_blob"}
        expect = address(golden, role) if blob else None
        with pytest.raises(CorruptCheckpoint):
            golden.codec(role).open(flip(data, at), role, expect_digest=expect)


def test_a_changed_byte_in_a_stored_lc_is_refused_by_a_read(
    golden: Golden, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """A delta LC changed by one byte, in the archive alone, is refused: nothing is guessed."""
    fields = golden.fields("lc_delta")
    cold = DiskArchive(tmp_path / "archive")
    damaged = flip(golden.data["lc_delta"], len(golden.data["lc_delta"]) // 2)
    cold.put_lc(fields["task"], fields["agent"], fields["id"], damaged)
    store = CheckpointStore(RedisHotStore(redis_client), cold, Codec())
    with pytest.raises(CorruptCheckpoint, match=fields["id"]):
        store.read_lc(fields["task"], fields["agent"], fields["id"])
