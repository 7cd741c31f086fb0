"""The shared workspace: files as a manifest over blobs, materialized where tools run.

A worker process keeps one directory per task in its cache and reuses it for every step
of that task it runs, whichever agent's: `sync` rewrites only the files whose blob
differs (lazily: only those a tool touches), `capture` finds what a step changed with an
mtime/size check and hashes only those files. Paths given by a model go through
`resolve`, which refuses anything that would leave the directory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from storage.codec import canonical_bytes
from storage.errors import ToolError
from storage.keys import check_name
from storage.records import WorkspaceManifest, sha256_hex
from storage.store import CheckpointStore

Files = dict[str, str]  # path → blob sha256
Changes = dict[str, str | None]  # path → new blob sha256, or None when deleted
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
    """A copy of a task's files in `root/files`, kept by one process and reused across steps.

    `sync` makes the tree hold a manifest, eagerly or lazily: lazily, nothing is written
    until a tool touches a path (`resolve` brings that one path up to date) or needs the
    whole tree (`materialize`, for commands and listings), so a step that reads or writes
    a few files of a large workspace costs a few files, whatever else changed.
    """

    def __init__(self, cache: Path, task: str, name: str) -> None:
        self.root = Path(cache) / check_name("task", task) / check_name("workspace", name)
        self.tree = self.root / TREE
        self.tree.mkdir(parents=True, exist_ok=True)
        self._real_tree = self.tree.resolve()
        self.task = task
        # path → (sha, mtime_ns, size) of each file as this process last wrote or hashed it
        self._index: dict[str, tuple[str, int, int]] = self._hash_tree()
        self._target: Files = self.files_on_disk()  # what the tree holds, as of now
        self._store: CheckpointStore | None = None
        self._whole = True  # every path of the tree matches `_target`
        self._checked: set[str] = set()  # paths matched to `_target` since a lazy sync

    def resolve(self, path: str) -> Path:
        """Return the real location of workspace path `path`, or raise `ToolError`.

        Absolute paths, `..` and symlinks that lead outside the workspace are refused.
        After a lazy sync the path's file is brought up to date first.
        """
        target = self._jail(check_path(path))  # before anything is written on its way
        if self._check_out(path):
            target = self._jail(path)  # what was at the path (a stale symlink?) is gone
        if target == self._real_tree:
            self.materialize()  # the whole tree was asked for
        return target

    def _jail(self, path: str) -> Path:
        target = (self.tree / path).resolve()
        tree = self._real_tree
        if target != tree and tree not in target.parents:
            raise ToolError(f"path {path!r} leads outside the workspace (through a symlink)")
        return target

    def relative(self, real: Path) -> str:
        """Return the workspace path of a real path inside the tree."""
        return real.resolve().relative_to(self._real_tree).as_posix()

    # syncing -----------------------------------------------------------------------------
    def sync(self, store: CheckpointStore, files: Files, *, lazy: bool = False) -> None:
        """Make the tree hold exactly `files`, writing only what differs from the index.

        With `lazy`, only remember `files`: paths are brought up to date as tools touch
        them, or all at once by `materialize`.
        """
        self._target, self._store = dict(files), store
        self._whole, self._checked = False, set()
        if not lazy:
            self.materialize()

    def materialize(self) -> None:
        """Bring every path of the tree up to date with the last sync (a no-op if it is)."""
        if self._whole:
            return
        current = self._scan()
        for path in current.keys() - self._target.keys():
            (self.tree / path).unlink()
            self._index.pop(path, None)
        stale = [p for p in self._target if not self._fresh(p, current.get(p))]
        self._write(stale)
        self._prune_empty_dirs()
        self._whole, self._checked = True, set()

    def _check_out(self, path: str) -> bool:
        """Bring one path (and the directories above it) up to date after a lazy sync.

        Return whether anything on disk changed.
        """
        if self._whole or path in self._checked:
            return False
        changed = False
        parts = PurePosixPath(path).parts
        for depth in range(1, len(parts)):  # a stale file where a directory must be
            above = "/".join(parts[:depth])
            if above not in self._target and (self.tree / above).is_file():
                (self.tree / above).unlink()
                self._index.pop(above, None)
                changed = True
        real = self.tree / path
        if path in self._target:
            if not self._fresh(path, _stat(real)):
                self._write([path])
                changed = True
        elif real.is_file() or real.is_symlink():
            real.unlink()  # left by an earlier state of the tree
            self._index.pop(path, None)
            changed = True
        elif real.is_dir() and not any(p.startswith(f"{path}/") for p in self._target):
            shutil.rmtree(real)
            for gone in [p for p in self._index if p.startswith(f"{path}/")]:
                del self._index[gone]
            changed = True
        self._checked.add(path)
        return changed

    def _fresh(self, path: str, stat: tuple[int, int] | None) -> bool:
        known = self._index.get(path)
        return known is not None and stat is not None and known == (self._target[path], *stat)

    def _write(self, paths: list[str]) -> None:
        """Write the target content of `paths`, fetching their blobs in one go."""
        if not paths:
            return
        assert self._store is not None  # a sync came first
        blobs = self._store.get_blobs(self.task, {self._target[p] for p in paths})
        for path in paths:
            target = self.tree / path
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.is_symlink() or target.is_dir():
                _remove(target)
            target.write_bytes(blobs[self._target[path]])
            st = target.stat()
            self._index[path] = (self._target[path], st.st_mtime_ns, st.st_size)

    def capture(self, store: CheckpointStore, unstored: dict[str, bytes] | None = None) -> Changes:
        """Store what changed in the tree since the last sync or capture; return the change set.

        Files whose mtime and size match the index are taken as unchanged without reading
        them; the rest are hashed and, if their content changed, put as blobs, or added to
        `unstored` (sha → content) when given, for the caller to store with its checkpoint.
        After a lazy sync only the paths tools touched can have changed, so only those are
        looked at.
        """
        changes: Changes = {}
        if self._whole:
            current = self._scan()
            looked_at = current.keys() | self._target.keys()
        else:
            current = {p: st for p in self._checked if (st := _stat(self.tree / p))}
            looked_at = set(self._checked)
        for path in looked_at - current.keys():
            if path in self._target:
                changes[path] = None
                del self._target[path]
            self._index.pop(path, None)
        for path, (mtime, size) in current.items():
            known = self._index.get(path)
            if known is not None and known[1:] == (mtime, size):
                sha = known[0]
            else:
                content = (self.tree / path).read_bytes()
                sha = sha256_hex(content)
                self._index[path] = (sha, mtime, size)
                if self._target.get(path) != sha:
                    if unstored is None:
                        store.put_blob(self.task, content)
                    else:
                        unstored[sha] = content
            if self._target.get(path) != sha:
                changes[path] = sha
                self._target[path] = sha
        return changes

    def files(self) -> Files:
        """Return path → sha of what the tree holds, as of the last sync or capture."""
        return dict(self._target)

    def files_on_disk(self) -> Files:
        """Return path → sha of the files this process knows to be on disk."""
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

    def _hash_tree(self) -> dict[str, tuple[str, int, int]]:
        """Index what an earlier process left in the tree (reading is cheaper than rewriting)."""
        return {
            path: (sha256_hex((self.tree / path).read_bytes()), mtime, size)
            for path, (mtime, size) in self._scan().items()
        }

    def _prune_empty_dirs(self) -> None:
        for directory, dirs, names in os.walk(self.tree, topdown=False):
            if not dirs and not names and Path(directory) != self.tree:
                with contextlib.suppress(OSError):
                    Path(directory).rmdir()


def _stat(path: Path) -> tuple[int, int] | None:
    """(mtime_ns, size) of a regular file, or None (missing, a directory, a symlink)."""
    try:
        st = path.lstat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size) if stat.S_ISREG(st.st_mode) else None


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


def manifest_blob(files: Files) -> tuple[str, bytes]:
    """Return the manifest of `files` as stored: its id (the sha256 of its bytes), its bytes."""
    data = canonical_bytes(WorkspaceManifest(files=files))
    return sha256_hex(data), data


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
