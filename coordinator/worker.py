"""The Cairn worker: an RQ worker that takes JSON jobs and runs only Cairn's functions.

It serves the control queue (restores) before the steps queue, and runs up to
`concurrency` jobs at once (`CAIRN_WORKER_CONCURRENCY`, `--concurrency`), each on a thread
of its own (a lane, kept across jobs): the main thread takes jobs from Redis only for free
lanes (as many as wait and lanes are free, in one round trip), so a job is never held
dequeued and unstarted behind a busy one. Each job runs as `SimpleWorker` runs one, in the
worker's own process (no process forked a job), with RQ's bookkeeping per job: an
execution in the queue's `StartedJobRegistry` and in the worker's execution index, so `rq
info` and RQ dashboards show every step running; the worker is `busy` while any lane runs.
A step keeps its own heartbeat, fencing token, attempt and workspace tree (a lane of the
process's cache slot), so killing the process retries every step it ran, and a zombie step
in a live process is fenced like any other.

Lanes are threads, not asyncio tasks and not processes: steps are synchronous code making
blocking HTTP, Redis and subprocess calls. The heartbeats are beaten by one thread of the
process, apart from the lanes, so a step busy on the CPU delays the beats by the
interpreter's switch interval, not by its work.
Measured against asyncio and processes: docs/benchmarks.md#worker-lanes-threads-asyncio-processes

Each worker says what it has (tools, agent kinds, MCP servers, model providers) in an
offer with a TTL, written as it starts and refreshed with its liveness beat
(`cairn.coordinator.offers`): a submit naming what no live worker has is refused.

A Redis at `maxmemory` refuses writes for a while, and a Redis failing over or
restarting is out of reach for seconds, longer than redis-py's own retries last: the
worker quits over neither (stock RQ quits on any error outside its wait for a job). Its
own bookkeeping waits: the liveness beat and the suspension check are skipped, taking a
job is tried again every `PAUSE` s, and a job it took but could not mark started, or
whose end it could not record, is left for the coordinator to retry. A step that fails
on it is retried like any other failed attempt. The log says when the wait begins
(`worker waits for Redis`) and ends (`worker reaches Redis again`).

SIGTERM (or SIGINT) stops taking jobs; the running ones get `DRAIN_SECONDS` to finish,
then those still running are handed back (their RQ jobs marked `stopped`, so the
coordinator retries them at once) and the process exits, within the 10 s `cairn worker`
and compose give it before SIGKILL. A second signal hands back at once.

Stock RQ runs it too, its jobs reading their settings from `CAIRN_*` once, as here:

    rq worker -w cairn.coordinator.worker.CairnWorker -j cairn.coordinator.worker.CairnJob \
        -S rq.serializers.JSONSerializer -u "$CAIRN_REDIS_URL" cairn-control cairn-steps

(`rq worker-pool` takes the same options; `rq info -S rq.serializers.JSONSerializer
-u URL` shows the queues and workers.)
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from queue import SimpleQueue
from types import FrameType
from typing import Any, cast

import redis
import structlog
from redis.client import Pipeline
from redis.exceptions import AuthorizationError, NoScriptError
from rq import Queue, SimpleWorker
from rq.exceptions import NoSuchJobError, StopRequested
from rq.executions import Execution
from rq.job import Job, JobStatus
from rq.job_lifecycle import call_exception_handlers, format_exc_info
from rq.registry import StartedJobRegistry
from rq.serializers import JSONSerializer
from rq.timeouts import TimerDeathPenalty
from rq.utils import decode_redis_hash, now
from rq.worker import DequeueStrategy, WorkerStatus

from cairn.agents.logs import configure_logging, get_logger
from cairn.agents.tracing import stop_tracing
from cairn.coordinator import heap
from cairn.coordinator.environment import built_environment, environment, offer_of
from cairn.coordinator.jobs import ALLOWED_JOBS, CONTROL_QUEUE, STEPS_QUEUE
from cairn.coordinator.offers import Offer, advertise, withdraw
from cairn.coordinator.settings import display_url, load_settings, process_settings, use_settings
from cairn.errors import InvalidSpec, RefusedJob, one_line
from cairn.storage.backends.redis import Lua, connect
from cairn.storage.redact import redact

log = get_logger(__name__)
BEAT_EVERY = 5.0  # seconds between a worker's RQ liveness beats
DRAIN_SECONDS = 8.0  # after SIGTERM: the steps running get this long, then are handed back
HANDED_BACK = "the worker stopped before the job ended: handed back"
SUSPENSION_CHECK_EVERY = 1.0  # seconds between looks for `rq suspend`
PAUSE = 0.5  # seconds between tries to take a job while Redis refuses writes or is out of reach
# What a Redis at maxmemory (OOM) or out of reach (a failover, a restart, a partition) raises
# once redis-py's retries are spent: waited out, not a reason to quit.
WAITED_OUT = (redis.OutOfMemoryError, redis.ConnectionError, redis.TimeoutError)
# How long one wait for a job blocks (stock RQ: worker_ttl - 15 s, 405 s). The command that
# follows it is when a connection notices that the Sentinels named another primary
# (`cairn.storage.backends.sentinel`): a worker blocked on a primary they replaced, which
# still answers, would take no job of the new one's for minutes.
DEQUEUE_WAIT = 5
# The exit code of a worker started while Redis does not answer or refuses writes: worth
# starting again (`cairn`'s code for a Redis that does not answer).
UNAVAILABLE = 3


# The fields of a job's hash that Cairn's enqueues write (RQ's `Job.to_dict` of a job made
# by `Queue.prepare_data` + `enqueue_many` or by `enqueue_call`, with an id, a timeout and
# result and failure TTLs) and that RQ writes as a worker runs and ends one. Any other is a
# Redis writer's: a callback or webhook RQ would call, a dependency, a retry or repeat RQ
# would act on, a meta or result RQ would deserialize.
JOB_FIELDS = frozenset({
    "created_at", "data", "description", "origin", "status", "enqueued_at", "timeout",
    "result_ttl", "failure_ttl", "started_at", "ended_at", "last_heartbeat", "worker_name",
    "exc_info",
})  # fmt: skip
# Fields RQ writes on every save of a job, empty on Cairn's: a value in one names a function
# RQ would import and call, or a group RQ would keep.
EMPTY_FIELDS = frozenset(
    {"success_callback_name", "failure_callback_name", "stopped_callback_name", "group_id"}
)
REFUSED_TTL = 86_400  # seconds a refused job stays in RQ's failed registry, as a failed step


class CairnJob(Job):
    """A job whose function must be one of `ALLOWED_JOBS`, read from Cairn's fields only.

    Reading a job keeps only the fields in `JOB_FIELDS`, so whatever else a Redis writer
    put in its hash (callbacks, webhooks, dependencies, retries, repeats, meta) is never
    seen by RQ, on any path: running it, or sweeping RQ's registries. A job that held such
    a field, or a field RQ cannot read, carries the reason in `refusal`: a `CairnWorker`
    marks it failed without running it, and its function is never called.
    """

    refusal: str | None = None

    def restore(self, raw_data: dict[bytes | str, Any]) -> None:
        """Load the job from its hash: Cairn's fields only, the others noted in `refusal`."""
        fields = decode_redis_hash(raw_data)
        foreign = sorted(
            name
            for name, value in fields.items()
            if name not in JOB_FIELDS and not (name in EMPTY_FIELDS and not value)
        )
        kept = {name: value for name, value in fields.items() if name in JOB_FIELDS}
        reasons = [f"fields Cairn does not set: {', '.join(foreign)}"] if foreign else []
        try:
            super().restore(kept)  # without `data`, RQ's NoSuchJobError: not a job at all
        except NoSuchJobError:
            raise
        except Exception:  # noqa: BLE001 - any value RQ cannot parse; named below
            unreadable = [name for name in sorted(kept) if not self._reads(name, kept[name])]
            # Each readable alone, not together: none but the call is kept.
            unreadable = unreadable or sorted(set(kept) - {"data"})
            reasons.append(f"fields RQ cannot read: {', '.join(unreadable)}")
            super().restore({n: v for n, v in kept.items() if n not in unreadable})
        self.refusal = f"job refused: {'; '.join(reasons)}" if reasons else None

    def _reads(self, name: str, value: object) -> bool:
        """True when RQ reads the field `name` holding `value` on its own."""
        try:
            super().restore({"data": b"", name: value})
        except Exception:  # noqa: BLE001 - whatever RQ's parsing of it raises
            return False
        return True

    @property
    def func(self) -> Callable[..., Any] | None:
        """The job's function, imported only if Cairn allows it and the job is not refused."""
        if self.refusal is not None:
            raise RefusedJob(self.refusal)
        if self.func_name not in ALLOWED_JOBS:
            raise RefusedJob(f"refusing job function {self.func_name!r}: not a Cairn job")
        return super().func  # type: ignore[no-any-return]


