"""The cold tier of `CairnSaver`: checkpoints moved from Redis to the disk archive.

`ColdTier.archive` moves all but the newest checkpoints of a namespace (their records,
writes and the blobs only they need) to disk, durably, then out of Redis; reads fall
back to the archive (storage/langgraph/tiers.py). What the archive names each document,
and the place each is sealed for, is in storage/langgraph/places.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import redis

from cairn.storage.backends.disk import DiskArchive
from cairn.storage.backends.redis import script
from cairn.storage.codec import Codec, Place
from cairn.storage.keys import ThreadKeys
from cairn.storage.langgraph.places import (
    NSS_DOC,
    checkpoint_at,
    cold_name,
    cold_task,
    ids_doc,
    index_at,
    namespaces_at,
    open_record,
    seal_record,
    writes_at,
)
from cairn.storage.langgraph.tiers import Tiers

DROP_ROUNDS = 4  # an archive's tries to drop blobs no checkpoint put meanwhile names


@dataclass(frozen=True)
class _Moving:
    """Checkpoints of a namespace an archive wrote to disk, to take out of Redis."""

    going: list[str]  # their ids
    staying: list[str]  # the ids it saw stay in Redis
    writes: dict[str, dict[bytes, bytes]]  # checkpoint id → each write's field → the value archived
    blobs: list[str]  # the keys of the blobs only they named


class ColdTier:
    """Moves a saver's older checkpoints to its archive, and deletes them there.

    With no archive (`archive` None) there is nothing to delete, and `archive` must not
    be called.
    """

    def __init__(
        self, client: redis.Redis, codec: Codec, archive: DiskArchive | None, tiers: Tiers
    ) -> None:
        self.redis = client
        self.codec = codec
        self.disk = archive
        self.tiers = tiers  # the saver's reads, both tiers
        self._archived = script(client, "lg_archive")

    def _seal(self, value: object, place: Place) -> bytes:
        return seal_record(self.codec, value, place)

    def _open(self, data: bytes, place: Place) -> dict[str, Any]:
        return open_record(self.codec, data, place)

    # archive ------------------------------------------------------------------------------
    def archive(self, where: ThreadKeys, keep: int) -> int:
        """Archive all but the newest `keep` checkpoints of a namespace; how many left Redis.

        The disk side runs under the lock of the namespace's archive index (`update_doc`'s
        file lock, so archivers in other processes wait too): each archiver reads what to
        move, writes it and names it in the index in its turn, so no index or writes
        document is written over by an archiver that read less. Redis then loses, in one
        script, only what is on disk (`_drop_archived`).
        """
        assert self.disk is not None
        moving: list[_Moving] = []

        def listed(index: bytes | None) -> bytes | None:
            found = self._archive_to_disk(where, keep)
            if found is None:
                return None  # nothing to move: the index stays as it is
            moving.append(found)
            ids = [] if index is None else self._open(index, index_at(where))["ids"]
            return self._seal({"ids": sorted({*ids, *found.going})}, index_at(where))

        self.disk.update_doc(cold_task(where.thread), ids_doc(where), listed)
        if not moving:
            return 0
        self._list_namespace(where)
        return self._drop_archived(where, moving[0])

    def _archive_to_disk(self, where: ThreadKeys, keep: int) -> _Moving | None:
        """Write all but the newest `keep` checkpoints of a namespace to disk, durably.

        Their records, their writes (merged into any archived before: what the archive
        holds of a write stays as it is) and the blobs they need. None if none is to move.
        """
        assert self.disk is not None
        ids = sorted(i.decode() for i in cast(list[bytes], self.redis.zrange(where.ids(), 0, -1)))
        cut = max(0, len(ids) - keep)
        raw = self.tiers.stored(where, {where.checkpoint(i): i for i in ids[:cut]})
        going = sorted(raw)  # a checkpoint deleted meanwhile (`prune`) has nothing to move
        if not going:
            return None
        docs = {cold_name(where.checkpoint(i)): data for i, data in raw.items()}
        records = [self._open(data, checkpoint_at(where, i)) for i, data in raw.items()]
        needed = self.tiers.blob_keys(where, records)
        blobs = self.tiers.stored(where, {key: key for key in needed})
        docs |= {cold_name(key): data for key, data in blobs.items()}
        pipe = self.redis.pipeline(transaction=False)
        for checkpoint_id in going:
            pipe.hgetall(where.writes(checkpoint_id))
        writes: dict[str, dict[bytes, bytes]] = {}
        for checkpoint_id, hot in zip(going, cast(list[dict[bytes, bytes]], pipe.execute()),
                                      strict=True):  # fmt: skip
            if not hot:
                continue
            # An earlier archiver's copy wins: Redis may lose a field once it is archived,
            # and a value replaced since then (a special write) stays in Redis, read over it.
            archived = {**hot, **self.tiers.archived_writes(where, checkpoint_id)}
            docs[cold_name(where.writes(checkpoint_id))] = self._seal(
                {f.decode(): v for f, v in archived.items()}, writes_at(where, checkpoint_id)
            )
            writes[checkpoint_id] = {f: archived[f] for f in hot}
        self.disk.put_docs(cold_task(where.thread), docs)
        staying = ids[cut:]
        return _Moving(going, staying, writes, sorted(needed - self._needed(where, staying)))

    def _drop_archived(self, where: ThreadKeys, moving: _Moving) -> int:
        """Take archived checkpoints out of Redis (`lg_archive.lua`); how many left its ids.

        A blob goes only once no checkpoint put meanwhile names it: those the script finds
        are read and their blobs kept, and it is sent again. After `DROP_ROUNDS` the blobs
        go anyway; they are on disk, where a read finds them.
        """
        going, blobs, seen = moving.going, moving.blobs, set(moving.staying)
        fields: list[str | bytes | int] = []
        for checkpoint_id in going:
            archived = moving.writes.get(checkpoint_id, {})
            fields += [len(archived), *(x for pair in archived.items() for x in pair)]
        moved = 0
        for attempt in range(DROP_ROUNDS):
            check = "1" if attempt < DROP_ROUNDS - 1 else "0"
            reply = self._archived(
                keys=[where.ids(), *(where.checkpoint(i) for i in going),
                      *(where.writes(i) for i in going), *blobs],
                args=[len(going), len(blobs), check, *going, *fields, *seen],
            )  # fmt: skip
            count, unseen = cast(tuple[int, list[bytes]], reply)
            moved += count
            if not unseen:
                break
            going, fields = [], []  # taken out: the next rounds only weigh the blobs
            arrived = [i.decode() for i in unseen]
            kept = self._needed(where, arrived)
            blobs = [key for key in blobs if key not in kept]
            seen.update(arrived)
        return moved

    def _needed(self, where: ThreadKeys, ids: list[str]) -> set[str]:
        """The blobs the checkpoints still stored of `ids` need (`Tiers.blob_keys`)."""
        raw = self.tiers.stored(where, {where.checkpoint(i): i for i in ids})
        return self.tiers.blob_keys(
            where, (self._open(data, checkpoint_at(where, i)) for i, data in raw.items())
        )

    def _list_namespace(self, where: ThreadKeys) -> None:
        """Name the namespace in the archive's list of the thread's (under its lock)."""
        assert self.disk is not None
        if where.ns in self.tiers.archived_namespaces(where.thread):
            return  # listed for good: only `delete_thread` takes a namespace out

        def listed(current: bytes | None) -> bytes | None:
            place = namespaces_at(where.thread)
            nss = set() if current is None else set(self._open(current, place)["nss"])
            return None if where.ns in nss else self._seal({"nss": sorted({*nss, where.ns})},
                                                           place)  # fmt: skip

        self.disk.update_doc(cold_task(where.thread), NSS_DOC, listed)

    # delete -------------------------------------------------------------------------------
    def forget(self, where: ThreadKeys, doomed: list[str], blobs: set[str]) -> None:
        """Delete checkpoints, their writes and `blobs` from the archive, if it holds any."""
        if self.disk is None or not set(doomed) & set(self.tiers.archived_ids(where)):
            return
        task = cold_task(where.thread)
        for key in [*(where.checkpoint(i) for i in doomed),
                    *(where.writes(i) for i in doomed), *blobs]:  # fmt: skip
            self.disk.delete_doc(task, cold_name(key))
        self._unlist(where, doomed)

    def delete_thread(self, thread: str) -> None:
        """Delete every archived document of a thread."""
        if self.disk is not None:
            self.disk.delete_docs(cold_task(thread))

    def _unlist(self, where: ThreadKeys, doomed: list[str]) -> None:
        """Take checkpoints out of the archive's index of their namespace (under its lock)."""
        assert self.disk is not None

        def left(index: bytes | None) -> bytes | None:
            if index is None:
                return None
            ids = set(self._open(index, index_at(where))["ids"]) - set(doomed)
            return self._seal({"ids": sorted(ids)}, index_at(where))

        self.disk.update_doc(cold_task(where.thread), ids_doc(where), left)
