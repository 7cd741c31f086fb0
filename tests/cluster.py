"""A private Redis with real RQ worker processes and a coordinator the test drives."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, cast

import redis
import yaml
from rq import Queue, Worker
from rq.job import Job
from rq.serializers import JSONSerializer

from cairn.coordinator.coordinator import Coordinator
from cairn.coordinator.jobs import STEPS_QUEUE
from cairn.coordinator.offers import Offer, live_offers
from cairn.coordinator.spec import TaskSpec
from cairn.coordinator.tasks import Tasks
from cairn.coordinator.worker import CairnJob, CairnWorker, queues
from cairn.storage import keys
from cairn.storage.backends.disk import DiskArchive
from cairn.storage.backends.redis import RedisHotStore, connect
from cairn.storage.codec import Codec
from cairn.storage.store import CheckpointStore
from cairn.testing.redis_server import RedisServer
from cairn.testing.replicas import ReplicaSet
from tests.agent_harness import files_of

ROOT = Path(__file__).resolve().parents[1]


class Cluster:
    """A private Redis, N worker processes and a coordinator driven by the test."""

    def __init__(self, server: RedisServer | ReplicaSet, tmp: Path) -> None:
        self.server, self.tmp = server, tmp
        self.client = connect(server.url)
        self.store = CheckpointStore(
            RedisHotStore(self.client), DiskArchive(tmp / "archive"), Codec()
        )
        self.coordinator = Coordinator(self.client, self.store, heartbeat_grace=1.0)
        self.env: dict[str, str] = {}  # more variables for the processes started from now on
        self.workers: list[subprocess.Popen[bytes]] = []
        self.processes: list[subprocess.Popen[bytes]] = []
        self._logs: list[IO[bytes]] = []

    def _env(self, cache: str) -> dict[str, str]:
        return {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            # The teams here record their effects in a ledger outside the workspace, which
            # stands for the world outside and which no sandboxed command can write: these
            # workers run commands bare. The sandbox's tests set `env["CAIRN_SANDBOX"]`.
            "CAIRN_SANDBOX": "off",
            "CAIRN_REDIS_URL": self.server.url,
            "CAIRN_ARCHIVE_DIR": str(self.tmp / "archive"),
            "CAIRN_CACHE_DIR": str(self.tmp / cache),
            **self.env,
        }

    def _spawn(self, args: list[str], cache: str, log: str) -> subprocess.Popen[bytes]:
        handle = (self.tmp / log).open("wb")
        self._logs.append(handle)
        process = subprocess.Popen(
            [sys.executable, "-m", *args],
            env=self._env(cache),
            stdout=subprocess.DEVNULL,
            stderr=handle,
        )
        self.processes.append(process)
        return process

    def start_coordinator(
        self, name: str, lease_ms: int = 1_000, module: str = "cairn.coordinator"
    ) -> subprocess.Popen[bytes]:
        """Start a coordinator process (a standby while another holds the lease).

        `module` may name the testing coordinator (`cairn.testing.coordinator`), whose
        faults a test arms in Redis.
        """
        args = [module, self.server.url, "--name", name, "--lease-ms", str(lease_ms)]
        return self._spawn(args, f"coordinator-{name}", f"coordinator-{name}.log")

    def start_worker(
        self, module: str = "cairn.testing.worker", options: Sequence[str] = ()
    ) -> subprocess.Popen[bytes]:
        """Start one more worker process, with a workspace cache of its own.

        By default the testing worker, whose scripted crashes kill it (`cairn.testing.faults`).
        """
        n = len(self.workers)
        args = [module, self.server.url, *options]
        worker = self._spawn(args, f"worker-{n}", f"worker-{n}.log")
        self.workers.append(worker)
        return worker

    @property
    def tasks(self) -> Tasks:
        """The user's side (submit, status, pause, ...) on the cluster's store, as it is now."""
        return Tasks(self.client, self.store)

    def status(self, task: str) -> dict[str, object]:
        """The task's status as `cairn status --json` prints it."""
        return self.tasks.status(task).to_json()

    def drive(self, task: str, timeout: float = 60.0) -> dict[str, object]:
        """Tick the coordinator until the task ends; return its final status (as JSON)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.coordinator.tick()
            status = self.tasks.status(task)
            if status.ended:
                return status.to_json()
            time.sleep(0.02)
        raise AssertionError(f"task {task} did not end: {self.status(task)}")

    def tick_until(self, check: Callable[[], bool], timeout: float = 60.0) -> None:
        """Tick the coordinator until `check()` holds, waiting out Redis errors (an outage).

        On timeout the error names the last Redis error seen, if any, and the tail of
        every worker's log: what a failure in CI needs to be read.
        """
        deadline = time.monotonic() + timeout
        last: redis.RedisError | None = None
        while time.monotonic() < deadline:
            try:
                self.coordinator.tick()
                if check():
                    return
            except redis.RedisError as exc:
                last = exc
            time.sleep(0.02)
        raise AssertionError(f"timed out; the last Redis error: {last!r}\n{self.worker_logs()}")

    def wait_for_workers(self, count: int, timeout: float = 30.0) -> None:
        """Return once `count` workers have registered with RQ (each is taking jobs)."""
        deadline = time.monotonic() + timeout
        while Worker.count(connection=self.client) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"fewer than {count} workers started\n{self.worker_logs()}")
            time.sleep(0.05)

    def wait_for_offers(self, count: int = 1, timeout: float = 30.0) -> list[Offer]:
        """The live workers' offers (what each has), once `count` of them are in Redis."""
        deadline = time.monotonic() + timeout
        while len(offers := live_offers(self.client)) != count:
            if time.monotonic() > deadline:
                raise AssertionError(f"{count} offers never appeared\n{self.worker_logs()}")
            time.sleep(0.05)
        return offers

    def worker_logs(self, lines: int = 15) -> str:
        """The last `lines` lines of each worker's log, each under its name."""
        tails = []
        for n in range(len(self.workers)):
            text = (self.tmp / f"worker-{n}.log").read_text(errors="replace").splitlines()
            tails.append(f"--- worker-{n}.log\n" + "\n".join(text[-lines:]))
        return "\n".join(tails)

    def start_superstep(self, task: str) -> None:
        """Tick until the task has a superstep in flight (prepared, steps launched)."""
        while not int(cast(bytes, self.client.hget(keys.run(task), "superstep") or b"0")):
            self.coordinator.tick()

    def wait_for_step(self, task: str, agent: str, superstep: int, attempt: int = 1) -> int:
        """Tick until that attempt of the agent's step is running; return its worker's pid."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            self.coordinator.tick()
            beat = self.store.hot.beating(task, agent)
            if beat is not None and beat.endswith(f":{superstep}:{attempt}"):
                return int(beat.split(":")[1])
            time.sleep(0.02)
        raise AssertionError(f"step {superstep} of {agent} never ran")

    def close(self) -> None:
        """Kill the workers, close the logs and the client."""
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait()
        for log in self._logs:
            log.close()
        self.client.close()


TEAM = """
name: Fix the greeting
goal: Make greet.py greet politely.
files: {"greet.py": "print('hi')\\n"}
verify: grep -q Hello greet.py && test -f REVIEW.md
agents:
  - name: planner
    model: scripted
    script:
      - say: Plan.
        tools:
          - {name: write_file, args: {path: PLAN.md, content: "1. say Hello\\n"}}
          - {name: send_message, args: {to: coder, content: Please make it say Hello.}}
  - name: coder
    model: scripted
    script:
      - say: Waiting for the plan.
      - say: Coding.
        latency: SLOW
        tools:
          - {name: write_file, args: {path: greet.py, content: "print('Hello')\\n"}}
          - {name: run_command, args: {command: "echo coder-ran >> LEDGER"}}
          - {name: send_message, args: {to: reviewer, content: "Done, please review."}}
  - name: reviewer
    model: scripted
    script:
      - say: Nothing to review yet.
      - say: Reviewing.
        tools:
          - {name: read_file, args: {path: greet.py}}
          - {name: write_file, args: {path: REVIEW.md, content: "Looks good.\\n"}}
          - {name: finish, args: {summary: approved}}
