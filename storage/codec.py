"""Sealing records into checksummed, optionally compressed bytes, and opening them again.

The stored form of every record and blob is an envelope:

    b"CRN1" | flags (1 byte) | digest (32 bytes) | crc32 of body (4 bytes) | body

`digest` is SHA-256 of the canonical bytes, or HMAC-SHA256 with the codec's signing key
(the `CAIRN_SIGNING_KEY` setting; flag bit 1). A record is bound to its `Place` (flag bit
2): the digest covers the place (task, kind, number or id) before the bytes, so a sound
record copied to another task, number or id fails its check as damaged bytes do. `body`
is the canonical bytes, zstd-compressed (flag bit 0) when larger than `compress_above`.
Opening checks the CRC of the stored body (so even a changed byte that would decompress
to the same content, such as an unused bit of a zstd frame header, is refused),
decompresses with a size cap, recomputes the digest and compares it in constant time:
any changed byte is refused, never half-used.

Content-addressed blobs are neither bound nor signed: their address is the SHA-256 of
their content and a signed record names it. Records sealed before records were bound stay
readable where nothing is signed; with a key, a signed unbound record is read only where
its own fields name the place it is read from (an LC's task, agent and id; a GC's task
and number), so an old signed record cannot be replayed anywhere else.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import threading
import zlib
from dataclasses import dataclass
from typing import TypeVar

import orjson
import zstandard
from pydantic import BaseModel, ValidationError

from cairn.errors import CorruptCheckpoint, RecordTooLarge
from cairn.storage.records import SCHEMA_VERSION, Record
from cairn.storage.upcast import needs_json, upcast

MAGIC = b"CRN1"
FLAG_ZSTD = 0x01
FLAG_HMAC = 0x02
FLAG_BOUND = 0x04
KNOWN_FLAGS = FLAG_ZSTD | FLAG_HMAC | FLAG_BOUND
# Opens every binding: no JSON record or msgpack map starts with a zero byte, so a bound
# digest never equals an unbound one of other bytes.
BINDING_TAG = "cairn-place-1"
DIGEST_END = len(MAGIC) + 1 + 32
HEADER_SIZE = DIGEST_END + 4
MAX_RECORD_BYTES = 512 * 1024 * 1024  # refuse to inflate anything larger (a zstd bomb)
MAX_SEALED_BYTES = 64 * 1024 * 1024  # refuse to write a record larger (canonical bytes)
# A delta LC (one message, ~1.3 KB) is cheaper to store plainly than to compress; a full
# one (hundreds of KB of repetitive JSON) shrinks ~5x. 4 KiB separates them.
DEFAULT_COMPRESS_ABOVE = 4096
ZSTD_LEVEL = 3
# A global checkpoint is mostly LC ids and hex checksums, which zstd's level 1 packs at
# least as small as level 3: measured on GCs of 32, 128 and 1,000 agents, 2-13% smaller,
# 1.3-2.4x faster in a loop and 2.6-3x within a commit (cold caches). Prose-heavy LCs,
# 2.5% smaller at level 3, keep it.
GC_ZSTD_LEVEL = 1

R = TypeVar("R", bound=Record)


@dataclass(frozen=True, slots=True)
class Place:
    """Where a record belongs: its kind, its task, and its agent and id, number or name.

    A bound record's digest covers its place, so it opens only where it was sealed for.
    `fields` are the record's own fields that name the place (an LC's, a GC's): they are
    how a signed record sealed before records were bound is still placed.
    """

    kind: str
    task: str
    at: tuple[str, ...] = ()
    fields: tuple[tuple[str, str | int], ...] = ()

    @classmethod
    def lc(cls, task: str, agent: str, lc_id: str) -> Place:
        """A local checkpoint's place: its task, agent and id."""
        return cls("lc", task, (agent, lc_id), (("task", task), ("agent", agent), ("id", lc_id)))

    @classmethod
    def gc(cls, task: str, number: int) -> Place:
        """A global checkpoint's place: its task and number."""
        return cls("gc", task, (str(number),), (("task", task), ("number", number)))

    @classmethod
    def doc(cls, task: str, name: str) -> Place:
        """A task document's place (spec, limits, an approval, the epoch floor)."""
        return cls("doc", task, (name,))

    @property
    def name(self) -> str:
        """How errors name the record: `lc task/agent/id`, `gc task/3`, `doc task/spec`."""
        return f"{self.kind} {'/'.join((self.task, *self.at))}"

    def binding(self) -> bytes:
        """The bytes the digest covers before the record's: each part, length-prefixed."""
        return _binding(self.kind, self.task, self.at)


