"""Running a command an agent asked for (`run_command`, a task's `verify`) in a sandbox.

A `Sandbox` is how one process runs such commands, chosen once when it starts
(`sandbox_for`): in bubblewrap (`bwrap`), unsandboxed (a deployment that opted out with
`CAIRN_SANDBOX=off`), or not at all (bubblewrap was asked for and cannot run here: every
command is refused with the reason). `Sandbox.run` takes the command, the workspace
directory, its `CommandLimits` and whether it may use the network, and returns its exit
code and output.

In bubblewrap a command sees an environment built from nothing, its own PID, IPC, UTS and
(without network) network namespaces, the system's programs read-only (`/usr`, `/bin`,
`/lib*`, a few files of `/etc`, the Python Cairn runs under), a private `/tmp`, and the
workspace at `/workspace`, the only path it can write. Nothing outlives it: when its shell
ends, or is killed at the timeout, its PID namespace ends and the kernel kills everything
left in it. Its processes are counted against `RLIMIT_NPROC` within a user namespace of
their own (a kernel from 5.14 counts per namespace), so one command's fork bomb stops at
its own cap and never starves another's; `RLIMIT_FSIZE` caps a file's size. The process
limit binds only a user other than root, so a worker running as root runs bubblewrap
privileged and has the command drop to `SANDBOX_UID` in a user namespace of its own
(`setpriv`, `unshare`); a worker running as another user runs bubblewrap unprivileged.
"""

from __future__ import annotations

import codecs
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from cairn.errors import MissingTool, ToolError

SandboxMode = Literal["bwrap", "off"]
WORKDIR = "/workspace"  # the workspace as a sandboxed command sees it, on every worker
MAX_PROCESSES = 256  # processes and threads one command may have at once
# The largest file a command may write (RLIMIT_FSIZE): the workspace's default limit on
# one file, so a command cannot fill the worker's disk with one.
MAX_FILE_BYTES = 64 * 1024 * 1024
SANDBOX_UID = 65534  # "nobody": who a root worker's commands run as
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# What of /etc programs need to run, resolve names and trust certificates; not the rest,
# where a host keeps its own configuration and secrets.
ETC = (
    "alternatives", "ca-certificates", "ca-certificates.conf", "gai.conf", "group",
    "host.conf", "hosts", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime",
    "mime.types", "nsswitch.conf", "passwd", "pki", "protocols", "resolv.conf", "services",
    "ssl", "timezone",
)  # fmt: skip
HELPERS = ("prlimit", "setpriv", "unshare")  # util-linux, under /usr in every sandbox
READ_CHUNK = 64 * 1024  # a pipe holds 64 KiB on Linux: one read empties it


@dataclass(frozen=True, slots=True)
class CommandLimits:
    """What one command may take: seconds, characters of output kept, processes, file bytes."""

    timeout: float
    output: int
    processes: int = MAX_PROCESSES
    file_bytes: int = MAX_FILE_BYTES


@dataclass(frozen=True, slots=True)
class Finished:
    """A command that ran to its end: its exit code and its (possibly cut) output."""

    exit_code: int
    output: str

    def report(self) -> str:
        """The command's end as a model reads it: `exit code N`, then the output."""
        return f"exit code {self.exit_code}\n{self.output}"


