"""The shared workspace: files as a manifest over blobs, materialized where tools run.

A worker keeps one directory per (task, agent) in its cache and reuses it across steps:
`sync` rewrites only the files whose blob differs, `capture` finds what a step changed
with an mtime/size check and hashes only those files. Paths given by a model go through
`resolve`, which refuses anything that would leave the directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from storage.errors import ToolError
from storage.keys import check_name
from storage.records import sha256_hex
from storage.store import CheckpointStore

Files = dict[str, str]  # path → blob sha256
Changes = dict[str, str | None]  # path → new blob sha256, or None when deleted
INDEX = "index.json"
TREE = "files"


def check_path(path: str) -> str:
    """Return `path` if it is a relative path that stays inside a workspace, else `ToolError`."""
    if not path or "\x00" in path:
        raise ToolError("path is empty or contains a NUL byte")
    pure = PurePosixPath(path)
    if pure.is_absolute() or ".." in pure.parts:
        raise ToolError(f"path {path!r} leaves the workspace: use a relative path inside it")
    return path


class Workspace:
    """One agent's copy of its task's files, in `root/files`, with an index beside it."""

    def __init__(self, cache: Path, task: str, agent: str) -> None:
        self.root = Path(cache) / check_name("task", task) / check_name("agent", agent)
        self.tree = self.root / TREE
        self.tree.mkdir(parents=True, exist_ok=True)
        self.task = task
        # path → (sha, mtime_ns, size) of the file as last synced or captured
        self._index: dict[str, tuple[str, int, int]] = self._load_index()

    def resolve(self, path: str) -> Path:
        """Return the real location of workspace path `path`, or raise `ToolError`.

        Absolute paths, `..` and symlinks that lead outside the workspace are refused.
        """
        target = (self.tree / check_path(path)).resolve()
        tree = self.tree.resolve()
        if target != tree and tree not in target.parents:
            raise ToolError(f"path {path!r} leads outside the workspace (through a symlink)")
        return target

    def relative(self, real: Path) -> str:
        """Return the workspace path of a real path inside the tree."""
        return real.resolve().relative_to(self.tree.resolve()).as_posix()

    # syncing -----------------------------------------------------------------------------
    def sync(self, store: CheckpointStore, files: Files) -> None:
        """Make the tree hold exactly `files`, writing only what differs from the index.

        Call `save_index` once the step is done to keep the work for the next process.
        """
        current = self._scan()
        for path in current.keys() - files.keys():
            (self.tree / path).unlink()
            self._index.pop(path, None)
        for path, sha in files.items():
            known = self._index.get(path)
            stat = current.get(path)
            if known is not None and stat is not None and known == (sha, *stat):
                continue
            target = self.tree / path
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.is_symlink() or target.is_dir():
                _remove(target)
            target.write_bytes(store.get_blob(self.task, sha))
            st = target.stat()
            self._index[path] = (sha, st.st_mtime_ns, st.st_size)
        self._prune_empty_dirs()

    def capture(self, store: CheckpointStore) -> Changes:
        """Store what changed in the tree since the last sync or capture; return the change set.

        Files whose mtime and size match the index are taken as unchanged without reading
        them; the rest are hashed and, if their content changed, put as blobs.
        """
        changes: Changes = {}
        current = self._scan()
        for path in self._index.keys() - current.keys():
            changes[path] = None
            del self._index[path]
        for path, (mtime, size) in current.items():
            known = self._index.get(path)
            if known is not None and known[1:] == (mtime, size):
                continue
            content = (self.tree / path).read_bytes()
            sha = sha256_hex(content)
            if known is None or known[0] != sha:
                store.put_blob(self.task, content)
                changes[path] = sha
            self._index[path] = (sha, mtime, size)
        return changes

    def files(self) -> Files:
        """Return path → sha of the tree as of the last sync or capture."""
        return {path: entry[0] for path, entry in self._index.items()}

    def _scan(self) -> dict[str, tuple[int, int]]:
        """Return path → (mtime_ns, size) of every regular file; symlinks are not files."""
        found: dict[str, tuple[int, int]] = {}
        stack = [("", str(self.tree))]
        while stack:
            prefix, directory = stack.pop()
            with os.scandir(directory) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append((f"{prefix}{entry.name}/", entry.path))
                    elif entry.is_file(follow_symlinks=False):
                        st = entry.stat(follow_symlinks=False)
                        found[prefix + entry.name] = (st.st_mtime_ns, st.st_size)
        return found

    def _prune_empty_dirs(self) -> None:
        for directory, dirs, names in os.walk(self.tree, topdown=False):
            if not dirs and not names and Path(directory) != self.tree:
                with contextlib.suppress(OSError):
                    Path(directory).rmdir()

    def _load_index(self) -> dict[str, tuple[str, int, int]]:
        try:
            raw = json.loads((self.root / INDEX).read_text())
            return {path: (str(v[0]), int(v[1]), int(v[2])) for path, v in raw.items()}
        except (OSError, ValueError, TypeError, IndexError, AttributeError):
            # No index, or a damaged one: everything is re-checked against its blob.
            return {}

    def save_index(self) -> None:
        """Keep the index on disk for the next worker process (once a step, at its end).

        An index older than the tree is harmless: a file whose mtime or size disagrees
        with it is checked against its blob again.
        """
        tmp = self.root / f"{INDEX}.tmp"
        tmp.write_text(json.dumps(self._index))
        tmp.replace(self.root / INDEX)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def apply_changes(files: Files, changes: Changes) -> Files:
    """Return `files` with a change set applied (None deletes a path)."""
    out = dict(files)
    for path, sha in changes.items():
        if sha is None:
            out.pop(path, None)
        else:
            out[path] = sha
    return out


def net_changes(base: Files, files: Files) -> Changes:
    """Return the change set that turns `base` into `files`."""
    changes: Changes = {p: sha for p, sha in files.items() if base.get(p) != sha}
    changes.update(dict.fromkeys(base.keys() - files.keys()))
    return changes


@dataclass(frozen=True, slots=True)
class Conflict:
    """Two agents wrote one path in one superstep; `winner` came later in agent order."""

    path: str
    winner: str
    loser: str


def merge(base: Files, changesets: list[tuple[str, Changes]]) -> tuple[Files, list[Conflict]]:
    """Apply agents' change sets in the order given; report each path two agents wrote.

    The later agent wins. Writing the same content (or both deleting) is not a conflict:
    nothing of the earlier agent is lost.
    """
    files = dict(base)
    writer: dict[str, tuple[str, str | None]] = {}
    conflicts: list[Conflict] = []
    for agent, changes in changesets:
        for path, sha in sorted(changes.items()):
            earlier = writer.get(path)
            if earlier is not None and earlier[1] != sha:
                conflicts.append(Conflict(path, agent, earlier[0]))
            writer[path] = (agent, sha)
        files = apply_changes(files, changes)
    return files, conflicts
