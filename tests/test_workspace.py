"""The materialized workspace: sync moves only what differs, capture hashes only what changed."""

from __future__ import annotations

import os
from pathlib import Path

from cairn.agents.workspace import Conflict, Workspace, apply_changes, merge, net_changes
from cairn.storage.store import CheckpointStore


def put(store: CheckpointStore, files: dict[str, bytes]) -> dict[str, str]:
    return {path: store.put_blob("ws", content) for path, content in files.items()}


def test_sync_writes_only_files_whose_blob_changed(store: CheckpointStore, tmp_path: Path) -> None:
    """A second sync rewrites the changed file, deletes the dropped one, leaves the rest alone."""
    store.hot.init_task("ws")
    ws = Workspace(tmp_path, "ws", "coder")
    ws.sync(store, put(store, {"a.txt": b"a", "d/b.txt": b"b", "c.txt": b"c"}))
    untouched = (ws.tree / "a.txt").stat().st_mtime_ns
    os.utime(ws.tree / "a.txt", ns=(1, 1))  # would be rewritten if sync looked at it again
    ws.sync(store, put(store, {"a.txt": b"a", "d/b.txt": b"B"}))
    assert b"B" == (ws.tree / "d/b.txt").read_bytes()
    assert not (ws.tree / "c.txt").exists()
    assert 1 != untouched
    assert b"a" == (ws.tree / "a.txt").read_bytes()


def test_a_fresh_worker_rebuilds_the_tree_from_blobs(
    store: CheckpointStore, tmp_path: Path
) -> None:
    """A new process hashes what an earlier one left, and a tampered file is put back."""
    store.hot.init_task("ws")
    files = put(store, {"a.txt": b"a", "b.txt": b"b"})
    Workspace(tmp_path, "ws", "coder").sync(store, files)
    (tmp_path / "ws" / "coder" / "index.json").write_text("{broken")
    (tmp_path / "ws" / "coder" / "files" / "a.txt").write_text("tampered")
    ws = Workspace(tmp_path, "ws", "coder")
    ws.sync(store, files)
    assert b"a" == (ws.tree / "a.txt").read_bytes()
    assert files == ws.files()


def test_capture_finds_new_changed_and_deleted_files(
    store: CheckpointStore, tmp_path: Path
) -> None:
    """Capture returns the change set and stores the new blobs."""
    store.hot.init_task("ws")
    ws = Workspace(tmp_path, "ws", "coder")
    base = put(store, {"keep.txt": b"k", "edit.txt": b"e", "gone.txt": b"g"})
    ws.sync(store, base)
    (ws.tree / "edit.txt").write_bytes(b"edited")
    (ws.tree / "gone.txt").unlink()
    (ws.tree / "new" / "n.txt").parent.mkdir()
    (ws.tree / "new" / "n.txt").write_bytes(b"n")
    (ws.tree / "link").symlink_to("/etc/passwd")  # not a file of the workspace
    changes = ws.capture(store)
    assert {"edit.txt", "gone.txt", "new/n.txt"} == set(changes)
    assert changes["gone.txt"] is None
    assert b"edited" == store.get_blob("ws", changes["edit.txt"] or "")
    assert {} == ws.capture(store)  # nothing new since


def test_capture_trusts_unchanged_mtime_and_size(store: CheckpointStore, tmp_path: Path) -> None:
    """A file whose mtime and size did not move is not read again (the quick check)."""
    store.hot.init_task("ws")
    ws = Workspace(tmp_path, "ws", "coder")
    ws.sync(store, put(store, {"a.txt": b"aaaa"}))
    path = ws.tree / "a.txt"
    stat = path.stat()
    path.write_bytes(b"bbbb")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert {} == ws.capture(store)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    assert ["a.txt"] == list(ws.capture(store))


def test_a_lazy_sync_writes_only_the_paths_tools_touch(
    store: CheckpointStore, tmp_path: Path
) -> None:
    """Lazily synced, a path is written when resolved; the rest waits for `materialize`."""
    store.hot.init_task("ws")
    ws = Workspace(tmp_path, "ws", "steps")
    ws.sync(store, put(store, {"a.txt": b"a", "b.txt": b"b"}), lazy=True)
    assert [] == list(ws.tree.iterdir())
    assert b"a" == ws.resolve("a.txt").read_bytes()
    assert not (ws.tree / "b.txt").exists()
    ws.materialize()
    assert b"b" == (ws.tree / "b.txt").read_bytes()
    assert {"a.txt", "b.txt"} == set(ws.files())


def test_one_tree_serves_agents_in_turn_without_leaking_files(
    store: CheckpointStore, tmp_path: Path
) -> None:
    """A step's writes never show in the next agent's view, touched or listed."""
    store.hot.init_task("ws")
    base = put(store, {"shared.txt": b"base", "d/x.txt": b"x"})
    ws = Workspace(tmp_path, "ws", "steps")
    ws.sync(store, base, lazy=True)  # the planner's step
    ws.resolve("shared.txt").write_bytes(b"planner's")
    ws.resolve("d/x.txt").unlink()
    ws.resolve("new.txt").write_bytes(b"n")
    assert {"shared.txt", "d/x.txt", "new.txt"} == set(ws.capture(store))
    ws.sync(store, base, lazy=True)  # the coder's step, from the same GC
    assert b"base" == ws.resolve("shared.txt").read_bytes()
    assert not ws.resolve("new.txt").exists()
    assert {} == ws.capture(store)  # the planner's leftovers are not the coder's changes
    assert base == ws.files()
    ws.materialize()
    assert {"shared.txt", "d/x.txt"} == {
        p.relative_to(ws.tree).as_posix() for p in ws.tree.rglob("*") if p.is_file()
    }
    assert b"x" == (ws.tree / "d/x.txt").read_bytes()


def test_a_stale_file_in_the_way_of_a_directory_is_cleared(
    store: CheckpointStore, tmp_path: Path
) -> None:
    """An earlier state's file `d` does not block the current state's `d/e.txt`."""
    store.hot.init_task("ws")
    ws = Workspace(tmp_path, "ws", "steps")
    ws.sync(store, put(store, {"d": b"a file"}))
    ws.sync(store, put(store, {"d/e.txt": b"e"}), lazy=True)
    assert b"e" == ws.resolve("d/e.txt").read_bytes()


def test_merge_applies_in_order_and_reports_conflicts() -> None:
    """The later agent wins a path two agents wrote differently; equal writes are no conflict."""
    base = {"a": "1", "b": "2", "c": "3"}
    files, conflicts = merge(
        base,
        [
            ("planner", {"a": "p", "b": None, "same": "s"}),
            ("coder", {"a": "c", "d": "4", "same": "s"}),
            ("reviewer", {"b": None}),
        ],
    )
    assert {"a": "c", "c": "3", "d": "4", "same": "s"} == files
    assert [Conflict("a", "coder", "planner")] == conflicts


def test_change_sets_compose() -> None:
    """net_changes and apply_changes are inverse."""
    base = {"a": "1", "b": "2"}
    files = {"a": "9", "c": "3"}
    changes = net_changes(base, files)
    assert {"a": "9", "b": None, "c": "3"} == changes
    assert files == apply_changes(base, changes)
