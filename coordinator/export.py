"""A task's files at a checkpoint: read into memory, or exported to a directory.

`workspace_files` is what `Task.workspace` returns; `export_workspace` writes the files
into an empty directory, leaving out what would make git take it for a repository (an
agent wrote those, and git runs what a repository's config and hooks name).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from cairn.agents.workspace import check_path, directories, tree_clashes
from cairn.coordinator.gcviews import checkpoint_at
from cairn.coordinator.views import Export
from cairn.errors import InvalidSpec, ToolError
from cairn.storage.store import CheckpointStore


def workspace_files(store: CheckpointStore, task: str, number: int | None) -> dict[str, bytes]:
    """The files of GC `number` (else the latest committed): path → contents, by path.

    Raises `CheckpointNotFound` when the checkpoint is absent, `InvalidSpec` when it names
    a path that would leave the workspace.
    """
    gc = checkpoint_at(store, task, number)
    manifest = store.read_manifest(task, gc.workspace)
    for path in manifest.files:
        try:
            check_path(path)
        except ToolError as exc:
            raise InvalidSpec(f"checkpoint {gc.number} names an unsafe path: {exc}") from None
    contents = store.get_blobs(task, manifest.files.values())
    return {path: contents[sha] for path, sha in sorted(manifest.files.items())}


def export_workspace(
    store: CheckpointStore,
    task: str,
    number: int | None,
    out: Path,
    *,
    include_git: bool = False,
) -> Export:
    """Write the files of GC `number` (else the latest) into the empty or new directory `out`.

    Files git would take for a repository's (`_git_files`) are left out unless
    `include_git`: agents wrote them, and git runs what a repository's config and hooks
    name when a person runs git in the directory. Raises `InvalidSpec` when
    `out` holds files already (an export is exactly the workspace) or the checkpoint's
    files are not a tree, and `OSError` when `out` cannot be written.
    """
    gc = checkpoint_at(store, task, number)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InvalidSpec(f"{out} is not an empty directory: choose a new or empty one")
    files = workspace_files(store, task, gc.number)
    canonical = {check_path(path): path for path in files}
    if len(canonical) < len(files):
        raise InvalidSpec(f"checkpoint {gc.number} is not a tree: it names a file twice")
    for above, below in tree_clashes(canonical)[:1]:
        raise InvalidSpec(
            f"checkpoint {gc.number} is not a tree: {above} is a file and a directory ({below})"
        )
    left_out = [] if include_git else _git_files(canonical)
    out.mkdir(parents=True, exist_ok=True)
    root = out.resolve()
    written = sorted(canonical.keys() - set(left_out))
    for path in written:
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(files[canonical[path]])
    return Export(
        task_id=task,
        checkpoint=gc.number,
        out=os.fspath(out),
        files=written,
        left_out=sorted(left_out),
    )


def _git_files(paths: Iterable[str]) -> list[str]:
    """The paths that would make git take a directory for a repository.

    Any path named `.git` or under one, and the `HEAD` of a directory shaped as a bare
    repository (`objects/` and `refs/` beside it): without its `HEAD`, git does not take a
    directory for one. Case and trailing dots or spaces do not count (a macOS or Windows
    disk ignores them), nor does Windows's short name of `.git`, `git~1`.
    """
    present = sorted(paths)
    folded = {d.lower() for d in directories(present)}
    found = []
    for path in present:
        parts = path.lower().split("/")
        if any(p.rstrip(". ") in {".git", "git~1"} for p in parts):
            found.append(path)
        elif parts[-1] == "head":
            beside = "/".join([*parts[:-1], ""])
            if {f"{beside}objects", f"{beside}refs"} <= folded:
                found.append(path)
    return found
