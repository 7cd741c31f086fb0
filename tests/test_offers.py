"""A configuration that cannot run fails once, fast, with its reason.

Workers say what they have in Redis (`cairn.coordinator.offers`); a submit naming what no
live worker has is refused; a step that finds its tool missing fails the task without a
retry or a rollback; a tool call with wrong argument names is told which.
"""

from __future__ import annotations

import json
import signal
import socket
import time
from pathlib import Path
from typing import cast

import pytest
import yaml

from cairn.agents.spec import AgentSpec
from cairn.agents.tools import TOOLS
from cairn.client import Client
from cairn.coordinator.offers import Offer, check_offers, live_offers
from cairn.coordinator.spec import TaskSpec
from cairn.errors import InvalidSpec
from cairn.storage import keys
from tests.cli_harness import cairn
from tests.cluster import Cluster, files_and_histories

TYPO = {
    "name": "typo", "goal": "Write notes.",
    "agents": [{"name": "writer", "model": "scripted", "tools": ["read_file", "write_fle"],
                "script": [{"say": "Writing."}]}],
}  # fmt: skip


# what a worker says it has -----------------------------------------------------------------
def test_a_worker_says_what_it_has_while_it_lives_and_withdraws_it_as_it_stops(
    cluster: Cluster,
) -> None:
    """Its offer names its tools and providers, carries a TTL, and is gone after SIGTERM."""
    worker = cluster.start_worker()
    (offer,) = cluster.wait_for_offers()
    assert f"{socket.gethostname()}:{worker.pid}" == offer.worker
    assert set(TOOLS) <= set(offer.tools)
    assert {"scripted", "openai", "anthropic"} <= set(offer.providers)
    (name,) = cast("set[bytes]", cluster.client.smembers(keys.WORKERS))
    assert 0 < cluster.client.ttl(keys.worker_offer(name.decode())) <= 30
    worker.send_signal(signal.SIGTERM)  # at once: it may still be bootstrapping
    assert 0 == worker.wait(20)  # stopped, not killed by the signal
    assert [] == live_offers(cluster.client)
    assert set() == cluster.client.smembers(keys.WORKERS)


def test_a_worker_stopped_the_moment_its_offer_appears_withdraws_it(cluster: Cluster) -> None:
    """SIGTERM while the worker still bootstraps (offer written, RQ not yet listening): a stop."""
    for _ in range(3):
        worker = cluster.start_worker()
        deadline = time.monotonic() + 30
        while not cluster.client.exists(keys.WORKERS) and time.monotonic() < deadline:
            time.sleep(0.001)
        worker.send_signal(signal.SIGTERM)
        assert 0 == worker.wait(20)
        assert [] == live_offers(cluster.client)


def test_an_offer_that_expired_is_not_a_live_worker(cluster: Cluster) -> None:
    """A worker killed outright stops beating: its offer expires and leaves the index."""
    offer = Offer(worker="gone:1", tools=["read_file"], kinds=[], mcp=[], providers=["scripted"])
    cluster.client.set(keys.worker_offer("gone"), offer.model_dump_json(), px=50)
    cluster.client.sadd(keys.WORKERS, "gone")
    assert [offer] == live_offers(cluster.client)
    time.sleep(0.1)
    assert [] == live_offers(cluster.client)
    assert set() == cluster.client.smembers(keys.WORKERS)


# refused at submit -------------------------------------------------------------------------
def test_cairn_submit_refuses_a_tool_no_live_worker_has_in_one_line(
    cluster: Cluster, tmp_path: Path
) -> None:
    """`cairn submit` with `write_fle`: exit 2, one line naming agent, tool and the fix."""
    cluster.start_worker()
    cluster.wait_for_offers()
    spec = tmp_path / "typo.yaml"
    spec.write_text(yaml.safe_dump(TYPO))
    done = cairn("submit", str(spec), env=cluster._env("cli"))
    assert 2 == done.returncode
    assert [
        "cairn: agent writer names tool 'write_fle', which no live worker has (did you mean "
        "write_file?)"
    ] == done.stderr.splitlines()
    assert "Traceback" not in done.stderr
    assert set() == cluster.client.smembers(keys.ACTIVE_TASKS)  # nothing was stored


