"""Write golden files: one stored record of each kind Cairn keeps, and what each decodes to.

Run it from the repository root, with the code whose stored form is to be pinned:

    python -m tests.golden.generate [ROOT]

It writes `ROOT/v<SCHEMA_VERSION>/` (ROOT defaults to this file's directory): the sealed
bytes of each record as Redis and the archive hold them, and `expected.json`, what each
decodes to. It refuses to touch a version directory that exists: golden files of a version
are never rewritten. Every id, time and content is fixed, so two runs write the same bytes.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import Checkpoint, CheckpointMetadata

from cairn.storage.backends.redis import connect
from cairn.storage.chain import rebuild
from cairn.storage.codec import FLAG_HMAC, FLAG_ZSTD, GC_ZSTD_LEVEL, Codec, Sealed, canonical_bytes
from cairn.storage.keys import ThreadKeys
from cairn.storage.langgraph import CairnSaver
from cairn.storage.langgraph.pieces import ref_of
from cairn.storage.records import (
    SCHEMA_VERSION,
    AgentResult,
    AgentState,
    ContextView,
    Effects,
    GCOrigin,
    GCStatus,
    GlobalCheckpoint,
    ImagePart,
    InboxMessage,
    LCRef,
    LocalCheckpoint,
    Message,
    Role,
    Spawned,
    SpawnRequest,
    ToolCall,
    TraceRecord,
    Usage,
    WorkspaceManifest,
)
from cairn.testing.redis_server import RedisServer

# A key for these files only; the test holds the same bytes. Never a real CAIRN_SIGNING_KEY.
SIGNING_KEY = b"golden-test-key"

TASK = "golden"
AGENT = "alice"
TEAMMATE = "bob"
SIGNED_AGENT = "carol"
FULL_ID = "01942a3c-1e00-7000-8000-00000000a001"
DELTA_ID = "01942a3c-2e00-7000-8000-00000000a002"
SIGNED_ID = "01942a3c-3e00-7000-8000-00000000c001"
GC_NUMBER = 1
EPOCH = 1
START = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)

THREAD = "golden-thread"
LG_PARENT_ID = "1efc8a3e-0000-6000-8000-000000000001"
LG_ID = "1efc8a3e-0000-6001-8000-000000000002"
LG_CHANNEL = "messages"
LG_VERSION = "00000000000000000000000000000002.0.5821837218457293"

FILES = {
    "lc_full": "lc-full.rec",
    "lc_delta": "lc-delta.rec",
    "lc_signed": "lc-signed.rec",
    "gc": "gc.rec",
    "manifest": "manifest.rec",
    "file_blob": "blob-notes.rec",
    "lg_checkpoint": "lg-checkpoint.rec",
    "lg_blob": "lg-blob.rec",
}


# A 1x1 PNG, as a tool result's image (base64).
PIXEL_PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4"
    "2mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)

# Each LC's model call; costs are exact in binary, so they read back as written.
FULL_CALL = Usage(prompt_tokens=812, completion_tokens=164, cached_tokens=512, cost_usd=0.25)
DELTA_CALL = Usage(prompt_tokens=1024, completion_tokens=32, cached_tokens=960, cost_usd=0.125)
SUMMARY_CALL = Usage(
    prompt_tokens=2048, completion_tokens=64, cost_usd=0.5, cache_write_tokens=1536
)
SUMMARY = "[Summary of the 4 earlier messages of this conversation]\nNotes are in notes.md."
SIGNED_CALL = Usage(prompt_tokens=300, completion_tokens=20, cost_usd=0.0625)


def at(seconds: float) -> datetime:
    """A fixed time, `seconds` after the golden task began."""
    return START + timedelta(seconds=seconds)


def notes_file() -> bytes:
    """The one workspace file: long enough that an LC quoting it is stored compressed."""
    lines = [
        f"{n:02d}. the survey of site {n} found {n % 7} cairns, {n % 3} fallen" for n in range(50)
    ]
    return ("# Survey notes\n\n" + "\n".join(lines) + "\n").encode()


def build_full_lc(manifest_id: str, notes_sha: str) -> LocalCheckpoint:
    """Alice's first step LC (full): two tool calls, their results (one with an image), more."""
    notes = notes_file().decode()
    calls = [
        ToolCall(id="call_1", name="write_file", args={"path": "notes.md", "content": notes}),
        ToolCall(
            id="call_2",
            name="http_post",
            args={"url": "https://example.org/survey", "body": {"sites": 90}},
        ),
        ToolCall(id="call_3", name="read_file", args={"path": "missing.md"}),
    ]
    return LocalCheckpoint(
        id=FULL_ID,
        depth=0,
        full=True,
        created_at=at(4),
        task=TASK,
        agent=AGENT,
        step=1,
        superstep=0,
        status=AgentState.ACTIVE,
        epoch=EPOCH,
        attempt=1,
        messages=[
            Message(role=Role.SYSTEM, content="You are alice, a surveyor. Keep notes."),
            Message(role=Role.USER, content="Write up the survey and report it."),
            Message(role=Role.ASSISTANT, content="Writing the notes first.", tool_calls=calls),
            Message(
                role=Role.TOOL, content="wrote notes.md", name="write_file", tool_call_id="call_1"
            ),
            Message(
                role=Role.TOOL,
                content='{"status": 201}\n[image/png, 70 bytes]',
                name="http_post",
                tool_call_id="call_2",
                images=[ImagePart(media_type="image/png", data=PIXEL_PNG)],
            ),
            Message(
                role=Role.TOOL,
                content="error: no such file: missing.md",
                name="read_file",
                tool_call_id="call_3",
                error=True,
            ),
            Message(role=Role.ASSISTANT, content="Notes written and the survey reported."),
        ],
        trace=[
            TraceRecord(
                step=1,
                superstep=0,
                started_at=at(0),
                finished_at=at(1.25),
                duration_ms=1250.0,
                usage=FULL_CALL,
            ),
            TraceRecord(
                step=1,
                superstep=0,
                tool="write_file",
                arguments={"path": "notes.md", "content": notes},
                result="wrote notes.md",
                effects=Effects.WORKSPACE,
                started_at=at(1.25),
                finished_at=at(1.5),
                duration_ms=250.0,
            ),
            TraceRecord(
                step=1,
                superstep=0,
                tool="http_post",
                arguments={"url": "https://example.org/survey", "body": {"sites": 90}},
                result={"status": 201},
                side_effect=True,
                effects=Effects.EXTERNAL,
                idempotency_key="golden:alice:0:1:5c0ffee5c0ffee55",
                started_at=at(1.5),
                finished_at=at(3.75),
                duration_ms=2250.0,
            ),
            TraceRecord(
                step=1,
                superstep=0,
                tool="read_file",
                arguments={"path": "missing.md"},
                error="no such file: missing.md",
                effects=Effects.NONE,
                started_at=at(3.75),
                finished_at=at(3.875),
                duration_ms=125.0,
            ),
        ],
        workspace_after=manifest_id,
        changes={"notes.md": notes_sha, "draft.md": None},
        usage=FULL_CALL,
        kind_state={"plan": ["survey", "notes"], "done": 1, "draft": None},
        outbox=[
            InboxMessage(
                id="01942a3c-1e01-7000-8000-00000000b001",
                seq=0,
                sender=AGENT,
                recipient=TEAMMATE,
                superstep=0,
                content="Notes are in notes.md.",
            )
        ],
    )


