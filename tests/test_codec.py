"""Sealed records: canonical bytes, checksums, signatures, compression, any byte changed."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import JsonValue

from cairn.errors import CorruptCheckpoint
from cairn.storage.codec import HEADER_SIZE, Codec, canonical_bytes
from cairn.storage.ids import new_id
from cairn.storage.records import (
    AgentState,
    GCStatus,
    GlobalCheckpoint,
    InboxMessage,
    LCRef,
    Level,
    LocalCheckpoint,
    Message,
    Record,
    Role,
    ToolCall,
    TraceRecord,
    Usage,
    WorkspaceManifest,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)

json_values: st.SearchStrategy[JsonValue] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63)
    | st.integers(2**64, 2**80)  # beyond orjson: the stdlib encoder takes over
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
names = st.from_regex(r"[a-z][a-z0-9_-]{0,11}", fullmatch=True)
times = st.datetimes(timezones=st.just(UTC))
args = st.dictionaries(st.text(max_size=8), json_values, max_size=4)
hexes = st.binary(min_size=32, max_size=32).map(bytes.hex)

messages = st.builds(
    Message,
    role=st.sampled_from(Role),
    content=st.none() | st.text(max_size=200),
    name=st.none() | names,
    tool_calls=st.lists(st.builds(ToolCall, id=names, name=names, args=args), max_size=2),
    tool_call_id=st.none() | names,
)
traces = st.builds(
    TraceRecord,
    step=st.integers(0, 10**6),
    superstep=st.integers(0, 10**6),
    tool=st.none() | names,
    arguments=args,
    result=json_values,
    side_effect=st.booleans(),
    error=st.none() | st.text(max_size=50),
    started_at=times,
    finished_at=times,
    duration_ms=st.floats(0, 1e9),
    usage=st.none()
    | st.builds(
        Usage, prompt_tokens=st.integers(0, 10**7), completion_tokens=st.integers(0, 10**7)
    ),
)
local_checkpoints = st.builds(
    LocalCheckpoint,
    id=st.uuids().map(str),
    parent_id=st.none() | st.uuids().map(str),
    parent_checksum=st.none() | hexes,
    depth=st.integers(0, 10**6),
    full=st.booleans(),
    created_at=times,
    task=names,
    agent=names,
    step=st.integers(0, 10**6),
    superstep=st.integers(0, 10**6),
    status=st.sampled_from(AgentState),
    epoch=st.integers(1, 10**6),
    attempt=st.integers(1, 100),
    level=st.sampled_from(Level),
    message_base=st.integers(0, 10**6),
    trace_base=st.integers(0, 10**6),
    messages=st.lists(messages, max_size=5),
    trace=st.lists(traces, max_size=3),
    workspace_before=st.none() | hexes,
    workspace_after=st.none() | hexes,
    inbox_cursor=st.integers(0, 10**6),
)
global_checkpoints = st.builds(
    GlobalCheckpoint,
    task=names,
    number=st.integers(0, 10**6),
    superstep=st.integers(0, 10**6),
    status=st.sampled_from(GCStatus),
    epoch=st.integers(1, 10**6),
    members=st.dictionaries(
        names, st.builds(LCRef, id=st.uuids().map(str), checksum=hexes), max_size=4
    ),
    workspace=hexes,
    inbox=st.lists(
        st.builds(
            InboxMessage,
            id=names,
            sender=names,
            recipient=names,
            superstep=st.integers(0, 99),
            content=st.text(max_size=80),
        ),
        max_size=3,
    ),
    created_at=times,
    committed_at=st.none() | times,
)
manifests = st.builds(
    WorkspaceManifest, files=st.dictionaries(st.text(min_size=1, max_size=30), hexes, max_size=8)
)
records = st.one_of(local_checkpoints, global_checkpoints, traces, manifests)
codecs = st.sampled_from([Codec(), Codec(signing_key=b"k" * 32), Codec(compress_above=0)])


@given(record=records, codec=codecs)
def test_every_record_round_trips(record: Record, codec: Codec) -> None:
    """Sealing then opening any record gives an equal record with checksum and size set."""
    sealed = codec.encode(record)
    again = codec.decode(sealed.data, type(record), "r")
    assert record.model_dump() == again.model_dump()
    assert sealed.checksum == again.checksum
    assert len(sealed.data) == again.size
    assert canonical_bytes(record) == canonical_bytes(again)


@settings(max_examples=300)
@given(record=records, codec=codecs, data=st.data())
def test_any_single_byte_change_is_detected(
    record: Record, codec: Codec, data: st.DataObject
) -> None:
    """Changing any one byte of a stored record makes opening it fail, never return data."""
    sealed = codec.encode(record).data
    position = data.draw(st.integers(0, len(sealed) - 1), label="position")
    flip = data.draw(st.integers(1, 255), label="xor")
    damaged = bytearray(sealed)
    damaged[position] ^= flip
    with pytest.raises(CorruptCheckpoint):
        codec.decode(bytes(damaged), type(record), "damaged")


@given(record=records, cut=st.integers(1, 10**6))
def test_truncation_is_detected(record: Record, cut: int) -> None:
    """A record cut short anywhere is refused."""
    sealed = Codec(compress_above=0).encode(record).data
    with pytest.raises(CorruptCheckpoint):
        Codec().decode(sealed[: max(0, len(sealed) - cut)], type(record), "short")


def test_canonical_bytes_ignore_insertion_order() -> None:
    """Two equal manifests built in different orders have the same bytes and checksum."""
    a = WorkspaceManifest(files={"a": "1" * 64, "b": "2" * 64})
    b = WorkspaceManifest(files={"b": "2" * 64, "a": "1" * 64})
    assert canonical_bytes(a) == canonical_bytes(b)
    assert Codec().encode(a).checksum == Codec().encode(b).checksum


def test_nan_is_refused_when_a_record_is_built() -> None:
    """NaN has no JSON form: a record holding one is refused at once, not when read back."""
    with pytest.raises(ValueError, match="finite"):
        TraceRecord(step=1, superstep=1, started_at=T0, finished_at=T0, duration_ms=float("nan"))
    with pytest.raises(ValueError, match="finite"):
        ToolCall(id="c", name="t", args={"x": [float("inf")]})


def test_large_records_are_compressed() -> None:
    """Payloads above the threshold are stored zstd-compressed, small ones plainly."""
    small = WorkspaceManifest(files={"a": "0" * 64})
    large = WorkspaceManifest(files={f"f{i}": "0" * 64 for i in range(200)})
    codec = Codec(compress_above=1024)
    assert len(canonical_bytes(small)) + HEADER_SIZE == codec.encode(small).size
    assert codec.encode(large).size < len(canonical_bytes(large)) // 4


def test_signed_records_need_the_key() -> None:
    """With a signing key, records carry an HMAC: no key, a wrong key or no signature fail."""
    record = WorkspaceManifest(files={"a": "0" * 64})
    signed = Codec(signing_key=b"secret").encode(record)
    assert signed.checksum != Codec().encode(record).checksum
    assert (
        record.files
        == Codec(signing_key=b"secret").decode(signed.data, WorkspaceManifest, "r").files
    )
    with pytest.raises(CorruptCheckpoint, match="no CAIRN_SIGNING_KEY"):
        Codec().decode(signed.data, WorkspaceManifest, "r")
    with pytest.raises(CorruptCheckpoint, match="checksum mismatch"):
        Codec(signing_key=b"other").decode(signed.data, WorkspaceManifest, "r")
    with pytest.raises(CorruptCheckpoint, match="unsigned"):
        Codec(signing_key=b"secret").decode(Codec().encode(record).data, WorkspaceManifest, "r")


def test_blobs_verify_against_their_address_even_when_signing() -> None:
    """Blobs are sealed with plain SHA-256 (their address) and open under any key."""
    codec = Codec(signing_key=b"secret")
    sealed = codec.seal(b"file content", keyed=False)
    assert codec.open(sealed.data, "blob", expect_digest=sealed.checksum) == b"file content"
    with pytest.raises(CorruptCheckpoint, match="not the one named"):
        codec.open(sealed.data, "blob", expect_digest="00" * 32)


def test_a_newer_schema_is_refused() -> None:
    """A record written by a newer Cairn is not half-understood."""
    record = WorkspaceManifest(files={}, schema_version=99)
    with pytest.raises(CorruptCheckpoint, match="schema version 99"):
        Codec().decode(Codec().encode(record).data, WorkspaceManifest, "future")


def test_ids_sort_by_time_and_are_unique() -> None:
    """UUIDv7 ids made one after another sort in that order and never repeat."""
    ids = [new_id() for _ in range(20_000)]
    assert ids == sorted(ids)
    assert len(ids) == len(set(ids))
    assert all(i[14] == "7" for i in ids)


def test_a_damaged_zstd_header_cannot_make_us_allocate() -> None:
    """Every value of the zstd frame's header byte is refused as corrupt, never a MemoryError."""
    codec = Codec(compress_above=0)
    record = WorkspaceManifest(files={"0": "0" * 64, "\x1f": "0" * 64, "000\x1f": "0" * 64})
    sealed = codec.encode(record).data
    position = HEADER_SIZE + 4  # the frame header descriptor, after zstd's 4-byte magic
    for flip in range(1, 256):
        damaged = bytearray(sealed)
        damaged[position] ^= flip
        with pytest.raises(CorruptCheckpoint):
            codec.decode(bytes(damaged), WorkspaceManifest, "damaged")
