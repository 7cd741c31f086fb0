"""The faults that fall across a spawn, and the fork the harness checks afterwards.

The team spawns members early (`chaos.team.SPAWNS`); these faults wait for a spawn's
moment: `kill_at_spawn` SIGKILLs the worker running a spawning step or a spawned
member's first step, `restore_across_spawn` restores the task to a GC from before a
member it has now joined, `fork_after_spawn` forks the task at a GC that names spawned
members. A fork is judged once the run has ended (`forks_seen`): it must carry the
source GC's members, their specs and spawners, and end as the fault-free run does.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from typing import TYPE_CHECKING, cast

from cairn.coordinator.settings import open_store
from cairn.errors import CairnError
from cairn.storage import keys
from cairn.storage.records import GCStatus, GlobalCheckpoint
from chaos.faults import Fault
from chaos.observe import ForkSeen, observe, view_gc
from chaos.team import MEMBERS, spawn_steps

if TYPE_CHECKING:
    from chaos.run import ChaosRun

SPAWN_WAIT = 12.0  # seconds a spawn fault waits for its moment before giving up
KILL_WITHIN = 0.6  # seconds into the step a kill lands at most (a model turn takes 0.4 s)
FORK_ENDS_WITHIN = 60.0  # seconds after the run's task, for a fork to end


def running(run: ChaosRun) -> dict[int, str]:
    """Worker pid → the member whose step it runs now (by the members' heartbeats)."""
    assert run.client is not None
    beats = cast(list[bytes | None],
                 run.client.mget([keys.heartbeat(run.task, m) for m in MEMBERS]))  # fmt: skip
    return {int(b.decode().split(":")[1]): m for m, b in zip(MEMBERS, beats, strict=True)
            if b is not None}  # fmt: skip


def kill_at_spawn(run: ChaosRun, fault: Fault) -> dict[str, object] | None:
    """SIGKILL the worker running a spawning step or a spawned member's first step.

    `fault.value` picks which of those steps, in superstep order (or any after it, when
    the run is past it), and how far into it the kill lands (up to `KILL_WITHIN` s), so
    some kills fall before the spawn is recorded in the step and some after, before its
    LC. Waits up to `SPAWN_WAIT` s for one to run (a restore to before a spawn runs them
    again).
    """
    ordered = sorted(spawn_steps(), key=lambda step: (step[1], step[0]))
    pick = fault.value * len(ordered)
    wanted, into = set(ordered[int(pick) :]), (pick % 1) * KILL_WITHIN
    deadline = time.monotonic() + SPAWN_WAIT
    while time.monotonic() < deadline and not run.done.is_set():
        superstep = int(run.run_state().get("superstep", "0"))
        live = {w.pid: w for w in run.workers
                if w.poll() is None and w.pid not in run.paused | run.cut}  # fmt: skip
        hits = [(pid, m) for pid, m in running(run).items()
                if (m, superstep) in wanted and pid in live]  # fmt: skip
        if hits:
            pid, member = run.rng.choice(sorted(hits))
            time.sleep(into)
            live[pid].kill()
            return {"pid": pid, "agent": member, "superstep": superstep,
                    "after_s": round(into, 3)}  # fmt: skip
        time.sleep(0.01)
    return None


def _latest_spawned(run: ChaosRun) -> GlobalCheckpoint | None:
    """The task's latest committed GC once it names a spawned member (None: none came)."""
    assert run.client is not None
    store = open_store(run.settings, run.client)
    deadline = time.monotonic() + SPAWN_WAIT
    while time.monotonic() < deadline and not run.done.is_set():
        with contextlib.suppress(CairnError):
            latest = store.latest_gc(run.task)
            if latest is not None and latest.spawned:
                return latest
        time.sleep(0.05)
    return None


def restore_across_spawn(run: ChaosRun, fault: Fault) -> dict[str, object] | None:
    """`cairn restore --to N`, N the latest committed GC without a member the task has now.

    The restore removes that member, with its files and messages; its spawner spawns it
    again when it runs its spawning step once more.
    """
    assert run.client is not None
    latest = _latest_spawned(run)
    if latest is None:
        return None
    member = run.rng.choice(sorted(latest.spawned))
    store = open_store(run.settings, run.client)
    older = sorted((g.number for g in store.list_gcs(run.task)
                    if g.status is GCStatus.COMMITTED and g.number < latest.number),
                   reverse=True)  # fmt: skip
    for number in older:
        with contextlib.suppress(CairnError):  # a GC the harness damaged: an older one
            if member not in store.read_gc(run.task, number).members:
                done = run.cairn("restore", run.task, "--to", str(number), "--json")
                return {"to": number, "member": member, "from_gc": latest.number,
                        "joined_at": latest.spawned[member].superstep,
                        "exit": done.returncode}  # fmt: skip
    return None


def fork_after_spawn(run: ChaosRun, fault: Fault) -> dict[str, object] | None:
    """`cairn fork --at N`, N the latest committed GC once it names a spawned member."""
    latest = _latest_spawned(run)
    if latest is None:
        return None
    assert run.client is not None
    # The source GC as the fork reads it, read now: a later fault may damage its archived
    # copy (corrupt_archive), which says nothing of the fork made before.
    source = view_gc(open_store(run.settings, run.client), run.task, latest.number)
    done = run.cairn("fork", run.task, "--at", str(latest.number), "--json")
    if done.returncode != 0:
        raise subprocess.SubprocessError(f"cairn fork exited {done.returncode}: {done.stderr}")
    fork = str(json.loads(done.stdout)["task_id"])
    run.forks[fork] = latest.number
    run.fork_sources[fork] = source
    return {"fork": fork, "at": latest.number, "spawned": sorted(latest.spawned)}


def forks_seen(run: ChaosRun, terminal: set[str]) -> list[ForkSeen]:
    """Each fork the run made, once it ended (or `FORK_ENDS_WITHIN` s passed), read back."""
    assert run.client is not None
    store = open_store(run.settings, run.client)
    deadline = time.monotonic() + FORK_ENDS_WITHIN
    seen = []
    for fork, at in run.forks.items():
        while run.run_state(fork).get("status") not in terminal:
            if time.monotonic() > deadline:
                break
            run.supervise()
            time.sleep(0.1)
        state = run.run_state(fork)
        observed = observe(store, run.client, fork, state, run.ledger)
        ended = state.get("status") in terminal
        source = run.fork_sources.get(fork) or view_gc(store, run.task, at)
        seen.append(ForkSeen(fork, at, source, observed, ended))
    return seen