def build_delta_lc(
    parent: LocalCheckpoint, parent_checksum: str, manifest_id: str
) -> LocalCheckpoint:
    """Alice's next step LC: a delta holding only what her first one lacked."""
    return LocalCheckpoint(
        id=DELTA_ID,
        parent_id=parent.id,
        parent_checksum=parent_checksum,
        depth=1,
        full=False,
        created_at=at(64),
        task=TASK,
        agent=AGENT,
        step=2,
        superstep=1,
        status=AgentState.FINISHED,
        epoch=EPOCH,
        attempt=2,
        message_base=len(parent.messages),
        trace_base=len(parent.trace),
        messages=[
            Message(role=Role.USER, content="[from bob] Thanks, reading them now."),
            Message(role=Role.ASSISTANT, content="Done: the survey is written up."),
        ],
        trace=[
            TraceRecord(
                step=2,
                superstep=1,
                result=SUMMARY,
                started_at=at(58),
                finished_at=at(60),
                duration_ms=2000.0,
                usage=SUMMARY_CALL,
                compacted=4,
            ),
            TraceRecord(
                step=2,
                superstep=1,
                started_at=at(60),
                finished_at=at(63.5),
                duration_ms=3500.0,
                usage=DELTA_CALL,
            ),
        ],
        workspace_before=manifest_id,
        workspace_after=manifest_id,
        inbox_cursor=1,
        usage=FULL_CALL.plus(SUMMARY_CALL).plus(DELTA_CALL),
        context=ContextView(
            head=2,
            start=6,
            summary=SUMMARY,
            folded=4,
            counted=1024,
            counted_at=len(parent.messages) + 1,
        ),
        result=AgentResult(value={"sites": 90, "cairns": [4, 0, 6]}, superstep=1),
        spawns=[
            SpawnRequest(
                name="dave",
                spec={"name": "dave", "model": "scripted", "tools": ["read_file", "finish"]},
                brief="Check the fallen cairns of sites 2 and 5.",
            )
        ],
        outbox=[
            InboxMessage(
                id="01942a3c-2e01-7000-8000-00000000b002",
                seq=0,
                sender=AGENT,
                recipient=TEAMMATE,
                superstep=1,
                content="All done.",
            )
        ],
    )


