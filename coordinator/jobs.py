"""The functions RQ workers run for Cairn; a Cairn worker runs no other (`ALLOWED_JOBS`).

Jobs carry only JSON (RQ's JSON serializer): names and numbers. A job takes the rest from
its process's environment (`cairn.coordinator.environment`), and reports why it ended without a
vote in the task's `outcomes` hash, so the coordinator can tell a fatal model error from a
crash, and a restore a refused agent from a slow one.
"""

from __future__ import annotations

import contextlib
import json

import redis

from cairn.agents import spans, tracing
from cairn.agents.heartbeat import Heartbeat, worker_token
from cairn.agents.logs import get_logger
from cairn.agents.logship import process_name
from cairn.agents.spec import TaskRecord
from cairn.agents.step import run_step
from cairn.coordinator.environment import Environment, environment
from cairn.coordinator.failures import FailureEvent, record_quietly
from cairn.coordinator.staging import PASSING, refusal, stage
from cairn.coordinator.verify import JOB as VERIFY_JOB
from cairn.coordinator.verify import VERDICT_TTL, VerifyBeats, VerifyRun, run_verify
from cairn.coordinator.wakes import wake
from cairn.errors import (
    AgentCodeError,
    CairnError,
    FencedWrite,
    MissingTool,
    ModelError,
    ToolUnreachable,
)
from cairn.storage import keys
from cairn.storage.keys import SPEC_DOC
from cairn.storage.redact import redact

STEPS_QUEUE = "cairn-steps"
CONTROL_QUEUE = "cairn-control"  # restores; workers serve it first
STEP_JOB = "cairn.coordinator.jobs.step_job"
STAGE_JOB = "cairn.coordinator.jobs.stage_job"
ALLOWED_JOBS = frozenset({STEP_JOB, STAGE_JOB, VERIFY_JOB})

log = get_logger(__name__)


def record_outcome(
    client: redis.Redis,
    task: str,
    agent: str,
    superstep: int,
    epoch: int,
    attempt: int,
    kind: str,
    message: str,
) -> None:
    """Say why an attempt ended without a vote (its `kind`, and the message).

    Kinds: `retryable`, `fatal`, `refused`, `missing`, `fenced`.

    `refused`: the model call's request is at fault (`ModelError.refused`), and the same
    request sent again would fail the same way. `missing`: the worker lacks a tool, MCP
    server, agent kind or model provider the agent names (`MissingTool`).

    The message is kept redacted: it becomes the task's reason, its timeline, its log.
    """
    said = redact(message)[:500]
    value = json.dumps({"attempt": attempt, "kind": kind, "message": said})
    client.hset(keys.outcomes(task, epoch, superstep), agent, value)


def report_failure(
    client: redis.Redis,
    task: str,
    agent: str,
    superstep: int,
    epoch: int,
    attempt: int,
    exc: BaseException,
) -> None:
    """Say, as it happens, that an attempt failed: in the task's failures and its log.

    The log line carries the traceback (`cairn logs --verbose`); neither write may change
    what the step's failure does next.
    """
    record_quietly(client, task, agent, superstep, epoch, attempt, FailureEvent.FAILED,
                   str(exc) or type(exc).__name__, error_class=type(exc).__name__,
                   process=process_name("worker"))  # fmt: skip
    log.warning(
        "step failed",
        task=task,
        agent=agent,
        superstep=superstep,
        epoch=epoch,
        attempt=attempt,
        error=str(exc),
        error_class=type(exc).__name__,
        exc_info=exc,
    )


def step_job(
    task: str, agent: str, superstep: int, epoch: int, attempt: int, trace: object = None
) -> str:
    """Run one attempt of one step; return the agent's status after it.

    A fenced attempt (a zombie, or one the coordinator gave up on) stops quietly. A model
    error or any other Cairn error is recorded, then raised, so RQ marks the job failed.
    A Redis at `maxmemory` refusing the step's writes is retryable: recorded when Redis
    takes the record (else the coordinator sees the heartbeat lapse), then raised. However
    it ends, the coordinator is woken to look at the task: a vote carries its own wake
    (the hot store's `write_lc`), anything else is followed by one.
    `trace` is the W3C trace context of the step's superstep, when the coordinator traces
    (`cairn.agents.tracing.parent_of` says what is taken of it).
    """
    env = environment()
    voted = False
    try:
        status = _step(env, task, agent, superstep, epoch, attempt, trace)
        voted = status != "fenced"  # a step that returns otherwise voted, and woke with it
        return status
    finally:
        if not voted:
            wake(env.redis, task)


