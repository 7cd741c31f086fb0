"""A task's `verify` command, the coordinator's side: launch its job, watch it, read its verdict.

See `cairn.coordinator.verify` for the whole of it: the worker runs the command and writes the
verdict; here the coordinator launches the job when every agent rests, reads the verdict
at each look of the task, and tries a job that is over without one again, `TRIES` times.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import cast

import redis
from rq import Queue
from rq.exceptions import InvalidJobOperation, NoSuchJobError
from rq.serializers import JSONSerializer

from cairn.agents.logs import get_logger
from cairn.coordinator.jobstate import JobState, TakenJobs, job_over
from cairn.coordinator.runs import RunState
from cairn.coordinator.spec import Limits
from cairn.coordinator.verify import BACKOFF, FIELD, JOB, TRIES, Verdict, VerifyRun
from cairn.coordinator.worker import CairnJob
from cairn.storage import keys

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class GaveUp:
    """No verdict will come: every try of the verify job ended without one."""

    reason: str


class Verifier:
    """Launches a task's verify jobs and watches them until one gives its verdict."""

    def __init__(self, client: redis.Redis, queue: Queue, runs: RunState, grace: float) -> None:
        self.redis, self.queue, self.runs, self.grace = client, queue, runs, grace
        self.taken = TakenJobs(grace)

    def poll(
        self, task: str, number: int, epoch: int, limits: Limits, now: float | None = None
    ) -> Verdict | GaveUp | None:
        """The verdict on GC `number`'s files, once a worker gave it; None while waiting.

        The first call for (`epoch`, `number`) launches the job; a try over without a
        verdict is launched again after a backoff, and after `TRIES` the answer is
        `GaveUp` with the last try's reason.
        """
        now = time.time() if now is None else now
        pipe = self.redis.pipeline(transaction=False)
        pipe.hget(keys.run(task), FIELD)
        pipe.get(keys.verdict(task, epoch, number))
        raw, said = cast(list[bytes | None], pipe.execute())
        current = VerifyRun.load(raw) if raw is not None else None
        if current is None or (current.epoch, current.gc) != (epoch, number):
            self._launch(task, VerifyRun(epoch, number, 1), limits)
            return None
        if said is not None:
            return Verdict.load(said)
        if current.retry_at:
            if now >= current.retry_at:
                self._launch(task, current, limits)
            return None
        beat = keys.verify_beat(task, epoch, number, current.attempt)
        beating = bool(self.redis.exists(beat))  # this very try's: no other beats there
        [job] = JobState.read_many(self.redis, [current.job], self.queue.key, self.grace, now)
        [job] = self.taken.judge(task, [current.job], [job], now)
        # The job's own time limit is `verify_timeout`: a little more before it counts as hung.
        why = job_over(job, "a verdict", limits.verify_timeout + 30, beating, self.grace, now)
        if why is None:
            return None
        if current.attempt >= TRIES:
            return GaveUp(f"{TRIES} tries of its job ended without a verdict; the last: {why}")
        # Gone, or ended already: nothing left to cancel.
        with contextlib.suppress(NoSuchJobError, InvalidJobOperation, redis.RedisError):
            CairnJob.fetch(current.job, connection=self.redis, serializer=JSONSerializer).cancel()
        pause = BACKOFF[min(current.attempt, len(BACKOFF)) - 1]
        retry = VerifyRun(epoch, number, current.attempt + 1, retry_at=now + pause)
        self.runs.write(task, {FIELD: retry.dump()})
        log.info("verify tried again", task=task, gc=number, attempt=retry.attempt, why=why)
        return None

    def _launch(self, task: str, run: VerifyRun, limits: Limits) -> None:
        """Enqueue the verify job of `run` and note it in the run hash."""
        job = f"cairn-{task}-{run.epoch}-verify-{run.gc}-{run.attempt}"
        self.queue.enqueue_call(
            JOB,
            args=(task, run.gc, run.epoch, run.attempt),
            job_id=job,
            timeout=int(limits.verify_timeout) + 60,
            result_ttl=60,
            failure_ttl=86_400,
        )
        self.runs.write(task, {FIELD: VerifyRun(run.epoch, run.gc, run.attempt, job).dump()})
        log.info("verify launched", task=task, gc=run.gc, epoch=run.epoch, attempt=run.attempt)

    def forget(self, task: str) -> None:
        """Drop what was noted of `task`'s jobs."""
        self.taken.forget(task)