def build_gc(head: LCRef, outbox: list[InboxMessage], manifest_id: str) -> GlobalCheckpoint:
    """Superstep 1's committed GC: alice's delta LC, the workspace, bob's inbox.

    Written by a restore of GC 0 (from v7, a GC says what wrote it), so its origin and
    source are both stored.
    """
    return GlobalCheckpoint(
        task=TASK,
        number=GC_NUMBER,
        superstep=1,
        status=GCStatus.COMMITTED,
        epoch=EPOCH,
        members={AGENT: head},
        statuses={AGENT: AgentState.FINISHED},
        workspace=manifest_id,
        inbox=[m.model_copy(update={"seq": 2}) for m in outbox],
        delivered={TEAMMATE: 2},
        spawned={
            AGENT: Spawned(
                parent=TEAMMATE,
                superstep=0,
                spec={"name": AGENT, "model": "scripted", "system": "You are alice, a surveyor."},
            )
        },
        created_at=at(65),
        committed_at=at(65.5),
        origin=GCOrigin.RESTORE,
        source=0,
    )


def build_signed_lc(manifest_id: str) -> LocalCheckpoint:
    """Carol's first LC, the one sealed with HMAC: waiting for a person's approval."""
    return LocalCheckpoint(
        id=SIGNED_ID,
        created_at=at(70),
        task=TASK,
        agent=SIGNED_AGENT,
        step=1,
        superstep=1,
        status=AgentState.WAITING_APPROVAL,
        epoch=EPOCH,
        attempt=1,
        messages=[
            Message(role=Role.SYSTEM, content="You are carol, the reviewer."),
            Message(
                role=Role.ASSISTANT,
                tool_calls=[ToolCall(id="call_9", name="publish", args={"path": "notes.md"})],
            ),
        ],
        trace=[
            TraceRecord(
                step=1,
                superstep=1,
                started_at=at(66),
                finished_at=at(68),
                duration_ms=2000.0,
                usage=SIGNED_CALL,
            )
        ],
        workspace_before=manifest_id,
        usage=SIGNED_CALL,
    )


def store_langgraph_checkpoint(scratch: Path) -> tuple[bytes, bytes, dict[str, Any]]:
    """Put one checkpoint through `CairnSaver` on a private Redis; its record, blob, fields.

    The record and the channel's blob are the bytes `lg_put` stored, read back from Redis.
    """
    checkpoint = cast(
        Checkpoint,
        {
            "v": 2,
            "id": LG_ID,
            "ts": "2025-01-02T03:05:10.250000+00:00",
            "channel_values": {
                LG_CHANNEL: [
                    {"role": "user", "content": "How many cairns at site 7?"},
                    {"role": "assistant", "content": "None; site 7 has 0 cairns, 1 fallen."},
                ]
            },
            "channel_versions": {LG_CHANNEL: LG_VERSION},
            "versions_seen": {"answer": {LG_CHANNEL: "00000000000000000000000000000001.0.1"}},
            "updated_channels": [LG_CHANNEL],
        },
    )
    metadata = cast(CheckpointMetadata, {"source": "loop", "step": 1, "parents": {}})
    config: RunnableConfig = {
        "configurable": {"thread_id": THREAD, "checkpoint_ns": "", "checkpoint_id": LG_PARENT_ID},
        "metadata": {"run_id": "golden-run"},
    }
    server = RedisServer(scratch / "redis").start()
    try:
        client = connect(server.url)
        saver = CairnSaver(client)
        saver.put(config, checkpoint, metadata, {LG_CHANNEL: LG_VERSION})
        where = ThreadKeys(THREAD, "")
        ref = ref_of(LG_VERSION, LG_ID)
        record = cast(bytes, client.get(where.checkpoint(LG_ID)))
        blob = cast(bytes, client.get(where.blob(LG_CHANNEL, ref)))
        found = saver.get_tuple({"configurable": {"thread_id": THREAD, "checkpoint_id": LG_ID}})
        assert found is not None
        client.close()
    finally:
        server.stop()
    fields = {
        "thread": THREAD,
        "ns": "",
        "checkpoint_id": LG_ID,
        "parent_id": LG_PARENT_ID,
        "blobs": {LG_CHANNEL: ref},
        "checkpoint": found.checkpoint,
        "metadata": found.metadata,
        "pending_writes": found.pending_writes,
    }
    return record, blob, fields


