"""A `CairnSaver`'s records where they are: in Redis, else in the disk archive.

Every read tries Redis first and falls back to the archive, where `ColdTier`
(storage/langgraph/cold.py) moves older checkpoints, so a checkpoint reads back the same
from either tier.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import redis

from cairn.errors import RecordNotFound
from cairn.storage.backends.disk import DiskArchive
from cairn.storage.codec import Codec, Place
from cairn.storage.keys import LANGGRAPH_PREFIX, ThreadKeys
from cairn.storage.langgraph.pieces import holds_value
from cairn.storage.langgraph.places import (
    NSS_DOC,
    blob_at,
    checkpoint_at,
    cold_name,
    cold_task,
    ids_doc,
    index_at,
    namespaces_at,
    open_record,
    writes_at,
)


class Tiers:
    """Reads of a saver's records from Redis, else from the archive (with none: Redis only)."""

    def __init__(self, client: redis.Redis, codec: Codec, archive: DiskArchive | None) -> None:
        self.redis = client
        self.codec = codec
        self.disk = archive

    def _open(self, data: bytes, place: Place) -> dict[str, Any]:
        return open_record(self.codec, data, place)

    # the archive alone --------------------------------------------------------------------
    def archived(self, where: ThreadKeys, key: str) -> bytes | None:
        """The archived record Redis kept at `key`, or None."""
        if self.disk is None:
            return None
        return self.disk.get_doc(cold_task(where.thread), cold_name(key))

    def archived_writes(self, where: ThreadKeys, checkpoint_id: str) -> dict[bytes, bytes]:
        """A checkpoint's archived writes: field → the write as Redis kept it."""
        raw = self.archived(where, where.writes(checkpoint_id))
        if raw is None:
            return {}
        opened = self._open(raw, writes_at(where, checkpoint_id))
        return {k.encode(): v for k, v in opened.items()}

    def archived_ids(self, where: ThreadKeys) -> list[str]:
        """The namespace's archived checkpoint ids, oldest first."""
        if self.disk is None:
            return []
        raw = self.disk.get_doc(cold_task(where.thread), ids_doc(where))
        return [] if raw is None else list(self._open(raw, index_at(where))["ids"])

    def archived_namespaces(self, thread: str) -> list[str]:
        """The thread's namespaces with checkpoints archived."""
        if self.disk is None:
            return []
        raw = self.disk.get_doc(cold_task(thread), NSS_DOC)
        return [] if raw is None else list(self._open(raw, namespaces_at(thread))["nss"])

    # both tiers ---------------------------------------------------------------------------
    def raw(self, where: ThreadKeys, key: str) -> bytes | None:
        """The record under `key`, sealed as stored; None if neither tier holds it."""
        found = cast(bytes | None, self.redis.get(key))
        return found if found is not None else self.archived(where, key)

    def raw_writes(self, where: ThreadKeys, checkpoint_id: str) -> dict[str, bytes]:
        """A checkpoint's writes, field → sealed write; Redis's over the archive's."""
        hot = cast(dict[bytes, bytes], self.redis.hgetall(where.writes(checkpoint_id)))
        merged = {**self.archived_writes(where, checkpoint_id), **hot}
        return {k.decode(): v for k, v in merged.items()}

    def stored(self, where: ThreadKeys, names: dict[str, str]) -> dict[str, bytes]:
        """Name → the record under its key (`names`: key → name), hot or else archived.

        Redis is read in one round trip. A key found nowhere (deleted) is left out.
        """
        if not names:
            return {}
        hot = cast(list[bytes | None], self.redis.mget(list(names)))
        found = {}
        for key, data in zip(names, hot, strict=True):
            sealed = data if data is not None else self.archived(where, key)
            if sealed is not None:
                found[names[key]] = sealed
        return found

    def records(self, where: ThreadKeys, ids: list[str]) -> dict[str, dict[str, Any]]:
        """Checkpoint id → its record (hot or archived)."""
        return {
            i: self._open(cast(bytes, self.raw(where, where.checkpoint(i))),
                          checkpoint_at(where, i))
            for i in ids
        }  # fmt: skip

    def blobs(
        self, where: ThreadKeys, keys: Iterable[str], *, missing_ok: bool = False
    ) -> dict[str, dict[str, Any]]:
        """Blob key → its record: the hot ones in one round trip, the rest from the archive.

        Raises `RecordNotFound` for a blob found nowhere, unless `missing_ok` (then it is
        left out).
        """
        wanted = list(keys)
        if not wanted:
            return {}
        found = cast(list[bytes | None], self.redis.mget(wanted))
        out = {}
        for key, data in zip(wanted, found, strict=True):
            sealed = data if data is not None else self.archived(where, key)
            if sealed is None:
                if missing_ok:
                    continue
                raise RecordNotFound(f"langgraph blob {key}")
            out[key] = self._open(sealed, blob_at(where, key))
        return out

    def blob_keys(self, where: ThreadKeys, records: Iterable[dict[str, Any]]) -> set[str]:
        """Every stored blob the records' channels need, earlier pieces included."""
        direct = {
            where.blob(ch, ref): ch
            for r in records
            for ch, ref in r["v"].items()
            if holds_value(ref)
        }
        stored = self.blobs(where, direct, missing_ok=True)
        needed = set(stored)
        for key, blob in stored.items():
            needed |= {where.blob(direct[key], v) for v in blob.get("base", ())}
        return needed

    def latest(self, where: ThreadKeys) -> str | None:
        """The namespace's newest checkpoint id, hot or archived; None if it has none."""
        newest = cast(list[bytes], self.redis.zrevrangebylex(where.ids(), "+", "-", 0, 1))
        if newest:
            return newest[0].decode()
        archived = self.archived_ids(where)
        return archived[-1] if archived else None

    def ids(self, where: ThreadKeys, before: str | None = None) -> list[str]:
        """The namespace's checkpoint ids, hot and archived, newest first."""
        top = f"({before}" if before else "+"
        found = cast(list[bytes], self.redis.zrevrangebylex(where.ids(), top, "-"))
        hot = [i.decode() for i in found]
        cold = [i for i in self.archived_ids(where) if before is None or i < before]
        return sorted(set(hot) | set(cold), reverse=True)

    def threads(self) -> list[str]:
        """Every thread with checkpoints in Redis (a scan: for `list(None)` and runs)."""
        names = list(self.redis.scan_iter(match=f"{LANGGRAPH_PREFIX}:*:name", count=1_000))
        found = cast(list[bytes | None], self.redis.mget(names)) if names else []
        return sorted(n.decode() for n in found if n is not None)

    def namespaces(self, thread: str) -> list[str]:
        """The thread's namespaces, hot and archived, sorted."""
        members = cast(set[bytes], self.redis.smembers(ThreadKeys(thread, "").namespaces()))
        return sorted({m.decode() for m in members} | set(self.archived_namespaces(thread)))
