"""Batched reads: many blobs or LCs verified as one at a time would be, hot ones in one trip."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis
from pydantic import ConfigDict
from redis.connection import AbstractConnection

from cairn.errors import CorruptCheckpoint, RecordNotFound
from cairn.storage import keys
from cairn.storage.records import LCRef, Record
from cairn.storage.store import CheckpointStore
from tests.factories import new_agent, take_step

TASK = "t1"


class Head(Record):
    """A view of an LC: the two fields these tests read, the rest ignored."""

    model_config = ConfigDict(extra="ignore")

    agent: str
    step: int


@pytest.fixture
def round_trips(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the commands (or pipelines) redis-py sends: one send, one round trip."""
    sent = [0]
    send = AbstractConnection.send_packed_command

    def counting(self: AbstractConnection, command: object, check_health: bool = True) -> None:
        sent[0] += 1
        send(self, command, check_health)  # type: ignore[no-untyped-call]

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counting)
    return sent


def _write_steps(store: CheckpointStore, agents: list[str]) -> dict[str, LCRef]:
    """Each agent takes one step and writes its LC; return agent → ref."""
    refs = {}
    for agent in agents:
        state = new_agent(store, TASK, agent)
        take_step(state, 1)
        refs[agent] = store.write_lc(state, vote=True)
    return refs


def _damage(value: bytes) -> bytes:
    """Flip one bit of the body: the envelope's CRC then refuses it."""
    return value[:-1] + bytes([value[-1] ^ 1])


def _raised(call: Callable[[], object]) -> tuple[type[BaseException], str]:
    """Run `call`, which must raise; return the error's type and message."""
    with pytest.raises((RecordNotFound, CorruptCheckpoint)) as caught:
        call()
    return type(caught.value), str(caught.value)


# every backend -----------------------------------------------------------------------
def test_get_blobs_returns_what_get_blob_returns(store: CheckpointStore) -> None:
    """Each blob's content, as `get_blob` gives it; a sha asked twice is read once."""
    shas = [store.put_blob(TASK, content) for content in (b"a", b"bb", b"")]
    assert {sha: store.get_blob(TASK, sha) for sha in shas} == store.get_blobs(
        TASK, [*shas, shas[0]]
    )
    assert {} == store.get_blobs(TASK, [])


def test_read_lcs_fields_returns_what_read_lc_fields_returns(store: CheckpointStore) -> None:
    """Each agent's view of its LC, as `read_lc_fields` gives it."""
    refs = _write_steps(store, ["planner", "coder"])
    expected = {a: store.read_lc_fields(TASK, a, ref, Head) for a, ref in refs.items()}
    assert expected == store.read_lcs_fields(TASK, refs, Head)
    assert {"planner": "planner", "coder": "coder"} == {
        a: head.agent for a, head in store.read_lcs_fields(TASK, refs, Head).items()
    }
    assert {} == store.read_lcs_fields(TASK, {}, Head)


# Redis and disk ----------------------------------------------------------------------
def test_get_blobs_reads_every_hot_blob_in_one_round_trip(
    real_store: CheckpointStore, round_trips: list[int]
) -> None:
    """Twenty hot blobs come back in one command."""
    contents = [f"file {i}\n".encode() for i in range(20)]
    shas = [real_store.put_blob(TASK, c) for c in contents]
    round_trips[0] = 0
    assert contents == list(real_store.get_blobs(TASK, shas).values())
    assert 1 == round_trips[0]


def test_a_corrupt_hot_blob_falls_back_to_the_archive(
    real_store: CheckpointStore, redis_client: redis.Redis
) -> None:
    """A blob damaged in Redis is read from the archive; the others still come from Redis."""
    good, bad = real_store.put_blob(TASK, b"good"), real_store.put_blob(TASK, b"bad")
    sealed = real_store.hot.get_blob(TASK, bad)
    assert sealed is not None
    real_store.cold.put_blob(bad, sealed)
    redis_client.set(keys.blob(TASK, bad), _damage(sealed))
    assert {good: b"good", bad: b"bad"} == real_store.get_blobs(TASK, [good, bad])


@pytest.mark.parametrize("fault", ["missing", "corrupt"])
def test_a_blob_sound_nowhere_raises_as_get_blob_does(
    real_store: CheckpointStore, redis_client: redis.Redis, fault: str
) -> None:
    """A blob neither copy of which is sound raises `get_blob`'s error, word for word."""
    good = real_store.put_blob(TASK, b"good")
    lost = "ef" * 32
    if fault == "corrupt":
        lost = real_store.put_blob(TASK, b"lost")
        sealed = redis_client.get(keys.blob(TASK, lost))
        assert isinstance(sealed, bytes)
        redis_client.set(keys.blob(TASK, lost), _damage(sealed))
        real_store.cold.put_blob(lost, _damage(sealed))
    alone = _raised(lambda: real_store.get_blob(TASK, lost))
    assert alone == _raised(lambda: real_store.get_blobs(TASK, [good, lost]))
    assert (RecordNotFound if fault == "missing" else CorruptCheckpoint) is alone[0]


def test_read_lcs_fields_reads_every_hot_lc_in_one_round_trip(
    real_store: CheckpointStore, round_trips: list[int]
) -> None:
    """Eight agents' hot LCs come back in one pipeline."""
    refs = _write_steps(real_store, [f"a{i}" for i in range(8)])
    round_trips[0] = 0
    heads = real_store.read_lcs_fields(TASK, refs, Head)
    assert 1 == round_trips[0]
    assert dict.fromkeys(refs, 1) == {a: head.step for a, head in heads.items()}


def test_a_corrupt_hot_lc_falls_back_to_the_archive(
    real_store: CheckpointStore, redis_client: redis.Redis
) -> None:
    """An LC damaged in Redis is read from its archived copy and still verified."""
    refs = _write_steps(real_store, ["planner", "coder"])
    key = keys.lc(TASK, refs["coder"].id)
    sealed = redis_client.hget(key, "data")
    assert isinstance(sealed, bytes)
    real_store.cold.put_lc(TASK, "coder", refs["coder"].id, sealed)
    redis_client.hset(key, "data", _damage(sealed))
    heads = real_store.read_lcs_fields(TASK, refs, Head)
    assert {"planner": "planner", "coder": "coder"} == {a: h.agent for a, h in heads.items()}
    assert refs["coder"].checksum == heads["coder"].checksum


@pytest.mark.parametrize("fault", ["missing", "other checksum"])
def test_an_lc_sound_nowhere_raises_as_read_lc_fields_does(
    real_store: CheckpointStore, fault: str
) -> None:
    """An LC that is gone, or is not the one its ref names, raises the single call's error."""
    refs = _write_steps(real_store, ["planner", "coder"])
    if fault == "missing":
        real_store.hot.delete_lcs(TASK, [refs["coder"].id])
    else:
        refs["coder"] = LCRef(id=refs["coder"].id, checksum="ab" * 32)
    alone = _raised(lambda: real_store.read_lc_fields(TASK, "coder", refs["coder"], Head))
    assert alone == _raised(lambda: real_store.read_lcs_fields(TASK, refs, Head))
    assert (RecordNotFound if fault == "missing" else CorruptCheckpoint) is alone[0]
