"""The chaos suite's parts: the checker finds each violation, the ledger, the schedules.

The checker is shown a clean history built by hand, then the same history broken in one
way per invariant: each must be reported, and only it. (A checker that cannot fail would
make every chaos run pass.) The runs themselves are `make chaos`.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import redis

from cairn.testing.redis_server import RedisServer
from chaos.checker import INVARIANTS, check
from chaos.faults import PRIMARY_MOVES, SINGLE_REDIS, SPAWN_SHARE, draw
from chaos.ledger import record
from chaos.observe import (
    ForkSeen,
    GCView,
    History,
    Joined,
    MemberView,
    Observed,
    Restore,
    read_history,
)
from chaos.proxy import DelayProxy


def member(epoch: int, attempt: int, superstep: int, said: str, keys: list[str]) -> MemberView:
    return MemberView(epoch, attempt, superstep, [("assistant", None, said, "[]")], keys)


def clean() -> tuple[History, Observed]:
    """Two agents, two supersteps, a retry of b's first step, then a restore to GC 1."""
    history = History(
        launched={(1, 1, "a"): 1, (1, 1, "b"): 2, (1, 2, "a"): 1, (1, 2, "b"): 1},
        commits=[("t1", 1, 1), ("t2", 2, 1), ("t3", 3, 2)],
        archives=[("t3.1", 3)],
        restores=[Restore("t3", 1, 1, 3, 2)],
    )
    gc1 = GCView(1, 1, 1, "w1", {"a": member(1, 1, 1, "a1", ["a:1:0"]),
                                 "b": member(1, 2, 1, "b1", ["b:1:0"])})  # fmt: skip
    gc2 = GCView(2, 2, 1, "w2", {"a": member(1, 1, 2, "a2", ["a:1:0", "a:2:0"]),
                                 "b": member(1, 1, 2, "b2", ["b:1:0"])})  # fmt: skip
    gc3 = GCView(3, 1, 2, "w1", {"a": member(2, 1, 1, "a1", ["a:1:0"]),
                                 "b": member(2, 1, 1, "b1", ["b:1:0"])})  # fmt: skip
    gc4 = GCView(4, 2, 2, "w2", {"a": member(2, 1, 2, "a2", ["a:1:0", "a:2:0"]),
                                 "b": member(2, 1, 2, "b2", ["b:1:0"])})  # fmt: skip
    history.launched |= {(2, 2, "a"): 1, (2, 2, "b"): 1}
    history.commits.append(("t4", 4, 2))
    history.archives.append(("t4.1", 4))
    gcs = {g.number: g for g in (gc1, gc2, gc3, gc4)}
    observed = Observed("succeeded", "verify passed", gcs, {"f": b"x"},
                        ["a:1:0", "b:1:0", "a:2:0"], 5)  # fmt: skip
    return history, observed


def found(history: History, observed: Observed, durability: str = "async") -> set[str]:
    _, reference = clean()
    return {v.invariant for v in check(history, observed, reference, durability, ended=True)}


def test_a_clean_history_passes() -> None:
    history, observed = clean()
    assert set() == found(history, observed)
    assert set() == found(history, observed, "sync")


def test_a_restore_that_mixes_gcs_is_caught() -> None:
    history, observed = clean()
    observed.gcs[3].members["b"] = member(2, 1, 1, "b2", ["b:1:0"])  # b got GC 2's history
    assert {"mixed_restore"} == found(history, observed) - {"fenced_write"}
    history, observed = clean()
    observed.gcs[3].members["a"].epoch = 1  # a was not restaged under the restore's epoch
    assert "mixed_restore" in found(history, observed)


def test_a_lost_acknowledged_gc_is_caught() -> None:
    history, observed = clean()
    del observed.gcs[2]
    assert "lost_commit" in found(history, observed)
    history, observed = clean()
    observed.gcs[2].error = "no such record"
    assert {"lost_commit"} == found(history, observed)


def test_under_sync_only_archived_gcs_count_as_acknowledged() -> None:
    history, observed = clean()
    history.archives.pop()  # GC 4 was committed, never archived
    observed.gcs[4].error = "gone with a FLUSHALL before its archive"
    assert "lost_commit" not in found(history, observed, "sync")
    assert "lost_commit" in found(history, observed, "async")