def _step(env: Environment, task: str, agent: str, superstep: int, epoch: int,
          attempt: int, trace: object) -> str:  # fmt: skip
    """`step_job`'s attempt, in `env`, its span under the superstep `trace` names."""
    where = (env.redis, task, agent, superstep, epoch, attempt)
    traced = spans.StepAt(task, agent, superstep, epoch, attempt, process_name("worker"))
    try:
        # The lane is a tree of its own while other steps run beside it.
        with spans.step_span(traced, trace) as span, env.lanes.lease() as lane:
            result = run_step(
                task,
                agent,
                superstep,
                epoch,
                attempt,
                store=env.store,
                cache=lane,
                models=env.models,
                tools=env.tools,
                mcp=env.mcp,
            )
            tracing.set_attributes(span, {"cairn.step.status": result.status.value,
                                          "cairn.step.resumed": result.resumed,
                                          "cairn.step.tools_run": result.tools_run})  # fmt: skip
    except FencedWrite as exc:
        record_outcome(*where, "fenced", str(exc))
        log.info("attempt fenced", task=task, agent=agent, reason=str(exc))
        return "fenced"
    except ModelError as exc:
        kind = "refused" if exc.refused else "retryable" if exc.retryable else "fatal"
        record_outcome(*where, kind, str(exc))
        report_failure(*where, exc)
        raise
    except (ToolUnreachable, AgentCodeError) as exc:  # another attempt may do better
        record_outcome(*where, "retryable", str(exc))
        report_failure(*where, exc)
        raise
    except redis.OutOfMemoryError as exc:  # Redis full for now: memory may be freed
        log.warning("step failed: Redis is out of memory", task=task, agent=agent, error=str(exc))
        with contextlib.suppress(redis.RedisError):  # a full Redis may refuse this too
            record_outcome(*where, "retryable", f"Redis is out of memory (maxmemory): {exc}")
        raise
    except MissingTool as exc:  # any worker like this one lacks it too: fail, not roll back
        record_outcome(*where, "missing", f"{type(exc).__name__}: {exc}")
        raise
    except CairnError as exc:
        record_outcome(*where, "fatal", f"{type(exc).__name__}: {exc}")
        report_failure(*where, exc)
        raise
    return result.status.value


def stage_job(task: str, agent: str, target: int, epoch: int, reason: str) -> str:
    """The worker's side of a restore: stage one agent, or say why it could not.

    A failure that passes (Redis failing, the archive's disk, a newer epoch fencing the
    write) says nothing of the target: it is recorded as such before it is raised, and
    the restorer gives this try up at once rather than at its deadline. Any other says
    the target cannot be staged ("no": a record damaged or missing everywhere, a state
    too large for one record): the restore falls back to an older GC.
    """
    env = environment()
    outcome = keys.outcomes(task, epoch, -target)
    try:
        stage(env.store, task, agent, target, epoch, reason)
    except PASSING as exc:
        with contextlib.suppress(redis.RedisError):  # a Redis that fails may refuse this too
            failed = f"{type(exc).__name__}: {exc}"
            env.redis.hset(outcome, agent, json.dumps({"failed": failed}))
        raise
    except Exception as exc:  # noqa: BLE001 - the target's; `refusal` logs it
        env.redis.hset(outcome, agent, json.dumps({"no": refusal(exc, task, agent)}))
        return "no"
    return "yes"


def verify_job(task: str, number: int, epoch: int, attempt: int) -> str:
    """Run the task's verify command on GC `number`'s files and write the verdict.

    Beats while it runs, so the coordinator sees a dead worker within seconds. A try of
    an epoch a restore has left behind stops at once: nobody reads its verdict.
    """
    env = environment()
    current = int(env.redis.get(keys.epoch(task)) or 0)
    if current != epoch:
        log.info("verify fenced", task=task, epoch=epoch, current=current)
        return "fenced"
    record = env.store.read_doc(task, SPEC_DOC, TaskRecord)
    token = worker_token(epoch, number, attempt)
    beating = VerifyBeats(env.redis, VerifyRun(epoch, number, attempt))
    beats = Heartbeat(beating, task, "verify", token, record.policy.heartbeat_ms)
    with beats, env.lanes.lease() as lane:
        verdict = run_verify(env.store, task, number, lane, record)
    env.redis.set(keys.verdict(task, epoch, number), verdict.dump(), ex=VERDICT_TTL)
    wake(env.redis, task)  # the coordinator judges it now, not at its next look
    log.info("verify done", task=task, gc=number, passed=verdict.passed)
    return "passed" if verdict.passed else "failed"