@dataclass(frozen=True, slots=True)
class Sandbox:
    """How this process runs agents' commands: in bubblewrap, unsandboxed, or refusing.

    `bwrap` is bubblewrap's path (None: commands run as plain child processes, the
    deployment opted out); `refusal` says why this process runs no command at all;
    `privileged` says bubblewrap runs as root, so the command drops to `SANDBOX_UID`.
    """

    bwrap: str | None = None
    refusal: str | None = None
    privileged: bool = False
    helpers: Mapping[str, str] | None = None  # name → path, of HELPERS

    @property
    def mode(self) -> str:
        """`bwrap`, `off` or `refused`, as logs and messages name it."""
        return "refused" if self.refusal else "bwrap" if self.bwrap else "off"

    def run(
        self,
        command: str,
        workspace: Path,
        limits: CommandLimits,
        *,
        network: bool = False,
        env: Mapping[str, str] | None = None,
    ) -> Finished:
        """Run `command` with `/bin/sh -c` in `workspace`; return how it ended.

        `env` is the command's whole environment, but for `HOME` (the workspace) and, in
        bubblewrap, `PATH` (the sandbox's). Raises `ToolError` when it outlived
        `limits.timeout` (it was killed, with everything it started), and `MissingTool`
        when this process cannot run commands (`refusal`) or bubblewrap failed to start.
        """
        if self.refusal is not None:
            raise MissingTool(self.refusal)
        if "\x00" in command:  # no program can receive it: Popen would raise ValueError
            raise ToolError("command contains a NUL byte")
        variables = dict(env or {})
        if self.bwrap is None:
            variables["HOME"] = str(workspace)
            return _run(["/bin/sh", "-c", command], limits, variables, cwd=workspace)
        finished, started = self._run_bwrap(command, workspace, limits, network, variables)
        if not started:
            why = _start_failure(finished)
            raise MissingTool(f"worker {_worker()} could not start its sandbox: {why}")
        return finished

    def _run_bwrap(
        self,
        command: str,
        workspace: Path,
        limits: CommandLimits,
        network: bool,
        env: Mapping[str, str],
    ) -> tuple[Finished, bool]:
        """Run `command` in bubblewrap; return how it ended, and whether it started at all."""
        if self.privileged:
            _hand_over(workspace)
        read_status, write_status = os.pipe()
        try:
            argv = self._argv(command, workspace, limits, network, env, write_status)
            finished = _run(argv, limits, {}, status_fd=write_status)
            os.close(write_status)
            write_status = -1
            # bubblewrap reports the command's exit code only if the command ran.
            return finished, b'"exit-code"' in _read_all(read_status)
        finally:
            os.close(read_status)
            if write_status >= 0:
                os.close(write_status)

    def _argv(
        self,
        command: str,
        workspace: Path,
        limits: CommandLimits,
        network: bool,
        env: Mapping[str, str],
        status_fd: int,
    ) -> list[str]:
        assert self.bwrap is not None  # a bubblewrap sandbox
        assert self.helpers is not None
        argv = [self.bwrap, "--die-with-parent", "--new-session", "--unshare-ipc",
                "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try"]  # fmt: skip
        if not network:
            argv.append("--unshare-net")
        if self.privileged:  # setpriv, in the sandbox, drops to SANDBOX_UID with these
            argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        else:
            argv += ["--unshare-user", "--disable-userns"]
        argv += _system_mounts()
        argv += ["--proc", "/proc", "--dev", "/dev"]
        # A /tmp and /dev/shm of its own: fresh tmpfs mounts, which the command may write.
        for scratch in ("/tmp", "/dev/shm"):  # noqa: S108
            argv += ["--perms", "1777", "--tmpfs", scratch]
        argv += ["--bind", str(workspace), WORKDIR, "--chdir", WORKDIR]
        argv += ["--json-status-fd", str(status_fd), "--clearenv"]
        path = SYSTEM_PATH
        interpreter = _interpreter_bin()
        if interpreter is not None:
            path = f"{interpreter}:{path}"
        variables = {**env, "PATH": path, "HOME": WORKDIR}
        for name, value in sorted(variables.items()):
            argv += ["--setenv", name, value]
        argv.append("--")
        if self.privileged:
            uid = str(SANDBOX_UID)
            argv += [self.helpers["setpriv"], f"--reuid={uid}", f"--regid={uid}",
                     "--clear-groups", "--inh-caps=-all", "--bounding-set=-all",
                     "--no-new-privs", self.helpers["unshare"], "--user", "--"]  # fmt: skip
        argv += [self.helpers["prlimit"], f"--nproc={limits.processes}",
                 f"--fsize={limits.file_bytes}", "--core=0", "--"]  # fmt: skip
        return [*argv, "/bin/sh", "-c", command]


UNSANDBOXED = Sandbox()


