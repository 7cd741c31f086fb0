"""The shared workspace: files as a manifest over blobs, materialized where tools run.

A worker process keeps one directory per task in its cache and reuses it for every step
of that task it runs, whichever agent's: `sync` rewrites only the files whose blob
differs (lazily: only those a tool touches), `capture` finds what a step changed with an
mtime/size check and hashes only those files. Paths given by a model go through
`resolve`, which refuses anything that would leave the directory.

A workspace is always a tree (`tree_clashes`): no path is both a file and a directory.
The write tools check their writes against the tree the step sees (`prepare_writes`),
`merge` keeps it one when agents' writes clash at a barrier, and `capture` refuses a
tree that is not one. Files stay within `SizeLimits`, one by one and together: the tools
refuse a write past them, `enforce_limits` removes what a command left past them, and
`capture` stats a file before it reads it. A file is written by renaming a new file over
it (`replace_file`), so a hard link in the tree to a file elsewhere is broken, never
written through.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import stat
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import chain
from pathlib import Path, PurePosixPath

from cairn.errors import InvalidWorkspace, ToolError
from cairn.storage.codec import canonical_bytes
from cairn.storage.keys import check_name
from cairn.storage.records import WorkspaceManifest, sha256_hex
from cairn.storage.store import CheckpointStore

Files = dict[str, str]  # path → blob sha256
Changes = dict[str, str | None]  # path → new blob sha256, or None when deleted
TREE = "files"
MiB = 1024 * 1024
# A file is read whole (to hash it, store it, materialize it) and every step holds the files
# it changed until its checkpoint is written: 64 MiB is far above source, data samples and
# build outputs, and eight such files fit a worker's lanes. A workspace is materialized on
# every worker lane that runs the task and kept in Redis: 1 GiB is ~16 files at the limit.
FILE_LIMIT = 64 * MiB
WORKSPACE_LIMIT = 1024 * MiB
# What a spec may raise them to: a blob must be read back whole, and a read refuses more
# than 512 MiB (storage/codec.py); a workspace past 64 GiB fills a worker's disk per lane.
MAX_FILE_LIMIT = 256 * MiB
MAX_WORKSPACE_LIMIT = 64 * 1024 * MiB


@dataclass(frozen=True, slots=True)
class SizeLimits:
    """The bytes one file of a workspace may hold (`file`), and all its files (`total`)."""

    file: int = FILE_LIMIT
    total: int = WORKSPACE_LIMIT


def check_path(path: str) -> str:
    """Return `path` made canonical (`./a//b/` is `a/b`) if it stays inside a workspace.

    Raises `ToolError` for an empty or absolute path, a NUL byte, or a `..` part.
    """
    if not path or "\x00" in path:
        raise ToolError("path is empty or contains a NUL byte")
    pure = PurePosixPath(path)
    if pure.is_absolute() or ".." in pure.parts:
        raise ToolError(f"path {path!r} leaves the workspace: use a relative path inside it")
    return pure.as_posix()


def tree_clashes(paths: Iterable[str]) -> list[tuple[str, str]]:
    """Return each (file, path under it) of `paths` where a file would be a directory too.

    `paths` (canonical, as `check_path` makes them) are the files of a tree exactly when
    there is none.
    """
    present = set(paths)
    both = present & directories(present)
    if not both:
        return []
    return sorted((above, path) for path in present for above in _parents(path) if above in both)


def _parents(path: str) -> Iterator[str]:
    """The directories above `path`, nearest first (`a/b/c`: `a/b`, `a`)."""
    at = path.rfind("/")
    while at > 0:
        yield path[:at]
        at = path.rfind("/", 0, at)


def directories(paths: Iterable[str]) -> set[str]:
    """Every directory above a path of `paths` (canonical, as `check_path` makes them)."""
    found: set[str] = set()
    for path in paths:
        for above in _parents(path):
            if above in found:
                break  # and so are the ones above it
            found.add(above)
    return found


class Workspace:
    """A copy of a task's files in `root/files`, kept by one process and reused across steps.

    `sync` makes the tree hold a manifest, eagerly or lazily: lazily, nothing is written
    until a tool touches a path (`resolve` brings that one path up to date) or needs the
    whole tree (`materialize`, for commands and listings), so a step that reads or writes
    a few files of a large workspace costs a few files, whatever else changed. A path a
    tool touched since a lazy sync is the step's: the disk holds what the step sees there.
    """

    def __init__(self, cache: Path, task: str, name: str) -> None:
        self.root = Path(cache) / check_name("task", task) / check_name("workspace", name)
        self.tree = self.root / TREE
        self.tree.mkdir(parents=True, exist_ok=True)
        self._real_tree = self.tree.resolve()
        self.task = task
        self.limits = SizeLimits()  # what `capture` holds files to (`sync` sets it)
        self._sizes: dict[str, int] = {}  # blob sha → its bytes, for those this process saw
        # path → (sha, mtime_ns, size) of each file as this process last wrote or hashed it
        self._index: dict[str, tuple[str, int, int]] = {}
        self.reclaim()  # an earlier process's command may have left the tree locked or linked
        self._hash_tree()
        self._target: Files = self.files_on_disk()  # what the tree holds, as of now
        self._dirs: set[str] | None = None  # the directories of `_target`, once asked for
        self._store: CheckpointStore | None = None
        self._whole = True  # every path of the tree matches `_target`
        self._checked: set[str] = set()  # paths matched to `_target` since a lazy sync

    def resolve(self, path: str) -> Path:
        """Return the real location of workspace path `path`, or raise `ToolError`.

        Absolute paths, `..` and symlinks that lead outside the workspace are refused.
        After a lazy sync the path's file is brought up to date first.
        """
        normal = check_path(path)
        if normal == ".":
            self.materialize()  # the whole tree was asked for
            return self._real_tree
        target = self._jail(normal)  # before anything is written on its way
        if self._check_out(normal):
            target = self._jail(normal)  # what was at the path (a stale symlink?) is gone
        if target == self._real_tree:
            self.materialize()  # a symlink leads to the whole tree
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

    # writing -----------------------------------------------------------------------------
    def prepare_writes(
        self, sizes: Mapping[str, int | None], limits: SizeLimits
    ) -> dict[str, Path]:
        """Check a tool's writes before it makes any; return where each path is on disk.

        `sizes` maps each workspace path the tool will write to the bytes it will hold, or
        to None where it deletes the file. Raises `ToolError`, nothing written, when a path
        leaves the workspace, when the writes would make a path both a file and a directory
        (a file under a file, a file where a directory is), or a file or the whole tree
        would be over `limits`. The writes are checked against the tree the step sees, and
        against each other.
        """
        where = {path: self.resolve(path) for path in sizes}
        after = {self.relative(where[path]): size for path, size in sizes.items()}
        for path, size in after.items():
            if size is None:
                continue
            both = [p for p in _parents(path) if p in after and after[p] is not None]
            both += [p for p, s in after.items() if p.startswith(f"{path}/") and s is not None]
            if both:
                pair = sorted([path, both[0]])
                raise ToolError(
                    f"cannot write both {pair[0]} and {pair[1]}: {pair[0]} cannot be a file "
                    "and a directory"
                )
            for above in _parents(path):
                if above not in after and self._is_file(above):
                    raise ToolError(f"cannot write {path}: {above} is a file, not a directory")
            if self._is_dir(path):
                raise ToolError(f"{path} is a directory; a file cannot replace it")
            if size > limits.file:
                raise ToolError(
                    f"{path} would be {size} bytes; a workspace file may have at most "
                    f"{limits.file} bytes"
                )
        grows = sum(size or 0 for size in after.values()) - sum(
            self._size_on_disk(path) for path in after
        )
        if grows > 0:
            total = self.total_bytes() + grows
            if total > limits.total:
                raise ToolError(
                    f"the workspace would hold {total} bytes; it may hold at most "
                    f"{limits.total} bytes"
                )
        return where

    def total_bytes(self) -> int:
        """Return the bytes of every file of the tree as the step sees it, its writes included.

        After a lazy sync this needs the size of each file: where this process never saw
        one (another worker's write), the tree is brought up to date first, which tells.
        """
        if not self._whole and any(
            sha not in self._sizes for p, sha in self._target.items() if p not in self._checked
        ):
            self.materialize()
        if self._whole:
            return sum(size for _, size in self._scan().values())
        synced = sum(self._sizes[sha] for p, sha in self._target.items() if p not in self._checked)
        return synced + sum(self._size_on_disk(path) for path in self._checked)

    def enforce_limits(self, limits: SizeLimits) -> str:
        """Remove what a command left in the tree past `limits`; say what, for the agent.

        Call it when a command has finished on the materialized tree. A file over
        `limits.file` goes; then, while the tree is over `limits.total`, the largest file
        the command made or changed goes. Sizes are stat'ed: no file is read. Returns one
        line per file removed, or "".
        """
        current = self._scan()
        notes = []
        for path, (_, size) in sorted(current.items()):
            if size > limits.file:
                (self.tree / path).unlink()
                del current[path]
                notes.append(
                    f"removed {path} ({size} bytes): a workspace file may have at most "
                    f"{limits.file} bytes"
                )
        total = sum(size for _, size in current.values())
        made = [p for p, st in current.items() if (self._index.get(p) or ("",))[1:] != st]
        for path in sorted(made, key=lambda p: (-current[p][1], p)):
            if total <= limits.total:
                break
            size = current[path][1]
            (self.tree / path).unlink()
            total -= size
            notes.append(
                f"removed {path} ({size} bytes): the workspace may hold at most "
                f"{limits.total} bytes"
            )
        return "\n".join(notes)

    def reclaim(self) -> None:
        """Take the tree back from a command: all of it the worker's again, no links in it.

        A command may `chmod` what it made (it runs as the worker's user when the worker
        is not root) and leave symlinks, FIFOs and the like, which no checkpoint holds:
        every directory is made readable, writable and searchable by its owner again, every
        file readable and writable, and whatever is neither is removed, so that capture,
        the limits and the next sync are neither stopped by the one nor led by the other.
        Call it when a command has finished.
        """
        _own(self.tree, directory=True)
        stack = [str(self.tree)]
        while stack:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        _own(Path(entry.path), directory=True)
                        stack.append(entry.path)
                    elif entry.is_file(follow_symlinks=False):
                        _own(Path(entry.path), directory=False)
                    else:
                        Path(entry.path).unlink()

    def _is_file(self, path: str) -> bool:
        """Whether `path` is a file of the tree the step sees."""
        if self._whole or path in self._checked:
            return _stat(self.tree / path) is not None
        return path in self._target

    def _is_dir(self, path: str) -> bool:
        """Whether `path` is a directory of the tree the step sees (perhaps an empty one)."""
        with contextlib.suppress(OSError):
            if stat.S_ISDIR((self.tree / path).lstat().st_mode):
                return True
        if self._whole:
            return False
        if self._dirs is None:
            self._dirs = directories(self._target)
        return path in self._dirs

    def _size_on_disk(self, path: str) -> int:
        st = _stat(self.tree / path)
        return 0 if st is None else st[1]

    # syncing -----------------------------------------------------------------------------
    def sync(
        self,
        store: CheckpointStore,
        files: Files,
        *,
        lazy: bool = False,
        limits: SizeLimits | None = None,
    ) -> None:
        """Make the tree hold exactly `files`, writing only what differs from the index.

        With `lazy`, only remember `files`: paths are brought up to date as tools touch
        them, or all at once by `materialize`. `limits` are what `capture` holds the
        step's files to (default: `SizeLimits()`).
        """
        self._target, self._store, self._dirs = dict(files), store, None
        self._whole, self._checked = False, set()
        if limits is not None:
            self.limits = limits
        seen = {entry[0] for entry in self._index.values()} | set(files.values())
        self._sizes = {sha: size for sha, size in self._sizes.items() if sha in seen}
        if not lazy:
            self.materialize()

    def materialize(self) -> None:
        """Bring every path of the tree up to date with the last sync (a no-op if it is).

        Paths a tool touched since a lazy sync keep what the step made of them.
        """
        if self._whole:
            return
        strays: list[str] = []
        current = self._scan(strays)
        own = self._checked
        # No manifest holds a symlink: one an earlier command left could lead a file the
        # manifest names (`d/x`, through `d`) out of the tree.
        for path in [*(current.keys() - self._target.keys()), *strays]:
            if path not in own:
                (self.tree / path).unlink()
                self._index.pop(path, None)
        stale = [p for p in self._target if p not in own and not self._fresh(p, current.get(p))]
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
        for above in _parents(path):  # a stale file (or symlink) where a directory must be
            real = self.tree / above
            if above not in self._target and above not in self._checked and _is_entry(real):
                real.unlink()
                self._index.pop(above, None)
                changed = True
        real = self.tree / path
        inside = f"{path}/"
        if path in self._target:
            if not self._fresh(path, _stat(real)):
                self._write([path])
                changed = True
        elif _is_entry(real):
            real.unlink()  # left by an earlier state of the tree
            self._index.pop(path, None)
            changed = True
        elif real.is_dir() and not any(
            p.startswith(inside) for p in chain(self._target, self._checked)
        ):
            shutil.rmtree(real)
            for gone in [p for p in self._index if p.startswith(inside)]:
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
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            replace_file(target, blobs[self._target[path]])
            st = target.stat()
            self._remember(path, self._target[path], st.st_mtime_ns, st.st_size)

    def _remember(self, path: str, sha: str, mtime: int, size: int) -> None:
        """Index `path` as holding blob `sha`, as the disk has it now."""
        self._index[path] = (sha, mtime, size)
        self._sizes[sha] = size

    def capture(self, store: CheckpointStore, unstored: dict[str, bytes] | None = None) -> Changes:
        """Store what changed in the tree since the last sync or capture; return the change set.

        Files whose mtime and size match the index are taken as unchanged without reading
        them; the rest are hashed and, if their content changed, put as blobs, or added to
        `unstored` (sha → content) when given, for the caller to store with its checkpoint.
        After a lazy sync only the paths tools touched can have changed, so only those are
        looked at. Raises `InvalidWorkspace` for a file over `limits.file`, a tree grown
        past `limits.total` (both found by their sizes: nothing is read), or a path that
        became both a file and a directory.
        """
        changes: Changes = {}
        if self._whole:
            current = self._scan()
            looked_at = current.keys() | self._target.keys()
            self._check_growth(sum(size for _, size in current.values()))
        else:
            current = {p: st for p in self._checked if (st := _stat(self.tree / p))}
            looked_at = set(self._checked)
        for path in looked_at - current.keys():
            if path in self._target:
                changes[path] = None
                del self._target[path]
            self._index.pop(path, None)
        added = False
        for path, (mtime, size) in current.items():
            known = self._index.get(path)
            if known is not None and known[1:] == (mtime, size):
                sha = known[0]
            else:
                sha = self._hash(store, unstored, path, mtime, size)
            if self._target.get(path) != sha:
                added = added or path not in self._target
                changes[path] = sha
                self._target[path] = sha
        if changes:
            self._dirs = None
        if added and (clashes := tree_clashes(self._target)):
            above, below = clashes[0]
            raise InvalidWorkspace(f"{above} is a file and a directory ({below}) of the workspace")
        return changes

    def _check_growth(self, total: int) -> None:
        """Raise `InvalidWorkspace` if the tree, `total` bytes now, grew past `limits.total`.

        A tree over the limit that did not grow (agents' writes merged) may shrink back.
        """
        if total > self.limits.total:
            before = sum(self._sizes.get(sha, 0) for sha in self._target.values())
            if total > before:
                raise InvalidWorkspace(
                    f"the step made the workspace {total} bytes; it may hold at most "
                    f"{self.limits.total}"
                )

    def _hash(
        self,
        store: CheckpointStore,
        unstored: dict[str, bytes] | None,
        path: str,
        mtime: int,
        size: int,
    ) -> str:
        """Hash a changed file, store its content if it is new (`capture`); return its sha."""
        content = _read_within(self.tree / path, path, self.limits.file)
        sha = sha256_hex(content)
        self._remember(path, sha, mtime, size)
        if self._target.get(path) != sha:
            if unstored is None:
                store.put_blob(self.task, content)
            else:
                unstored[sha] = content
        return sha

    def files(self) -> Files:
        """Return path → sha of what the tree holds, as of the last sync or capture."""
        return dict(self._target)

    def files_on_disk(self) -> Files:
        """Return path → sha of the files this process knows to be on disk."""
        return {path: entry[0] for path, entry in self._index.items()}

    def _scan(self, strays: list[str] | None = None) -> dict[str, tuple[int, int]]:
        """Return path → (mtime_ns, size) of every regular file; symlinks are not files.

        What is neither a file nor a directory (a symlink, a FIFO) goes into `strays`.
        """
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
                    elif strays is not None:
                        strays.append(prefix + entry.name)
        return found

    def _hash_tree(self) -> None:
        """Index what an earlier process left in the tree (reading is cheaper than rewriting).

        A file no workspace may hold (a command's leftover) is removed unread.
        """
        for path, (mtime, size) in self._scan().items():
            if size > MAX_FILE_LIMIT:
                (self.tree / path).unlink()
                continue
            content = _read_within(self.tree / path, path, MAX_FILE_LIMIT)
            self._remember(path, sha256_hex(content), mtime, size)

    def _prune_empty_dirs(self) -> None:
        for directory, dirs, names in os.walk(self.tree, topdown=False):
            if not dirs and not names and Path(directory) != self.tree:
                with contextlib.suppress(OSError):
                    Path(directory).rmdir()


def _own(path: Path, *, directory: bool) -> None:
    """Give `path`'s owner back what the worker needs of it: rwx on a directory, rw on a file."""
    mode = stat.S_IMODE(path.lstat().st_mode)
    wanted = mode | (0o700 if directory else 0o600)
    if wanted != mode:
        path.chmod(wanted)


def replace_file(path: Path, data: bytes) -> None:
    """Make `path` a new file holding `data`, written aside and renamed over what was there.

    What was at `path` is replaced, never written through: a hard link to a file outside
    the workspace is broken and that file left alone. The new file keeps the old one's mode.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        old = path.lstat()
    except FileNotFoundError:
        old = None
    temp = path.with_name(f".cairn-{secrets.token_hex(8)}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    try:
        with os.fdopen(fd, "wb") as out:
            if old is not None and stat.S_ISREG(old.st_mode):
                os.fchmod(out.fileno(), stat.S_IMODE(old.st_mode))
            out.write(data)
        temp.replace(path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def _read_within(path: Path, name: str, limit: int) -> bytes:
    """Read a file of at most `limit` bytes, stat'ed first; `InvalidWorkspace` if it is larger."""
    size = path.lstat().st_size
    if size <= limit:
        with path.open("rb") as source:
            content = source.read(limit + 1)  # it may have grown since
        size = max(size, len(content))
        if len(content) <= limit:
            return content
    raise InvalidWorkspace(f"{name} is {size} bytes; a workspace file may have at most {limit}")


def _stat(path: Path) -> tuple[int, int] | None:
    """(mtime_ns, size) of a regular file, or None (missing, a directory, a symlink)."""
    try:
        st = path.lstat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size) if stat.S_ISREG(st.st_mode) else None


def _is_entry(path: Path) -> bool:
    """Whether `path` is a file or a symlink (to anything): what a directory cannot be."""
    return path.is_symlink() or path.is_file()


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
    """Two agents' writes of one superstep could not both stay; `winner` came later in order.

    Either both wrote `path`, or the winner wrote `clash`, a directory above `path` or a
    file under it, and `path` was dropped. `winner` is "" where `path` clashed with a file
    no agent changed (a change set that is not a tree, which no tool makes).
    """

    path: str
    winner: str
    loser: str
    clash: str = ""


def merge(base: Files, changesets: list[tuple[str, Changes]]) -> tuple[Files, list[Conflict]]:
    """Apply agents' change sets in the order given; report each write that did not stay.

    The later agent wins a path two agents wrote. Writing the same content (or both
    deleting) is not a conflict: nothing of the earlier agent is lost. Where the files
    left are not a tree (one agent made `x` a file, another `x/y`), the later writer's path
    stays and the earlier's is dropped; files no agent changed stay. The result is a tree.
    """
    files = dict(base)
    writer: dict[str, tuple[str, str | None]] = {}
    rank: dict[str, int] = {}  # path → the place in `changesets` of its last writer
    conflicts: list[Conflict] = []
    for place, (agent, changes) in enumerate(changesets):
        for path, sha in sorted(changes.items()):
            earlier = writer.get(path)
            if earlier is not None and earlier[1] != sha:
                conflicts.append(Conflict(path, agent, earlier[0]))
            writer[path] = (agent, sha)
            rank[path] = place
        files = apply_changes(files, changes)
    clashes = tree_clashes(files)
    if clashes:
        conflicts += _drop_clashes(files, clashes, writer, rank, len(changesets))
    return files, conflicts


def _drop_clashes(
    files: Files,
    clashes: list[tuple[str, str]],
    writer: dict[str, tuple[str, str | None]],
    rank: dict[str, int],
    unchanged: int,
) -> list[Conflict]:
    """Make `files` a tree: drop each clashing path that clashes with one of a later writer.

    Paths are kept from the last writer's down (files no agent changed, of rank
    `unchanged`, first); a path clashing with one kept is dropped. Return who lost what.
    """
    near: dict[str, list[str]] = {}
    for above, below in clashes:
        near.setdefault(above, []).append(below)
        near.setdefault(below, []).append(above)
    kept: set[str] = set()
    dropped: list[Conflict] = []
    for path in sorted(near, key=lambda p: (-rank.get(p, unchanged), p)):
        winners = sorted(p for p in near[path] if p in kept)
        if not winners:
            kept.add(path)
            continue
        del files[path]
        if path in writer:
            won = winners[0]
            winner = writer[won][0] if won in writer else ""
            dropped.append(Conflict(path, winner, writer[path][0], clash=won))
    return dropped
