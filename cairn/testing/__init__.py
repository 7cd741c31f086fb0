"""Testing your own team: a private Redis, a deterministic model, a local Cairn.

    from cairn import TaskSpec, TaskState
    from cairn.testing import AgentSpec, LocalCairn, ToolRequest, Turn

    writer = AgentSpec(
        name="writer",
        model="scripted",  # plays `script`, one turn per step, and calls no API
        script=[Turn(say="Writing.", tools=[
            ToolRequest(name="write_file", args={"path": "hello.txt", "content": "hello"}),
            ToolRequest(name="finish", args={"summary": "done"}),
        ])],
    )
    spec = TaskSpec(name="hello", goal="Write hello.txt.", agents=[writer])
    with LocalCairn(tmp_path) as cairn:  # redis-server, a coordinator, a worker
        status = cairn.client.submit(spec).wait(timeout=60)
    assert status.state is TaskState.SUCCEEDED

What is here (docs/testing-your-agents.md has more):

- `LocalCairn(directory, workers=1, **settings)`: what `cairn up` runs (a private
  `redis-server`, a coordinator, worker processes), under `directory`, stopped at the end
  of its `with` block; `.client` is a `cairn.Client` on it, `.url` its Redis URL.
- `RedisServer(directory, ...)`: one private `redis-server` on a free loopback port,
  started by `start()` (or `with`), stopped by `stop()`, crashed by `kill()`; `.url`.
  `free_port()` is the port picker it uses; `TLSFiles` serves TLS only.
- `ReplicaSet(directory, replicas=2)`: a primary, its replicas and three Sentinels as
  processes; `.url` is the `redis+sentinel://` URL, `failover()` SIGKILLs the primary.
- The scripted model: an agent with `model: scripted` plays its `script`, a list of
  `Turn`s (what it says, the `ToolRequest`s it makes, a `latency`, a `FailSpec` making
  the model call fail on given attempts, a `CrashSpec` making the worker SIGKILL itself
  mid-step: a worker of `LocalCairn`'s, or any started as `python -m cairn.testing.worker`
  or after `install_fault_hook()`; other workers log the crash and go on).
  `ScriptedModel` is that model on its own; past its script it answers `FINISHED` with
  no tool call, and the agent rests.
"""

from typing import TYPE_CHECKING

from cairn.agents.models.scripted import FINISHED, ScriptedModel
from cairn.agents.spec import AgentSpec, CrashSpec, FailSpec, ToolRequest, Turn
from cairn.testing.faults import install_fault_hook
from cairn.testing.redis_server import RedisServer, TLSFiles, free_port
from cairn.testing.replicas import ReplicaSet

if TYPE_CHECKING:
    from cairn.testing.local import LocalCairn


def __getattr__(name: str) -> object:
    """`LocalCairn`, imported when first asked for.

    It brings the client and the CLI's process helpers, which a worker started as
    `python -m cairn.testing.worker` (it imports this package first) never needs.
    """
    if name == "LocalCairn":
        from cairn.testing.local import LocalCairn  # noqa: PLC0415 - on first use only

        return LocalCairn
    raise AttributeError(f"module 'cairn.testing' has no attribute {name!r}")


def __dir__() -> list[str]:
    """What the module holds, `LocalCairn` included before it is first asked for."""
    return sorted({*globals(), *__all__})


__all__ = [
    "FINISHED",
    "AgentSpec",
    "CrashSpec",
    "FailSpec",
    "LocalCairn",
    "RedisServer",
    "ReplicaSet",
    "ScriptedModel",
    "TLSFiles",
    "ToolRequest",
    "Turn",
    "free_port",
    "install_fault_hook",
]