def sandbox_for(mode: SandboxMode, search_path: str | None) -> Sandbox:
    """The sandbox a process with setting `mode` uses, bubblewrap looked up on `search_path`.

    `off` runs commands unsandboxed. `bwrap` finds bubblewrap and runs one command in it
    to prove it works; if it does not, the sandbox refuses every command with the reason.
    """
    if mode == "off":
        return UNSANDBOXED
    found = shutil.which("bwrap", path=search_path)
    if found is None:
        return _refusing("bwrap (bubblewrap) is not on PATH")
    helpers = {name: shutil.which(name, path=SYSTEM_PATH) for name in HELPERS}
    lacking = [name for name, where in helpers.items() if where is None]
    if lacking:
        return _refusing(f"{', '.join(lacking)} (util-linux) not found in {SYSTEM_PATH}")
    sandbox = Sandbox(found, privileged=os.geteuid() == 0, helpers=_found(helpers))
    failure = _try(sandbox)
    return sandbox if failure is None else _refusing(failure)


def _try(sandbox: Sandbox) -> str | None:
    """Run one command in `sandbox`; None if it ran as it should, else what went wrong."""
    with tempfile.TemporaryDirectory(prefix="cairn-sandbox-") as scratch:
        try:
            finished, started = sandbox._run_bwrap(
                "echo ok", Path(scratch), CommandLimits(30.0, 4_000), False, {}
            )
        except (ToolError, OSError) as exc:  # timed out, or bwrap cannot be executed
            return f"a trial command in it failed: {exc}"
    if not started:
        return f"bwrap fails: {_start_failure(finished)}"
    if finished.report() != "exit code 0\nok\n":
        return f"a trial command in it gave {finished.report()!r}"
    return None


_process: list[Sandbox] = []  # this process's sandbox, once chosen or probed


def use_sandbox(sandbox: Sandbox) -> None:
    """Make `sandbox` the one this process runs agents' commands in (a worker's, at start)."""
    _process[:] = [sandbox]


def process_sandbox() -> Sandbox:
    """The sandbox this process runs agents' commands in (`run_command`, `verify`).

    The one its entry point chose (`use_sandbox`), else bubblewrap found on PATH, probed
    once: a process that cannot sandbox refuses commands rather than run them bare.
    """
    if not _process:
        _process.append(sandbox_for("bwrap", None))
    return _process[0]


def _refusing(why: str) -> Sandbox:
    return Sandbox(
        refusal=f"worker {_worker()} cannot sandbox commands ({why}), so it runs none: "
        "install bubblewrap, or set CAIRN_SANDBOX=off to run them unsandboxed"
    )


def _start_failure(finished: Finished) -> str:
    """Why bubblewrap did not start a command: the last line it printed."""
    lines = finished.output.strip().splitlines()
    return lines[-1] if lines else f"exit code {finished.exit_code}"


def _found(helpers: Mapping[str, str | None]) -> dict[str, str]:
    return {name: where for name, where in helpers.items() if where is not None}


def _worker() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _system_mounts() -> list[str]:
    """The arguments that show the system's programs, libraries and some of /etc, read-only."""
    argv: list[str] = []
    for directory in SYSTEM_DIRS:
        path = Path(directory)
        if path.is_symlink():  # a merged /usr: /bin → usr/bin
            argv += ["--symlink", str(path.readlink()), directory]
        elif path.is_dir():
            argv += ["--ro-bind", directory, directory]
    argv += ["--perms", "0755", "--dir", "/etc"]
    for name in ETC:
        argv += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    prefix = _interpreter_prefix()
    if prefix is not None:
        # Its parents are made as plain directories (0755), whatever the host's are: a
        # Python under /root is shown without showing /root.
        parents = list(reversed(Path(prefix).parents))[1:]
        for parent in parents:
            argv += ["--perms", "0755", "--dir", str(parent)]
        argv += ["--ro-bind", prefix, prefix]
    return argv


