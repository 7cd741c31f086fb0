"""Where each record of a LangGraph thread lives: its `Place`, its name in the archive.

Every record is sealed by Cairn's codec for its `Place` (its kind, thread and position):
a record copied to another place, or another thread's record put in its stead, is
refused when read, in Redis and in the archive alike. Redis keeps a record under its key
(storage/keys.py); the archive keeps a thread's records under one name (`cold_task`),
each under a digest of its Redis key (`cold_name`), beside an index of each namespace's
archived checkpoints (`ids_doc`) and the list of the thread's namespaces (`NSS_DOC`).
"""

from __future__ import annotations

import hashlib
from typing import Any

import ormsgpack

from cairn.errors import CorruptCheckpoint
from cairn.storage.codec import Codec, Place
from cairn.storage.keys import ThreadKeys, langgraph_slot

NSS_DOC = "namespaces"  # the archive's list of a thread's archived namespaces


def seal_record(codec: Codec, value: object, place: Place) -> bytes:
    """`value` packed (msgpack) and sealed for `place`."""
    return codec.seal(ormsgpack.packb(value), place).data


def open_record(codec: Codec, data: bytes, place: Place) -> dict[str, Any]:
    """The map sealed in `data` for `place`; raises `CorruptCheckpoint` if it is no map."""
    found = ormsgpack.unpackb(codec.open(data, place))
    if not isinstance(found, dict):
        raise CorruptCheckpoint("langgraph record", "not a map")
    return found


def checkpoint_at(where: ThreadKeys, checkpoint_id: str) -> Place:
    """The place a checkpoint record is sealed for: its thread, namespace and id."""
    return Place("langgraph checkpoint", where.thread, (where.ns, checkpoint_id))


def blob_at(where: ThreadKeys, key: str) -> Place:
    """The place a channel blob is sealed for: its thread and key (namespace, channel, ref)."""
    return Place("langgraph blob", where.thread, (key,))


def write_at(where: ThreadKeys, checkpoint_id: str, field: str) -> Place:
    """The place a pending write is sealed for: its checkpoint, task id and index."""
    task_id, _, idx = field.rpartition("\x00")
    return Place("langgraph write", where.thread, (where.ns, checkpoint_id, task_id, idx))


def writes_at(where: ThreadKeys, checkpoint_id: str) -> Place:
    """The place of a checkpoint's archived writes (one record holding them all)."""
    return Place("langgraph writes", where.thread, (where.ns, checkpoint_id))


def index_at(where: ThreadKeys) -> Place:
    """The place of a namespace's archived checkpoint ids."""
    return Place("langgraph index", where.thread, (where.ns,))


def namespaces_at(thread: str) -> Place:
    """The place of a thread's archived namespaces."""
    return Place("langgraph namespaces", thread)


def cold_task(thread: str) -> str:
    """The archive's name for a thread's documents."""
    return f"lg-{langgraph_slot(thread)}"


def cold_name(key: str) -> str:
    """The archive's name for the record Redis keeps at `key`."""
    return "r." + hashlib.sha256(key.encode(errors="surrogatepass")).hexdigest()[:48]


def ids_doc(where: ThreadKeys) -> str:
    """The archive's name for a namespace's index of archived checkpoint ids."""
    return "ids." + hashlib.sha256(where.ns_key.encode()).hexdigest()[:40]
