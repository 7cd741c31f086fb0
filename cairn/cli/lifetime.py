"""How `cairn up`'s children live and die with it: one process group, and the parent's death.

Every child of one `cairn up` (its redis-server, coordinator and workers) runs in a process
group of its own, apart from `cairn up`'s. A terminal's Ctrl-C or hang-up then reaches
`cairn up` alone, which stops its children in order (SIGTERM, SIGKILL after a grace), and
`cairn down` knows the whole group to wait for.

A `cairn up` killed with SIGKILL runs no handler, so on Linux each child asks the kernel
(`prctl(PR_SET_PDEATHSIG)`) for a signal the moment its parent dies. It is chosen over
children polling `getppid()` because redis-server is not ours to change, the kernel acts
at once rather than a poll later, and nothing runs in the child but one system call.
Elsewhere no such call exists: a SIGKILLed `cairn up` leaves its children running, to be
killed by hand (their process group is the second line of `up.pid`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PROC = Path("/proc")

Output = IO[bytes] | int | None


def parent_death_hook(signum: signal.Signals) -> Callable[[], None] | None:
    """A `preexec_fn` making the child get `signum` when this process dies (Linux), else None.

    The kernel sends it when the *thread* that started the child ends, so children must be
    started from a thread that lives as long as `cairn up` (its main thread does).
    """
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here, not in the forked child
    parent = os.getpid()

    def die_with_parent() -> None:
        prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the request took effect
            os.kill(os.getpid(), signum)

    return die_with_parent


class ChildGroup:
    """The process group every child of one `cairn up` is started in.

    The first child leads a new group; the others join it. `on_new_group` hears each group
    made (once, unless every member died and a restarted child had to make another).
    """

    def __init__(self, on_new_group: Callable[[int], None] | None = None) -> None:
        self.pgid: int | None = None
        self._on_new_group = on_new_group

    def popen(
        self,
        argv: list[str],
        *,
        death_signal: signal.Signals,
        env: Mapping[str, str] | None = None,
        stdout: Output = None,
        stderr: Output = None,
    ) -> subprocess.Popen[bytes]:
        """Start `argv` in the group, to get `death_signal` when `cairn up` dies.

        Its stdin is /dev/null: a process outside the terminal's foreground group that
        read the terminal would be stopped.
        """
        hook = parent_death_hook(death_signal)
        if self.pgid is not None:
            try:
                return subprocess.Popen(  # noqa: S603 - our own commands, from a list
                    argv, env=env, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                    process_group=self.pgid, preexec_fn=hook,  # noqa: PLW1509 - one syscall
                )  # fmt: skip
            except PermissionError:  # every member died: the group is gone, make another
                self.pgid = None
        process = subprocess.Popen(  # noqa: S603 - our own commands, from a list
            argv, env=env, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
            process_group=0, preexec_fn=hook,  # noqa: PLW1509 - one syscall
        )  # fmt: skip
        self.pgid = process.pid
        if self._on_new_group is not None:
            self._on_new_group(process.pid)
        return process

    def kill_rest(self) -> None:
        """SIGKILL whatever is left in the group (what the children started, too)."""
        if self.pgid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pgid, signal.SIGKILL)


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name, or None if it is gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def is_alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, dead but not yet reaped, does not)."""
    if PROC.is_dir():
        fields = _stat(pid)
        return fields is not None and fields[0] not in {"Z", "X"}
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def group_members(pgid: int) -> set[int]:
    """The live processes of group `pgid` (Linux; elsewhere the leader, if it runs)."""
    if not PROC.is_dir():
        return {pgid} if group_alive(pgid) else set()
    found = set()
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None and fields[0] not in {"Z", "X"} and int(fields[2]) == pgid:
                found.add(int(entry.name))
    return found


def group_alive(pgid: int) -> bool:
    """Whether any process of group `pgid` runs."""
    if PROC.is_dir():
        return bool(group_members(pgid))
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def runs_cairn_up(pid: int) -> bool:
    """Whether `pid` runs `cairn up` (not another process that took a dead one's pid)."""
    if not is_alive(pid):
        return False
    try:
        command = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return not PROC.is_dir()  # no /proc to ask: trust the pid
    return b"cairn" in command and b"\0up\0" in command


def kill_strays(pgid: int) -> None:
    """SIGKILL what is left of a dead `cairn up`'s children in group `pgid` (Linux only).

    Only processes that are Cairn's or a redis-server: the group id may be another's by now.
    """
    for pid in group_members(pgid) if PROC.is_dir() else set():
        try:
            command = (PROC / str(pid) / "cmdline").read_bytes()
        except OSError:
            continue
        if b"cairn" in command or b"redis-server" in command:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