"""


def team_spec(ledger: Path, slow: float = 0.0) -> TaskSpec:
    """Three agents working through messages on one workspace, verified by a command."""
    text = TEAM.replace("LEDGER", str(ledger)).replace("SLOW", str(slow))
    return TaskSpec.model_validate(yaml.safe_load(text))


Histories = dict[str, list[tuple[str, str | None, list[str]]]]


def files_and_histories(cluster: Cluster, task: str) -> tuple[dict[str, bytes], Histories]:
    """The task's latest files, and every agent's history (roles, texts, calls)."""
    gc = cluster.store.latest_gc(task)
    assert gc is not None
    histories = {
        agent: [
            (m.role.value, m.content, [c.name for c in m.tool_calls])
            for m in cluster.store.read_state(task, agent, ref.id, ref.checksum).messages
        ]
        for agent, ref in gc.members.items()
    }
    return files_of(cluster.store, gc), histories


Outcome = tuple[dict[str, bytes], Histories, int]


def outcome(cluster: Cluster, task: str, ledger: Path) -> Outcome:
    """The task's final files, every agent's history, how often the coder's command ran."""
    files, histories = files_and_histories(cluster, task)
    return files, histories, ledger.read_text().count("coder-ran")


def run_foreign_job(url: str, func: str, *args: object) -> Job:
    """Push a JSON job naming `func` onto Cairn's steps queue; run one burst Cairn worker."""
    client = connect(url)
    job = Queue(STEPS_QUEUE, connection=client, serializer=JSONSerializer).enqueue_call(
        func, args=args
    )
    served = queues(url)
    CairnWorker(served, connection=served[0].connection, serializer=JSONSerializer,
                job_class=CairnJob).work(burst=True)  # fmt: skip
    served[0].connection.close()
    return job  # its client stays open: the caller reads the job's status through it