def describe(sealed: Sealed, record: dict[str, Any]) -> dict[str, Any]:
    """What expected.json says of one sealed record: its envelope and decoded fields."""
    flags = sealed.data[4]
    return {
        "checksum": sealed.checksum,
        "size": sealed.size,
        "compressed": bool(flags & FLAG_ZSTD),
        "signed": bool(flags & FLAG_HMAC),
        "record": record,
    }


def build_version() -> tuple[dict[str, bytes], dict[str, Any]]:
    """Every golden file's bytes, by role, and the expected.json document."""
    plain, signing = Codec(), Codec(signing_key=SIGNING_KEY)
    notes = notes_file()
    notes_blob = plain.seal(notes, keyed=False)  # as CheckpointStore.put_blob seals a file
    manifest = WorkspaceManifest(files={"notes.md": notes_blob.checksum})
    manifest_blob = plain.seal(canonical_bytes(manifest), keyed=False)  # as put_manifest
    manifest_id = manifest_blob.checksum
    full = build_full_lc(manifest_id, notes_blob.checksum)
    full_sealed = plain.encode(full)
    delta = build_delta_lc(full, full_sealed.checksum, manifest_id)
    delta_sealed = plain.encode(delta)
    gc = build_gc(LCRef(id=DELTA_ID, checksum=delta_sealed.checksum), delta.outbox, manifest_id)
    gc_sealed = plain.encode(gc, level=GC_ZSTD_LEVEL)  # as CheckpointStore.seal_gc seals it
    signed = build_signed_lc(manifest_id)
    signed_sealed = signing.encode(signed)
    full.checksum, delta.checksum = full_sealed.checksum, delta_sealed.checksum
    state = rebuild([delta, full])
    with tempfile.TemporaryDirectory() as scratch:
        lg_record, lg_blob, lg_fields = store_langgraph_checkpoint(Path(scratch))
    data = {
        "lc_full": full_sealed.data,
        "lc_delta": delta_sealed.data,
        "lc_signed": signed_sealed.data,
        "gc": gc_sealed.data,
        "manifest": manifest_blob.data,
        "file_blob": notes_blob.data,
        "lg_checkpoint": lg_record,
        "lg_blob": lg_blob,
    }
    expected = {
        "schema_version": SCHEMA_VERSION,
        "files": FILES,
        "records": {
            "lc_full": describe(full_sealed, full.model_dump(mode="json")),
            "lc_delta": describe(delta_sealed, delta.model_dump(mode="json")),
            "lc_signed": describe(signed_sealed, signed.model_dump(mode="json")),
            "gc": describe(gc_sealed, gc.model_dump(mode="json")),
            "manifest": describe(manifest_blob, manifest.model_dump(mode="json")),
        },
        "file_blob": {"address": notes_blob.checksum, "content": notes.decode()},
        # The state the delta rebuilds holds the full LC's history, then the delta's; its
        # base is where the next delta would start.
        "rebuilt": {
            "base": {
                "id": DELTA_ID,
                "checksum": delta_sealed.checksum,
                "depth": 1,
                "message_count": len(state.messages),
                "trace_count": len(state.trace),
            },
        },
        "langgraph": lg_fields,
    }
    return data, expected


def write_version(root: Path) -> Path:
    """Write `root/v<SCHEMA_VERSION>/` whole, or raise `FileExistsError` if it exists."""
    target = root / f"v{SCHEMA_VERSION}"
    if target.exists():
        raise FileExistsError(f"{target} exists: golden files are never rewritten")
    data, expected = build_version()
    # Built aside and renamed into place: a failed run leaves no half-written version.
    staging = Path(tempfile.mkdtemp(prefix=f".v{SCHEMA_VERSION}-", dir=root))
    try:
        staging.chmod(0o755)  # mkdtemp's is 0o700
        for role, name in FILES.items():
            (staging / name).write_bytes(data[role])
        text = json.dumps(expected, indent=2, sort_keys=True, ensure_ascii=False)
        (staging / "expected.json").write_text(text + "\n")
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def main(argv: Sequence[str]) -> int:
    """Write the current schema version's golden files; 1 if they exist already."""
    root = Path(argv[0]) if argv else Path(__file__).parent
    try:
        target = write_version(root)
    except FileExistsError as exc:
        print(f"refused: {exc}; a new schema version adds a new directory", file=sys.stderr)
        return 1
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