def test_a_number_given_again_is_a_loss_only_if_its_first_gc_was_acknowledged() -> None:
    """Under sync, a GC lost to a FLUSHALL before its archive may see its number reused.

    One archived first may not: it was on disk, so it cannot have been lost.
    """
    history, observed = clean()
    history.archives.pop()
    history.flushes.append("t5")
    history.commits.append(("t6", 4, 3))  # the restore after the flush took number 4
    history.archives.append(("t7", 4))
    observed.gcs[4].epoch = 3
    for member_ in observed.gcs[4].members.values():
        member_.epoch = 3
    history.launched |= {(3, 2, "a"): 1, (3, 2, "b"): 1}
    assert set() == found(history, observed, "sync")
    history.archives.insert(-1, ("t4.1", 4))  # but GC 4 of epoch 2 had been archived
    assert {"lost_commit"} == found(history, observed, "sync")


def test_across_a_failover_each_durability_keeps_what_it_acknowledged() -> None:
    """GC 4, committed and not archived, is gone after a failover.

    Under `async` that is allowed (it was acknowledged as committed, not as durable);
    under `replicated` it is a loss once a replica held it, and allowed before.
    """
    history, observed = clean()
    history.archives.pop()
    history.failovers.append("t5")
    observed.gcs[4].error = "gone with the old primary"
    assert "lost_commit" not in found(history, observed, "async")
    assert "lost_commit" not in found(history, observed, "replicated")
    history.replicated.append(("t4.2", 4))
    assert "lost_commit" in found(history, observed, "replicated")
    history.failovers = []  # with no failover, async acknowledged it at its commit
    assert "lost_commit" in found(history, observed, "async")


def test_a_commit_while_two_primaries_took_writes_is_not_acknowledged_by_a_later_archive() -> None:
    """GC 4 committed during a split, maybe on the old primary only, then an archive.

    The archive, made from the new primary, need not hold GC 4: its loss is no violation.
    The same commit and archive outside a split is.
    """
    history, observed = clean()
    observed.gcs[4].error = "PREPARING: committed on the old primary only"
    history.splits.append(("t3.9", "t4.05"))  # the commit of GC 4 at t4 falls within
    assert "lost_commit" not in found(history, observed, "sync")
    history.splits = [("t4.2", "t4.3")]
    assert "lost_commit" in found(history, observed, "sync")


def test_a_restore_is_checked_only_against_the_gcs_it_saw() -> None:
    """A restore whose GC (or target) number now names another GC is not judged by it."""
    history, observed = clean()
    observed.gcs[3].members["b"] = member(2, 1, 1, "b2", ["b:1:0"])  # mixed…
    history.restores = [Restore("t3", 1, 1, 3, 9)]  # …but the restore wrote epoch 9's GC 3
    assert "mixed_restore" not in found(history, observed)


def test_detected_corruption_of_a_damaged_file_is_not_a_loss() -> None:
    history, observed = clean()
    observed.gcs[2].error, observed.gcs[2].corrupt = "checksum mismatch", True
    assert "lost_commit" in found(history, observed)  # nobody damaged anything
    history.corrupted.append("tasks/t/lc/b/x.zst")
    assert "lost_commit" not in found(history, observed)


def test_a_write_from_a_fenced_attempt_or_epoch_is_caught() -> None:
    history, observed = clean()
    observed.gcs[1].members["b"].attempt = 1  # attempt 2 was current
    assert {"fenced_write"} == found(history, observed)
    history, observed = clean()
    observed.gcs[2].members["a"].epoch = 0
    assert {"fenced_write"} == found(history, observed)


def test_in_a_split_an_attempt_launched_on_either_primary_may_be_current() -> None:
    """While two primaries take writes, no log says which one a retry's launch reached."""
    history, observed = clean()
    observed.gcs[1].members["b"].attempt = 1
    history.launches = [("t0", (1, 1, "b"), 1), ("t1.5", (1, 1, "b"), 2)]
    history.splits = [("t1.2", "t1.8")]  # attempt 2 launched while two primaries took writes
    assert set() == found(history, observed)
    history.splits = [("t1.6", "t1.8")]  # launched before the split: attempt 2 was current
    assert {"fenced_write"} == found(history, observed)
    history.splits = [("t1.2", "t1.8")]
    observed.gcs[1].members["b"].attempt = 3  # never launched at all
    assert {"fenced_write"} == found(history, observed)


