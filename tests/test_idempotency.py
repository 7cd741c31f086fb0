"""Idempotency keys on a real redis-server: one key never names two different calls.

Every external effect goes through `chaos/ledger.py`, an external system that honours the
key (it applies a key's first call only), so a lost effect shows as a missing line.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from cairn.agents.models.base import ModelReply, ModelRequest
from cairn.agents.spec import AgentSpec, CheckpointTriggers, StepPolicy, TaskRecord
from cairn.agents.step import run_step
from cairn.agents.task import start_task
from cairn.agents.tools import idempotency_key
from cairn.coordinator.restore import Restorer
from cairn.storage.records import Role, ToolCall, Usage
from cairn.storage.store import CheckpointStore
from cairn.testing.redis_server import RedisServer
from tests.agent_harness import superstep
from tests.cluster import ROOT

LEDGER = ROOT / "chaos" / "ledger.py"
# The ledger is outside the workspace, run by Cairn's own interpreter: no sandboxed command
# could reach it, so these commands run bare (its subprocess does as `unsandboxed` does).
pytestmark = pytest.mark.usefixtures("unsandboxed")


def pay(ledger: Path, effect: str) -> str:
    """A command that asks the ledger to apply `effect` under the call's key."""
    return f'{sys.executable} {LEDGER} {ledger} "$CAIRN_IDEMPOTENCY_KEY" {effect}'


def applied(ledger: Path) -> list[str]:
    """The effects the ledger applied, in order."""
    return [line.split("\t")[1] for line in (ledger / "applied.log").read_text().splitlines()]


def keys(ledger: Path) -> list[str]:
    """The key of every call the ledger saw, applied or not, in order."""
    return [line.split("\t")[0] for line in (ledger / "calls.log").read_text().splitlines()]


class Restored:
    """A model whose choice depends on its context, as an LLM's does: restored, it pays bob.

    `same` makes it choose alike either way (a restore that reproduces the call).
    """

    def __init__(self, ledger: Path, *, same: bool = False) -> None:
        self.ledger, self.same = ledger, same

    def complete(self, request: ModelRequest) -> ModelReply:
        """Pay once, then halt."""
        turns = sum(1 for m in request.messages if m.role is Role.ASSISTANT)
        if turns:
            return ModelReply(content="done", usage=Usage())
        restored = any("restored" in (m.content or "") for m in request.messages)
        effect = "pay-bob-20" if restored and not self.same else "pay-alice-10"
        call = ToolCall(id="c0", name="run_command", args={"command": pay(self.ledger, effect)})
        return ModelReply(content=effect, usage=Usage(), tool_calls=[call])


def run_paying_task(
    client: redis.Redis, store: CheckpointStore, tmp_path: Path, *, same: bool
) -> Path:
    """Pay in superstep 1, restore to before it, run superstep 1 again; return the ledger."""
    ledger, cache = tmp_path / "ledger", tmp_path / "cache"
    model = Restored(ledger, same=same)
    spec = TaskRecord(
        task="pay",
        goal="pay",
        agents=[AgentSpec(name="a", model="scripted", tools=["run_command"])],
    )
    start_task(store, spec, {"f": b"x"})
    assert superstep(store, "pay", cache, lambda _: model) is not None
    assert superstep(store, "pay", cache, lambda _: model) is not None  # halts
    Restorer(client, store, workers=False).restore("pay", to=0, reason="a person asked")
    assert superstep(store, "pay", cache, lambda _: model) is not None
    return ledger


def test_another_call_at_the_same_place_after_a_restore_gets_another_key(
    redis_client: redis.Redis, real_store: CheckpointStore, tmp_path: Path
) -> None:
    """Replayed after a restore, superstep 1 makes a different call: it gets its own key.

    A restore does not undo the first payment, and the second is a different call: the
    ledger must apply both, not answer the second as if it were the first.
    """
    ledger = run_paying_task(redis_client, real_store, tmp_path, same=False)
    assert ["pay-alice-10", "pay-bob-20"] == applied(ledger)
    first, second = keys(ledger)
    assert first != second
    assert first.split(":")[:4] == second.split(":")[:4]  # one place: pay:a:1:0


def test_the_same_call_replayed_after_a_restore_keeps_its_key(
    redis_client: redis.Redis, real_store: CheckpointStore, tmp_path: Path
) -> None:
    """A restore that makes the same call at the same place hands the same key: applied once."""
    ledger = run_paying_task(redis_client, real_store, tmp_path, same=True)
    assert ["pay-alice-10"] == applied(ledger)
    first, second = keys(ledger)
    assert first == second


