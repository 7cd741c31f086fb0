"""One chaos run: real processes, the seed's faults, and what the checker needs afterwards.

A run starts its own redis-server (AOF, fsync on every write) behind a delaying proxy,
two coordinator processes (one leads, one stands by), and the plan's worker processes, all
reaching Redis through the proxy; each worker through a link of its own too (a proxy the
partition fault cuts). A plan that fails Redis over runs instead on a primary, two
replicas and three Sentinels, every process given their `redis+sentinel://` URL and no
proxy. It submits the team with `cairn submit`, injects the
plan's faults on a thread while the main loop keeps the worker pool and a standby alive
(as a supervisor would), and stops when the task ends or the time bound passes. Then it
reads the history and the stored checkpoints, and checks them.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, cast

import redis
import yaml
from pydantic import JsonValue

from cairn.coordinator.settings import load_settings, open_store
from cairn.coordinator.worker import UNAVAILABLE
from cairn.errors import RedisServerError
from cairn.storage import keys
from cairn.storage.backends.redis import connect
from cairn.testing.coordinator import KILL_AT_COMMIT, cure, kill_at_commit, lose_wakes, poison
from cairn.testing.faults import KILL_AFTER_COMPACTION
from cairn.testing.redis_server import RedisServer
from cairn.testing.replicas import ReplicaSet
from chaos.checker import Violation, check
from chaos.faults import Fault, Plan
from chaos.observe import GCView, History, Observed, observe, read_history
from chaos.proxy import DelayProxy
from chaos.spawning import fork_after_spawn, forks_seen, kill_at_spawn, restore_across_spawn
from chaos.spawning import running as running_steps
from chaos.team import team, victim

TESTING_COORDINATOR = ("poison_task", "kill_coordinator_mid_commit", "lose_wakes")

ROOT = Path(__file__).resolve().parents[1]
TERMINAL = {"succeeded", "failed", "cancelled", "unrecoverable"}
ARCHIVE_FS_BYTES = 32 * 1024 * 1024
# The headroom the `maxmemory` fault leaves above what Redis uses, and the key filling it.
MAXMEMORY_MARGIN = 64 * 1024
FLUSHALL_RESTORE_FOR = 30.0  # seconds the operator keeps trying a refused restore
MEMORY_FILLER = "chaos:maxmemory-filler"
# What a fault that could not be injected raises (a promotion that never came, too).
FAULT_ERRORS = (OSError, redis.RedisError, subprocess.SubprocessError, RedisServerError)
BUSY_WAIT = 2.0  # seconds a fault on "a worker running a step" waits for one to run
TIMESTAMP = "%Y-%m-%dT%H:%M:%S.%fZ"  # structlog's ISO timestamps in UTC, as the logs spell them
# Seconds after a split within which every process has left the old primary: a pool asks the
# Sentinels every second (cairn.storage.backends.sentinel), a worker's wait for a job ends
# within 5 s (cairn.coordinator.worker.DEQUEUE_WAIT), a commit under way finishes first.
SPLIT_LEFT_WITHIN = 8.0
# The phases of the coordinator a `poison_task` fault may make raise: each one a second
# task reaches, and cannot get past while it raises. Raising for longer than it takes the
# coordinator to pause a task whose advance keeps failing (`cairn.coordinator.isolation`: 10 s,
# tried at 0.25 s doubling to 5 s apart, so the pause comes at its try after 12.75 s).
POISON_PHASES = ("begin", "watch", "commit", "after commit", "verify", "finish")
POISON_FOR = 20.0
VICTIM_ENDS_WITHIN = 60.0  # seconds after the run's task, for a second task to end


@dataclass
class RunResult:
    """A run's verdict and what it saw."""

    plan: Plan
    task: str
    seconds: float
    history: History
    observed: Observed
    violations: list[Violation] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # faults not injected, and why


def utc_now() -> str:
    """Now, as structlog's ISO timestamps spell it (UTC): comparable with log lines."""
    return datetime.now(UTC).strftime(TIMESTAMP)


