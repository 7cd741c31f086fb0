"""The Cairn worker: an RQ worker that takes JSON jobs and runs only Cairn's functions.

It serves the control queue (restores) before the steps queue. Steps run in the worker's
own process (`SimpleWorker`, ~3.4 ms a job here against ~13 ms for a forking worker); crash
isolation comes from one worker per process, restarted by its supervisor when it dies,
and from the fencing that makes a dead or stalled worker's writes harmless.

Stock RQ runs it too, its jobs reading their settings from `CAIRN_*` once, as here:

    rq worker -w coordinator.worker.CairnWorker -j coordinator.worker.CairnJob \
        -S rq.serializers.JSONSerializer -u "$CAIRN_REDIS_URL" cairn-control cairn-steps

(`rq worker-pool` takes the same options; `rq info -S rq.serializers.JSONSerializer
-u URL` shows the queues and workers.)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import structlog
from redis.client import Pipeline
from rq import Queue, SimpleWorker
from rq.job import Job
from rq.serializers import JSONSerializer
from rq.utils import now

from agents.logs import configure_logging
from coordinator.environment import environment
from coordinator.jobs import ALLOWED_JOBS, CONTROL_QUEUE, STEPS_QUEUE
from coordinator.settings import load_settings, process_settings, use_settings
from storage.backends.redis import connect
from storage.errors import InvalidSpec, RefusedJob

BEAT_EVERY = 5.0  # seconds between a worker's RQ liveness beats


class CairnJob(Job):
    """A job whose function must be one of `ALLOWED_JOBS`."""

    @property
    def func(self) -> Callable[..., Any] | None:
        """The job's function, imported only if Cairn allows it."""
        if self.func_name not in ALLOWED_JOBS:
            raise RefusedJob(f"refusing job function {self.func_name!r}: not a Cairn job")
        return super().func  # type: ignore[no-any-return]


class CairnWorker(SimpleWorker):
    """An RQ worker on Cairn's queues, with JSON jobs and Cairn's job class.

    Its own bookkeeping is lighter than stock RQ's: the liveness beat is rate-limited
    (stock RQ beats three times a job, three round trips each, to keep a worker key that
    lives `worker_ttl`, 420 s, from expiring: a third of an empty job's cost; Cairn's
    failure detection reads a step's own heartbeat instead), and a state it already
    holds is not written again.

    Started by stock RQ (`rq worker -w coordinator.worker.CairnWorker`), it reads the
    process's settings and configures Cairn's logging from them (`CAIRN_LOG_FORMAT`,
    `CAIRN_LOG_LEVEL`) unless the process has already.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # noqa: ANN401 - RQ's own
        if not structlog.is_configured():
            settings = process_settings()
            configure_logging(settings.log_format, settings.log_level)
        super().__init__(*args, **kwargs)

    def set_state(self, state: str, pipeline: Pipeline | None = None) -> None:
        """Set the worker's state, skipping the round trip when it is already that state.

        Stock RQ sets IDLE after each job and again as it starts waiting for the next.
        """
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
        with self.connection.pipeline() as batch:
            super().heartbeat(None, batch)
            batch.execute()


def queues(url: str) -> list[Queue]:
    """Cairn's queues on the Redis at `url`, control first."""
    client = connect(url)
    return [
        Queue(name, connection=client, serializer=JSONSerializer)
        for name in (CONTROL_QUEUE, STEPS_QUEUE)
    ]


def run_worker(url: str, *, burst: bool = False, name: str | None = None) -> None:
    """Work Cairn's queues until stopped (or, with `burst`, until they are empty)."""
    served = queues(url)
    worker = CairnWorker(
        served,
        connection=served[0].connection,
        serializer=JSONSerializer,
        job_class=CairnJob,
        name=name,
    )
    worker.work(burst=burst, logging_level="WARNING")


def main(argv: list[str] | None = None) -> int:
    """`python -m coordinator.worker [REDIS_URL] [--burst]`: run one worker.

    The URL comes from `CAIRN_REDIS_URL` unless given (on the command line, any user of
    the machine can read it); the other settings from `CAIRN_*`, read here once for the
    process and its jobs.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", nargs="?", help="default: CAIRN_REDIS_URL")
    parser.add_argument("--burst", action="store_true")
    args = parser.parse_args(argv)
    try:
        settings = load_settings(redis_url=args.url)
        url, _origin = settings.redis()
    except InvalidSpec as exc:
        parser.error(str(exc))
    use_settings(settings)
    configure_logging(settings.log_format, settings.log_level)
    try:  # its tools, MCP servers and metrics (port + 1 + its cache slot) before any job
        environment()
    except InvalidSpec as exc:  # a bad tool module or MCP file: its one line, no usage
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    run_worker(url, burst=args.burst)
    return 0


if __name__ == "__main__":
    sys.exit(main())
