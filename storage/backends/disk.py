"""The cold archive on disk: write-once files that appear only whole.

Layout under the archive root:

    blobs/sha256/ab/abcdef….rec           content-addressed blobs (files and manifests)
    tasks/<task>/lc/<agent>/<lc_id>.rec   local checkpoints
    tasks/<task>/gc/<number>.rec          global checkpoints, written last

Every file is written to a temporary name, fsynced and renamed into place: a crash leaves
either the whole file or none of it (plus a stray temporary file, which listings ignore and
`remove_temporaries` clears). The directories that gained entries are fsynced together by
`sync()`, once per archived GC rather than once per file; `put_gc` syncs before and after
writing the GC file, so a GC is durable only once everything it names is.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

from cairn.errors import ArchiveConflict, ArchiveError
from cairn.storage.keys import check_name

SUFFIX = ".rec"
TMP_PREFIX = ".tmp-"
SHA256_HEX_LEN = 64
MAX_REMEMBERED_DIRS = 100_000  # (task, agent) → LC directory; a few MB at most


class DiskArchive:
    """A `ColdArchive` in a directory tree; safe for many processes writing at once."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self._known_dirs: set[Path] = set()
        self._lc_dirs: dict[tuple[str, str], Path] = {}
        self._unsynced: set[Path] = set()
        self._lock = threading.Lock()
        try:
            self._ensure_dir(self.root)
        except OSError as exc:
            raise ArchiveError(
                f"cannot use archive directory {self.root}: {_reason(exc)}"
            ) from None
        self.sync()

    # paths -------------------------------------------------------------------------------
    def _blob_path(self, sha: str) -> Path:
        if len(sha) != SHA256_HEX_LEN or not all(c in "0123456789abcdef" for c in sha):
            raise ArchiveError(f"not a sha256 address: {sha!r}")
        return self.root / "blobs" / "sha256" / sha[:2] / f"{sha}{SUFFIX}"

    def _task_dir(self, task: str) -> Path:
        return self.root / "tasks" / check_name("task", task)

    def _lc_path(self, task: str, agent: str, lc_id: str) -> Path:
        return self._lc_dir(task, agent) / f"{check_name('checkpoint', lc_id)}{SUFFIX}"

    def _lc_dir(self, task: str, agent: str) -> Path:
        """Return an agent's LC directory, remembered: a GC's archive and trim ask thousands."""
        found = self._lc_dirs.get((task, agent))
        if found is None:
            if len(self._lc_dirs) >= MAX_REMEMBERED_DIRS:
                self._lc_dirs.clear()
            found = self._task_dir(task) / "lc" / check_name("agent", agent)
            self._lc_dirs[(task, agent)] = found
        return found

    def _gc_path(self, task: str, number: int) -> Path:
        return self._task_dir(task) / "gc" / f"{number:012d}{SUFFIX}"

    # durable writes ----------------------------------------------------------------------
    def _ensure_dir(self, path: Path) -> None:
        """Create `path` and fsync each new directory's parent, so the entry itself survives."""
        if path in self._known_dirs:
            return
        missing = []
        probe = path
        while not probe.exists():
            missing.append(probe)
            probe = probe.parent
        for directory in reversed(missing):
            with contextlib.suppress(FileExistsError):
                directory.mkdir()
        with self._lock:
            self._unsynced.update(d.parent for d in missing)
            self._known_dirs.add(path)

    def _write(self, path: Path, data: bytes, *, replace: bool = True) -> bool:
        """Write `data` at `path` atomically and durably, or raise `ArchiveError`.

        With `replace=False` an existing file is left alone and False returned: the new
        one is linked into place, which (unlike a rename) never replaces another.
        """
        tmp = path.parent / f"{TMP_PREFIX}{path.name}.{os.getpid()}.{threading.get_ident()}"
        try:
            self._ensure_dir(path.parent)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            if replace:
                tmp.replace(path)
            else:
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    return False
                finally:
                    tmp.unlink()
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise ArchiveError(f"cannot archive {path}: {_reason(exc)}") from None
        with self._lock:
            self._unsynced.add(path.parent)
        return True

    def sync(self) -> None:
        """Make every file put so far durable: fsync each directory that gained an entry."""
        with self._lock:
            pending, self._unsynced = self._unsynced, set()
        try:
            # Deepest first: a new directory's own entries before its entry in its parent.
            for directory in sorted(pending, key=lambda p: len(p.parts), reverse=True):
                _fsync_dir(directory)
        except OSError as exc:
            with self._lock:
                self._unsynced |= pending
            raise ArchiveError(f"cannot sync the archive: {_reason(exc)}") from None

    def _read(self, path: Path) -> bytes | None:
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ArchiveError(f"cannot read {path}: {_reason(exc)}") from None

    def _delete(self, path: Path) -> None:
        try:
            path.unlink()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise ArchiveError(f"cannot delete {path}: {_reason(exc)}") from None
        _fsync_dir(path.parent)

    # blobs -------------------------------------------------------------------------------
    def put_blob(self, sha: str, data: bytes) -> None:
        if not self.has_blob(sha):
            self._write(self._blob_path(sha), data)

    def get_blob(self, sha: str) -> bytes | None:
        return self._read(self._blob_path(sha))

    def has_blob(self, sha: str) -> bool:
        path = self._blob_path(sha)
        try:
            # Touching a blob that a new GC names again keeps a concurrent sweep off it.
            os.utime(path)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise ArchiveError(f"cannot touch blob {sha}: {_reason(exc)}") from None
        self._found(path)
        return True

    def _found(self, path: Path) -> None:
        """Count a file another writer put as ours to sync: it may have died before syncing."""
        with self._lock:
            self._unsynced.add(path.parent)

    def blob_times(self) -> dict[str, float]:
        times: dict[str, float] = {}
        for path in (self.root / "blobs" / "sha256").glob(f"*/*{SUFFIX}"):
            if not path.name.startswith(TMP_PREFIX):
                with contextlib.suppress(FileNotFoundError):
                    times[path.name.removesuffix(SUFFIX)] = path.stat().st_mtime
        return times

    def delete_blob(self, sha: str) -> None:
        self._delete(self._blob_path(sha))

    # local checkpoints -------------------------------------------------------------------
    def put_lc(self, task: str, agent: str, lc_id: str, data: bytes) -> None:
        path = self._lc_path(task, agent, lc_id)
        if not path.exists():
            self._write(path, data)

    def get_lc(self, task: str, agent: str, lc_id: str) -> bytes | None:
        return self._read(self._lc_path(task, agent, lc_id))

    def has_lc(self, task: str, agent: str, lc_id: str) -> bool:
        path = self._lc_path(task, agent, lc_id)
        if not path.exists():
            return False
        self._found(path)
        return True

    def list_lcs(self, task: str) -> list[tuple[str, str]]:
        paths = (self._task_dir(task) / "lc").glob(f"*/*{SUFFIX}")
        return sorted(
            (p.parent.name, p.name.removesuffix(SUFFIX))
            for p in paths
            if not p.name.startswith(TMP_PREFIX)
        )

    def delete_lc(self, task: str, agent: str, lc_id: str) -> None:
        self._delete(self._lc_path(task, agent, lc_id))

    # global checkpoints ------------------------------------------------------------------
    def put_gc(self, task: str, number: int, data: bytes) -> None:
        path = self._gc_path(task, number)
        existing = self._read(path)
        if existing is None:
            self.sync()  # everything the GC names is durable before the GC appears
            if not self._write(path, data, replace=False):
                existing = self._read(path)  # another writer was first
        if existing is not None and existing != data:
            raise ArchiveConflict(
                f"archive already holds another GC {number} of task {task}; not replaced"
            )
        self.sync()

    def get_gc(self, task: str, number: int) -> bytes | None:
        return self._read(self._gc_path(task, number))

    def list_gcs(self, task: str) -> list[int]:
        numbers = []
        for path in (self._task_dir(task) / "gc").glob(f"*{SUFFIX}"):
            stem = path.name.removesuffix(SUFFIX)
            if stem.isdigit():
                numbers.append(int(stem))
        return sorted(numbers)

    def delete_gc(self, task: str, number: int) -> None:
        self._delete(self._gc_path(task, number))

    # task documents ----------------------------------------------------------------------
    def _doc_path(self, task: str, name: str) -> Path:
        return self._task_dir(task) / "doc" / f"{check_name('document', name)}{SUFFIX}"

    def put_doc(self, task: str, name: str, data: bytes) -> None:
        self._write(self._doc_path(task, name), data)  # the rename replaces an older one
        self.sync()

    def get_doc(self, task: str, name: str) -> bytes | None:
        return self._read(self._doc_path(task, name))

    def update_doc(
        self, task: str, name: str, change: Callable[[bytes | None], bytes | None]
    ) -> None:
        path = self._doc_path(task, name)
        lock = path.parent / f".lock-{path.name}"
        try:
            self._ensure_dir(path.parent)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise ArchiveError(f"cannot lock {path}: {_reason(exc)}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # other processes' updates wait; released on close
            data = change(self._read(path))
            if data is not None:
                self._write(path, data)
                self.sync()
        finally:
            os.close(fd)

    def put_docs(self, task: str, docs: dict[str, bytes]) -> None:
        """Put many documents of a task, made durable together by one `sync()`."""
        for name, data in docs.items():
            self._write(self._doc_path(task, name), data)
        self.sync()

    def delete_doc(self, task: str, name: str) -> None:
        """Delete one document of a task (gone already: nothing to do)."""
        self._delete(self._doc_path(task, name))

    def delete_docs(self, task: str) -> None:
        """Delete every document of a task (its other records stay)."""
        directory = self._task_dir(task) / "doc"
        try:
            shutil.rmtree(directory)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise ArchiveError(f"cannot delete {directory}: {_reason(exc)}") from None
        with self._lock:
            self._known_dirs = {d for d in self._known_dirs if not d.is_relative_to(directory)}

    def tasks(self) -> list[str]:
        base = self.root / "tasks"
        return sorted(p.name for p in base.iterdir()) if base.exists() else []

    def remove_temporaries(self, older_than: float = 3600.0) -> int:
        """Delete temporary files left by writers that died mid-write; return how many.

        Only files untouched for `older_than` seconds go: a younger one may be a live write.
        """
        horizon = time.time() - older_than
        removed = 0
        for path in self.root.rglob(f"{TMP_PREFIX}*"):
            with contextlib.suppress(FileNotFoundError):
                if path.stat().st_mtime < horizon:
                    path.unlink()
                    removed += 1
        return removed


def _reason(exc: OSError) -> str:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return "disk full"
    return exc.strerror or str(exc)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
