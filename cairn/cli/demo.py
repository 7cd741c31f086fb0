"""`cairn demo`: a planner, a coder and a reviewer fix a bug through a crash and a rollback.

The team of `cairn/cli/demo/team.yaml` fixes `calc.py` on two real worker processes.
While the coder's step runs, the demo SIGKILLs its worker: the coordinator sees the
heartbeat stop and retries the step (attempt 2) on the other worker. Once the reviewer
has approved, the demo rolls the task back to an earlier global checkpoint, as a person
would: every agent and file returns to that superstep and the team plays on to the same
end, where `verify` runs the project's tests. It prints each event as it happens, then
the timeline of checkpoints and where the archive is.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import cast

from cairn.agents.logs import configure_logging
from cairn.coordinator.coordinator import Coordinator
from cairn.coordinator.runs import StepRun, TaskState
from cairn.coordinator.settings import Settings, load_settings, open_store
from cairn.coordinator.spec import TaskSpec, load_spec
from cairn.coordinator.tasks import Tasks
from cairn.coordinator.views import TaskStatus
from cairn.errors import CairnError
from cairn.storage import keys
from cairn.storage.backends.redis import connect
from cairn.storage.records import GCStatus, GlobalCheckpoint
from cairn.storage.store import CheckpointStore
from cairn.testing.redis_server import RedisServer

KILL_AGENT, KILL_SUPERSTEP = "coder", 2  # whose step loses its worker, and when
ROLLBACK_AFTER, ROLLBACK_TO = 3, 1  # once GC 3 is committed, go back to GC 1
TIMEOUT = 120.0  # seconds: the demo ends in ~15 s; this bounds a broken machine
Say = Callable[[str], None]


def demo_dir() -> Path:
    """Where the demo's team spec and project live (inside the installed package)."""
    return Path(str(resources.files("cairn.cli").joinpath("demo")))


def demo_spec(model: str | None = None, base_url: str | None = None) -> TaskSpec:
    """The demo team; with `model` ("openai:<name>") every agent uses it, not its script."""
    spec = load_spec(demo_dir() / "team.yaml")
    if model is not None:
        for agent in spec.agents:
            agent.model, agent.base_url = model, base_url
    return spec


