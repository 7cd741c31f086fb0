"""A task's run state in Redis: what the coordinator is doing with it right now.

`cairn:{task}:run` holds the status, the superstep in flight (0 between supersteps), the
GC number and epoch it will commit under, and what the coordinator learnt (the reason a
task ended, verify's output, the last archived GC). Any coordinator can pick it up.
"""

from __future__ import annotations

from typing import cast

import redis
import structlog

from storage import keys
from storage.errors import CairnError
from storage.store import CheckpointStore

log = structlog.get_logger(__name__)


def read_run(client: redis.Redis, task: str) -> dict[str, str]:
    """Return the task's run state (empty for an unknown task)."""
    raw = cast(dict[bytes, bytes], client.hgetall(keys.run(task)))
    return {k.decode(): v.decode() for k, v in raw.items()}


def abort_in_flight(client: redis.Redis, store: CheckpointStore, task: str) -> None:
    """Abort the superstep in flight, if any: its GC is marked ABORTED, its LCs dropped.

    Its jobs must already be fenced (a raised epoch) or be allowed to fail.
    """
    run = read_run(client, task)
    superstep = int(run.get("superstep", "0"))
    latest = store.latest_gc(task)
    if superstep and "number" in run and latest is not None:
        intent = latest.model_copy(
            update={
                "number": int(run["number"]),
                "superstep": superstep,
                "epoch": int(run["epoch"]),
            }
        )
        try:
            store.abort_gc(intent)
        except CairnError as exc:  # e.g. it committed in the meantime
            log.info("superstep in flight not aborted", task=task, why=str(exc))
    client.delete(keys.steps(task))
    client.hset(keys.run(task), "superstep", 0)