class CairnWorker(SimpleWorker):
    """An RQ worker on Cairn's queues, with JSON jobs, Cairn's job class and lanes.

    It runs up to `concurrency` jobs at once, each on a thread of its own (default: the
    process's `worker_concurrency` setting); `drain` bounds how long a stop waits for them.

    Its own bookkeeping is lighter than stock RQ's: the liveness beat is rate-limited
    (stock RQ beats three times a job, three round trips each, to keep a worker key that
    lives `worker_ttl`, 420 s, from expiring: a third of an empty job's cost; Cairn's
    failure detection reads a step's own heartbeat instead), and a state it already
    holds is not written again.

    Started by stock RQ (`rq worker -w cairn.coordinator.worker.CairnWorker`), it reads the
    process's settings and configures Cairn's logging from them (`CAIRN_LOG_FORMAT`,
    `CAIRN_LOG_LEVEL`) unless the process has already.

    It reads every job, and its queues' registries, as a `CairnJob` (whatever job class it
    is given: RQ's command line passes its own `Job` unless told `-j`), and marks a job
    Cairn did not make failed without running it. A failed job's traceback is redacted
    (`cairn.storage.redact`) where RQ stores and logs it.
    """

    job_class = CairnJob
    # A job's RQ timeout on a lane's thread: SIGALRM, RQ's default, reaches the main
    # thread only. (Cairn's coordinator retries a step past `step_timeout` long before.)
    death_penalty_class = TimerDeathPenalty
    # RQ's wait for a job, failing to reach Redis, tries again after 1 s, doubling up to
    # this (stock RQ: 60 s): a worker takes jobs again within seconds of a failover.
    max_connection_wait_time = 4.0

    @property
    def dequeue_timeout(self) -> int:
        """Seconds one wait for a job blocks (`DEQUEUE_WAIT`); the socket's is 10 s more."""
        return DEQUEUE_WAIT

    def __init__(
        self,
        *args: Any,  # noqa: ANN401 - RQ's own
        concurrency: int | None = None,
        drain: float = DRAIN_SECONDS,
        **kwargs: Any,  # noqa: ANN401 - RQ's own
    ) -> None:
        try:
            settings = process_settings()
        except InvalidSpec as exc:
            # Under stock `rq worker` this is the process's entry: RQ would print a
            # traceback and exit 1; a bad setting is bad input (exit 2), said in one line.
            sys.stderr.write(f"{Path(sys.argv[0]).name}: error: {exc}\n")
            raise SystemExit(2) from None
        if not structlog.is_configured():
            configure_logging(settings.log_format, settings.log_level)
        if concurrency is None:
            concurrency = settings.worker_concurrency
        self.concurrency, self.drain = concurrency, drain
        # job id → what its lane runs; the condition wakes whoever waits for a free lane
        self._lanes = threading.Condition()
        self._running: dict[str, tuple[Job, Queue, Execution]] = {}
        # jobs started and handed to the lane threads; as many threads as ever ran at once
        self._taken: SimpleQueue[tuple[Job, Queue, Execution]] = SimpleQueue()
        self._lane_threads = 0
        self._prepared: set[str] = set()  # jobs marked started with their execution
        self._take_jobs = Lua(lambda: self.connection, "take_jobs")
        self._batching = True  # jobs may be taken several at once (`_take_more`)
        self._handed_back: set[str] = set()
        self._interruptible = False  # the main thread waits (for Redis or a lane): a stop may raise
        self._stop_at: float | None = None
        self._force = threading.Event()
        self._trouble_since: float | None = None  # when Redis began refusing or went out of reach
        self._offer: Offer | None = None  # what it has, once its environment is built
        self._unsuspended_at = float("-inf")  # when it last found RQ's workers not suspended
        super().__init__(*args, **kwargs)
        if not issubclass(self.job_class, CairnJob):
            self.job_class = CairnJob
        for queue in self.queues:  # RQ's sweeps of a queue's registries read its job class
            queue.job_class = self.job_class

    def work(self, *args: Any, **kwargs: Any) -> bool:  # noqa: ANN401 - RQ's own
        """RQ's work loop; jobs are taken one at a time when it is to stop after `max_jobs`."""
        max_jobs = args[4] if len(args) > 4 else kwargs.get("max_jobs")  # noqa: PLR2004 - its place
        self._batching = max_jobs is None
        return super().work(*args, **kwargs)

    def bootstrap(self, *args: Any, **kwargs: Any) -> None:  # noqa: ANN401 - RQ's own
        """Take SIGTERM and SIGINT as a stop before the offer is written, then RQ's bootstrap.

        Stock RQ installs its handlers only after bootstrapping: a stop in between killed
        the worker outright, its offer left live for `OFFER_TTL` with nobody behind it.
        """
        self._install_signal_handlers()  # type: ignore[no-untyped-call]
        super().bootstrap(*args, **kwargs)

    def register_birth(self) -> None:
        """Register the worker with RQ, and write its offer (`cairn.coordinator.offers`)."""
        super().register_birth()  # type: ignore[no-untyped-call]
        with self._waiting_out("offer not written"), self.connection.pipeline() as batch:
            self._advertise(batch)
            batch.execute()

    def _advertise(self, batch: Pipeline) -> None:
        """Add the worker's offer to `batch`, once its environment is built.

        `cairn worker` builds it before the first job; under stock `rq worker` the offer
        follows the first job (which builds it).
        """
        if self._offer is None and (env := built_environment()) is not None:
            self._offer = offer_of(env)
        if self._offer is not None:
            advertise(batch, self.name, self._offer)

    def set_state(self, state: str, pipeline: Pipeline | None = None) -> None:
        """Set the worker's state, skipping the round trip when it is already that state.

        Stock RQ sets IDLE after each job and again as it starts waiting for the next; a
        worker with a lane still running stays BUSY.
        """
        if state == WorkerStatus.IDLE and self._running:
            return
        if pipeline is None and state == self.get_state():
            return
        super().set_state(state, pipeline)

    def heartbeat(self, timeout: int | None = None, pipeline: Pipeline | None = None) -> None:
        """Beat (in one round trip) unless the last beat was under `BEAT_EVERY` s ago."""
        if pipeline is not None or timeout is not None:
            super().heartbeat(timeout, pipeline)  # part of RQ's own pipelines: no round trip
            return
        last = self.last_heartbeat
        if last is not None and (now() - last).total_seconds() < BEAT_EVERY:
            return
        # RQ's own beat is bookkeeping (the worker key lives 420 s): Redis refusing it or
        # out of reach is no reason for the worker to quit, which RQ does on any error.
        with self._waiting_out("worker beat skipped"), self.connection.pipeline() as batch:
            super().heartbeat(None, batch)
            self._advertise(batch)  # its TTL refreshed in the same round trip
            batch.execute()

    @contextlib.contextmanager
    def _waiting_out(self, what: str) -> Iterator[None]:
        """Swallow a Redis refusing the block's writes (maxmemory) or out of reach.

        The first of a streak is logged, saying what was given up (`what`), and so is the
        streak's end, with how long it lasted; the lanes and the main thread share it.
        """
        try:
            yield
        except WAITED_OUT as exc:
            if self._trouble_since is None:
                self._trouble_since = time.monotonic()
                full = isinstance(exc, redis.OutOfMemoryError)
                state = "out of memory" if full else "out of reach"
                log.warning(
                    "worker waits for Redis", worker=self.name, redis=state, meanwhile=what,
                    error=str(exc),
                )  # fmt: skip
        else:
            since, self._trouble_since = self._trouble_since, None
            if since is not None:
                gone = round(time.monotonic() - since, 1)
                log.warning("worker reaches Redis again", worker=self.name, after_s=gone)

    def check_for_suspension(self, burst: bool) -> None:
        """Wait while RQ's workers are suspended (`rq suspend`); look at most once a second.

        Stock RQ looks before every job, a round trip on the path from one job to the
        next; a suspension takes effect within `SUSPENSION_CHECK_EVERY` here. Not at all
        while Redis refuses the check: RQ beats in its round trip, a write refused at
        maxmemory.
        """
        if time.monotonic() - self._unsuspended_at < SUSPENSION_CHECK_EVERY:
            return
        with self._waiting_out("suspension not checked"):
            super().check_for_suspension(burst)
            self._unsuspended_at = time.monotonic()

    def run_maintenance_tasks(self) -> None:
        """RQ's sweep of its registries; left for the next round while Redis is in trouble."""
        with self._waiting_out("registries not swept"):
            super().run_maintenance_tasks()  # type: ignore[no-untyped-call]

    # lanes ---------------------------------------------------------------------------------
    def dequeue_job_and_maintain_ttl(
        self, timeout: int | None, max_idle_time: int | None = None
    ) -> tuple[Job, Queue] | None:
        """Wait for a free lane, then take the next job (control queue first)."""
        self._interruptible = True
        try:
            while True:
                self._wait_for_lane()
                if self._stop_requested:
                    raise StopRequested
                with self._waiting_out("taking jobs paused"):
                    # A job taken just before a refusal is not lost: the coordinator sees
                    # it taken and never started, and retries it.
                    return super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
                time.sleep(PAUSE)
        finally:
            self._interruptible = False

    def _wait_for_lane(self) -> None:
        while True:
            with self._lanes:
                if len(self._running) < self.concurrency:
                    return
                self._lanes.wait(BEAT_EVERY)
            self.heartbeat()

    def execute_job(self, job: Job, queue: Queue) -> None:
        """Start `job`, and the waiting jobs the other free lanes can run, each on a lane.

        The others are taken in one round trip (`_take_more`), and the whole group is marked
        started in one more (`_prepare`); then each is handed to a lane and this returns (the
        main thread takes the next). A job `CairnJob` refused is not run: it is marked failed
        (`refuse`).
        """
        runnable: list[tuple[Job, Queue]] = []
        for one, origin in [(job, queue), *self._take_more()]:
            if any(one.id == other.id for other, _ in runnable):
                continue  # its id queued twice: it runs once, as one lane would run it
            if isinstance(one, CairnJob) and one.refusal is not None:
                with self._waiting_out(f"refused job {one.id} not marked failed"):
                    self.refuse(one, origin)
            else:
                runnable.append((one, origin))
        if not runnable:
            return
        names = ", ".join(one.id for one, _ in runnable)
        with self._lanes, self._waiting_out(f"jobs {names} left for a retry"):
            prepared = self._prepare([one for one, _ in runnable])
            for (one, origin), execution in zip(runnable, prepared, strict=True):
                self._running[one.id] = (one, origin, execution)
        # Not marked started (Redis refused or out of reach): the coordinator retries them.
        started = [self._running[one.id] for one, _ in runnable if one.id in self._running]
        with self._lanes:
            while self._lane_threads < len(self._running):  # every lane thread is busy
                self._lane_threads += 1
                name = f"cairn-lane-{self._lane_threads}"
                threading.Thread(target=self._lane, name=name, daemon=True).start()
        for held in started:
            self._taken.put(held)

    def _take_more(self) -> list[tuple[Job, Queue]]:
        """The waiting jobs the lanes free beside the one job just taken can run, at most.

        Taken in one round trip (`take_jobs.lua`: popped in the order RQ serves the queues,
        with their hashes), read as RQ's dequeue reads a job. None when no other lane is
        free, when the worker is stopping, or when it takes jobs otherwise than as RQ's
        `default` strategy on several queues does: one queue (RQ then moves each job it
        takes to a list of its own), another queue order, or a `max_jobs` to count.
        """
        with self._lanes:
            free = self.concurrency - len(self._running) - 1
        if free <= 0 or not self._batching or len(self.queues) == 1 or self._stop_requested:
            return []
        if self._dequeue_strategy not in (None, DequeueStrategy.DEFAULT):
            return []
        served = {q.key: q for q in self._ordered_queues}
        command = self._take_jobs.command(
            list(served), [free, self.job_class.redis_job_namespace_prefix]
        )
        reply: list[Any] = []
        with self._waiting_out("no more jobs taken"):
            try:
                reply = cast(list[Any], self.connection.execute_command(*command))  # type: ignore[no-untyped-call]
            except NoScriptError:  # a Redis that restarted: nothing was taken
                self._take_jobs.load(self.connection)
                reply = cast(list[Any], self.connection.execute_command(*command))  # type: ignore[no-untyped-call]
        taken: list[tuple[Job, Queue]] = []
        version = self.get_redis_server_version()  # type: ignore[no-untyped-call]
        for key, job_id, fields in zip(reply[::3], reply[1::3], reply[2::3], strict=True):
            one = self.job_class(
                job_id.decode(), connection=self.connection, serializer=self.serializer
            )
            try:
                one.restore(dict(zip(fields[::2], fields[1::2], strict=True)))
            except NoSuchJobError:  # a hash that is no job: RQ's dequeue skips it too
                continue
            one.redis_server_version = version
            taken.append((one, served[key.decode()]))
        return taken

    def prepare_execution(self, job: Job) -> Execution:
        """Register the job's execution and mark it started, in one round trip (`_prepare`)."""
        return self._prepare([job])[0]

    def _prepare(self, jobs: list[Job]) -> list[Execution]:
        """Register each job's execution and mark it started, all in one round trip.

        Stock RQ takes two pipelines a job: the execution on the main thread, then the job
        marked started on the thread that runs it (`prepare_job_execution`). Here both sets
        of writes go at once for every job, before any is handed to a lane.
        """
        executions = []
        ttls = [self.get_heartbeat_ttl(job) for job in jobs]
        with self.connection.pipeline() as pipeline:
            self.set_state(WorkerStatus.BUSY, pipeline=pipeline)
            self.heartbeat(max(ttls), pipeline=pipeline)  # the worker kept alive for them all
            for job, ttl in zip(jobs, ttls, strict=True):
                execution = Execution.create(job, ttl, pipeline=pipeline, worker_name=self.name)
                self.executions[execution.id] = execution
                executions.append(execution)
                job.heartbeat(now(), ttl, pipeline=pipeline)
                job.prepare_for_execution(self.name, pipeline=pipeline)
                pipeline.persist(job.key)
                if len(self.queues) == 1:  # RQ's wait on one queue keeps the job in a second list
                    pipeline.lrem(self.queues[0].intermediate_queue_key, 1, job.id)
            pipeline.execute()
        self._prepared.update(job.id for job in jobs)
        return executions

    def prepare_job_execution(self, job: Job, remove_from_intermediate_queue: bool = False) -> None:
        """Nothing more for a job `prepare_execution` marked started; RQ's own for any other."""
        if job.id in self._prepared:
            self._prepared.discard(job.id)
            return
        super().prepare_job_execution(job, remove_from_intermediate_queue)

    def _lane(self) -> None:
        """Run the jobs the main thread hands over, one at a time, as long as the process lives.

        A lane is a thread kept across jobs, not one per job: what a thread holds (its
        Redis connection, its compressor) is made once, and no job waits for a thread to
        start.
        """
        while True:
            job, queue, execution = self._taken.get()
            try:
                self._run_lane(job, queue, execution)
            except Exception:  # a lane outlives any one job's failure
                log.exception("lane failed its job", job=job.id, worker=self.name)

    def _run_lane(self, job: Job, queue: Queue, execution: Execution) -> None:
        try:
            # The job's end unrecorded: still started, its step's heartbeat gone, it is
            # retried by the coordinator as a step whose worker died.
            with self._waiting_out(f"the end of job {job.id} not recorded"):
                self.perform_job(job, queue, execution)
        finally:
            with self._lanes:
                self._running.pop(job.id, None)
                self._lanes.notify_all()
                if not self._running:
                    with contextlib.suppress(redis.RedisError):  # the next job sets it anyway
                        self.set_state(WorkerStatus.IDLE)

    def refuse(self, job: CairnJob, queue: Queue) -> None:
        """Mark a refused job failed, unrun, and log it once.

        Its hash is written anew from what `CairnJob` read, so what it held besides
        Cairn's fields is gone for every later reader, stock RQ's tools among them; its
        result says why it was refused (`rq info`, and the coordinator retries a step).
        """
        reason = job.refusal or "job refused"
        log.warning("job refused", job=job.id, queue=queue.name, reason=reason, worker=self.name)
        job.origin, job.failure_ttl, job.ended_at = queue.name, REFUSED_TTL, now()
        with self.connection.pipeline() as pipeline:
            pipeline.delete(job.key)
            job.set_status(JobStatus.FAILED, pipeline=pipeline)
            job._handle_failure(reason, pipeline=pipeline, worker_name=self.name)  # saves it
            pipeline.lrem(queue.intermediate_queue_key, 1, job.id)  # `rq worker` on one queue
            self.increment_failed_job_count(pipeline)
            pipeline.execute()

    def handle_exception(self, job: Job, *exc_info: Any) -> None:  # noqa: ANN401 - RQ's own
        """Log a job's exception, secrets redacted, then call RQ's exception handlers.

        A provider's error or a command's output in the exception can hold an API key.
        """
        self.log.error(
            "Worker %s: job %s: exception raised while executing\n%s",
            self.name, job.id, redact(format_exc_info(exc_info)),
            extra={"queue": job.origin, "job_id": job.id},
        )  # fmt: skip
        call_exception_handlers(self._exc_handlers, job, *exc_info)

    def handle_execution_ended(self, job: Job, queue: Queue, heartbeat_ttl: int) -> None:
        """Note when the job ended; its end is written next, in one round trip.

        Stock RQ beats the job here too, in a round trip of its own, to keep it alive
        through its success callback: Cairn's jobs have none.
        """
        job.ended_at = now()

    def handle_job_success(
        self, job: Job, queue: Queue, started_job_registry: StartedJobRegistry, execution: Execution
    ) -> None:
        """Record the job's success in one round trip, unless the worker handed it back.

        Stock RQ first watches and reads the job's dependents, two round trips more on a
        lane's way to its next job: the coordinator enqueues no job that depends on
        another. A job that repeats or has a rate limit (none of Cairn's) goes RQ's way.
        """
        if job.id in self._handed_back:
            return
        if job.repeats_left is not None or job.has_rate_limit:
            super().handle_job_success(job, queue, started_job_registry, execution)
            return
        took = cast(datetime, job.ended_at) - cast(datetime, job.started_at)  # set: it ran
        with self.connection.pipeline() as pipeline:  # MULTI/EXEC, as RQ's own
            self.increment_successful_job_count(pipeline=pipeline)
            self.increment_total_working_time(took, pipeline)
            result_ttl = job.get_result_ttl(self.default_result_ttl)
            if result_ttl != 0:
                job._handle_success(
                    result_ttl, pipeline=pipeline, worker_name=self.name,
                    execution_id=execution.id, execution_started_at=execution.created_at,
                    execution_ended_at=job.ended_at,
                )  # fmt: skip
            job.cleanup(result_ttl, pipeline=pipeline, remove_from_queue=False)
            job._status = JobStatus.FINISHED
            self.cleanup_execution(job, pipeline=pipeline, execution=execution)
            pipeline.execute()

    def handle_job_failure(
        self,
        job: Job,
        queue: Queue,
        started_job_registry: StartedJobRegistry | None = None,
        exc_string: str = "",
        execution: Execution | None = None,
    ) -> None:
        """Record the job's failure (its traceback redacted), unless it was handed back."""
        if job.id not in self._handed_back:
            exc_string = redact(exc_string)
            super().handle_job_failure(job, queue, started_job_registry, exc_string, execution)

    # stopping ------------------------------------------------------------------------------
    def _shutdown(self) -> None:
        """On SIGTERM or SIGINT: take no new job; the running ones get `drain` seconds."""
        self._stop_requested = True
        self._stop_at = time.monotonic()
        with contextlib.suppress(redis.RedisError):  # a stop needs no Redis
            self.set_shutdown_requested_date()  # type: ignore[no-untyped-call]
        if self._interruptible:  # waiting for Redis or a lane, holding no job: stop now
            raise StopRequested

    def request_force_stop(self, signum: int, frame: FrameType | None) -> None:
        """On a second signal: hand the running jobs back now."""
        asked = self._shutdown_requested_date
        if asked is not None and now() - asked < timedelta(seconds=1):
            return  # the same stop, sent twice (a pool and a terminal)
        self.log.warning("Worker %s: second stop signal: handing the jobs back", self.name)
        self._force.set()

    def teardown(self) -> None:
        """Let the running jobs finish (within `drain` of a stop), hand back the rest.

        The worker's offer is withdrawn (a spec is checked against the workers still live),
        then the spans its steps left are exported.
        """
        self._drain()
        # Unregistered (Redis out of reach), the worker's key expires within `worker_ttl`,
        # its offer within `OFFER_TTL`.
        with self._waiting_out("the worker's end not recorded"):
            with self.connection.pipeline() as batch:
                withdraw(batch, self.name)
                batch.execute()
            super().teardown()  # type: ignore[no-untyped-call]
        stop_tracing()  # last: a collector out of reach holds it up for seconds

    def _drain(self) -> None:
        while True:
            with self._lanes:
                if not self._running:
                    return
                late = self._stop_at is not None and time.monotonic() > self._stop_at + self.drain
                if late or self._force.is_set():
                    held = list(self._running.values())
                    self._handed_back.update(self._running)
                    break
                self._lanes.wait(0.1)
            self.heartbeat()
        for job, queue, execution in held:
            # Not handed back (Redis out of reach): its step's heartbeat stops with the
            # process, and the coordinator retries it as a step whose worker died.
            with self._waiting_out(f"job {job.id} not handed back"):
                self._hand_back(job, queue, execution)

    def _hand_back(self, job: Job, queue: Queue, execution: Execution) -> None:
        """Mark a job still running as stopped, so the coordinator retries it now.

        Its thread dies with the process; whatever it writes until then is fenced once
        the coordinator has moved the step on.
        """
        self.log.warning("Worker %s: handing back job %s", self.name, job.id)
        job.ended_at = now()
        with self.connection.pipeline() as pipeline:
            job.set_status(JobStatus.STOPPED, pipeline=pipeline)
            self.cleanup_execution(job, pipeline=pipeline, execution=execution)
            job._handle_failure(HANDED_BACK, pipeline=pipeline, worker_name=self.name)
            self.increment_failed_job_count(pipeline)
            pipeline.execute()