def test_a_write_accepted_after_its_fence_is_caught_from_the_audit_stream() -> None:
    """Redis's order says b's attempt 1 wrote after attempt 2 was fenced in: a violation.

    It is one even though the GC took attempt 2's LC (the zombie's vote was overwritten).
    """
    history, observed = clean()
    observed.audit = [
        ("fence", "b", "1:1:1", ""), ("lc", "b", "1:1:1", "x1"),
        ("fence", "b", "1:1:2", ""), ("lc", "b", "1:1:2", "x2"),
    ]  # fmt: skip
    assert set() == found(history, observed)
    observed.audit.append(("lc", "b", "1:1:1", "zombie"))
    assert {"fenced_write"} == found(history, observed)
    observed.audit = [("fence", "a", "1:2:1", ""), ("epoch", "", "2", ""),
                      ("lc", "a", "1:2:1", "old epoch")]  # fmt: skip
    assert {"fenced_write"} == found(history, observed)


def test_a_restore_to_a_gc_now_unreadable_is_still_known_as_a_restore() -> None:
    """GC 5 restores GC 4, whose archived file was damaged since.

    GC 5 follows GC 3 among the readable ones, so only the restore's log line says it is
    no superstep's GC.
    """
    history, observed = clean()
    observed.gcs[4].error, observed.gcs[4].corrupt = "checksum mismatch", True
    history.corrupted.append("tasks/t/gc/000000000004.rec")
    observed.gcs[5] = GCView(5, 2, 3, "w2", {"a": member(3, 1, 2, "a2", ["a:1:0", "a:2:0"]),
                                             "b": member(3, 1, 2, "b2", ["b:1:0"])})  # fmt: skip
    history.commits.append(("t5", 5, 3))
    history.restores.append(Restore("t5", 4, 2, 5, 3))
    assert set() == found(history, observed)
    history.restores.pop()  # without it, GC 5 looks like superstep 2's, launched by nobody
    assert {"fenced_write"} == found(history, observed)


def test_a_different_end_is_caught() -> None:
    history, observed = clean()
    observed.files = {"f": b"y"}
    assert {"diverged"} == found(history, observed)
    history, observed = clean()
    observed.gcs[4].members["a"].messages.append(("user", "b", "extra", "[]"))
    assert {"diverged"} == found(history, observed)


def test_an_effect_applied_twice_missing_or_extra_is_caught() -> None:
    for ledger in (["a:1:0", "b:1:0", "a:2:0", "a:2:0"], ["a:1:0", "b:1:0"],
                   ["a:1:0", "b:1:0", "a:2:0", "b:2:0"]):  # fmt: skip
        history, observed = clean()
        observed.ledger = ledger
        assert {"effect_not_once"} == found(history, observed), ledger


def test_a_task_that_did_not_succeed_in_time_is_caught() -> None:
    history, observed = clean()
    _, reference = clean()
    stuck = check(history, observed, reference, "async", ended=False)
    assert {"stuck"} == {v.invariant for v in stuck}
    observed.status, observed.reason = "unrecoverable", "no checkpoint could be restored"
    assert "stuck" in found(history, observed)


def test_a_process_that_quit_on_its_own_is_caught() -> None:
    """Each exit the harness noted is a violation, naming the process; none, none."""
    history, observed = clean()
    _, reference = clean()
    assert [] == check(history, observed, reference, "async", True, quits=[])
    quits = ["worker-3 exited with 0", "coordinator-1 exited with 1"]
    said = check(history, observed, reference, "async", True, quits=quits)
    assert [("process_quit", q) for q in quits] == [(v.invariant, v.detail) for v in said]


def test_a_second_task_left_unfinished_is_caught() -> None:
    """A task a `poison_task` fault stranded is an `isolation` violation, said as found."""
    history, observed = clean()
    _, reference = clean()
    assert [] == check(history, observed, reference, "async", True, stranded=[])
    stranded = ["victim v (poisoned in commit) ended paused: the coordinator could not"]
    said = check(history, observed, reference, "async", True, stranded=stranded)
    assert [("isolation", s) for s in stranded] == [(v.invariant, v.detail) for v in said]


def test_every_invariant_has_a_way_to_fail() -> None:
    """Each invariant listed in the table was shown failing above."""
    shown = {"mixed_restore", "lost_commit", "fenced_write", "diverged", "effect_not_once",
             "stuck", "process_quit", "isolation", "membership", "fork"}  # fmt: skip
    assert shown == set(INVARIANTS)


