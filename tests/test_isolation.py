"""One task's trouble is that task's alone: every phase of the coordinator is isolated.

Real worker processes on a real redis-server; the coordinator is driven by the test.
Faults are injected two ways: `PoisonedCoordinator` raises in a named phase for a named
task (as a bug met there would), and garbage written into one task's state in Redis (as
a hostile Redis writer, or a bug of ours, would leave it).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import cast

import pytest
from structlog.testing import capture_logs

from cairn.coordinator.coordinator import Coordinator
from cairn.coordinator.isolation import FAULT_REASON
from cairn.coordinator.runs import TaskState
from cairn.coordinator.spec import TaskSpec
from cairn.storage import keys
from cairn.testing.coordinator import PHASES, PoisonedCoordinator, cure, poison
from cairn.testing.redis_server import RedisServer
from tests.cluster import Cluster, files_and_histories, team_spec

PAUSE_AFTER = 0.5  # seconds a task's advance may keep failing here before it is paused
# The phases every run of the team reaches and cannot get past while they fail: `sync`
# durability commits, then closes the superstep before the next; every agent rests, then
# the verify runs, then the end. (Archiving is reached too, but a superstep does not wait
# for it: a GC archiving failed to write goes to disk at the task's end.)
REACHED = ("begin", "watch", "commit", "after commit", "verify", "finish")


@pytest.fixture
def poisoned(own_redis: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    """A cluster whose coordinator raises where a poison says, with two workers."""
    built = Cluster(own_redis, tmp_path)
    built.coordinator = PoisonedCoordinator(
        built.client, built.store, heartbeat_grace=1.0,
        pause_after=PAUSE_AFTER,
    )  # fmt: skip
    built.start_worker()
    built.start_worker()
    yield built
    built.close()


def synced(spec: TaskSpec) -> TaskSpec:
    """`spec`, each GC on disk before the next superstep (so every phase is reached)."""
    policy = spec.checkpoints.model_copy(update={"durability": "sync"})
    return spec.model_copy(update={"checkpoints": policy})


def tick_until_paused(cluster: Cluster, victims: Collection[str], beside: TaskSpec) -> list[str]:
    """Tick until every victim is paused, a task of `beside` running next to them meanwhile.

    A failing task is paused only while another task advances (a coordinator that
    advances none pauses none), so a task beside that ended before a victim's trouble
    began would leave that victim waiting: another is submitted whenever the last one has
    ended. Returns the tasks beside, all ended.
    """
    besides = [cluster.tasks.submit(beside)]

    def paused_and_ended() -> bool:
        if not cluster.tasks.status(besides[-1]).ended:
            return False
        if all(cluster.tasks.status(t).state is TaskState.PAUSED for t in victims):
            return True
        besides.append(cluster.tasks.submit(beside))
        return False

    cluster.tick_until(paused_and_ended, timeout=90)
    return besides


def test_a_task_failing_in_any_phase_is_paused_alone_and_the_others_finish(
    poisoned: Cluster, tmp_path: Path
) -> None:
    """A phase that raises for one task pauses that task, reason and phase named, alone.

    The task beside it runs to its end meanwhile; once the fault is gone, each paused
    task resumes and ends as the untouched one did.
    """
    cluster = poisoned
    spec = synced(team_spec(tmp_path / "ledger"))
    victims = {phase: cluster.tasks.submit(spec) for phase in REACHED}
    for phase, task in victims.items():
        poison(cluster.client, task, phase)
    unarchived = cluster.tasks.submit(spec)
    poison(cluster.client, unarchived, "archive")

    with capture_logs() as logs:
        besides = tick_until_paused(cluster, victims.values(), beside=spec)
        cluster.tick_until(lambda: cluster.tasks.status(unarchived).ended, timeout=90)
    assert all("succeeded" == cluster.status(t)["status"] for t in besides)
    assert "succeeded" == cluster.status(unarchived)["status"]
    for phase, task in victims.items():
        status = cluster.status(task)
        assert "paused" == status["status"], (phase, status)
        reason = str(status["reason"])
        assert reason.startswith(f"{FAULT_REASON} ({phase},"), reason
        assert f"InjectedFault: injected fault in {phase}" in reason
    # Logged at a bounded rate: one line a task, not one a tick.
    said = [e["task"] for e in logs if e["event"] == "task not advanced"]
    assert sorted(victims.values()) == sorted(t for t in said if t != unarchived)

    for task in victims.values():
        cure(cluster.client, task)
        cluster.tasks.resume(task)
    cluster.tick_until(lambda: all(cluster.tasks.status(t).ended for t in victims.values()))
    expected = files_and_histories(cluster, besides[0])[0]
    for phase, task in victims.items():
        assert "succeeded" == cluster.status(task)["status"], phase
        assert expected == files_and_histories(cluster, task)[0], phase


def test_a_rollback_that_fails_pauses_the_task_alone(poisoned: Cluster, tmp_path: Path) -> None:
    """A fatal step error whose rollback raises pauses that task; the other one goes on."""
    cluster = poisoned
    spec = synced(team_spec(tmp_path / "ledger"))
    data = spec.model_dump()
    data["agents"][0]["script"][0]["fail"] = {"attempts": [1], "error": "fatal"}
    failing = TaskSpec.model_validate(data)
    victim = cluster.tasks.submit(failing)
    poison(cluster.client, victim, "rollback")
    besides = tick_until_paused(cluster, [victim], beside=spec)
    assert all("succeeded" == cluster.status(t)["status"] for t in besides)
    assert str(cluster.status(victim)["reason"]).startswith(f"{FAULT_REASON} (rollback,")


def test_a_restore_that_raises_is_tried_again_and_never_paused(
    poisoned: Cluster, tmp_path: Path
) -> None:
    """A task left `restoring` whose restore raises stays `restoring`, tried again later.

    Pausing it would drop the mark that its restore must be done again (a paused task
    resumes into `running`, its half-way restore forgotten); the other task goes on.
    Once the fault is gone, the restore runs and the task ends as the other did.
    """
    cluster = poisoned
    spec = team_spec(tmp_path / "ledger")
    victim = cluster.tasks.submit(spec)
    cluster.client.hset(keys.run(victim), "status", "restoring")  # as a dead restorer leaves it
    poison(cluster.client, victim, "restore")
    bystander = cluster.tasks.submit(spec)
    cluster.tick_until(lambda: cluster.tasks.status(bystander).ended, timeout=90)
    assert "succeeded" == cluster.status(bystander)["status"]
    assert b"restoring" == cluster.client.hget(keys.run(victim), "status")
    cure(cluster.client, victim)
    cluster.tick_until(lambda: cluster.tasks.status(victim).ended, timeout=90)
    assert "succeeded" == cluster.status(victim)["status"]


def garble_steps(cluster: Cluster, task: str) -> None:
    """Write an entry of the superstep in flight that is not JSON."""
    cluster.client.hset(keys.steps(task), "planner", b"{not json")


def garble_votes(cluster: Cluster, task: str) -> None:
    """Write a vote of the superstep in flight that is not a vote (by no agent, so it stays)."""
    epoch, superstep = cast(list[bytes], cluster.client.hmget(keys.run(task), "epoch", "superstep"))
    vote = keys.votes(task, int(epoch), int(superstep))
    cluster.client.hset(vote, "intruder", b"\xff\xfe not a vote")


def garble_vote_type(cluster: Cluster, task: str) -> None:
    """Make the votes of the superstep in flight a key of the wrong type (a string)."""
    epoch, superstep = cast(list[bytes], cluster.client.hmget(keys.run(task), "epoch", "superstep"))
    vote = keys.votes(task, int(epoch), int(superstep))
    cluster.client.delete(vote)
    cluster.client.set(vote, b"not a hash")


@pytest.mark.parametrize(
    ("garble", "phase"),
    [(garble_steps, "watch"), (garble_votes, "look"), (garble_vote_type, "look")],
)
def test_garbage_in_one_tasks_state_pauses_it_alone(
    cluster: Cluster, tmp_path: Path, garble: object, phase: str
) -> None:
    """State of one task that does not parse pauses that task; a restore mends it.

    The real coordinator, the garbage written in Redis as a hostile writer would. On the
    task beside it nothing changes; restored to its latest GC (which resumes it), the
    damaged task runs to the same end.
    """
    assert callable(garble)
    cluster.coordinator = Coordinator(
        cluster.client, cluster.store, heartbeat_grace=1.0,
        pause_after=PAUSE_AFTER,
    )  # fmt: skip
    cluster.start_worker()
    cluster.start_worker()
    spec = team_spec(tmp_path / "ledger", slow=0.5)  # the coder's turn takes a while
    victim = cluster.tasks.submit(spec)
    cluster.start_superstep(victim)
    garble(cluster, victim)
    besides = tick_until_paused(cluster, [victim], beside=team_spec(tmp_path / "ledger"))
    assert all("succeeded" == cluster.status(t)["status"] for t in besides)
    assert str(cluster.status(victim)["reason"]).startswith(f"{FAULT_REASON} ({phase},")

    cluster.coordinator.restorer.restore(victim, reason="a person mends it")  # and resumes it
    cluster.tick_until(lambda: cluster.tasks.status(victim).ended, timeout=90)
    assert "succeeded" == cluster.status(victim)["status"]
    expected = files_and_histories(cluster, besides[0])[0]
    assert expected == files_and_histories(cluster, victim)[0]


def test_every_phase_a_poison_can_name_is_a_method_of_the_coordinator() -> None:
    """The hooks wrap methods that exist: a renamed phase fails here, not silently."""
    for kind, method in PHASES.values():
        assert callable(getattr(kind, method)), method
    assert set(REACHED) < set(PHASES)


def test_a_coordinator_that_advances_no_task_pauses_none(poisoned: Cluster, tmp_path: Path) -> None:
    """Every task failing alike (the coordinator's own trouble) pauses none of them.

    As with a coordinator started with the wrong signing key: it logs, backs off, and
    the tasks run on once it (or a standby) can advance them.
    """
    cluster = poisoned
    tasks = [cluster.tasks.submit(team_spec(tmp_path / "ledger")) for _ in range(2)]
    for task in tasks:
        poison(cluster.client, task, "begin")
    deadline = time.monotonic() + 6 * PAUSE_AFTER
    while time.monotonic() < deadline:
        cluster.coordinator.tick()
        time.sleep(0.02)
    assert ["running", "running"] == [cluster.status(t)["status"] for t in tasks]
    for task in tasks:
        cure(cluster.client, task)
    cluster.tick_until(lambda: all(cluster.tasks.status(t).ended for t in tasks))
    assert ["succeeded", "succeeded"] == [cluster.status(t)["status"] for t in tasks]
