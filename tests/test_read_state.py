"""Reading an agent's state: what `read_state` returns equals a full validation of its chain.

On Redis and disk as users run them, for generated states: a guard for any faster way of
building verified records, and proof that damage and newer schemas are still refused.
"""

from __future__ import annotations

from datetime import timedelta, timezone

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cairn.errors import CorruptCheckpoint
from cairn.storage import keys
from cairn.storage.base import LCEntry
from cairn.storage.chain import VerifiedTrace, WorkingState, cut_lc, rebuild
from cairn.storage.codec import DIGEST_END, Codec, Place, canonical_bytes
from cairn.storage.ids import new_id
from cairn.storage.records import (
    SCHEMA_VERSION,
    Effects,
    Level,
    LocalCheckpoint,
    Message,
    Role,
    ToolCall,
    TraceRecord,
    Usage,
    WorkspaceManifest,
)
from cairn.storage.store import CheckpointStore
from tests.factories import new_agent, take_step
from tests.test_codec import json_values, names

# Naive and aware, at any whole-minute offset: every form a datetime takes in a record.
offsets = st.integers(-23 * 60 - 59, 23 * 60 + 59).map(lambda m: timezone(timedelta(minutes=m)))
times = st.datetimes(timezones=st.none() | offsets)
tool_calls = st.builds(
    ToolCall,
    id=names,
    name=names,
    args=st.dictionaries(st.text(max_size=8), json_values, max_size=3),
)
messages = st.builds(
    Message,
    role=st.sampled_from(Role),
    content=st.none() | st.text(max_size=120),
    name=st.none() | names,
    tool_calls=st.lists(tool_calls, max_size=2),
    tool_call_id=st.none() | names,
)
traces = st.builds(
    TraceRecord,
    step=st.integers(0, 10**6),
    superstep=st.integers(0, 10**6),
    tool=st.none() | names,
    arguments=st.dictionaries(st.text(max_size=8), json_values, max_size=3),
    result=json_values,
    side_effect=st.booleans(),
    effects=st.none() | st.sampled_from(Effects),
    idempotency_key=st.none() | names,
    error=st.none() | st.text(max_size=40),
    started_at=times,
    finished_at=times,
    duration_ms=st.floats(0, 1e12),
    usage=st.none()
    | st.builds(
        Usage,
        prompt_tokens=st.integers(0, 10**9),
        completion_tokens=st.integers(0, 10**9),
        cached_tokens=st.integers(0, 10**9),
    ),
)
# Each step adds some messages and trace records; the first LC is full, the rest deltas.
steps = st.lists(
    st.tuples(st.lists(messages, max_size=3), st.lists(traces, max_size=2)), max_size=4
)
Steps = list[tuple[list[Message], list[TraceRecord]]]
codecs = st.sampled_from([Codec(), Codec(signing_key=b"k" * 32), Codec(compress_above=0)])
REAL = settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])


def validated_read(store: CheckpointStore, task: str, lc_id: str) -> WorkingState:
    """The state as full validation of every verified record of the chain rebuilds it."""
    chain = []
    wanted = lc_id
    for data in store.hot.read_chain(task, lc_id, 100):
        payload = store.codec.open(data, Place.lc(task, "coder", wanted))
        lc = LocalCheckpoint.model_validate_json(payload)
        lc.checksum, lc.size = data[5:DIGEST_END].hex(), len(data)
        chain.append(lc)
        wanted = lc.parent_id or ""
    return rebuild(chain)


def write_steps(
    store: CheckpointStore,
    state: WorkingState,
    history: list[tuple[list[Message], list[TraceRecord]]],
) -> str:
    """Write an LC of `state`, then one per step of `history`, as a step adds to the trace."""
    ref = store.write_lc(state)
    for added_messages, added_trace in history:
        state.step += 1
        state.messages.extend(added_messages)
        for record in added_trace:
            state.add_trace(record)
        ref = store.write_lc(state)
    return ref.id


@REAL
@given(first=steps, history=steps, codec=codecs)
def test_read_state_equals_a_validated_read(
    redis_client: redis.Redis,
    real_store: CheckpointStore,
    first: list[tuple[list[Message], list[TraceRecord]]],
    history: list[tuple[list[Message], list[TraceRecord]]],
    codec: Codec,
) -> None:
    """For any history, read_state equals the full validation of its chain and what was written."""
    store = CheckpointStore(real_store.hot, real_store.cold, codec, full_every=3)
    state = new_agent(store, f"t{new_id()}", "coder")
    for added_messages, added_trace in first:
        state.messages.extend(added_messages)
        state.trace.extend(added_trace)
    lc_id = write_steps(store, state, history)

    read = store.read_state(state.task, state.agent, lc_id)

    expected = validated_read(store, state.task, lc_id)
    assert expected == read
    assert state.messages == read.messages
    assert state.trace == read.trace
    for built, validated in zip(
        [*read.messages, *read.trace], [*expected.messages, *expected.trace], strict=True
    ):
        assert validated.model_fields_set == built.model_fields_set
        assert validated.model_dump_json() == built.model_dump_json()


