"""Aborted GCs after their records leave Redis: a note in the archive keeps their numbers.

A GC that aborted committed nothing, so it is never archived, and Redis drops its record
once it is older than every GC kept hot (`trim_hot`). Its number stays taken (numbers are
never handed out twice), so without a note the task's checkpoints would show a gap that
nothing explains. Before an aborted GC leaves Redis its number, superstep, epoch, time and
origin are added to the task's `AbortedGCs` document in the archive.
"""

from __future__ import annotations

from collections.abc import Iterable

from cairn.storage.codec import Place
from cairn.storage.keys import ABORTED_DOC
from cairn.storage.records import AbortedGC, AbortedGCs, GlobalCheckpoint
from cairn.storage.store import CheckpointStore


def note_aborted(store: CheckpointStore, task: str, gcs: Iterable[GlobalCheckpoint]) -> None:
    """Add `gcs` (aborted GCs of `task`) to the archive's note, durably, each number once."""
    notes = [
        AbortedGC(
            number=gc.number,
            superstep=gc.superstep,
            epoch=gc.epoch,
            created_at=gc.created_at,
            origin=gc.origin,
        )
        for gc in gcs
    ]
    if not notes:
        return
    place = Place.doc(task, ABORTED_DOC)

    def added(current: bytes | None) -> bytes | None:
        kept = [] if current is None else store.codec.decode(current, AbortedGCs, place).gcs
        known = {note.number for note in kept}
        new = [note for note in notes if note.number not in known]
        if not new:
            return None
        merged = sorted([*kept, *new], key=lambda note: note.number)
        return store.codec.encode(AbortedGCs(gcs=merged), place).data

    store.cold.update_doc(task, ABORTED_DOC, added)


def aborted_gcs(store: CheckpointStore, task: str) -> dict[int, AbortedGC]:
    """The aborted GCs of `task` whose records left Redis, by number (none: empty)."""
    data = store.cold.get_doc(task, ABORTED_DOC)
    if data is None:
        return {}
    found = store.codec.decode(data, AbortedGCs, Place.doc(task, ABORTED_DOC))
    return {note.number: note for note in found.gcs}
