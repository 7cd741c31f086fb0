"""How the coordinator tells that a job it launched (a step, a verify) is over without an answer.

A job answers by writing what it was for (a step its vote, a verify its verdict). One
that will not is found from its RQ job, read field by field without loading it
(`JobState`), and from the heartbeat its job keeps alive while it runs: gone, failed,
finished without answering, taken by a worker that died before starting it, past its
timeout, or its worker silent (`job_over`); for a step, what its job said of its end
comes first (`step_failure`). What failed is tried again after a `backoff`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, cast

import redis
from rq.job import Job, JobStatus
from rq.utils import utcparse

if TYPE_CHECKING:
    from cairn.coordinator.runs import StepRun
    from cairn.coordinator.spec import Limits

MAX_BACKOFF = 30.0  # seconds: the longest wait before a try of what keeps failing


@dataclass(frozen=True, slots=True)
class JobState:
    """The fields of an RQ job the watch needs, read without loading the whole job."""

    status: str
    started_at: float | None  # Unix seconds
    enqueued_at: float | None = None
    dequeued: bool = False  # queued, yet no longer in its queue: a worker took it

    @classmethod
    def read_many(
        cls, client: redis.Redis, ids: list[str], queue: str, grace: float, now: float
    ) -> list[JobState | None]:
        """Read the jobs' states in one round trip; None for a job that is gone.

        A job still `queued` `grace` seconds after it was enqueued is looked for in
        `queue` (a second round trip, only then): a worker that took it and died before
        starting it leaves it `queued` in no queue, where RQ's own sweep finds it only
        minutes later.
        """
        pipe = client.pipeline(transaction=False)
        for job_id in ids:
            pipe.hmget(Job.key_for(job_id), "status", "started_at", "enqueued_at")
        found: list[JobState | None] = []
        for status, started, enqueued in cast(list[list[bytes | None]], pipe.execute()):
            if status is None:
                found.append(None)
                continue
            found.append(cls(status.decode(), _when(started), _when(enqueued)))
        late = [
            (n, job_id) for n, (job_id, job) in enumerate(zip(ids, found, strict=True))
            if job is not None and job.status == JobStatus.QUEUED and job.enqueued_at
            and now - job.enqueued_at > grace
        ]  # fmt: skip
        if late:
            pipe = client.pipeline(transaction=False)
            for _, job_id in late:
                pipe.lpos(queue, job_id)
            for (n, _), place in zip(late, pipe.execute(), strict=True):
                job = found[n]
                if place is None and job is not None:
                    found[n] = cls(job.status, job.started_at, job.enqueued_at, dequeued=True)
        return found


def _when(stamp: bytes | None) -> float | None:
    """An RQ timestamp as Unix seconds."""
    return utcparse(stamp.decode()).timestamp() if stamp else None


def job_over(  # noqa: PLR0911 - one return per way a job can be over
    job: JobState | None,
    answer: str,
    timeout: float,
    beating: bool,
    grace: float,
    now: float,
) -> str | None:
    """Why a job is over without its `answer` ("a vote", "a verdict"), or None if it is not.

    `beating` says whether the heartbeat of this very try of the job is alive; it counts
    only once the job has run `grace` seconds (its first beat may still be on its way).
    """
    if job is None:
        return "its job vanished"
    if job.status in (JobStatus.FAILED, JobStatus.STOPPED, JobStatus.CANCELED):
        return f"its job {job.status}"
    if job.status == JobStatus.FINISHED:
        return f"its job finished without {answer}"
    if job.dequeued:
        return "a worker took its job and died before starting it"
    if job.status != JobStatus.STARTED or job.started_at is None:
        return None  # still queued: waiting is not failing
    running = now - job.started_at
    if running > timeout:
        return f"timed out after {timeout:g} s"
    if running > grace and not beating:
        return "its worker stopped beating (dead or stalled)"
    return None


class TakenJobs:
    """Which jobs a look found taken from their queue and not started, since when.

    A worker takes a job from its queue, then marks it started: a look between the two
    finds it in neither state, and under load that can last a while. Only a job still
    taken and not started `grace` s after a look first found it so is one whose worker
    died in between.
    """

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self._first: dict[tuple[str, str], float] = {}  # (task, job id) → first seen taken

    def judge(
        self, task: str, ids: list[str], jobs: list[JobState | None], now: float
    ) -> list[JobState | None]:
        """`jobs` (of `task`, by `ids`), each taken for under the grace counted as waiting.

        What was noted of `task`'s other jobs is forgotten: `ids` are all it watches now.
        """
        kept = {k: v for k, v in self._first.items() if k[0] != task}
        out: list[JobState | None] = []
        for job_id, job in zip(ids, jobs, strict=True):
            if job is not None and job.dequeued:
                first = kept[(task, job_id)] = self._first.get((task, job_id), now)
                if now - first < self.grace:
                    job = replace(job, dequeued=False)  # noqa: PLW2901 - the job as judged
            out.append(job)
        self._first = kept
        return out

    def forget(self, task: str) -> None:
        """Drop what was noted of `task`'s jobs."""
        self._first = {k: v for k, v in self._first.items() if k[0] != task}


def backoff(tries: int) -> float:
    """Seconds to wait before try `tries + 1` of what failed `tries` times (a step, a restore).

    0.25 s after the first failure, doubling each time, at most `MAX_BACKOFF`.
    """
    return min(MAX_BACKOFF, 0.25 * 2.0 ** (tries - 1))


def step_failure(
    step: StepRun,
    epoch: int,
    superstep: int,
    outcome: bytes | None,
    job: JobState | None,
    beat: str | None,
    limits: Limits,
    grace: float,
    now: float,
) -> tuple[str, str] | None:
    """Why the current attempt of a step is over without a vote, or None if it is not.

    `outcome` is what the job recorded, `job` its RQ job (None once gone), `beat` the
    step's heartbeat token, which must be this attempt's of this epoch: after a restore a
    zombie of the old epoch may beat for the same superstep and attempt.
    """
    if outcome is not None:
        said = json.loads(outcome)
        if said["attempt"] == step.attempt and said["kind"] != "fenced":
            return str(said["kind"]), str(said["message"])
    mine = f":{epoch}:{superstep}:{step.attempt}"  # the token of this very attempt
    beating = beat is not None and beat.endswith(mine)
    why = job_over(job, "a vote", limits.step_timeout, beating, grace, now)
    return None if why is None else ("retryable", why)