@functools.lru_cache(maxsize=4096)  # a step seals and opens a few places many times
def _binding(kind: str, task: str, at: tuple[str, ...]) -> bytes:
    """`Place.binding`: the count of parts, then each part's length and UTF-8 bytes."""
    out = bytearray((3 + len(at)).to_bytes(2, "big"))
    for part in (BINDING_TAG, kind, task, *at):
        raw = part.encode(errors="surrogatepass")
        out += len(raw).to_bytes(4, "big")
        out += raw
    return bytes(out)


@dataclass(frozen=True, slots=True)
class Sealed:
    """A record's stored bytes with the checksum they carry (hex) and their size."""

    data: bytes
    checksum: str

    @property
    def size(self) -> int:
        """Bytes as stored (after compression)."""
        return len(self.data)


def canonical_bytes(record: BaseModel) -> bytes:
    """Return the record as JSON with sorted keys and no spaces: equal records, equal bytes.

    orjson does it 2.6x faster than the stdlib on a 1,000-message LC (`make bench`); the
    stdlib takes over only for integers beyond 64 bits, which orjson refuses.
    """
    data = record.model_dump(mode="json")
    try:
        return orjson.dumps(data, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return json.dumps(
            data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        ).encode()


class _Zstd(threading.local):
    """zstd contexts are not thread-safe; one set per thread, reused across calls."""

    def __init__(self) -> None:
        self.compressors: dict[int, zstandard.ZstdCompressor] = {}
        self.decompressor = zstandard.ZstdDecompressor()

    def compressor(self, level: int) -> zstandard.ZstdCompressor:
        """Return this thread's compressor at `level`, made on first use."""
        found = self.compressors.get(level)
        if found is None:
            found = self.compressors[level] = zstandard.ZstdCompressor(level=level)
        return found


class Codec:
    """Seals and opens envelopes; holds the signing key and the compression threshold."""

    def __init__(
        self, signing_key: bytes | None = None, compress_above: int = DEFAULT_COMPRESS_ABOVE
    ) -> None:
        self._key = signing_key or None
        self._compress_above = compress_above
        self._zstd = _Zstd()

    @property
    def signs(self) -> bool:
        """True when records are signed with HMAC-SHA256 rather than plainly hashed."""
        return self._key is not None

    def seal(
        self,
        payload: bytes,
        place: Place | None = None,
        *,
        keyed: bool = True,
        level: int = ZSTD_LEVEL,
    ) -> Sealed:
        """Wrap `payload` in an envelope bound to `place` (None: unbound).

        `keyed=False` forces plain, unbound SHA-256: a blob, whose checksum is its address.
        `level` is the zstd level used if the payload is compressed; any level opens alike.
        """
        flags = 0
        binding = b""
        if not keyed:
            digest = hashlib.sha256(payload).digest()
        else:
            if place is not None:
                binding = place.binding()
                flags |= FLAG_BOUND
            digest = self._digest(binding, payload)
            if self._key is not None:
                flags |= FLAG_HMAC
        body = payload
        if len(payload) > self._compress_above:
            body = self._zstd.compressor(level).compress(payload)
            flags |= FLAG_ZSTD
        crc = zlib.crc32(body).to_bytes(4, "big")
        return Sealed(MAGIC + bytes((flags,)) + digest + crc + body, digest.hex())

    def _digest(self, binding: bytes, payload: bytes, *, signed: bool = True) -> bytes:
        """HMAC-SHA256 (with a key, when `signed`) or SHA-256 of `binding` then `payload`.

        Two updates rather than one joined input: binding costs its few bytes, never a copy
        of the payload.
        """
        if signed and self._key is not None:
            mac = hmac.new(self._key, binding, hashlib.sha256)
            mac.update(payload)
            return mac.digest()
        plain = hashlib.sha256(binding)
        plain.update(payload)
        return plain.digest()

    def open(self, data: bytes, place: Place | str, *, expect_digest: str | None = None) -> bytes:
        """Return the verified payload of an envelope, or raise `CorruptCheckpoint`.

        `place` is where the record is read from; a bare name (a blob's, or a record's read
        unplaced) opens unbound envelopes only. `expect_digest` (hex) is the digest the
        caller already trusts, such as a blob's address or the checksum a global checkpoint
        names; it must match too.
        """
        if len(data) < HEADER_SIZE or data[:4] != MAGIC:
            raise CorruptCheckpoint(_named(place), "truncated or not a Cairn record")
        flags = data[4]
        if flags & ~KNOWN_FLAGS:
            raise CorruptCheckpoint(_named(place), f"unknown flags {flags:#04x}")
        binding = b""
        if flags & FLAG_BOUND:
            if isinstance(place, str):
                raise CorruptCheckpoint(_named(place), "bound to a place, but read without one")
            binding = place.binding()
        digest = data[5:DIGEST_END]
        body = data[HEADER_SIZE:]
        if zlib.crc32(body).to_bytes(4, "big") != data[DIGEST_END:HEADER_SIZE]:
            raise CorruptCheckpoint(_named(place), "stored bytes damaged (CRC mismatch)")
        payload = self._decompress(body, place) if flags & FLAG_ZSTD else body
        if flags & FLAG_HMAC:
            if self._key is None:
                raise CorruptCheckpoint(
                    _named(place), "signed, but no CAIRN_SIGNING_KEY is configured"
                )
        elif self._key is not None and expect_digest is None:
            # With a key configured, only content-addressed blobs may be unsigned: their
            # address (expect_digest) is itself the proof.
            raise CorruptCheckpoint(
                _named(place), "unsigned, but CAIRN_SIGNING_KEY requires a signature"
            )
        actual = self._digest(binding, payload, signed=bool(flags & FLAG_HMAC))
        if not hmac.compare_digest(actual, digest):
            # A bound record fails alike when damaged and when copied from another place.
            where = ": damaged, or sealed for another place" if flags & FLAG_BOUND else ""
            raise CorruptCheckpoint(_named(place), f"checksum mismatch{where}")
        if expect_digest is not None and not hmac.compare_digest(digest.hex(), expect_digest):
            raise CorruptCheckpoint(
                _named(place), f"checksum {digest.hex()[:12]}… is not the one named"
            )
        if flags & FLAG_HMAC and not flags & FLAG_BOUND and isinstance(place, Place):
            _check_named(place, payload)
        return payload

    @staticmethod
    def named_digest(data: bytes) -> str | None:
        """The checksum an envelope's header names (hex), unverified; None if not an envelope.

        Enough to tell two sealed copies of a record apart or alike; `open` before using one.
        """
        if len(data) < HEADER_SIZE or data[:4] != MAGIC:
            return None
        return data[5:DIGEST_END].hex()

    def _decompress(self, body: bytes, place: Place | str) -> bytes:
        try:
            # A damaged frame header can declare any size: check it before allocating it.
            declared = zstandard.frame_content_size(body)
            if declared > MAX_RECORD_BYTES:
                raise CorruptCheckpoint(_named(place), f"frame declares {declared} bytes")
            return self._zstd.decompressor.decompress(body, max_output_size=MAX_RECORD_BYTES)
        except (zstandard.ZstdError, MemoryError) as exc:
            raise CorruptCheckpoint(_named(place), f"cannot decompress: {exc}") from None

    def encode(
        self, record: Record, place: Place | None = None, *, level: int = ZSTD_LEVEL
    ) -> Sealed:
        """Seal a record's canonical bytes, bound to `place` (signed when a key is configured).

        Raises `RecordTooLarge` when they are over `MAX_SEALED_BYTES`. Blobs (`seal`) are
        bounded by the workspace limits instead: a file may be larger than any record.
        """
        payload = canonical_bytes(record)
        if len(payload) > MAX_SEALED_BYTES:
            raise RecordTooLarge(_describe(record), len(payload), MAX_SEALED_BYTES)
        return self.seal(payload, place, level=level)

    def decode(
        self,
        data: bytes,
        model: type[R],
        place: Place | str,
        *,
        expect_digest: str | None = None,
    ) -> R:
        """Open and parse a record sealed for `place`; `checksum` and `size` come from the envelope.

        A record of a newer schema than this reader knows is refused.
        """
        return self.decode_keeping(data, model, place, expect_digest=expect_digest)[0]

    def decode_keeping(
        self,
        data: bytes,
        model: type[R],
        place: Place | str,
        *,
        expect_digest: str | None = None,
    ) -> tuple[R, bytes]:
        """`decode`, also returning the verified canonical JSON, for `parse` to read more of."""
        payload = self.open(data, place, expect_digest=expect_digest)
        record = parse(model, payload, _named(place))
        record.checksum = data[5:DIGEST_END].hex()
        record.size = len(data)
        return record, payload


def parse(model: type[R], payload: bytes, name: str) -> R:
    """Parse a record's verified canonical JSON into `model`, or raise `CorruptCheckpoint`.

    A record of a newer schema than this reader knows is refused, naming its version.
    """
    record = _validate(model, payload, name)
    _check_version(record.schema_version, name)
    if record.schema_version < SCHEMA_VERSION and needs_json(record.schema_version):
        return _upcast(model, payload, name)
    return record


def _validate(model: type[R], payload: bytes, name: str) -> R:
    """Parse verified canonical JSON into `model`, or raise `CorruptCheckpoint`."""
    try:
        return model.model_validate_json(payload)
    except ValidationError as exc:
        # A record of a newer schema fails on its new fields: say so rather than which.
        version = _peek_version(payload)
        _check_version(version, name)
        if isinstance(version, int) and version < SCHEMA_VERSION and needs_json(version):
            return _upcast(model, payload, name)  # an older shape, fields renamed or moved
        raise _unparsable(name, exc) from None


def _upcast(model: type[R], payload: bytes, name: str) -> R:
    """Parse a record of an older schema through its upcasters (storage/upcast.py)."""
    try:
        return model.model_validate(upcast(orjson.loads(payload)))
    except ValidationError as exc:
        raise _unparsable(name, exc) from None


def _unparsable(name: str, exc: ValidationError) -> CorruptCheckpoint:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "record"
    return CorruptCheckpoint(name, f"unparsable: {where}: {first['msg']}")


def _peek_version(payload: bytes) -> object:
    """The `schema_version` a payload claims, unvalidated; None if it names none."""
    try:
        found = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    return found.get("schema_version") if isinstance(found, dict) else None


def _check_version(version: object, name: str) -> None:
    """Raise `CorruptCheckpoint` for a schema version newer than this reader knows."""
    if isinstance(version, int) and version > SCHEMA_VERSION:
        raise CorruptCheckpoint(name, f"schema version {version} is newer than {SCHEMA_VERSION}")


def _named(place: Place | str) -> str:
    """How an error names the record read from `place` (a Place, or a bare name)."""
    return place if isinstance(place, str) else place.name


def _check_named(place: Place, payload: bytes) -> None:
    """Refuse a signed, unbound record unless its own fields name `place`.

    It was signed before records were bound: anyone holding a copy could otherwise replay
    it at another place. An LC or a GC names its own; a document does not.
    """
    if not place.fields:
        raise CorruptCheckpoint(place.name, "signed without a binding to its place")
    try:
        found = orjson.loads(payload)
    except orjson.JSONDecodeError:
        found = None
    if not isinstance(found, dict) or any(found.get(k) != v for k, v in place.fields):
        raise CorruptCheckpoint(place.name, "signed without a binding, for another place")


def _describe(record: Record) -> str:
    """Name `record` for an error: its kind and, when it has them, its task, agent and id."""
    parts = [type(record).__name__]
    parts += [str(v) for f in ("task", "agent", "id") if (v := getattr(record, f, None))]
    return " ".join(parts)