def test_history_is_read_from_log_lines_of_every_process(tmp_path: Path) -> None:
    """JSON events of the task are folded in; other tasks, RQ's lines and cut lines are not."""
    (tmp_path / "coordinator-1.log").write_text(
        '{"event": "steps launched", "task": "t", "epoch": 1, "superstep": 1,'
        ' "attempts": {"a": 1}}\n'
        "12:00:01 default: Job OK (cairn-t-1-1-a-1)\n"
        '{"event": "steps launched", "task": "t", "epoch": 1, "superstep": 1,'
        ' "attempts": {"a": 2}}\n'
        '{"event": "superstep committed", "task": "t", "gc": 1, "epoch": 1, "timestamp": "A"}\n'
        '{"event": "superstep committed", "task": "other", "gc": 9, "epoch": 1}\n'
        '{"event": "checkpoints archived", "task": "t", "through": 1, "timestamp": "B"}\n'
        '{"event": "task restored", "task": "t", "to": 1, "to_epoch": 1, "gc": 2, "epoch": 2,'
        ' "timestamp": "C"}\n'
        '{"event": "superstep comm'
    )
    (tmp_path / "worker-2.log").write_text('{"event": "attempt fenced", "task": "t"}\n')
    (tmp_path / "harness.jsonl").write_text(
        '{"event": "fault injected", "task": "t", "fault": "corrupt_archive", "file": "x"}\n'
        '{"event": "fault injected", "task": "t", "fault": "flushall", "flushed_at": "D"}\n'
        '{"event": "fault injected", "task": "t", "fault": "split_primary", "promoted_at": "E",'
        ' "left_by": "F"}\n'
    )
    history = read_history(tmp_path, "t")
    assert {(1, 1, "a"): 2} == history.launched
    assert [("A", 1, 1), ("C", 2, 2)] == history.commits
    assert [Restore("C", 1, 1, 2, 2)] == history.restores
    assert ([("B", 1)], ["D"]) == (history.archives, history.flushes)
    assert (1, ["x"]) == (history.fenced, history.corrupted)
    assert (["F"], [("E", "F")]) == (history.failovers, history.splits)
    assert {"corrupt_archive": 1, "flushall": 1, "split_primary": 1} == dict(history.faults)


def test_the_ledger_applies_a_key_once_and_refuses_a_call_without_one(tmp_path: Path) -> None:
    assert record(tmp_path, "t:a:1:0", "one")
    assert not record(tmp_path, "t:a:1:0", "one again")
    assert record(tmp_path, "t:a:1:1", "two")
    applied = (tmp_path / "applied.log").read_text().splitlines()
    assert ["t:a:1:0\tone", "t:a:1:1\ttwo"] == applied
    assert 3 == len((tmp_path / "calls.log").read_text().splitlines())
    script = Path(__file__).resolve().parents[1] / "chaos" / "ledger.py"
    run = [sys.executable, str(script), str(tmp_path), "", "x"]
    refused = subprocess.run(run, capture_output=True, text=True, check=False)
    assert 2 == refused.returncode
    assert "CAIRN_IDEMPOTENCY_KEY" in refused.stderr


def test_a_seed_draws_one_schedule() -> None:
    """The same seed gives the same plan; FLUSHALL only under sync; a full disk only as root.

    Part of the seeds run their workers several steps at a time; part on replicas, failing
    over once, with `replicated` durability only there and no fault needing a lone Redis.
    """
    assert draw(7, 8.0, True) == draw(7, 8.0, True)
    plans = [draw(seed, 8.0, False) for seed in range(200)]
    kinds = {f.kind for p in plans for f in p.faults}
    assert "full_archive" not in kinds
    assert all(p.durability == "sync" for p in plans for f in p.faults if f.kind == "flushall")
    assert {"kill_worker", "flushall", "manual_restore", "partition_worker", "maxmemory"} <= kinds
    assert all(0.5 <= f.at <= 8.0 for p in plans for f in p.faults)
    assert {1, 2, 4} == {p.concurrency for p in plans}
    on_replicas = [p for p in plans if p.replicas]
    assert on_replicas, "no seed fails Redis over"
    assert all(1 == sum(f.kind in PRIMARY_MOVES for f in p.faults) for p in on_replicas)
    assert {"failover", "split_primary"} == {f.kind for p in on_replicas for f in p.faults
                                             if f.kind in PRIMARY_MOVES}  # fmt: skip
    assert not {f.kind for p in on_replicas for f in p.faults} & set(SINGLE_REDIS)
    assert all(p.replicas for p in plans if p.durability == "replicated")
    spawns = {"kill_at_spawn", "restore_across_spawn", "fork_after_spawn"}
    assert spawns <= kinds
    assert spawns <= {f.kind for p in on_replicas for f in p.faults}
    early = 0.5 + (8.0 - 0.5) * SPAWN_SHARE  # when the team spawns
    assert all(f.at <= early for p in plans for f in p.faults if f.kind == "kill_at_spawn")