@REAL
@given(history=steps, data=st.data())
def test_a_changed_byte_in_redis_is_refused_by_read_state(
    redis_client: redis.Redis,
    real_store: CheckpointStore,
    history: list[tuple[list[Message], list[TraceRecord]]],
    data: st.DataObject,
) -> None:
    """Any one byte changed in any LC of the chain in Redis (none archived) is refused."""
    state = new_agent(real_store, f"t{new_id()}", "coder")
    lc_id = write_steps(real_store, state, history)
    chain = real_store.load_chain(state.task, state.agent, lc_id)
    victim = data.draw(st.sampled_from(chain), label="lc")
    position = data.draw(st.integers(0, len(victim.data) - 1), label="position")
    damaged = bytearray(victim.data)
    damaged[position] ^= data.draw(st.integers(1, 255), label="xor")
    redis_client.hset(keys.lc(state.task, victim.record.id), "data", bytes(damaged))

    with pytest.raises(CorruptCheckpoint):
        real_store.read_state(state.task, state.agent, lc_id)


def test_a_newer_schema_with_new_fields_is_refused_for_its_version() -> None:
    """A record of a newer schema, holding fields this reader lacks, is refused by version."""
    codec = Codec()
    newer = SCHEMA_VERSION + 1
    sealed = codec.seal(b'{"files":{},"new_field":[1],"schema_version":%d}' % newer)
    with pytest.raises(CorruptCheckpoint, match=f"version {newer} is newer than {SCHEMA_VERSION}"):
        codec.decode(sealed.data, WorkspaceManifest, "future")


@REAL
@given(first=steps, later=steps, codec=codecs)
def test_steps_on_a_read_state_write_lcs_that_read_back_whole(
    real_store: CheckpointStore, first: Steps, later: Steps, codec: Codec
) -> None:
    """Steps taken on a read state, its trace unbuilt (full LCs build it), read back whole."""
    store = CheckpointStore(real_store.hot, real_store.cold, codec, full_every=3)
    state = new_agent(store, f"t{new_id()}", "coder")
    lc_id = write_steps(store, state, first)
    read = store.read_state(state.task, state.agent, lc_id)
    read_lc_id = write_steps(store, read.copy(), later)
    for added_messages, added_trace in later:
        state.messages.extend(added_messages)
        state.trace.extend(added_trace)

    again = store.read_state(state.task, state.agent, read_lc_id)

    assert validated_read(store, state.task, read_lc_id) == again
    assert state.messages == again.messages
    assert state.trace == again.trace


def test_a_step_on_a_read_state_builds_no_trace_record(
    real_store: CheckpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counting, appending to, copying and writing a delta of a read state build no trace."""
    state = new_agent(real_store, "t", "coder")
    for i in range(3):
        take_step(state, i)
    lc_id = real_store.write_lc(state).id
    read = real_store.read_state(state.task, state.agent, lc_id)
    with monkeypatch.context() as patched:
        patched.setattr(VerifiedTrace, "build", lambda _: pytest.fail("trace built"))
        step = read.copy()
        take_step(step, 3)
        ref = real_store.write_lc(step)
        assert (3, 4) == (read.trace_count, step.trace_count)

    take_step(state, 3)
    again = real_store.read_state(state.task, state.agent, ref.id)
    assert step == again
    assert (state.messages, state.trace) == (again.messages, again.trace)
    assert state.trace[:3] == read.trace


def test_a_verified_lc_whose_trace_does_not_validate_is_refused_when_read(
    real_store: CheckpointStore,
) -> None:
    """A sealed LC whose checksum holds but whose trace is not valid fails on reading it."""
    state = new_agent(real_store, "t", "coder")
    take_step(state, 1)
    lc = cut_lc(state, Level.STEP)
    payload = canonical_bytes(lc).replace(b'"duration_ms":1.5', b'"duration_ms":"soon"')
    real_store.hot.write_lc(LCEntry(lc, real_store.codec.seal(payload)))

    read = real_store.read_state(state.task, state.agent, lc.id)

    assert state.messages == read.messages
    with pytest.raises(CorruptCheckpoint, match=r"trace\.0\.duration_ms"):
        _ = read.trace
    with pytest.raises(CorruptCheckpoint, match=r"trace\.0\.duration_ms"):
        real_store.load_chain(state.task, state.agent, lc.id)


def test_a_list_assigned_to_an_unbuilt_trace_is_the_trace(real_store: CheckpointStore) -> None:
    """Assigning `trace` on a read state replaces its unbuilt trace, for counts and deltas too."""
    state = new_agent(real_store, "t", "coder")
    take_step(state, 1)
    read = real_store.read_state(state.task, state.agent, real_store.write_lc(state).id)
    replaced = [*state.trace, *state.trace]

    read.trace = replaced

    assert (replaced, 2, replaced[1:]) == (read.trace, read.trace_count, read.trace_since(1))
