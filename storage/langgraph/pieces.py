"""How CairnSaver stores a list channel that only grew, and what it remembers to do so.

A list channel is stored in pieces: a version's blob holds the items it adds and folds
in the newest pieces no bigger than it (a binary counter), so a read joins O(log n)
blobs and a step with 1,000 messages of history stores about what it added, not the
1,000 messages.
"""

from __future__ import annotations

import operator
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from langgraph.checkpoint.serde.base import SerializerProtocol

MAX_PIECES = 40  # a list channel's blobs a read joins at most (O(log n) in practice)


@dataclass(slots=True)
class Grown:
    """What this saver last stored of a list channel, to store only what it gained.

    `pieces` are the refs of the blobs that hold the list, oldest first, each with how many
    of its items it holds: the first from item 0, each next one where the last ended.
    """

    value: list[Any]
    pieces: list[tuple[str, int]]


K = TypeVar("K")
V = TypeVar("V")


class Recent(Generic[K, V]):
    """A small map that forgets its least recently used entries past `size`.

    Thread-safe: the async methods run the sync ones on threads.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        """The value remembered for `key`, now the most recently used; None if none."""
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
            return found

    def put(self, key: K, value: V) -> None:
        """Remember `value` for `key`, forgetting the least recently used past `size`."""
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def pop(self, key: K) -> V | None:
        """Forget `key`; its value, or None if none."""
        with self._lock:
            return self._items.pop(key, None)

    def newest(self, wanted: Callable[[K], bool]) -> list[K]:
        """The keys `wanted` accepts, the most recently used first."""
        with self._lock:
            return [k for k in reversed(self._items) if wanted(k)]

    def forget(self, keep: Callable[[K], bool]) -> None:
        """Drop every entry whose key `keep` rejects."""
        with self._lock:
            for key in [k for k in self._items if not keep(k)]:
                del self._items[key]


def stored_form(
    serde: SerializerProtocol,
    channel: str,
    ref: str,
    values: dict[str, Any],
    last: Grown | None,
    max_pieces: int = MAX_PIECES,
) -> tuple[dict[str, Any], Grown | None]:
    """The stored form of a channel's new version (blob `ref`), and what to remember once stored.

    Whole, or the items it adds to `last`, the version this saver last wrote or read.
    """
    if channel not in values:
        return {"t": "empty"}, None
    value = values[channel]
    if not isinstance(value, list):
        kind, data = serde.dumps_typed(value)
        return {"t": kind, "d": data}, None
    # The same objects in the same places: LangGraph's reducers build a new list and
    # leave the old items be, so this holds exactly when the list only grew.
    if (
        last is None
        or len(value) < len(last.value)
        or not all(map(operator.is_, value, last.value))
    ):
        kind, data = serde.dumps_typed(value)
        return {"t": kind, "d": data}, Grown(value, [(ref, len(value))])
    # This version's blob holds the new items, and takes in each newest piece that is
    # no bigger than it: piece sizes halve from the first, as the digits of a binary
    # counter, so a read joins O(log n) pieces and a write rewrites each item O(log n)
    # times over the list's life: a cost that stays flat as the history grows.
    pieces, start = list(last.pieces), len(last.value)
    while pieces and (pieces[-1][1] <= len(value) - start or len(pieces) >= max_pieces):
        start -= pieces.pop()[1]
    kind, data = serde.dumps_typed(value[start:])
    blob = {"t": kind, "d": data}
    if pieces:
        blob["base"] = [r for r, _ in pieces]
    return blob, Grown(value, [*pieces, (ref, len(value) - start)])


def ref_of(version: object, checkpoint_id: str) -> str:
    """The name of a channel's blob within its channel: its version and the put that wrote it.

    Checkpoint ids are unique and each is written once, so no two puts share a blob: two
    branches grown from one checkpoint (a replay, an `update_state` fork) may draw the same
    channel version, and each still reads back what it wrote.
    """
    return f"{version}@{checkpoint_id}"


def no_value_ref(version: object) -> str:
    """The ref of a channel version that no put ever stored: the channel holds no value.

    LangGraph reads a version no saver stored a blob for as a channel without a value (a
    migrated thread's renamed channels carry such versions). A put records that as this
    ref, so a read needs no blob for it, while a blob missing under any other ref is still
    damage, and says so.
    """
    return f"{version}@"


def holds_value(ref: str) -> bool:
    """Whether a ref names a stored blob (not `no_value_ref`)."""
    return not ref.endswith("@")