def test_the_proxy_forwards_and_drops_clients_when_redis_is_down(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis").start()
    proxy = DelayProxy(server.port).start()
    try:
        client = redis.Redis(port=proxy.port, socket_timeout=2)
        assert client.ping()
        proxy.delay = 0.01
        assert client.set("k", "v")
        assert b"v" == client.get("k")
        client.close()
        server.kill()
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=2) as sock:
            sock.settimeout(2)
            assert b"" == sock.recv(1)  # closed by the proxy: Redis is not there
    finally:
        proxy.close()
        server.kill()


# A spawning team ------------------------------------------------------------------------


def gc(number: int, superstep: int, epoch: int, members: dict[str, MemberView],
       spawned: dict[str, Joined] | None = None) -> GCView:  # fmt: skip
    return GCView(number, superstep, epoch, f"w{superstep}", members, spawned=spawned or {})


def team_at(superstep: int, epoch: int, spawned: bool) -> dict[str, MemberView]:
    """Agents a and b at `superstep`, and s when `spawned` (it joins at superstep 1)."""
    keys = [f"a:{n}:0" for n in range(1, superstep + 1)]
    members = {"a": member(epoch, 1, superstep, f"a{superstep}", keys),
               "b": member(epoch, 1, superstep, f"b{superstep}", [])}  # fmt: skip
    if spawned:
        members["s"] = member(epoch, 1, superstep, f"s{superstep}", [])
    return members


SCOUT = {"s": Joined("a", 1, '{"model": "scripted"}')}


def spawning() -> tuple[History, Observed]:
    """Agent a spawns s in superstep 1; a restore to GC 0 removes s; a spawns it again, to the end.

    GCs 0-2 at epoch 1 (s joins at 1, steps at 2), GC 3 the restore to GC 0 at epoch 2,
    GCs 4-5 the same supersteps again. The audit stream has s's fences and LCs.
    """
    history = History(restores=[Restore("t3", 0, 1, 3, 2)])
    for epoch in (1, 2):
        for superstep in (1, 2):
            history.launched |= {(epoch, superstep, "a"): 1, (epoch, superstep, "b"): 1}
        history.launched[(epoch, 2, "s")] = 1
    history.commits = [("t0", 0, 1), ("t1", 1, 1), ("t2", 2, 1), ("t3", 3, 2), ("t4", 4, 2),
                       ("t5", 5, 2)]  # fmt: skip
    history.archives = [("t5.1", 5)]
    gcs = [gc(0, 0, 1, team_at(0, 1, False)), gc(3, 0, 2, team_at(0, 2, False))]
    gcs += [gc(n, n - epoch * 3 + 3, epoch, team_at(n - epoch * 3 + 3, epoch, True), SCOUT)
            for epoch, n in ((1, 1), (1, 2), (2, 4), (2, 5))]  # fmt: skip
    audit = [("fence", "s", "1:1:1", ""), ("lc", "s", "1:1:1", "s1"),
             ("fence", "s", "1:2:1", ""), ("lc", "s", "1:2:1", "s2"), ("epoch", "", "2", ""),
             ("fence", "s", "2:1:1", ""), ("lc", "s", "2:1:1", "s3"),
             ("fence", "s", "2:2:1", ""), ("lc", "s", "2:2:1", "s4")]  # fmt: skip
    observed = Observed("succeeded", "verify passed", {g.number: g for g in gcs}, {"f": b"x"},
                        ["a:1:0", "a:2:0"], 4, audit)  # fmt: skip
    return history, observed


def broken(history: History, observed: Observed, forks: list[ForkSeen] | None = None) -> set[str]:
    _, reference = spawning()
    said = check(history, observed, reference, "async", ended=True, forks=forks or [])
    return {v.invariant for v in said}