class ChaosRun:
    """One run of one plan in `directory`; `ledger` is the session's shared ledger."""

    def __init__(
        self, plan: Plan, directory: Path, ledger: Path, timeout: float, mount: bool
    ) -> None:
        self.plan, self.dir, self.ledger, self.timeout = plan, directory, ledger, timeout
        self.mount = mount and any(f.kind == "full_archive" for f in plan.faults)
        self.logs = directory / "logs"
        self.archive = directory / "archive"
        # The harness reads what the processes wrote, with their settings (the archive here).
        self.settings = load_settings(archive_dir=self.archive)
        # One of the two: a lone server (behind the proxies), or replicas to fail over.
        self.server: RedisServer | None = None
        self.replica_set: ReplicaSet | None = None
        if plan.replicas:
            self.replica_set = ReplicaSet(directory / "redis", replicas=2)
        else:
            self.server = RedisServer(directory / "redis", appendonly=True, fsync="always")
        self.proxy: DelayProxy | None = None
        self.client: redis.Redis | None = None  # straight to Redis, for the harness alone
        self.workers: list[subprocess.Popen[bytes]] = []
        self.links: dict[int, DelayProxy] = {}  # worker pid → its own link to the proxy
        self.paused: set[int] = set()
        self.cut: set[int] = set()  # workers partitioned off Redis now
        self.coordinators: dict[str, subprocess.Popen[bytes]] = {}
        self.handles: list[IO[bytes]] = []
        self.names: dict[int, str] = {}  # pid → the process's name (its log's)
        self.quits: list[str] = []  # processes that exited on their own, and how
        self.task = ""
        self.started = 0.0
        self.done = threading.Event()
        # While the primary moves, and until every process has left the old one, a task
        # may end on the old primary only: its end counts once they all follow the new.
        self.moving = threading.Event()
        self.settled_by = 0.0  # monotonic: when the last move's old primary is left
        self.skipped: list[str] = []
        self.events = self.logs / "harness.jsonl"
        self.rng = random.Random(plan.seed * 7919)  # targets of faults, apart from the plan
        # Coordinators with the testing hooks (`cairn.testing.coordinator`), where a fault
        # needs them: one that poisons a phase, kills at a commit or loses wakes.
        self.poisonable = any(f.kind in TESTING_COORDINATOR for f in plan.faults)
        self.victims: dict[str, str] = {}  # second task → the phase poisoned for it
        self.forks: dict[str, int] = {}  # fork of the task → the GC it was forked at
        self.fork_sources: dict[str, GCView] = {}  # fork → its source GC, read as it was made
        self._spawned = 0

    # the run ------------------------------------------------------------------------------
    def execute(self, reference: Observed | None) -> RunResult:
        """Run the plan; check against `reference` (None: this is the fault-free run)."""
        self.logs.mkdir(parents=True, exist_ok=True)
        try:
            self._start()
            self.task = self._submit()
            self.started = time.monotonic()
            injector = threading.Thread(target=self._inject_all, name="faults", daemon=True)
            injector.start()
            ended = self._wait()
            seconds = time.monotonic() - self.started
            self.done.set()
            injector.join(timeout=120)
            self._calm()
            # A restore under way as the task ended runs it again from the restored GC: the
            # end that counts is the one after the last fault.
            if ended and self.run_state().get("status") not in TERMINAL:
                ended = self._wait()
                seconds = time.monotonic() - self.started
            return self._verdict(reference, ended, seconds)
        finally:
            self._stop()

    def _start(self) -> None:
        if self.mount:
            self.archive.mkdir(parents=True, exist_ok=True)
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={ARCHIVE_FS_BYTES}", "tmpfs",
                 str(self.archive)], check=True, capture_output=True,
            )  # fmt: skip
        if self.replica_set is not None:
            self.client = connect(self.replica_set.start().url)
        else:
            server = self.server_started()
            self.client = connect(server.url)
            self.proxy = DelayProxy(server.port).start()
        for _ in range(2):
            self._start_coordinator()
        for _ in range(self.plan.workers):
            self.workers.append(self._start_worker())

    def server_started(self) -> RedisServer:
        """The lone redis-server, started unless it runs (a run without replicas only)."""
        assert self.server is not None
        if self.server.process is None:
            self.server.start()
        return self.server

    def _url(self, port: int | None) -> str:
        """Redis's URL for a process: the Sentinels', else the proxy's (or a link's `port`)."""
        if self.replica_set is not None:
            return self.replica_set.url
        assert self.proxy is not None
        return f"redis://127.0.0.1:{port or self.proxy.port}/0"

    def _env(self, name: str, port: int | None = None) -> dict[str, str]:
        return {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            # The team's effects go to chaos/ledger.py, outside the workspace, run by this
            # interpreter: a sandboxed command could reach neither, so commands run bare.
            "CAIRN_SANDBOX": "off",
            "CAIRN_REDIS_URL": self._url(port),
            "CAIRN_ARCHIVE_DIR": str(self.archive),
            "CAIRN_CACHE_DIR": str(self.dir / "cache" / name),
            "CAIRN_LOG_FORMAT": "json",
            "CAIRN_LOG_LEVEL": "info",
            "CAIRN_AUDIT": "1",  # fences and accepted writes, in Redis's order, for the checker
        }

    def _spawn(
        self, args: list[str], name: str, port: int | None = None
    ) -> subprocess.Popen[bytes]:
        handle = (self.logs / f"{name}.log").open("ab")
        self.handles.append(handle)
        process = subprocess.Popen(
            [sys.executable, "-m", *args], env=self._env(name, port), stdout=handle,
            stderr=handle, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        self.names[process.pid] = name
        return process

    def _exited(self, process: subprocess.Popen[bytes]) -> bool:
        """True once `process` has exited; noted in `quits` unless the harness killed it.

        A worker started while Redis does not answer or refuses writes exits with
        `UNAVAILABLE` by design, for its supervisor (here, `supervise`) to start it again.
        """
        code = process.poll()
        if code is None:
            return False
        if code not in (-signal.SIGKILL, UNAVAILABLE):
            self.quits.append(f"{self.names[process.pid]} exited with {code}")
        return True

    def _start_coordinator(self) -> None:
        self._spawned += 1
        name = f"coordinator-{self._spawned}"
        url = self._env(name)["CAIRN_REDIS_URL"]
        module = "cairn.testing.coordinator" if self.poisonable else "cairn.coordinator"
        self.coordinators[name] = self._spawn(
            [module, url, "--name", name, "--lease-ms", "1000"], name
        )

    def _start_worker(self) -> subprocess.Popen[bytes]:
        """Start a worker whose every connection goes through a link of its own.

        With replicas there is no proxy to link to: the worker asks the Sentinels.
        """
        self._spawned += 1
        name = f"worker-{self._spawned}"
        # Made by `kill_after_compaction`: the first worker past a compaction dies there.
        flag = [KILL_AFTER_COMPACTION, str(self.dir / "kill-after-compaction")]
        concurrency = ["--concurrency", str(self.plan.concurrency), *flag]
        if self.proxy is None:
            url = self._env(name)["CAIRN_REDIS_URL"]
            return self._spawn(["cairn.testing.worker", url, *concurrency], name)
        link = DelayProxy(self.proxy.port).start()
        url = self._env(name, link.port)["CAIRN_REDIS_URL"]
        worker = self._spawn(["cairn.testing.worker", url, *concurrency], name, link.port)
        self.links[worker.pid] = link
        return worker

    def cairn(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """Run a `cairn` command as a person would, its log lines kept with the others."""
        self._spawned += 1
        env = self._env(f"cli-{self._spawned}")
        with (self.logs / f"cli-{self._spawned}.log").open("ab") as log:
            return subprocess.run(
                [sys.executable, "-m", "cairn.cli", *args], env=env, stdout=subprocess.PIPE,
                stderr=log, text=True, timeout=timeout, check=False,
            )  # fmt: skip

    def _submit(self, name: str = "team", spec_of: dict[str, JsonValue] | None = None) -> str:
        spec = self.dir / f"{name}.yaml"
        spec.write_text(yaml.safe_dump(spec_of or team(self.ledger, self.plan.durability)))
        done = self.cairn("submit", str(spec), "--json")
        if done.returncode != 0:
            raise RuntimeError(f"cairn submit failed ({done.returncode}): see {self.logs}")
        return str(json.loads(done.stdout)["task_id"])

    def run_state(self, task: str | None = None) -> dict[str, str]:
        """The run record of `task` (default: the run's), empty while Redis does not answer."""
        assert self.client is not None
        try:
            raw = cast(dict[bytes, bytes], self.client.hgetall(keys.run(task or self.task)))
        except redis.RedisError:
            return {}
        return {k.decode(): v.decode() for k, v in raw.items()}

    def _wait(self) -> bool:
        """Keep the pool alive until the task ends (True) or the bound passes (False).

        After a split, an end counts only once every process has left the old primary
        (`SPLIT_LEFT_WITHIN`): before, the task may have ended there alone, and the
        harness's own pool may still read it there.
        """
        deadline = self.started + self.timeout
        while time.monotonic() < deadline:
            settled = not self.moving.is_set() and time.monotonic() >= self.settled_by
            if settled and self.run_state().get("status") in TERMINAL:
                return True
            self.supervise()
            time.sleep(0.1)
        return False

    def supervise(self) -> None:
        """Start a worker for each that died, and a standby when fewer than two coordinate."""
        for n, worker in enumerate(self.workers):
            if self._exited(worker):
                link = self.links.pop(worker.pid, None)
                if link is not None:
                    link.close()
                self.cut.discard(worker.pid)
                self.workers[n] = self._start_worker()
        for name, process in list(self.coordinators.items()):
            if self._exited(process):
                del self.coordinators[name]
        while len(self.coordinators) < 2:
            self._start_coordinator()

    def _calm(self) -> None:
        """Undo what faults left behind, so the end state can be read."""
        for pid in self.paused:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        if self.proxy is not None:
            self.proxy.delay = 0.0
        for link in self.links.values():
            link.mend()
        self._free_memory()
        (self.archive / "filler").unlink(missing_ok=True)
        if self.server is not None:
            self.server_started()

    def _verdict(self, reference: Observed | None, ended: bool, seconds: float) -> RunResult:
        assert self.client is not None
        store = open_store(self.settings, self.client)
        observed = observe(store, self.client, self.task, self.run_state(), self.ledger)
        history = read_history(self.logs, self.task)
        result = RunResult(self.plan, self.task, seconds, history, observed, skipped=self.skipped)
        stranded = self._stranded()
        for process in [*self.workers, *self.coordinators.values()]:
            self._exited(process)  # since the last look of `supervise`
        forks = forks_seen(self, TERMINAL)
        result.violations = check(history, observed, reference or observed,
                                  self.plan.durability, ended, self.quits, stranded,
                                  forks)  # fmt: skip
        return result

    def _stranded(self) -> list[str]:
        """Each second task that did not end `succeeded` within its bound, and how it ended."""
        deadline = time.monotonic() + VICTIM_ENDS_WITHIN
        stranded = []
        for task, phase in self.victims.items():
            while True:
                run = self.run_state(task)
                if run.get("status") in TERMINAL or time.monotonic() > deadline:
                    break
                self.supervise()
                time.sleep(0.1)
            if run.get("status") != "succeeded":
                ended = run.get("status") or "never"
                stranded.append(f"second task {task} (poisoned in {phase}) ended "
                                f"{ended}: {run.get('reason', '')}")  # fmt: skip
        return stranded

    def _stop(self) -> None:
        processes = [*self.workers, *self.coordinators.values()]
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
        for process in processes:
            process.wait()
        for handle in self.handles:
            handle.close()
        for link in self.links.values():
            link.close()
        if self.proxy is not None:
            self.proxy.close()
        if self.client is not None:
            self.client.close()
        if self.server is not None:
            self.server.kill()
        if self.replica_set is not None:
            self.replica_set.stop()
        if self.mount:
            subprocess.run(["umount", "-l", str(self.archive)], check=False, capture_output=True)

    # faults -------------------------------------------------------------------------------
    def _event(self, **fields: object) -> None:
        fields = {"task": self.task, "t": round(time.monotonic() - self.started, 3),
                  "timestamp": utc_now(), **fields}  # fmt: skip
        with self.events.open("a") as out:
            out.write(json.dumps(fields) + "\n")

    def _inject_all(self) -> None:
        for fault in self.plan.faults:
            if self.done.wait(max(0.0, self.started + fault.at - time.monotonic())):
                self.skipped.append(f"{fault.kind}: the task had ended")
                continue
            try:
                detail = getattr(self, f"_{fault.kind}")(fault)
            except FAULT_ERRORS as exc:
                self._event(event="fault failed", fault=fault.kind, error=str(exc))
                self.skipped.append(f"{fault.kind}: {exc}")
                continue
            if detail is None:
                self.skipped.append(f"{fault.kind}: nothing to inject it into")
                continue
            self._event(event="fault injected", fault=fault.kind, **detail)

    def _busy_worker(self) -> tuple[subprocess.Popen[bytes], str | None] | None:
        """A worker running a step of the task now (by its heartbeat), and its agent.

        Between supersteps no step runs for a moment: it waits up to `BUSY_WAIT` s for one.
        With none running by then, any live worker, and None for the agent.
        """
        deadline = time.monotonic() + BUSY_WAIT
        while True:
            running = running_steps(self)
            live = [w for w in self.workers
                    if w.poll() is None and w.pid not in self.paused | self.cut]  # fmt: skip
            busy = [w for w in live if w.pid in running]
            if busy or not live or time.monotonic() > deadline or self.done.is_set():
                break
            time.sleep(0.02)
        if not live:
            return None
        worker = self.rng.choice(busy or live)
        return worker, running.get(worker.pid)

    def _kill_worker(self, fault: Fault) -> dict[str, object] | None:
        found = self._busy_worker()
        if found is None:
            return None
        found[0].kill()
        return {"pid": found[0].pid, "agent": found[1]}

    def _kill_after_compaction(self, fault: Fault) -> dict[str, object] | None:
        """Arm the compaction's fault point: the next worker past one SIGKILLs itself there.

        Past the compaction's checkpoint, so the step's retry must go on from it without
        paying for the summary again; `supervise` starts a worker in its place.
        """
        flag = self.dir / "kill-after-compaction"
        flag.touch()
        return {"armed": flag.name}

    def _pause_worker(self, fault: Fault) -> dict[str, object] | None:
        """SIGSTOP a busy worker; SIGCONT it once its step was retried elsewhere.

        So it wakes as a zombie racing its successor; or after `fault.value` seconds,
        whichever comes first.
        """
        found = self._busy_worker()
        if found is None:
            return None
        worker, agent = found
        os.kill(worker.pid, signal.SIGSTOP)
        self.paused.add(worker.pid)
        attempt = self._attempt(agent) if agent is not None else 0
        threading.Thread(target=self._wake, args=(worker.pid, agent, attempt, fault.value),
                         daemon=True).start()  # fmt: skip
        return {"pid": worker.pid, "agent": agent, "seconds": fault.value}

    def _attempt(self, agent: str) -> int:
        """The attempt of `agent`'s step in flight (0: none, or Redis not answering)."""
        assert self.client is not None
        with contextlib.suppress(redis.RedisError):
            raw = cast(bytes | None, self.client.hget(keys.steps(self.task), agent))
            return 0 if raw is None else int(json.loads(raw)["attempt"])
        return 0

    def _wake(self, pid: int, agent: str | None, attempt: int, most: float) -> None:
        """SIGCONT `pid` once `agent`'s step moved past `attempt`, or after `most` s."""
        deadline = time.monotonic() + most
        while agent is not None and time.monotonic() < deadline and not self.done.is_set():
            if self._attempt(agent) > max(attempt, 1):
                time.sleep(self.rng.uniform(0.0, 0.5))  # into the retry's run
                break
            time.sleep(0.02)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        self.paused.discard(pid)

    def _leader(self) -> str | None:
        assert self.client is not None
        holder = cast(bytes | None, self.client.get(keys.LEASE))
        return None if holder is None else holder.decode().rsplit(":", 1)[0]

    def _kill_leader(self) -> dict[str, object] | None:
        """SIGKILL the coordinator holding the lease (waiting a while for a live one)."""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not self.done.is_set():
            name = self._leader() or ""
            process = self.coordinators.get(name)
            if process is not None and process.poll() is None:
                process.kill()
                return {"coordinator": name}
            time.sleep(0.05)  # the lease still names a dead leader: wait for its successor
        return None

    def _kill_coordinator(self, fault: Fault) -> dict[str, object] | None:
        return self._kill_leader()

    def _kill_coordinator_mid_commit(self, fault: Fault) -> dict[str, object] | None:
        """Kill the leader past a superstep's last vote and its wake, as its commit begins.

        The leader (`cairn.testing.coordinator`) kills itself there once armed: a harness
        polling for the last vote would land after the commit, which follows the vote's
        wake within milliseconds.
        """
        assert self.client is not None
        leader = self._leader()
        kill_at_commit(self.client)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not self.done.is_set():
            if not self.client.exists(KILL_AT_COMMIT):
                return {"leader": leader, "superstep": self.run_state().get("superstep")}
            time.sleep(0.01)
        self.client.delete(KILL_AT_COMMIT)  # no commit came: nothing killed
        return None

    def _lose_wakes(self, fault: Fault) -> dict[str, object] | None:
        """Make the leader drop every wake it takes for `fault.value` seconds."""
        assert self.client is not None
        lose_wakes(self.client, fault.value)
        return {"seconds": fault.value, "leader": self._leader()}

    def _restart_redis(self, fault: Fault) -> dict[str, object] | None:
        assert self.server is not None
        self.server.kill()
        time.sleep(fault.value)
        self.server.start()
        return {"down_s": fault.value}

    def _failover(self, fault: Fault) -> dict[str, object] | None:
        """SIGKILL the primary; return once every Sentinel names the replica promoted.

        The Sentinels promote it, or, when they would not in `FAILOVER_WAIT` s (after a
        stall of the whole machine put them in TILT), the harness does, as an operator
        would (`promoted_by` says which). The old primary stays dead, so the one replica
        left is the one `replicated` waits for. `promoted_at` (on the processes' clock)
        is when the checker counts what a GC only the old primary held as lost: no write
        reaches a primary in between.
        """
        assert self.replica_set is not None
        old = self.replica_set.primary()
        killed_at = utc_now()
        try:
            new, by = self.replica_set.failover(), "sentinel"
        except RedisServerError as exc:  # the Sentinels would not: as an operator does
            new, by = self.replica_set.promote(old), f"hand ({exc})"
        return {"old_port": old.port, "new_port": new.port, "killed_at": killed_at,
                "promoted_at": utc_now(), "promoted_by": by}  # fmt: skip

    def _split_primary(self, fault: Fault) -> dict[str, object] | None:
        """Promote a replica while the old primary lives on; return once the Sentinels agree.

        The old primary keeps answering, with no replica, until the run ends: the
        processes must leave it on their own (`cairn.storage.backends.sentinel`). `left_by` is
        `SPLIT_LEFT_WITHIN` s after the promotion: a GC only the old primary held may be
        lost until every process has left it, so the checker counts what was not durable
        by then as gone with it.
        """
        assert self.replica_set is not None
        promoted = datetime.now(UTC)  # before: a write may reach the new primary at once
        self.settled_by = time.monotonic() + SPLIT_LEFT_WITHIN
        self.moving.set()
        try:
            old, new = self.replica_set.split()
        finally:
            self.moving.clear()
        left_by = (promoted + timedelta(seconds=SPLIT_LEFT_WITHIN)).strftime(TIMESTAMP)
        return {"old_port": old.port, "new_port": new.port,
                "promoted_at": promoted.strftime(TIMESTAMP), "left_by": left_by}  # fmt: skip

    def _flushall(self, fault: Fault) -> dict[str, object] | None:
        assert self.client is not None
        flushed_at = utc_now()  # on the clock the processes' log lines carry
        self.client.flushall()
        time.sleep(0.5)
        # The operator brings it back, and tries again a while when the restore is refused
        # for a reason that passes (the archive's disk full: its epoch floor must be on
        # disk before an epoch is used), as a person reading the one-line error would.
        deadline, tries = time.monotonic() + FLUSHALL_RESTORE_FOR, 0
        while True:
            done = self.cairn("restore", self.task, "--json")
            tries += 1
            if done.returncode == 0 or time.monotonic() > deadline or self.done.is_set():
                break
            time.sleep(1.0)
        # Every other task Redis lost too, as an operator restores them all.
        for other in [*self.victims, *self.forks]:
            for _ in range(int(FLUSHALL_RESTORE_FOR)):
                if self.cairn("restore", other, "--json").returncode == 0:
                    break
                time.sleep(1.0)
        return {"restore_exit": done.returncode, "tries": tries, "flushed_at": flushed_at}

    def _corrupt_archive(self, fault: Fault) -> dict[str, object] | None:
        """Flip a byte of an archived LC, GC or file that GC 0 (the last fallback) lacks."""
        assert self.client is not None
        store = open_store(self.settings, self.client)
        gc0 = store.read_gc(self.task, 0)
        keep = {f"{ref.id}" for ref in gc0.members.values()} | {gc0.workspace}
        keep |= set(store.read_manifest(self.task, gc0.workspace).files.values())
        task_dir = self.archive / "tasks" / self.task
        candidates = sorted(
            p for p in [*task_dir.glob("lc/*/*"), *task_dir.glob("gc/*"),
                        *(self.archive / "blobs").glob("*/*/*")]
            if p.is_file() and not any(k in p.name for k in keep)
            and not p.name.startswith(f"{0:012d}")
        )  # fmt: skip
        if not candidates:
            return None
        path = self.rng.choice(candidates)
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
        return {"file": str(path.relative_to(self.archive))}

    def _full_archive(self, fault: Fault) -> dict[str, object] | None:
        if not self.mount:
            return None
        filler = self.archive / "filler"
        # Armed first, so the disk is freed whatever filling it raised: a filler left
        # behind keeps the archive full for good, and every restore after it refused.
        threading.Timer(fault.value, lambda: filler.unlink(missing_ok=True)).start()
        written, chunk = 0, b"\0" * 65_536
        # Unbuffered: the ENOSPC that ends the loop is the last word, with nothing left
        # for close() to flush (and raise again) outside it.
        with contextlib.suppress(OSError), filler.open("wb", buffering=0) as out:
            while True:
                written += out.write(chunk) or 0
        return {"bytes": written, "seconds": fault.value}

    def _slow_redis(self, fault: Fault) -> dict[str, object] | None:
        assert self.proxy is not None
        proxy = self.proxy
        proxy.delay = fault.value

        def restore() -> None:
            proxy.delay = 0.0

        threading.Timer(3.0, restore).start()
        return {"delay_s": fault.value}

    def _manual_restore(self, fault: Fault) -> dict[str, object] | None:
        assert self.client is not None
        store = open_store(self.settings, self.client)
        committed = [
            g.number for g in store.hot.list_gcs(self.task) if g.status.value == "committed"
        ]
        to = [] if fault.value < 0.5 or not committed else ["--to", str(self.rng.choice(committed))]
        done = self.cairn("restore", self.task, *to, "--json")
        return {"to": to[1] if to else "latest", "exit": done.returncode}

    def _partition_worker(self, fault: Fault) -> dict[str, object] | None:
        """Cut a busy worker's link to Redis for `fault.value` s, then mend it.

        Its sockets stay open and stall: its heartbeat lapses, the coordinator retries its
        step elsewhere, and what it sent meanwhile reaches Redis late, to be refused.
        """
        found = self._busy_worker()
        if found is None:
            return None
        worker, agent = found
        link = self.links[worker.pid]
        link.cut()
        self.cut.add(worker.pid)

        def mend() -> None:
            link.mend()
            self.cut.discard(worker.pid)

        threading.Timer(fault.value, mend).start()
        return {"pid": worker.pid, "agent": agent, "seconds": fault.value}

    def _maxmemory(self, fault: Fault) -> dict[str, object] | None:
        """Hold Redis at `maxmemory` (noeviction) for `fault.value` s, then free it.

        The limit is set just above what Redis uses, and a filler key takes the headroom
        (as another tenant's data would): until both go, every write that needs memory
        fails with OOM. Nothing is evicted, so the fault itself loses nothing stored.
        """
        assert self.client is not None
        used = int(cast(dict[str, int], self.client.info("memory"))["used_memory"])
        threading.Timer(fault.value, self._free_memory).start()  # whatever fails below
        self.client.set(MEMORY_FILLER, b"\0" * 2 * MAXMEMORY_MARGIN)
        self.client.config_set("maxmemory-policy", "noeviction")
        self.client.config_set("maxmemory", used + MAXMEMORY_MARGIN)
        return {"used_memory": used, "seconds": fault.value}

    def _free_memory(self) -> None:
        """Drop the filler and lift the limit (deleting needs no memory: it works at the limit)."""
        if self.client is not None:
            with contextlib.suppress(redis.RedisError):
                self.client.delete(MEMORY_FILLER)
                self.client.config_set("maxmemory", 0)

    def _kill_at_spawn(self, fault: Fault) -> dict[str, object] | None:
        return kill_at_spawn(self, fault)

    def _restore_across_spawn(self, fault: Fault) -> dict[str, object] | None:
        return restore_across_spawn(self, fault)

    def _fork_after_spawn(self, fault: Fault) -> dict[str, object] | None:
        return fork_after_spawn(self, fault)

    def _poison_task(self, fault: Fault) -> dict[str, object] | None:
        """Submit a second task and make one phase raise for it for `POISON_FOR` s.

        The phase is drawn by `fault.value`. Once lifted, the task goes on; paused for it
        meanwhile (the coordinator pauses a task whose advance keeps failing), a person
        resumes it, here the harness.
        """
        assert self.client is not None
        client = self.client
        # Submitting may fail while another fault holds (the archive's disk full under
        # `sync`, a primary moving): tried again for a while, as a person would.
        deadline = time.monotonic() + 15.0
        while True:
            try:
                task = self._submit(f"victim-{len(self.victims)}", victim())
                break
            except RuntimeError as exc:
                if time.monotonic() > deadline or self.done.is_set():
                    raise subprocess.SubprocessError(str(exc)) from None
                time.sleep(1.0)
        phase = POISON_PHASES[int(fault.value * len(POISON_PHASES))]
        poison(client, task, phase)
        self.victims[task] = phase

        def lift() -> None:
            with contextlib.suppress(redis.RedisError):
                cure(client, task)
                time.sleep(1.0)  # a try that failed before the cure may still pause it
                if self.run_state(task).get("status") == "paused":
                    self.cairn("resume", task)

        threading.Timer(POISON_FOR, lift).start()
        return {"victim": task, "phase": phase, "seconds": POISON_FOR}
