"""CairnSaver: a LangGraph `BaseCheckpointSaver` on Redis (fenced puts) and a disk archive."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import ormsgpack
import redis
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    PendingWrite,
    get_checkpoint_id,
    get_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from storage.backends.disk import DiskArchive
from storage.backends.redis import script, translating
from storage.codec import Codec, Place
from storage.errors import CairnError, CorruptCheckpoint, RecordNotFound
from storage.keys import LANGGRAPH_PREFIX, ThreadKeys, langgraph_slot
from storage.langgraph.pieces import MAX_PIECES, Grown, Recent, ref_of, stored_form

REMEMBERED = 1_000  # threads' channels (and forks) a saver remembers for its next put
NSS_DOC = "namespaces"  # the archive's list of a thread's archived namespaces


def _pack(value: object) -> bytes:
    return ormsgpack.packb(value)


def _unpack(data: bytes) -> dict[str, Any]:
    found = ormsgpack.unpackb(data)
    if not isinstance(found, dict):
        raise CorruptCheckpoint("langgraph record", "not a map")
    return found


class CairnSaver(BaseCheckpointSaver[str]):
    """A LangGraph `BaseCheckpointSaver`, sync and async, on Redis and a disk archive."""

    def __init__(
        self,
        client: redis.Redis,
        archive: str | Path | None = None,
        *,
        serde: SerializerProtocol | None = None,
        codec: Codec | None = None,
        max_pieces: int = MAX_PIECES,
        strict: bool = False,
        hot_keep: int | None = None,
    ) -> None:
        super().__init__(serde=serde)
        if hot_keep is not None and (archive is None or hot_keep < 1):
            raise CairnError("hot_keep needs an archive directory and a count of at least 1")
        self.strict = strict
        self.hot_keep = hot_keep
        self.redis = client
        self.codec = codec or Codec()
        self.cold = DiskArchive(archive) if archive is not None else None
        self.max_pieces = max_pieces
        self._put = script(client, "lg_put")
        # (thread, ns, channel) → the list last stored or read; bounded, for a saver that
        # serves many threads holds their histories.
        self._grown: Recent[tuple[str, str, str], Grown] = Recent(REMEMBERED)
        self._forks: Recent[tuple[str, str, str], bool] = Recent(REMEMBERED)  # read by id
        # (thread, ns, checkpoint id) → its channels' blob refs, for a put of its child.
        self._refs: Recent[tuple[str, str, str], dict[str, str]] = Recent(REMEMBERED)

    # sealing ------------------------------------------------------------------------------
    def _seal(self, value: object, place: Place) -> bytes:
        return self.codec.seal(_pack(value), place).data

    def _open(self, data: bytes, place: Place) -> dict[str, Any]:
        return _unpack(self.codec.open(data, place))

    def _reseal(self, data: bytes, source: Place, target: Place) -> bytes:
        """A record sealed for `source`, verified, sealed again for `target` (a copy's)."""
        return self.codec.seal(self.codec.open(data, source), target).data

    # put ----------------------------------------------------------------------------------
    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint as the new head of its thread's namespace.

        Raises `FencedWrite` when its parent is not the head (another writer extended the
        thread since this one read it), unless this saver read that parent by its id.
        """
        conf = config["configurable"]
        where = ThreadKeys(str(conf["thread_id"]), str(conf.get("checkpoint_ns", "")))
        parent = conf.get("checkpoint_id") or ""
        saved = checkpoint.copy()
        values: dict[str, Any] = saved.pop("channel_values")  # type: ignore[misc]
        refs = self._inherited(where, parent, checkpoint["channel_versions"], new_versions)
        blob_keys, blobs, grown = [], [], {}
        for channel, version in new_versions.items():
            refs[channel] = ref_of(version, checkpoint["id"])
            blob_keys.append(where.blob(channel, refs[channel]))
            last = self._grown.get((where.thread, where.ns, channel))
            blob, grown[channel] = stored_form(
                self.serde, channel, refs[channel], values, last, self.max_pieces
            )
            blobs.append(self._seal(blob, _blob_at(where, blob_keys[-1])))
        merged = get_checkpoint_metadata(config, metadata)
        record = {
            "v": refs,
            "c": list(self.serde.dumps_typed(saved)),
            "m": list(self.serde.dumps_typed(merged)),
            "p": parent or None,
            "r": merged.get("run_id"),
        }
        # A put naming no parent starts a new history; only `strict` refuses it in a
        # namespace that has one (LangGraph writes none there unless two runs start a
        # thread at once, but its conformance suite does, on purpose).
        forked = self._forks.pop((where.thread, where.ns, parent)) is not None
        fork = "1" if forked or (not parent and not self.strict) else "0"
        hot = cast(int, translating(lambda: self._put(
            keys=[where.head(), where.checkpoint(checkpoint["id"]), where.ids(),
                  where.namespaces(), where.name(), *blob_keys],
            args=[checkpoint["id"], parent, fork, where.ns,
                  self._seal(record, _checkpoint_at(where, checkpoint["id"])), where.thread,
                  *blobs],
        )))  # fmt: skip
        # Only now, stored: a refused put must not become the base of the next one.
        self._refs.put((where.thread, where.ns, checkpoint["id"]), refs)
        for channel, state in grown.items():
            key = (where.thread, where.ns, channel)
            if state is None:
                self._grown.pop(key)
            else:
                self._grown.put(key, state)
        # Retention: archive down to `hot_keep` once Redis holds twice that, so the
        # archive's cost (a few fsyncs) comes once every `hot_keep` puts.
        if self.hot_keep is not None and hot > 2 * self.hot_keep:
            self.archive(where.thread, keep=self.hot_keep)
        return {"configurable": {"thread_id": where.thread, "checkpoint_ns": where.ns,
                                 "checkpoint_id": checkpoint["id"]}}  # fmt: skip

    def _inherited(
        self, where: ThreadKeys, parent: str, versions: ChannelVersions, new: ChannelVersions
    ) -> dict[str, str]:
        """The blob refs of the channels a put does not write: its parent's.

        A channel the parent holds at another version (or a parent never stored) keeps the
        plain version as its ref, the form of records stored before refs named their put.
        """
        known = self._parent_refs(where, parent) if parent and versions.keys() - new else {}
        refs = {}
        for channel, version in versions.items():
            ref = known.get(channel, "")
            refs[channel] = ref if ref.split("@", 1)[0] == str(version) else str(version)
        return refs

    def _parent_refs(self, where: ThreadKeys, checkpoint_id: str) -> dict[str, str]:
        """A stored checkpoint's blob refs: remembered from its put or read, else read."""
        known = self._refs.get((where.thread, where.ns, checkpoint_id))
        if known is not None:
            return known
        raw = self._raw(where, where.checkpoint(checkpoint_id))
        if raw is None:
            return {}
        refs: dict[str, str] = self._open(raw, _checkpoint_at(where, checkpoint_id))["v"]
        self._refs.put((where.thread, where.ns, checkpoint_id), refs)
        return refs

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's pending writes for a checkpoint (a write already there is kept)."""
        conf = config["configurable"]
        where = ThreadKeys(str(conf["thread_id"]), str(conf.get("checkpoint_ns", "")))
        key = where.writes(str(conf["checkpoint_id"]))
        pipe = self.redis.pipeline(transaction=True)
        for index, (channel, value) in enumerate(writes):
            idx = WRITES_IDX_MAP.get(channel, index)
            kind, data = self.serde.dumps_typed(value)
            field = f"{task_id}\x00{idx}"
            sealed = self._seal({"task": task_id, "idx": idx, "ch": channel, "t": kind,
                                 "d": data, "path": task_path},
                                _write_at(where, str(conf["checkpoint_id"]), field))  # fmt: skip
            # Special writes (errors, interrupts) replace; ordinary ones are written once.
            (pipe.hset if idx < 0 else pipe.hsetnx)(key, field, sealed)
        pipe.execute()

    # get ----------------------------------------------------------------------------------
    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint the config names, or its namespace's latest; None if none."""
        conf = config["configurable"]
        where = ThreadKeys(str(conf["thread_id"]), str(conf.get("checkpoint_ns", "")))
        checkpoint_id = get_checkpoint_id(config)
        if checkpoint_id:
            self._forks.put((where.thread, where.ns, checkpoint_id), True)
        else:
            checkpoint_id = self._latest(where)
            if checkpoint_id is None:
                return None
        return self._tuple(where, checkpoint_id, seed=True)

    def _latest(self, where: ThreadKeys) -> str | None:
        newest = cast(list[bytes], self.redis.zrevrangebylex(where.ids(), "+", "-", 0, 1))
        if newest:
            return newest[0].decode()
        archived = self._cold_ids(where)
        return archived[-1] if archived else None

    def _ids(self, where: ThreadKeys, before: str | None = None) -> list[str]:
        """The namespace's checkpoint ids, hot and archived, newest first."""
        top = f"({before}" if before else "+"
        found = cast(list[bytes], self.redis.zrevrangebylex(where.ids(), top, "-"))
        hot = [i.decode() for i in found]
        cold = [i for i in self._cold_ids(where) if before is None or i < before]
        return sorted(set(hot) | set(cold), reverse=True)

    def _tuple(
        self, where: ThreadKeys, checkpoint_id: str, *, seed: bool = False
    ) -> CheckpointTuple | None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.get(where.checkpoint(checkpoint_id))
        pipe.hgetall(where.writes(checkpoint_id))
        raw, raw_writes = cast(tuple[bytes | None, dict[bytes, bytes]], pipe.execute())
        if raw is None:  # archived, or never there
            raw = self._cold_get(where, where.checkpoint(checkpoint_id))
            if raw is None:
                return None
            # Writes put after the checkpoint was archived are still in Redis.
            raw_writes = {**self._cold_writes(where, checkpoint_id), **raw_writes}
        record = self._open(raw, _checkpoint_at(where, checkpoint_id))
        checkpoint = cast(Checkpoint, self.serde.loads_typed(tuple(record["c"])))
        self._refs.put((where.thread, where.ns, checkpoint_id), record["v"])
        checkpoint["channel_values"] = self._values(where, record["v"], seed=seed)
        return CheckpointTuple(
            config=_config(where, checkpoint_id),
            checkpoint=checkpoint,
            metadata=cast(CheckpointMetadata, self.serde.loads_typed(tuple(record["m"]))),
            parent_config=_config(where, record["p"]) if record["p"] else None,
            pending_writes=self._pending(where, checkpoint_id, raw_writes),
        )

    def _pending(
        self, where: ThreadKeys, checkpoint_id: str, raw: dict[bytes, bytes]
    ) -> list[PendingWrite]:
        found = [
            self._open(data, _write_at(where, checkpoint_id, field.decode()))
            for field, data in raw.items()
        ]
        found.sort(key=lambda w: writes_sort_key(w["path"], w["task"], w["idx"]))
        return [(w["task"], w["ch"], self.serde.loads_typed((w["t"], w["d"]))) for w in found]

    def _values(
        self, where: ThreadKeys, refs: dict[str, str], *, seed: bool = False
    ) -> dict[str, Any]:
        """The channels' values, by their blobs' refs, every blob read in two round trips.

        With `seed`, the lists read are remembered as the last stored versions of their
        channels: a writer that goes on from this checkpoint hands LangGraph's reducers
        these very objects, and its next put stores only what they add to them.
        """
        wanted = {ch: where.blob(ch, ref) for ch, ref in refs.items()}
        stored = self._blobs(where, wanted.values())
        bases = {
            where.blob(ch, r) for ch, key in wanted.items() for r in stored[key].get("base", ())
        }
        stored |= self._blobs(where, bases - stored.keys())
        values: dict[str, Any] = {}
        for channel, key in wanted.items():
            blob = stored[key]
            if blob["t"] == "empty":
                continue
            value = self.serde.loads_typed((blob["t"], blob["d"]))
            pieces: list[tuple[str, int]] = []
            if "base" in blob:
                whole: list[Any] = []
                for ref in blob["base"]:
                    part = stored[where.blob(channel, ref)]
                    items = self.serde.loads_typed((part["t"], part["d"]))
                    pieces.append((ref, len(items)))
                    whole.extend(items)
                value = whole + value
            if isinstance(value, list):
                pieces.append((refs[channel], len(value) - sum(n for _, n in pieces)))
            if seed and isinstance(value, list):
                self._grown.put((where.thread, where.ns, channel), Grown(value, pieces))
            values[channel] = value
        return values

    def _blobs(
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
            sealed = data if data is not None else self._cold_get(where, key)
            if sealed is None:
                if missing_ok:
                    continue
                raise RecordNotFound(f"langgraph blob {key}")
            out[key] = self._open(sealed, _blob_at(where, key))
        return out

    def _threads(self) -> list[str]:
        """Every thread with checkpoints in Redis (a scan: for `list(None)` and runs)."""
        names = list(self.redis.scan_iter(match=f"{LANGGRAPH_PREFIX}:*:name", count=1_000))
        found = cast(list[bytes | None], self.redis.mget(names)) if names else []
        return sorted(n.decode() for n in found if n is not None)

    def _namespaces(self, thread: str) -> list[str]:
        members = cast(set[bytes], self.redis.smembers(ThreadKeys(thread, "").namespaces()))
        return sorted({m.decode() for m in members} | set(self._cold_namespaces(thread)))

    # delete -------------------------------------------------------------------------------
    def delete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint, write and blob of a thread."""
        pattern = ThreadKeys(thread_id, "").base + "*"  # a slot holds no glob character
        doomed = list(self.redis.scan_iter(match=pattern, count=1_000))
        for start in range(0, len(doomed), 1_000):
            self.redis.delete(*doomed[start : start + 1_000])
        if self.cold is not None:
            self.cold.delete_docs(_cold_task(thread_id))
        self._grown.forget(lambda key: key[0] != thread_id)

    # the cold tier ------------------------------------------------------------------------
    def archive(self, thread_id: str, keep: int = 1) -> int:
        """Move all but the newest `keep` checkpoints of each namespace to the archive.

        Their records, writes and the blobs only they need are written to disk (durably)
        before they leave Redis; reads fall back to the archive. Returns how many moved.
        Raises `CairnError` without an archive.
        """
        if self.cold is None:
            raise CairnError("this CairnSaver has no archive directory")
        moved = 0
        for ns in self._namespaces(thread_id):
            where = ThreadKeys(thread_id, ns)
            ids = sorted(
                i.decode() for i in cast(list[bytes], self.redis.zrange(where.ids(), 0, -1))
            )
            going, staying = ids[: max(0, len(ids) - keep)], ids[max(0, len(ids) - keep) :]
            if going:
                self._archive_ids(where, going, staying)
                moved += len(going)
        return moved

    def _archive_ids(self, where: ThreadKeys, going: list[str], staying: list[str]) -> None:
        assert self.cold is not None
        records = self._records(where, going)
        needed = self._blob_keys(where, records.values())
        kept = self._blob_keys(where, self._records(where, staying).values())
        docs: dict[str, bytes] = {}
        for checkpoint_id in going:
            key = where.checkpoint(checkpoint_id)
            docs[_cold_name(key)] = cast(bytes, self._raw(where, key))
            writes = self._raw_writes(where, checkpoint_id)
            docs[_cold_name(where.writes(checkpoint_id))] = self._seal(
                writes, _writes_at(where, checkpoint_id)
            )
        for key in needed:
            docs[_cold_name(key)] = cast(bytes, self._raw(where, key))
        task = _cold_task(where.thread)
        docs[_ids_doc(where)] = self._seal(
            {"ids": sorted({*self._cold_ids(where), *going})}, _index_at(where)
        )
        docs[NSS_DOC] = self._seal({"nss": sorted({*self._cold_namespaces(where.thread),
                                                   where.ns})},
                                   _namespaces_at(where.thread))  # fmt: skip
        self.cold.put_docs(task, docs)  # on disk, durably, before anything leaves Redis
        pipe = self.redis.pipeline(transaction=True)
        pipe.zrem(where.ids(), *going)
        for checkpoint_id in going:
            pipe.delete(where.checkpoint(checkpoint_id), where.writes(checkpoint_id))
        for key in needed - kept:
            pipe.delete(key)
        pipe.execute()

    def _records(self, where: ThreadKeys, ids: list[str]) -> dict[str, dict[str, Any]]:
        """Checkpoint id → its record (hot or archived)."""
        return {
            i: self._open(cast(bytes, self._raw(where, where.checkpoint(i))),
                          _checkpoint_at(where, i))
            for i in ids
        }  # fmt: skip

    def _blob_keys(self, where: ThreadKeys, records: Iterable[dict[str, Any]]) -> set[str]:
        """Every stored blob the records' channels need, earlier pieces included."""
        direct = {where.blob(ch, ref): ch for r in records for ch, ref in r["v"].items()}
        stored = self._blobs(where, direct, missing_ok=True)
        needed = set(stored)
        for key, blob in stored.items():
            needed |= {where.blob(direct[key], v) for v in blob.get("base", ())}
        return needed

    def _raw(self, where: ThreadKeys, key: str) -> bytes | None:
        found = cast(bytes | None, self.redis.get(key))
        return found if found is not None else self._cold_get(where, key)

    def _raw_writes(self, where: ThreadKeys, checkpoint_id: str) -> dict[str, bytes]:
        hot = cast(dict[bytes, bytes], self.redis.hgetall(where.writes(checkpoint_id)))
        merged = {**self._cold_writes(where, checkpoint_id), **hot}
        return {k.decode(): v for k, v in merged.items()}

    def _cold_get(self, where: ThreadKeys, key: str) -> bytes | None:
        if self.cold is None:
            return None
        return self.cold.get_doc(_cold_task(where.thread), _cold_name(key))

    def _cold_writes(self, where: ThreadKeys, checkpoint_id: str) -> dict[bytes, bytes]:
        raw = self._cold_get(where, where.writes(checkpoint_id))
        if raw is None:
            return {}
        opened = self._open(raw, _writes_at(where, checkpoint_id))
        return {k.encode(): v for k, v in opened.items()}

    def _cold_ids(self, where: ThreadKeys) -> list[str]:
        if self.cold is None:
            return []
        raw = self.cold.get_doc(_cold_task(where.thread), _ids_doc(where))
        return [] if raw is None else list(self._open(raw, _index_at(where))["ids"])

    def _cold_namespaces(self, thread: str) -> list[str]:
        if self.cold is None:
            return []
        raw = self.cold.get_doc(_cold_task(thread), NSS_DOC)
        return [] if raw is None else list(self._open(raw, _namespaces_at(thread))["nss"])

    # the extended capabilities ------------------------------------------------------------
    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint of a thread, with its writes and blobs, to another (hot)."""
        pipe = self.redis.pipeline(transaction=False)
        for ns in self._namespaces(source_thread_id):
            source, target = ThreadKeys(source_thread_id, ns), ThreadKeys(target_thread_id, ns)
            ids = sorted(self._ids(source))
            records = self._records(source, ids)
            # Each record is sealed for its place, so the copy is sealed again for its own.
            for key in self._blob_keys(source, records.values()):
                copy = key.replace(source.base, target.base, 1)
                data = cast(bytes, self._raw(source, key))
                pipe.set(copy, self._reseal(data, _blob_at(source, key), _blob_at(target, copy)))
            for checkpoint_id in ids:
                record = cast(bytes, self._raw(source, source.checkpoint(checkpoint_id)))
                pipe.set(target.checkpoint(checkpoint_id), self._reseal(
                    record, _checkpoint_at(source, checkpoint_id),
                    _checkpoint_at(target, checkpoint_id)))  # fmt: skip
                for field, data in self._raw_writes(source, checkpoint_id).items():
                    pipe.hset(target.writes(checkpoint_id), field, self._reseal(
                        data, _write_at(source, checkpoint_id, field),
                        _write_at(target, checkpoint_id, field)))  # fmt: skip
                pipe.zadd(target.ids(), {checkpoint_id: 0})
            if ids:
                pipe.set(target.head(), ids[-1])
                pipe.sadd(target.namespaces(), ns)
                pipe.set(target.name(), target_thread_id)
        pipe.execute()

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete every checkpoint (and its writes) that one of `run_ids` made."""
        doomed_runs = set(run_ids)
        if not doomed_runs:
            return
        for thread in self._threads():
            for ns in self._namespaces(thread):
                where = ThreadKeys(thread, ns)
                records = self._records(where, self._ids(where))
                doomed = [i for i, r in records.items() if r.get("r") in doomed_runs]
                if doomed:
                    self._forget(where, doomed)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Keep only each namespace's latest checkpoint (`keep_latest`), or none (`delete`)."""
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"unknown prune strategy {strategy!r}")
        for thread in thread_ids:
            if strategy == "delete":
                self.delete_thread(thread)
                continue
            for ns in self._namespaces(thread):
                where = ThreadKeys(thread, ns)
                ids = self._ids(where)
                if len(ids) > 1:
                    self._forget(where, ids[1:], keep=ids[0])

    def _forget(self, where: ThreadKeys, doomed: list[str], keep: str | None = None) -> None:
        """Delete checkpoints and their writes, hot and archived.

        With `keep`, also the blobs only the deleted ones needed.
        """
        if keep is not None:
            needed = self._blob_keys(where, self._records(where, doomed).values())
            needed -= self._blob_keys(where, self._records(where, [keep]).values())
        else:
            needed = set()
        pipe = self.redis.pipeline(transaction=True)
        pipe.zrem(where.ids(), *doomed)
        for checkpoint_id in doomed:
            pipe.delete(where.checkpoint(checkpoint_id), where.writes(checkpoint_id))
        for key in needed:
            pipe.delete(key)
        remaining = sorted(set(self._ids(where)) - set(doomed))
        if remaining:
            pipe.set(where.head(), remaining[-1])
        else:
            pipe.delete(where.head())
        pipe.execute()
        if self.cold is not None and set(doomed) & set(self._cold_ids(where)):
            task = _cold_task(where.thread)
            for key in [*(where.checkpoint(i) for i in doomed),
                        *(where.writes(i) for i in doomed), *needed]:  # fmt: skip
                self.cold.delete_doc(task, _cold_name(key))
            left: list[str] = sorted(set(self._cold_ids(where)) - set(doomed))
            self.cold.put_docs(task, {_ids_doc(where): self._seal({"ids": left}, _index_at(where))})

    # async --------------------------------------------------------------------------------
    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """`get_tuple` on a thread, so the event loop is not blocked."""
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """`list`, read on a thread."""
        found = await asyncio.to_thread(
            lambda: list(self.list(config, filter=filter, before=before, limit=limit))
        )
        for item in found:
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """`put` on a thread."""
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """`put_writes` on a thread."""
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        """`delete_thread` on a thread."""
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """`copy_thread` on a thread."""
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """`delete_for_runs` on a thread."""
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """`prune` on a thread."""
        await asyncio.to_thread(self.prune, thread_ids, strategy=strategy)

    # list (last: inside the class, `list` names this method) -------------------------------
    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first, by thread, namespace, metadata, `before` and `limit`."""
        if config is not None:
            threads = [str(config["configurable"]["thread_id"])]
        else:
            threads = self._threads()
        wanted_ns = config["configurable"].get("checkpoint_ns") if config else None
        wanted_id = get_checkpoint_id(config) if config else None
        before_id = get_checkpoint_id(before) if before else None
        remaining = limit
        for thread in threads:
            for ns in self._namespaces(thread):
                if wanted_ns is not None and ns != wanted_ns:
                    continue
                where = ThreadKeys(thread, ns)
                for checkpoint_id in self._ids(where, before_id):
                    if wanted_id and checkpoint_id != wanted_id:
                        continue
                    if remaining is not None and remaining <= 0:
                        return
                    found = self._tuple(where, checkpoint_id)
                    if found is None or not _matches(found.metadata, filter):
                        continue
                    if remaining is not None:
                        remaining -= 1
                    yield found


def _cold_task(thread: str) -> str:
    """The archive's name for a thread's documents."""
    return f"lg-{langgraph_slot(thread)}"


def _cold_name(key: str) -> str:
    """The archive's name for the record Redis keeps at `key`."""
    return "r." + hashlib.sha256(key.encode(errors="surrogatepass")).hexdigest()[:48]


def _checkpoint_at(where: ThreadKeys, checkpoint_id: str) -> Place:
    """The place a checkpoint record is sealed for: its thread, namespace and id."""
    return Place("langgraph checkpoint", where.thread, (where.ns, checkpoint_id))


def _blob_at(where: ThreadKeys, key: str) -> Place:
    """The place a channel blob is sealed for: its thread and key (namespace, channel, ref)."""
    return Place("langgraph blob", where.thread, (key,))


def _write_at(where: ThreadKeys, checkpoint_id: str, field: str) -> Place:
    """The place a pending write is sealed for: its checkpoint, task id and index."""
    task_id, _, idx = field.rpartition("\x00")
    return Place("langgraph write", where.thread, (where.ns, checkpoint_id, task_id, idx))


def _writes_at(where: ThreadKeys, checkpoint_id: str) -> Place:
    """The place of a checkpoint's archived writes (one record holding them all)."""
    return Place("langgraph writes", where.thread, (where.ns, checkpoint_id))


def _index_at(where: ThreadKeys) -> Place:
    """The place of a namespace's archived checkpoint ids."""
    return Place("langgraph index", where.thread, (where.ns,))


def _namespaces_at(thread: str) -> Place:
    """The place of a thread's archived namespaces."""
    return Place("langgraph namespaces", thread)


def _ids_doc(where: ThreadKeys) -> str:
    return "ids." + hashlib.sha256(where.ns_key.encode()).hexdigest()[:40]


def _config(where: ThreadKeys, checkpoint_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": where.thread, "checkpoint_ns": where.ns,
                             "checkpoint_id": checkpoint_id}}  # fmt: skip


def _matches(metadata: CheckpointMetadata, wanted: dict[str, Any] | None) -> bool:
    return not wanted or all(metadata.get(k) == v for k, v in wanted.items())
