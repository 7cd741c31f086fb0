"""The faults a chaos run injects, and the schedule a seed draws.

A schedule is a pure function of the seed: the same seed gives the same durability, the
same faults in the same order at the same offsets from the task's submission. (Processes
still race, so a replay repeats the schedule, not every interleaving.)
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

# kind → what it does (the table's rows, in this order)
KINDS = {
    "kill_worker": "SIGKILL a worker running a step",
    "kill_after_compaction": "SIGKILL the next worker to compact an agent's context, past its LC",
    "pause_worker": "SIGSTOP a worker mid-step; SIGCONT once its step is retried (a zombie)",
    "kill_coordinator": "SIGKILL the leading coordinator; a standby takes over",
    "kill_coordinator_mid_commit": "SIGKILL the leader past a superstep's last vote, as it commits",
    "lose_wakes": "the leader drops every wake it takes for a while: it goes on by its looks",
    "restart_redis": "SIGKILL redis-server and start it again on its AOF",
    "flushall": "FLUSHALL (durability sync), then `cairn restore` from the archive",
    "corrupt_archive": "flip bytes of an archived file no fallback to GC 0 needs",
    "full_archive": "fill the archive's small filesystem for a while, then free it",
    "slow_redis": "delay every request to Redis through a proxy for a while",
    "manual_restore": "`cairn restore` by hand, to the latest or an older checkpoint",
    "partition_worker": "cut a worker running a step off Redis for a while, then reconnect it",
    "maxmemory": "hold Redis at `maxmemory` (noeviction) for a while: writes fail with OOM",
    "failover": "SIGKILL the Redis primary; Sentinel promotes a replica, every process follows",
    "split_primary": "promote a replica while the old primary answers on; every process leaves it",
    "poison_task": "a second task whose every try of one phase raises for a while: it alone waits",
    "kill_at_spawn": "SIGKILL the worker running a spawning step or a spawned member's first",
    "restore_across_spawn": "`cairn restore` to a checkpoint from before a member was spawned",
    "fork_after_spawn": "`cairn fork` at a checkpoint after a spawn; the fork ends as the run",
}
# The faults that move the primary: a run on replicas has exactly one of them.
PRIMARY_MOVES = ("failover", "split_primary")
SPLIT_SHARE = 0.5  # of the runs on replicas, whose primary moves by a split, not a kill
ALWAYS_POSSIBLE = tuple(k for k in KINDS if k not in ("flushall", "full_archive", *PRIMARY_MOVES))
# Faults that need the lone redis-server behind the harness's proxies: a run with replicas
# has no proxy to slow or cut (every process asks the Sentinels for the primary's own
# address), and restarting, flushing or filling a primary is a fault of its own there.
SINGLE_REDIS = ("restart_redis", "flushall", "slow_redis", "partition_worker", "maxmemory")
WITH_REPLICAS = tuple(k for k in ALWAYS_POSSIBLE if k not in SINGLE_REDIS)
# Of the horizon, where a `kill_at_spawn` lands: the team's spawning steps and the spawned
# members' first steps run in its first supersteps (chaos/team.py, `SPAWNS`).
SPAWN_SHARE = 0.4
REPLICA_SHARE = 0.25  # of the seeds run on replicas, with one `failover` (startup: ~7 s)


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault: what, when (seconds after submission) and its drawn parameters."""

    kind: str
    at: float
    value: float = 0.0  # kind-specific: a duration, a delay, or a draw in [0, 1)


@dataclass(frozen=True, slots=True)
class Plan:
    """A run's schedule: durability, worker processes and the steps each runs at once, faults."""

    seed: int
    durability: str
    workers: int
    faults: list[Fault] = field(default_factory=list)
    concurrency: int = 1

    @property
    def replicas(self) -> bool:
        """Whether the run needs Redis with replicas and Sentinels (it fails one over)."""
        return any(f.kind in PRIMARY_MOVES for f in self.faults)


def draw(seed: int, horizon: float, can_mount: bool) -> Plan:
    """The schedule of `seed`: 2 to 5 faults within `horizon` seconds of the submission.

    Half the seeds run their workers at concurrency 2 or 4 (several steps in one process,
    so one kill or pause hits them all), drawn last so the rest of a schedule is the one
    the seed always drew. A `kill_at_spawn` lands within the first `SPAWN_SHARE` of the
    horizon, when the team spawns. `flushall` only under `durability: sync` (under async a GC not
    yet archived may be lost with Redis, as documented); `full_archive` only when a small
    filesystem can be mounted (root). A share of the seeds run on replicas: exactly one
    of their faults moves the primary, the others are among `WITH_REPLICAS`, and their
    durability is any of the three (`replicated` needs replicas, so only there). Half of
    those move it by a `split_primary` instead of a `failover`, drawn last too.
    """
    rng = random.Random(seed)
    replicas = rng.random() < REPLICA_SHARE
    durability = rng.choice(("replicated", "async", "sync") if replicas else ("sync", "async"))
    kinds = list(WITH_REPLICAS if replicas else ALWAYS_POSSIBLE)
    if durability == "sync" and not replicas:
        kinds.append("flushall")
    if can_mount:
        kinds.append("full_archive")
    faults = []
    if replicas:
        faults.append(Fault("failover", round(rng.uniform(0.5, horizon), 2)))
    for _ in range(rng.randint(2, 5) - len(faults)):
        kind = rng.choice(kinds)
        at = round(rng.uniform(0.5, horizon), 2)
        if kind == "kill_at_spawn":  # the team spawns early: within its first supersteps
            at = round(0.5 + (at - 0.5) * SPAWN_SHARE, 2)
        value = {
            "pause_worker": rng.uniform(2.0, 8.0),  # seconds stopped at most
            "restart_redis": rng.uniform(0.2, 1.5),  # seconds down
            "full_archive": rng.uniform(1.0, 4.0),  # seconds full
            "slow_redis": rng.uniform(0.005, 0.03),  # seconds per request
            "partition_worker": rng.uniform(1.0, 10.0),  # seconds cut off
            "maxmemory": rng.uniform(2.0, 5.0),  # seconds out of memory
            "lose_wakes": rng.uniform(1.0, 6.0),  # seconds of wakes dropped
        }.get(kind, rng.random())
        faults.append(Fault(kind, at, round(value, 4)))
    workers = rng.randint(2, 4)
    concurrency = rng.choice((1, 1, 2, 4))
    if replicas and rng.random() < SPLIT_SHARE:
        faults = [Fault("split_primary", f.at) if f.kind == "failover" else f for f in faults]
    return Plan(seed, durability, workers, sorted(faults, key=lambda f: f.at), concurrency)