def _interpreter_prefix() -> str | None:
    """The installation of the Python Cairn runs under, if outside the system's directories.

    Its base installation, not a virtual environment: Cairn's own packages stay hidden.
    """
    prefix = os.path.realpath(sys.base_prefix)
    if any(prefix == d or prefix.startswith(f"{d}/") for d in SYSTEM_DIRS):
        return None
    return prefix


def _interpreter_bin() -> str | None:
    """Where `python3` is in `_interpreter_prefix`, first on a sandboxed command's PATH."""
    prefix = _interpreter_prefix()
    return None if prefix is None else f"{prefix}/bin"


def _hand_over(workspace: Path) -> None:
    """Make `SANDBOX_UID` own the workspace, so a command dropped to it can write there."""
    uid = SANDBOX_UID
    os.chown(workspace, uid, uid)
    for directory, dirs, files in os.walk(workspace):
        for name in (*dirs, *files):
            os.chown(Path(directory, name), uid, uid, follow_symlinks=False)


def _read_all(fd: int) -> bytes:
    """What a pipe holds, without waiting for writers that may still hold it open."""
    os.set_blocking(fd, False)
    chunks: list[bytes] = []
    while True:
        try:
            chunk = os.read(fd, READ_CHUNK)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def _run(
    argv: list[str],
    limits: CommandLimits,
    env: dict[str, str],
    *,
    cwd: Path | None = None,
    status_fd: int | None = None,
) -> Finished:
    """Run `argv`, keep the head and tail of its output, kill all it started at the timeout."""
    proc = subprocess.Popen(  # noqa: S603 - running the model's command is this module's job
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        pass_fds=() if status_fd is None else (status_fd,),
        start_new_session=True,  # its own process group, so a timeout kills it all
    )
    assert proc.stdout is not None  # stdout=PIPE
    output = _Output(limits.output)
    try:
        done = _collect(proc, output, time.monotonic() + limits.timeout)
    finally:
        if proc.returncode is None:  # timed out, or interrupted: leave nothing running
            # bubblewrap's own child dies with it (--die-with-parent), and with that child
            # the PID namespace and everything in it.
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stdout.close()
    if not done:
        raise ToolError(f"command timed out after {limits.timeout:g} s and was killed")
    return Finished(proc.returncode, output.text())


class _Output:
    """A command's output, decoded as it comes, of which only a head and a tail are kept.

    The text is what decoding all of it at once would give, truncated to `limit`
    characters the same way, yet a command printing gigabytes holds O(`limit`) in memory.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.head_size = limit // 2
        self.tail_size = limit - self.head_size
        self.head = ""
        self.tail = ""  # what follows the head; trimmed to its last `tail_size` characters
        self.chars = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes, *, final: bool = False) -> None:
        """Take the next bytes of output (`final` when there are no more)."""
        text = self._decoder.decode(data, final)
        self.chars += len(text)
        room = self.head_size - len(self.head)
        if room > 0:
            self.head, text = self.head + text[:room], text[room:]
        self.tail += text
        if len(self.tail) > 2 * self.tail_size:  # trim rarely: copying is amortized O(1)
            self.tail = self.tail[-self.tail_size :]

    def text(self) -> str:
        """The whole output, or its head and tail around a note of how much was cut."""
        self.feed(b"", final=True)
        if self.chars <= self.limit:
            return self.head + self.tail
        return (
            self.head
            + f"\n… [{self.chars - self.limit} characters cut] …\n"
            + self.tail[-self.tail_size :]
        )


def _collect(proc: subprocess.Popen[bytes], output: _Output, deadline: float) -> bool:
    """Feed `proc`'s output to `output` and wait for it to exit: False if `deadline` came first."""
    assert proc.stdout is not None  # stdout=PIPE
    if not _drain(proc.stdout.fileno(), output, deadline):
        return False
    try:  # its output is closed, but the command may still run: the deadline covers both
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return False
    return True


def _drain(fd: int, output: _Output, deadline: float) -> bool:
    """Feed what `fd` yields to `output` until end of file (True) or `deadline` (False)."""
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not selector.select(remaining):
                return False
            chunk = os.read(fd, READ_CHUNK)
            if not chunk:
                return True
            output.feed(chunk)
