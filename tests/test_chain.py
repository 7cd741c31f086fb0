"""Incremental local checkpoints: deltas, full snapshots, rebuild and link verification."""

from __future__ import annotations

import pytest

from cairn.errors import CorruptCheckpoint
from cairn.storage.base import LCEntry
from cairn.storage.chain import cut_lc
from cairn.storage.records import Level, LocalCheckpoint
from cairn.storage.store import CheckpointStore
from tests.factories import new_agent, next_superstep, take_step

TASK = "chain"


def test_thousand_step_chain_rebuilds_exactly(real_store: CheckpointStore) -> None:
    """1,000 incremental steps on Redis rebuild to exactly the state that was written."""
    state = new_agent(real_store, TASK, "coder")
    refs = []
    for i in range(1, 1001):
        take_step(state, i, size=50)
        refs.append(real_store.write_lc(state))
        next_superstep(real_store, state)
    rebuilt = real_store.read_state(TASK, "coder", refs[-1].id, refs[-1].checksum)
    assert len(rebuilt.messages) == 1001
    assert state.messages == rebuilt.messages
    assert state.trace == rebuilt.trace
    assert state.base == rebuilt.base
    middle = real_store.read_state(TASK, "coder", refs[499].id)
    assert state.messages[:501] == middle.messages


def test_deltas_hold_only_what_the_parent_lacked(store: CheckpointStore) -> None:
    """A step LC stores one new message; every full_every-th LC is full."""
    state = new_agent(store, TASK, "coder")
    stored: list[LocalCheckpoint] = []
    for i in range(1, 12):
        take_step(state, i)
        ref = store.write_lc(state)
        stored.append(store.read_lc(TASK, "coder", ref.id))
        next_superstep(store, state)
    # full_every is 5 in the `store` fixture: depths 0, 5, 10 are full.
    assert [lc.depth for lc in stored if lc.full] == [0, 5, 10]
    assert [len(lc.messages) for lc in stored if not lc.full] == [1] * 8
    assert len(stored[10].messages) - 1 == 11  # the full one has everything (+ system prompt)
    assert max(len(store.load_chain(TASK, "coder", lc.id)) for lc in stored) <= 5


def test_tool_lc_resumes_from_the_same_parent(store: CheckpointStore) -> None:
    """A state read from a tool LC cuts its step LC from the step-start parent."""
    state = new_agent(store, TASK, "coder")
    take_step(state, 1)
    start = store.write_lc(state)
    next_superstep(store, state)
    take_step(state, 2)
    tool = store.write_lc(state, Level.TOOL)
    assert start.id == (state.base.id if state.base else None)
    resumed = store.read_state(TASK, "coder", tool.id)
    assert resumed.base is not None
    assert start.id == resumed.base.id
    take_step(resumed, 3)
    step = store.write_lc(resumed)
    lc = store.read_lc(TASK, "coder", step.id)
    assert start.id == lc.parent_id
    assert len(lc.messages) == 2  # steps 2 and 3: the tool LC is not its parent
    assert resumed.messages == store.read_state(TASK, "coder", step.id).messages


def test_history_that_shrinks_is_refused(store: CheckpointStore) -> None:
    """Messages are append-only: a state shorter than its base cannot be checkpointed."""
    state = new_agent(store, TASK, "coder")
    take_step(state, 1)
    store.write_lc(state)
    state.messages.pop()
    with pytest.raises(ValueError, match="append-only"):
        store.write_lc(state)


def test_a_forged_link_is_detected(store: CheckpointStore) -> None:
    """A delta whose parent checksum does not match its parent is refused, naming the link."""
    state = new_agent(store, TASK, "coder")
    take_step(state, 1)
    store.write_lc(state)
    take_step(state, 2)
    assert state.base is not None
    state.base.checksum = "00" * 32  # as if the parent had been swapped
    forged = cut_lc(state, Level.STEP)
    sealed = store.codec.encode(forged)
    store.hot.write_lc(LCEntry(forged, sealed))
    assert forged.parent_id is not None
    with pytest.raises(CorruptCheckpoint, match=forged.parent_id):
        store.read_state(TASK, "coder", forged.id)
