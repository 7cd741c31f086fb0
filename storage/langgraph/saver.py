"""CairnSaver: a LangGraph `BaseCheckpointSaver` on Redis (fenced puts) and a disk archive."""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import redis
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
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

from cairn.errors import CairnError
from cairn.storage.backends.disk import DiskArchive
from cairn.storage.backends.redis import script, translating
from cairn.storage.codec import Codec, Place
from cairn.storage.keys import ThreadKeys
from cairn.storage.langgraph.cold import ColdTier
from cairn.storage.langgraph.pieces import (
    MAX_PIECES,
    Grown,
    Recent,
    holds_value,
    no_value_ref,
    ref_of,
    stored_form,
)
from cairn.storage.langgraph.places import (
    blob_at,
    checkpoint_at,
    open_record,
    seal_record,
    write_at,
)
from cairn.storage.langgraph.threaded import ThreadedSaver
from cairn.storage.langgraph.tiers import Tiers

REMEMBERED = 1_000  # threads' channels (and forks) a saver remembers for its next put


class CairnSaver(ThreadedSaver):
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
        self._tiers = Tiers(client, self.codec, self.cold)
        self._cold_tier = ColdTier(client, self.codec, self.cold, self._tiers)
        # (thread, ns, channel) → the list last stored or read; bounded, for a saver that
        # serves many threads holds their histories.
        self._grown: Recent[tuple[str, str, str], Grown] = Recent(REMEMBERED)
        # (thread, ns, checkpoint id) a caller of this saver went back to (`_chosen`): a
        # put may fork from it (time travel).
        self._forks: Recent[tuple[str, str, str], bool] = Recent(REMEMBERED)
        # (thread, ns, checkpoint id) → its channels' blob refs, for a put of its child.
        self._refs: Recent[tuple[str, str, str], dict[str, str]] = Recent(REMEMBERED)

    # sealing ------------------------------------------------------------------------------
    def _seal(self, value: object, place: Place) -> bytes:
        return seal_record(self.codec, value, place)

    def _open(self, data: bytes, place: Place) -> dict[str, Any]:
        return open_record(self.codec, data, place)

    def _reseal(self, data: bytes, source: Place, target: Place) -> bytes:
        """A record sealed for `source`, verified, sealed again for `target` (a copy's)."""
        return self.codec.seal(self.codec.open(data, source), target).data

    # versions -----------------------------------------------------------------------------
    # LangGraph's version type is a TypeVar of int, float or str, one per saver; this one
    # serves threads of either kind, which its generics cannot say.
    def get_next_version(  # type: ignore[override]
        self, current: int | str | None, channel: None = None
    ) -> int | str:
        """The version after `current`: an integer after an integer (Cairn's own form).

        After a string (the form SqliteSaver, PostgresSaver and InMemorySaver write, met in
        a thread moved here from one of them) it is a string of theirs: the counter
        zero-padded to 32 digits, a dot and a random fraction, so one thread's versions
        stay of one type and ordered, and two branches that reach one count differ.
        """
        if current is None or isinstance(current, int):
            return (current or 0) + 1
        count = int(str(current).split(".", 1)[0]) + 1
        return f"{count:032}.{random.random():016}"  # noqa: S311 - apart, not secret

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
        thread since this one read it), unless a caller of this saver went back to that
        parent: read it by id, listed it before a named checkpoint, or read by id a
        checkpoint whose parent it is (LangGraph's replays, `update_state` forks,
        `__copy__` siblings, and the subgraphs of a replay).
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
            blobs.append(self._seal(blob, blob_at(where, blob_keys[-1])))
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
                  self._seal(record, checkpoint_at(where, checkpoint["id"])), where.thread,
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
        """The blob refs of the channels a put does not write, found where they were stored.

        Its parent's, as a put that extends a thread has. A channel the parent holds at
        another version (a `__copy__` of a checkpoint put beside it, under the copied one's
        parent, or with none when the copied one is a root) takes the ref of a checkpoint
        of the namespace a caller chose by id, the most recently chosen first: the one
        copied. One found nowhere is a blob stored under the plain version (the form of
        records stored before refs named their put) if there is one, else a version no put
        stored: the channel holds no value (`no_value_ref`), as LangGraph reads it.
        """
        refs = {channel: str(version) for channel, version in versions.items()}
        wanted = {ch: str(v) for ch, v in versions.items() if ch not in new}
        for known in self._ref_sources(where, parent, bool(wanted)):
            for channel, version in list(wanted.items()):
                ref = known.get(channel, "")
                if ref.split("@", 1)[0] == version:
                    refs[channel] = ref
                    del wanted[channel]
            if not wanted:
                break
        if wanted:
            keys = {where.blob(ch, version): ch for ch, version in wanted.items()}
            stored = self._blobs(where, keys, missing_ok=True)
            for key, channel in keys.items():
                if key not in stored:
                    refs[channel] = no_value_ref(wanted[channel])
        return refs

    def _ref_sources(
        self, where: ThreadKeys, parent: str, needed: bool
    ) -> Iterator[dict[str, str]]:
        """The refs a put may inherit from: its parent's, then the chosen checkpoints'."""
        if not needed:
            return
        if parent:
            yield self._parent_refs(where, parent)
        chosen = self._forks.newest(lambda key: key[:2] == (where.thread, where.ns))
        for key in chosen:
            known = self._refs.get(key)
            if known is not None:
                yield known

    def _parent_refs(self, where: ThreadKeys, checkpoint_id: str) -> dict[str, str]:
        """A stored checkpoint's blob refs: remembered from its put or read, else read."""
        known = self._refs.get((where.thread, where.ns, checkpoint_id))
        if known is not None:
            return known
        raw = self._tiers.raw(where, where.checkpoint(checkpoint_id))
        if raw is None:
            return {}
        refs: dict[str, str] = self._open(raw, checkpoint_at(where, checkpoint_id))["v"]
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
                                write_at(where, str(conf["checkpoint_id"]), field))  # fmt: skip
            # Special writes (errors, interrupts) replace; ordinary ones are written once.
            (pipe.hset if idx < 0 else pipe.hsetnx)(key, field, sealed)
        pipe.execute()

    # get ----------------------------------------------------------------------------------
    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint the config names, or its namespace's latest; None if none."""
        conf = config["configurable"]
        where = ThreadKeys(str(conf["thread_id"]), str(conf.get("checkpoint_ns", "")))
        checkpoint_id = get_checkpoint_id(config)
        chosen = bool(checkpoint_id)
        if not checkpoint_id:
            checkpoint_id = self._tiers.latest(where)
            if checkpoint_id is None:
                return None
        found = self._tuple(where, checkpoint_id, seed=True)
        if chosen and found is not None:
            self._chosen(found)
        return found

    def _chosen(self, found: CheckpointTuple) -> None:
        """Let a put fork from `found` and from its parent: a caller went back to them.

        Granted by a read by id and by a `list` before a named checkpoint. Reading the
        latest, or listing a thread's history, grants nothing: two writers that both read
        the head and both extend it are a race, and the second is fenced.
        """
        for config in (found.parent_config, found.config):  # the one read, most recent
            if config is not None:
                conf = config["configurable"]
                key = (str(conf["thread_id"]), str(conf["checkpoint_ns"]),
                       str(conf["checkpoint_id"]))  # fmt: skip
                self._forks.put(key, True)

    def _tuple(
        self, where: ThreadKeys, checkpoint_id: str, *, seed: bool = False
    ) -> CheckpointTuple | None:
        # One transaction: an archive moving this checkpoint between the two reads would
        # leave its record read from Redis and its writes from neither tier.
        pipe = self.redis.pipeline(transaction=True)
        pipe.get(where.checkpoint(checkpoint_id))
        pipe.hgetall(where.writes(checkpoint_id))
        raw, raw_writes = cast(tuple[bytes | None, dict[bytes, bytes]], pipe.execute())
        if raw is None:  # archived, or never there
            raw = self._tiers.archived(where, where.checkpoint(checkpoint_id))
            if raw is None:
                return None
            # Writes put after the checkpoint was archived are still in Redis.
            raw_writes = {**self._tiers.archived_writes(where, checkpoint_id), **raw_writes}
        record = self._open(raw, checkpoint_at(where, checkpoint_id))
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
            self._open(data, write_at(where, checkpoint_id, field.decode()))
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
        wanted = {ch: where.blob(ch, ref) for ch, ref in refs.items() if holds_value(ref)}
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
        """Blob key → its record, hot or archived (`Tiers.blobs`)."""
        return self._tiers.blobs(where, keys, missing_ok=missing_ok)

    # delete -------------------------------------------------------------------------------
    def delete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint, write and blob of a thread."""
        pattern = ThreadKeys(thread_id, "").base + "*"  # a slot holds no glob character
        doomed = list(self.redis.scan_iter(match=pattern, count=1_000))
        for start in range(0, len(doomed), 1_000):
            self.redis.delete(*doomed[start : start + 1_000])
        self._cold_tier.delete_thread(thread_id)
        self._grown.forget(lambda key: key[0] != thread_id)

    # the cold tier ------------------------------------------------------------------------
    def archive(self, thread_id: str, keep: int = 1) -> int:
        """Move all but the newest `keep` checkpoints of each namespace to the archive.

        Their records, writes and the blobs only they need are written to disk (durably)
        before they leave Redis; reads fall back to the archive. Safe beside puts,
        `put_writes` and other archivers, in this process or others: what is stored while
        it runs stays in Redis, and no archiver's index loses another's checkpoints.
        Returns how many it took out of Redis. Raises `CairnError` without an archive.
        """
        if self.cold is None:
            raise CairnError("this CairnSaver has no archive directory")
        return sum(
            self._cold_tier.archive(ThreadKeys(thread_id, ns), keep)
            for ns in self._tiers.namespaces(thread_id)
        )

    # the extended capabilities ------------------------------------------------------------
    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint of a thread, with its writes and blobs, to another (hot)."""
        pipe = self.redis.pipeline(transaction=False)
        for ns in self._tiers.namespaces(source_thread_id):
            source, target = ThreadKeys(source_thread_id, ns), ThreadKeys(target_thread_id, ns)
            ids = sorted(self._tiers.ids(source))
            records = self._tiers.records(source, ids)
            # Each record is sealed for its place, so the copy is sealed again for its own.
            for key in self._tiers.blob_keys(source, records.values()):
                copy = key.replace(source.base, target.base, 1)
                data = cast(bytes, self._tiers.raw(source, key))
                pipe.set(copy, self._reseal(data, blob_at(source, key), blob_at(target, copy)))
            for checkpoint_id in ids:
                record = cast(bytes, self._tiers.raw(source, source.checkpoint(checkpoint_id)))
                pipe.set(target.checkpoint(checkpoint_id), self._reseal(
                    record, checkpoint_at(source, checkpoint_id),
                    checkpoint_at(target, checkpoint_id)))  # fmt: skip
                for field, data in self._tiers.raw_writes(source, checkpoint_id).items():
                    pipe.hset(target.writes(checkpoint_id), field, self._reseal(
                        data, write_at(source, checkpoint_id, field),
                        write_at(target, checkpoint_id, field)))  # fmt: skip
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
        for thread in self._tiers.threads():
            for ns in self._tiers.namespaces(thread):
                where = ThreadKeys(thread, ns)
                records = self._tiers.records(where, self._tiers.ids(where))
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
            for ns in self._tiers.namespaces(thread):
                where = ThreadKeys(thread, ns)
                ids = self._tiers.ids(where)
                if len(ids) > 1:
                    self._forget(where, ids[1:], keep=ids[0])

    def _forget(self, where: ThreadKeys, doomed: list[str], keep: str | None = None) -> None:
        """Delete checkpoints and their writes, hot and archived.

        With `keep`, also the blobs only the deleted ones needed.
        """
        if keep is not None:
            needed = self._tiers.blob_keys(where, self._tiers.records(where, doomed).values())
            needed -= self._tiers.blob_keys(where, self._tiers.records(where, [keep]).values())
        else:
            needed = set()
        pipe = self.redis.pipeline(transaction=True)
        pipe.zrem(where.ids(), *doomed)
        for checkpoint_id in doomed:
            pipe.delete(where.checkpoint(checkpoint_id), where.writes(checkpoint_id))
        for key in needed:
            pipe.delete(key)
        remaining = sorted(set(self._tiers.ids(where)) - set(doomed))
        if remaining:
            pipe.set(where.head(), remaining[-1])
        else:
            pipe.delete(where.head())
        pipe.execute()
        self._cold_tier.forget(where, doomed, needed)

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
            threads = self._tiers.threads()
        wanted_ns = config["configurable"].get("checkpoint_ns") if config else None
        wanted_id = get_checkpoint_id(config) if config else None
        before_id = get_checkpoint_id(before) if before else None
        remaining = limit
        for thread in threads:
            for ns in self._tiers.namespaces(thread):
                if wanted_ns is not None and ns != wanted_ns:
                    continue
                where = ThreadKeys(thread, ns)
                for checkpoint_id in self._tiers.ids(where, before_id):
                    if wanted_id and checkpoint_id != wanted_id:
                        continue
                    if remaining is not None and remaining <= 0:
                        return
                    found = self._tuple(where, checkpoint_id)
                    if found is None or not _matches(found.metadata, filter):
                        continue
                    if remaining is not None:
                        remaining -= 1
                    if before_id:  # older than a named one: a caller going back in time
                        self._chosen(found)  # (LangGraph's replay finds subgraphs' so)
                    yield found


def _config(where: ThreadKeys, checkpoint_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": where.thread, "checkpoint_ns": where.ns,
                             "checkpoint_id": checkpoint_id}}  # fmt: skip


def _matches(metadata: CheckpointMetadata, wanted: dict[str, Any] | None) -> bool:
    return not wanted or all(metadata.get(k) == v for k, v in wanted.items())