def test_a_clean_spawning_history_passes() -> None:
    """Joining, a restore that removes the member, joining again: no violation."""
    assert set() == broken(*spawning())


def test_a_gc_whose_spawned_member_or_spawner_is_no_member_is_caught() -> None:
    history, observed = spawning()
    del observed.gcs[2].members["s"]
    assert {"membership"} == broken(history, observed)
    history, observed = spawning()
    observed.gcs[2].spawned = {"s": Joined("z", 1, "{}")}  # a spawner that is not there
    assert {"membership"} == broken(history, observed)


def test_a_restore_that_keeps_the_spawned_map_of_another_gc_is_caught() -> None:
    """After a restore to GC 0 (no spawns), GC 3 still records s as spawned; or keeps s."""
    history, observed = spawning()
    observed.gcs[3].spawned = dict(SCOUT)
    assert "mixed_restore" in broken(history, observed)
    history, observed = spawning()
    observed.gcs[3].members["s"] = member(2, 1, 0, "s1", [])
    assert "mixed_restore" in broken(history, observed)


def test_a_member_named_before_its_spawners_step_committed_is_caught() -> None:
    """In GC 1, a's LC predates the step that spawned s; or s is in GC 0 of its epoch."""
    history, observed = spawning()
    observed.gcs[1].members["a"] = member(1, 1, 0, "a0", [])
    assert {"membership"} == broken(history, observed)
    history, observed = spawning()
    observed.gcs[1].spawned = {"s": Joined("a", 2, "{}")}  # joined after the GC's superstep
    assert "membership" in broken(history, observed)
    history, observed = spawning()
    observed.gcs[0].members["s"] = member(1, 1, 0, "s0", [])  # before it joined, at epoch 1
    assert "membership" in broken(history, observed)


def test_a_member_removed_by_a_restore_that_runs_or_writes_again_is_caught() -> None:
    """After the restore to GC 0 (epoch 2), s is launched, or an LC of s is accepted."""
    history, observed = spawning()
    history.launched[(2, 1, "s")] = 1  # launched after GC 3, which does not name it
    assert {"membership"} == broken(history, observed)
    history, observed = spawning()
    at = observed.audit.index(("epoch", "", "2", "")) + 1
    observed.audit[at:at] = [("fence", "s", "2:0:1", ""), ("lc", "s", "2:0:1", "zombie")]
    assert {"membership"} == broken(history, observed)


def test_a_joined_members_first_lc_of_another_attempt_or_epoch_is_caught() -> None:
    history, observed = spawning()
    observed.gcs[1].members["s"].attempt = 2
    assert {"fenced_write"} == broken(history, observed)


def test_a_final_team_other_than_the_fault_free_runs_is_caught() -> None:
    history, observed = spawning()
    observed.gcs[5].spawned = {"s": Joined("b", 1, '{"model": "scripted"}')}  # b spawned it
    assert {"diverged"} == broken(history, observed)


def fork_of(observed: Observed) -> ForkSeen:
    """A fork at GC 2 that starts as GC 2 and ends as GC 5 does."""
    start = gc(0, 2, 1, team_at(2, 1, True), SCOUT)
    end = gc(1, 2, 1, team_at(2, 1, True), SCOUT)
    end.members = observed.gcs[5].members
    ended = Observed("succeeded", "verify passed", {0: start, 1: end}, {"f": b"x"}, [], 0)
    return ForkSeen("f", 2, observed.gcs[2], ended, True)


def test_a_fork_that_lost_a_spawned_member_or_its_end_is_caught() -> None:
    history, observed = spawning()
    assert set() == broken(history, observed, [fork_of(observed)])
    seen = fork_of(observed)
    del seen.observed.gcs[0].members["s"]
    assert {"fork"} == broken(history, observed, [seen])
    seen = fork_of(observed)
    seen.observed.gcs[0].spawned = {"s": Joined("a", 1, '{"model": "other"}')}  # another spec
    assert {"fork"} == broken(history, observed, [seen])
    seen = fork_of(observed)
    seen.observed.files = {"f": b"y"}
    assert {"fork"} == broken(history, observed, [seen])
    seen = fork_of(observed)
    seen.observed.status, seen.ended = "running", False
    assert {"fork"} == broken(history, observed, [seen])
