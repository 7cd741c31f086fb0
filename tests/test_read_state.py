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

from storage import keys
from storage.chain import AgentState, rebuild
from storage.codec import DIGEST_END, Codec
from storage.errors import CorruptCheckpoint
from storage.ids import new_id
from storage.records import (
    Effects,
    LocalCheckpoint,
    Message,
    Role,
    ToolCall,
    TraceRecord,
    Usage,
    WorkspaceManifest,
)
from storage.store import CheckpointStore
from tests.factories import new_agent
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
codecs = st.sampled_from([Codec(), Codec(signing_key=b"k" * 32), Codec(compress_above=0)])
REAL = settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])


def validated_read(store: CheckpointStore, task: str, lc_id: str) -> AgentState:
    """The state as full validation of every verified record of the chain rebuilds it."""
    chain = []
    for data in store.hot.read_chain(task, lc_id, 100):
        lc = LocalCheckpoint.model_validate_json(store.codec.open(data, "lc"))
        lc.checksum, lc.size = data[5:DIGEST_END].hex(), len(data)
        chain.append(lc)
    return rebuild(chain)


def write_steps(
    store: CheckpointStore,
    state: AgentState,
    history: list[tuple[list[Message], list[TraceRecord]]],
) -> str:
    """Write a full LC of `state`, then one delta per step of `history`; return the last id."""
    ref = store.write_lc(state)
    for added_messages, added_trace in history:
        state.step += 1
        state.messages.extend(added_messages)
        state.trace.extend(added_trace)
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
    sealed = codec.seal(b'{"files":{},"new_field":[1],"schema_version":2}')
    with pytest.raises(CorruptCheckpoint, match="schema version 2 is newer than 1"):
        codec.decode(sealed.data, WorkspaceManifest, "future")