def queues(url: str) -> list[Queue]:
    """Cairn's queues on the Redis at `url`, control first."""
    client = connect(url)
    return [
        Queue(name, connection=client, serializer=JSONSerializer, job_class=CairnJob)
        for name in (CONTROL_QUEUE, STEPS_QUEUE)
    ]


def run_worker(
    url: str, *, burst: bool = False, name: str | None = None, concurrency: int | None = None
) -> None:
    """Work Cairn's queues until stopped (or, with `burst`, until they are empty)."""
    served = queues(url)
    worker = CairnWorker(
        served,
        connection=served[0].connection,
        serializer=JSONSerializer,
        job_class=CairnJob,
        name=name,
        concurrency=concurrency,
    )
    heap.settle()  # what it built to start is never scanned again (`cairn.coordinator.heap`)
    worker.work(burst=burst, logging_level="WARNING")


def main(argv: list[str] | None = None) -> int:
    """`python -m cairn.coordinator.worker [REDIS_URL] [--burst] [--concurrency N]`: run one worker.

    The URL comes from `CAIRN_REDIS_URL` unless given (on the command line, any user of
    the machine can read it); the other settings from `CAIRN_*`, read here once for the
    process and its jobs.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", nargs="?", help="default: CAIRN_REDIS_URL")
    parser.add_argument("--burst", action="store_true")
    parser.add_argument(
        "--concurrency", type=int, help="steps run at once (default: CAIRN_WORKER_CONCURRENCY, 1)"
    )
    args = parser.parse_args(argv)
    if args.concurrency is not None and args.concurrency < 1:
        parser.error(f"--concurrency: must be at least 1, not {args.concurrency}")
    try:
        settings = load_settings(redis_url=args.url, worker_concurrency=args.concurrency)
        url, _origin = settings.redis()
    except InvalidSpec as exc:  # a setting, not the command line: its one line, no usage
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    use_settings(settings)
    configure_logging(settings.log_format, settings.log_level)
    try:  # its tools, MCP servers and metrics (port + 1 + its cache slot) before any job
        environment()
    except InvalidSpec as exc:  # a bad tool module or MCP file: its one line, no usage
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    try:
        run_worker(url, burst=args.burst, concurrency=settings.worker_concurrency)
    except WAITED_OUT as exc:
        # Only its start can raise these: once working, it waits Redis out (see above).
        code, what = UNAVAILABLE, "does not answer"
        if isinstance(exc, redis.OutOfMemoryError):
            what = "refuses writes"
        elif isinstance(exc, redis.AuthenticationError | AuthorizationError):
            code, what = 2, "refused the credentials"  # a setting to fix: bad input
        where = display_url(url)
        parser.exit(code, f"{parser.prog}: error: Redis at {where} {what}: {one_line(exc)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