def test_client_submit_and_fork_refuse_what_every_live_worker_lacks(cluster: Cluster) -> None:
    """A kind, a model provider and an MCP server no worker has: `InvalidSpec` naming each."""
    cluster.start_worker()
    cluster.wait_for_offers()
    client = Client(cluster.server.url, cluster.tmp / "archive")
    try:
        with pytest.raises(InvalidSpec) as raised:
            client.submit({
                "name": "odd", "goal": "Go.",
                "agents": [{"name": "a", "model": "opneai:gpt-4o", "tools": ["mcp:notes"]},
                           {"name": "b", "kind": "echoer"}],
            })  # fmt: skip
        assert (
            "agent a names model provider 'opneai' (in 'opneai:gpt-4o'), which no live worker "
            "has (did you mean openai?); agent a names MCP server 'notes' (in 'mcp:notes'), "
            "which no live worker has (live workers have none); agent b is of kind 'echoer', "
            "which no live worker has (live workers have none)"
        ) == str(raised.value)
        good = json.loads(json.dumps(TYPO))
        good["agents"][0]["tools"] = ["read_file"]
        task = client.submit(good)
        with pytest.raises(InvalidSpec, match=r"did you mean write_file\?"):
            task.fork(0, TYPO)
    finally:
        client.close()


def test_a_submit_with_no_live_worker_is_accepted(cluster: Cluster) -> None:
    """No worker has said what it has: a worker may come later, so nothing is refused."""
    task = cluster.tasks.submit(TaskSpec.model_validate(TYPO))
    assert "running" == cluster.status(task)["status"]


def test_what_no_worker_has_is_named_with_the_closest_name_or_what_they_have() -> None:
    """One worker having it is enough; a tool a worker refuses is named with its reason."""
    plain = Offer(worker="h:1", tools=["read_file"], kinds=["echoer"], mcp=[], providers=[])
    other = Offer(worker="h:2", tools=[], kinds=[], mcp=["notes"], providers=["scripted"],
                  refused={"run_command": "worker h:2 cannot sandbox commands"})  # fmt: skip
    agents = [
        AgentSpec(name="a", kind="echoer", model="none", tools=["read_file", "mcp:notes/get"])
    ]
    check_offers(agents, [plain, other])  # each thing on some worker
    check_offers([AgentSpec(name="a", model="scripted", tools=["nope"])], [])
    with pytest.raises(InvalidSpec) as raised:
        check_offers([AgentSpec(name="a", model="scripted", tools=["run_command", "zzz"])],
                     [plain, other])  # fmt: skip
    assert (
        "agent a names tool 'run_command', which no live worker has: worker h:2 cannot "
        "sandbox commands; agent a names tool 'zzz', which no live worker has (live workers "
        "have read_file)"
    ) == str(raised.value)


# failed once, at the first step ------------------------------------------------------------
def test_a_step_on_a_worker_lacking_a_tool_fails_the_task_once(cluster: Cluster) -> None:
    """Accepted with no worker live, the task fails at its first step: no retry, no rollback.

    One attempt, one epoch raise (the failure's fence), the reason naming tool, worker and
    the closest name.
    """
    task = cluster.tasks.submit(TaskSpec.model_validate(TYPO))
    worker = cluster.start_worker()
    status = cluster.drive(task, timeout=90)
    assert "failed" == status["status"]
    where = f"{socket.gethostname()}:{worker.pid}"
    assert (
        f"step of writer in superstep 1: MissingTool: agent writer names tool 'write_fle', which "
        f"worker {where} does not have (did you mean 'write_file'?); not rolled back: a "
        "configuration the workers cannot run fails the same way again"
    ) == status["reason"]
    outcome = json.loads(cluster.client.hget(keys.outcomes(task, 1, 1), "writer") or b"{}")
    assert (1, "missing") == (outcome["attempt"], outcome["kind"])
    assert cluster.client.hget(keys.run(task), "rollbacks") is None
    assert b"2" == cluster.client.get(keys.epoch(task))  # 1 at submit, raised once to fail


# argument names ----------------------------------------------------------------------------
def test_a_model_calling_write_file_with_text_reads_which_argument_is_wrong(
    cluster: Cluster,
) -> None:
    """`text` for `content`: the tool's result names both, and the step goes on."""
    cluster.start_worker()
    spec = TaskSpec.model_validate({
        "name": "args", "goal": "Write notes.",
        "agents": [{"name": "writer", "model": "scripted", "tools": ["write_file", "finish"],
                    "script": [
            {"tools": [{"name": "write_file", "args": {"path": "notes.md", "text": "hi"}}]},
            {"tools": [{"name": "write_file", "args": {"path": "notes.md", "content": "hi"}}]},
            {"tools": [{"name": "finish", "args": {"summary": "wrote"}}]},
        ]}],
    })  # fmt: skip
    task = cluster.tasks.submit(spec)
    status = cluster.drive(task, timeout=90)
    assert "succeeded" == status["status"]
    files, histories = files_and_histories(cluster, task)
    assert {"notes.md": b"hi"} == files
    results = [text for role, text, _calls in histories["writer"] if role == "tool"]
    assert [
        "error: write_file: unknown argument 'text'; missing required argument 'content' "
        "(did you mean 'content'?)",
        "wrote 2 bytes to notes.md",
        "finished",
    ] == results