@dataclass
class Workers:
    """The demo's worker processes (`python -m cairn.coordinator.worker`), each its own cache.

    Each learns its Redis from `CAIRN_REDIS_URL`: a URL on its command line would show.
    Its other settings are the demo's, with the archive in the demo's state directory.
    """

    url: str
    state: Path
    settings: Settings = field(default_factory=load_settings)
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self) -> subprocess.Popen[bytes]:
        """Start one more worker."""
        n = len(self.processes)
        archived = self.settings.model_copy(update={"archive_dir": self.state / "archive"})
        env = {
            **archived.child_env(self.url),
            "CAIRN_CACHE_DIR": str(self.state / f"worker-{n}"),
            "CAIRN_LOG_FORMAT": "json",
        }
        log = (self.state / f"worker-{n}.log").open("ab")
        with log:
            process = subprocess.Popen(
                [sys.executable, "-m", "cairn.coordinator.worker"],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        self.processes.append(process)
        return process

    def stop(self) -> None:
        """Stop every worker still running."""
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@contextlib.contextmanager
def redis_url(url: str | None, state: Path, say: Say) -> Iterator[str]:
    """`url`, or else a private redis-server (AOF on) in `state` for the demo's life."""
    if url:
        yield url
        return
    server = RedisServer(state / "redis", appendonly=True).start()
    say(f"started a private redis-server at {server.url} (AOF in {server.directory})")
    try:
        yield server.url
    finally:
        server.stop()


@dataclass
class Demo:
    """One run of the demo: the task, what happened, and when."""

    coordinator: Coordinator
    tasks: Tasks
    store: CheckpointStore
    workers: Workers
    say: Say
    started: float = field(default_factory=time.monotonic)
    events: list[tuple[float, str]] = field(default_factory=list)
    killed: bool = False
    rolled_back: bool = False
    seen_gcs: set[int] = field(default_factory=set)
    attempts: dict[str, int] = field(default_factory=dict)

    def event(self, text: str) -> None:
        """Print an event and keep it for the timeline."""
        at = time.monotonic() - self.started
        self.events.append((at, text))
        self.say(f"{at:6.1f}s  {text}")

    def run(self, task: str) -> TaskStatus:
        """Drive the task to its end, injecting the crash and the rollback on the way."""
        deadline = self.started + TIMEOUT
        while True:
            # The demo drives its coordinator itself, as the leader: never beside another.
            if not self.coordinator.lease.acquire():
                raise CairnError("another coordinator leads on this Redis: stop it, or run "
                                 "the demo without CAIRN_REDIS_URL (a private Redis)")  # fmt: skip
            self.coordinator.tick()
            self._watch(task)
            status = self.tasks.status(task)
            if status.ended:
                return status
            if time.monotonic() > deadline:
                self.event(f"gave up after {TIMEOUT:g} s: {status.state.value}")
                return status
            time.sleep(0.05)

    def _watch(self, task: str) -> None:
        for listed in self.store.list_gcs(task):
            if listed.status is GCStatus.COMMITTED and listed.number not in self.seen_gcs:
                self.seen_gcs.add(listed.number)
                self.event(_committed(self.store.read_gc(task, listed.number)))
        self._note_retries(task)
        if not self.killed:
            self._kill_mid_step(task)
        latest = self.store.hot.latest_gc(task) or 0
        if not self.rolled_back and latest >= ROLLBACK_AFTER:
            self.rolled_back = True
            self.event(f"a person rolls the task back to GC {ROLLBACK_TO}")
            restored = self.coordinator.restorer.restore(task, to=ROLLBACK_TO, reason="demo")
            self.event(
                f"restored: GC {restored.restored_to}'s agents and files are live again as "
                f"GC {restored.number}, under epoch {restored.epoch}; older steps are fenced"
            )

    def _kill_mid_step(self, task: str) -> None:
        beat = self.store.hot.beating(task, KILL_AGENT)
        if beat is None or not beat.endswith(f":{KILL_SUPERSTEP}:1"):
            return
        pid = int(beat.split(":")[1])
        os.kill(pid, signal.SIGKILL)
        self.killed = True
        self.event(f"SIGKILL to worker pid {pid} while {KILL_AGENT}'s step {KILL_SUPERSTEP} ran")
        self.workers.start()
        self.event("started a replacement worker")

    def _note_retries(self, task: str) -> None:
        steps = cast(dict[bytes, bytes], self.coordinator.redis.hgetall(keys.steps(task)))
        for raw_agent, raw in steps.items():
            agent, attempt = raw_agent.decode(), StepRun.load(raw).attempt
            if attempt > self.attempts.get(agent, 1):
                self.event(f"{agent}'s step retried as attempt {attempt} (its worker died)")
            self.attempts[agent] = attempt


def _committed(gc: GlobalCheckpoint) -> str:
    agents = ", ".join(f"{a} {s.value}" for a, s in gc.statuses.items())
    return f"GC {gc.number} committed: superstep {gc.superstep}, epoch {gc.epoch} ({agents})"


def timeline(store: CheckpointStore, task: str, say: Say) -> None:
    """Print every checkpoint of the task: number, superstep, epoch, status, where it is."""
    say("")
    say(" GC  superstep  epoch  status     hot  cold  members (agent:LC id)")
    for listed in store.list_gcs(task):
        gc = store.read_gc(task, listed.number)
        members = ", ".join(f"{a}:{r.id[-6:]}" for a, r in sorted(gc.members.items()))
        hot, cold = ("yes" if x else "-" for x in (listed.hot, listed.cold))
        say(
            f"{gc.number:>3}  {gc.superstep:>9}  {gc.epoch:>5}  {gc.status.value:<9}  "
            f"{hot:>3}  {cold:>4}  {members}"
        )


def run_demo(
    state: Path,
    say: Say = print,
    model: str | None = None,
    base_url: str | None = None,
    settings: Settings | None = None,
) -> int:
    """Run the demo with its state under `state`, on the settings' Redis, else a private one.

    The state holds the archive, the workers' caches and the logs (and the private
    Redis's AOF); `settings` default to the process's `CAIRN_*`. Return the exit code: 0
    when the task succeeded.
    """
    settings = settings or load_settings()
    archive = state / "archive"
    settings = settings.model_copy(update={"archive_dir": archive})
    state.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        logs = stack.enter_context((state / "coordinator.log").open("a"))
        configure_logging("json", "info", stream=logs)  # the story is printed; details there
        url = stack.enter_context(redis_url(settings.redis_url, state, say))
        client = connect(url)
        stack.callback(client.close)
        store = open_store(settings, client)
        workers = Workers(url, state, settings)
        stack.callback(workers.stop)
        for _ in range(2):
            workers.start()
        coordinator = Coordinator(client, store, heartbeat_grace=1.0)
        spec = demo_spec(model, base_url)
        tasks = Tasks(client, store)
        task = tasks.submit(spec, base=demo_dir())
        demo = Demo(coordinator, tasks, store, workers, say)
        demo.event(f"submitted {task}: {', '.join(a.name for a in spec.agents)} on 2 workers")
        try:
            status = demo.run(task)
        finally:
            coordinator.lease.release()
        demo.event(f"task {status.state.value}: {status.reason}")
        timeline(store, task, say)
        say("")
        say(f"archive: {archive.resolve()}/tasks/{task}")
        say(f"verify output: {(status.verify_output or '').strip()}")
        return 0 if status.state is TaskState.SUCCEEDED else 1


def main(argv: list[str] | None = None) -> int:
    """`python -m cairn.cli.demo [--state DIR] [--model openai:NAME]`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state", type=Path, default=Path(".cairn/demo"))
    parser.add_argument("--model", default=None, help="openai:<name> instead of the scripts")
    parser.add_argument("--base-url", default=None, help="an OpenAI-compatible endpoint")
    args = parser.parse_args(argv)
    try:
        settings = load_settings()  # CAIRN_*: a CAIRN_REDIS_URL runs the demo on that Redis
        return run_demo(args.state, model=args.model, base_url=args.base_url, settings=settings)
    except CairnError as exc:
        print(f"cairn demo: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