SAMPLER = """
import sys
from pathlib import Path
from cairn.agents import faults
from cairn.agents.models.base import ModelReply
from cairn.agents.sandbox import UNSANDBOXED, use_sandbox
from cairn.agents.step import run_step
from cairn.storage.backends.disk import DiskArchive
from cairn.storage.backends.redis import RedisHotStore, connect
from cairn.storage.codec import Codec
from cairn.storage.records import ToolCall, Usage
from cairn.storage.store import CheckpointStore
from cairn.testing.faults import install_fault_hook

url, archive, cache, task, attempt, first, again = sys.argv[1:8]

class Sampler:
    # Asked again (a retry), it chooses another call, as a model at temperature > 0 may.
    def complete(self, request):
        command = first if request.attempt == 1 else again
        call = ToolCall(id="c0", name="run_command", args={"command": command})
        if request.attempt == 1:  # attempt 1 dies past its one tool
            faults.arm(faults.Crash(after_tools=1))
        return ModelReply(content="paying", usage=Usage(), tool_calls=[call])

use_sandbox(UNSANDBOXED)
install_fault_hook()
store = CheckpointStore(RedisHotStore(connect(url)), DiskArchive(archive), Codec())
epoch = store.hot.get_epoch(task)
run_step(task, "a", 1, epoch, int(attempt), store=store, cache=Path(cache),
         models=lambda spec: Sampler())
"""


def test_a_retry_that_asks_the_model_again_gives_its_new_call_a_new_key(
    own_redis: RedisServer, own_store: CheckpointStore, tmp_path: Path
) -> None:
    """No tool-level LC recorded the turn; killed after its command, the retry asks again.

    The retry's model turn chooses another call at the same place: the ledger applies both,
    since the first one's effect happened and the retry's is a different one.
    """
    ledger = tmp_path / "ledger"
    alice, carol = pay(ledger, "pay-alice-10"), pay(ledger, "refund-carol-99")
    policy = StepPolicy(triggers=CheckpointTriggers(tool_call="none"))
    agents = [AgentSpec(name="a", model="scripted", tools=["run_command"])]
    start_task(own_store, TaskRecord(task="retry", goal="pay", policy=policy, agents=agents), {})
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for attempt, code in ((1, -signal.SIGKILL), (2, 0)):
        own_store.hot.begin_attempt("retry", "a", 1, attempt)
        done = subprocess.run(
            [sys.executable, "-c", SAMPLER, own_redis.url, str(tmp_path / "archive"),
             str(tmp_path / f"cache{attempt}"), "retry", str(attempt), alice, carol],
            capture_output=True, text=True, env=env, check=False,
        )  # fmt: skip
        assert code == done.returncode, done.stderr
    assert ["pay-alice-10", "refund-carol-99"] == applied(ledger)
    vote = own_store.hot.get_votes("retry", 1, 1)["a"]
    state = own_store.read_state("retry", "a", vote.id, vote.checksum)
    [call] = [r for r in state.trace if r.tool == "run_command"]
    assert keys(ledger)[1] == call.idempotency_key != keys(ledger)[0]


def test_a_retry_of_the_same_turn_keeps_the_key(
    real_store: CheckpointStore, tmp_path: Path
) -> None:
    """A step run again from the same recorded turn hands its calls the keys they had."""
    ledger = tmp_path / "ledger"
    command = pay(ledger, "pay-alice-10")
    turn = {"tools": [{"name": "run_command", "args": {"command": command}}]}
    script = AgentSpec.model_validate(
        {"name": "a", "model": "scripted", "script": [turn], "tools": ["run_command"]}
    )
    start_task(real_store, TaskRecord(task="again", goal="pay", agents=[script]), {})
    for attempt in (1, 2):  # attempt 1's vote is dropped: as if it were never counted
        real_store.hot.begin_attempt("again", "a", 1, attempt)
        run_step("again", "a", 1, 1, attempt, store=real_store, cache=tmp_path / "cache")
    key = idempotency_key("again", "a", 1, 0, "run_command", {"command": command})
    assert [key, key] == keys(ledger)
    assert ["pay-alice-10"] == applied(ledger)


def test_the_key_is_the_place_and_a_digest_of_the_call() -> None:
    """`task:agent:superstep:index:digest`: argument order does not count, their values do."""
    key = idempotency_key("t", "a", 3, 1, "run_command", {"command": "ls", "x": 1})
    task, agent, superstep_, index, digest = key.split(":")
    assert ("t", "a", "3", "1", 16) == (task, agent, superstep_, index, len(digest))
    assert key == idempotency_key("t", "a", 3, 1, "run_command", {"x": 1, "command": "ls"})
    assert key != idempotency_key("t", "a", 3, 1, "run_command", {"command": "ls", "x": 2})
    assert key != idempotency_key("t", "a", 3, 1, "read_file", {"command": "ls", "x": 1})
