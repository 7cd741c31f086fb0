"""The ten invariants a chaos run must keep, checked on what was recorded and stored.

1. `mixed_restore`: a restore leaves every agent at the one GC it restored to: the GC it
   wrote has the target's members, and the target's spawned members with the same
   spawners, superstep and specs; each member is a state of its epoch, at the target's
   superstep, whose history is the target member's history (plus the restore note), over
   the target's workspace.
2. `lost_commit`: every GC acknowledged as committed stays restorable: it reads back whole
   (every member's state, the manifest, every file). Under `durability: sync` the
   acknowledgement is the archive's (a GC committed but not yet archived may go with a
   FLUSHALL); under `replicated` a replica's or the archive's; under `async` it is the
   commit itself (the lone Redis fsyncs every write), but a failover takes the GCs only
   the old primary held, so across one only the archive's counts. A GC
   that fails only because the harness corrupted one of its archived files, and the
   failure was detected as corruption, is not lost: it is refused, as it must be.
3. `fenced_write`: no LC write was accepted from a fenced epoch or attempt. Replayed from
   Redis's own order of events (the task's audit stream: every epoch raise, every fence
   of a step's attempt, every accepted LC write), each accepted write must carry the
   epoch then current and its agent's attempt then current. And every GC member written
   in the GC's own superstep carries the GC's epoch and the attempt the coordinator last
   launched for that step.
4. `diverged`: the final workspace, the final team (its members, and who spawned whom)
   and every agent's history (restore notes aside) equal the fault-free run's.
5. `effect_not_once`: the ledger applied each committed side effect exactly once: its
   applied keys are exactly the idempotency keys of the `run_command` calls in the final
   histories, each once, and the same keys as the fault-free run's.
6. `stuck`: the task ended `succeeded` within the run's time bound.
7. `process_quit`: no worker or coordinator exited unless a fault killed it (SIGKILL);
   a worker started while Redis does not answer or refuses writes exits with
   `UNAVAILABLE` by design, for its supervisor to start it again. The harness restarts
   every process that exits, as a supervisor would, so without this one a process
   quitting over a fault would go unseen.
8. `isolation`: a second task whose advance kept failing in one phase of the coordinator
   (the `poison_task` fault) held up nothing: the run's task is judged by the invariants
   above as in any run, and the second task, once the fault is lifted (and, if it was
   paused for it, resumed), ends `succeeded` too.
9. `membership`: membership is part of a GC. Every GC's spawned members are members of
   it, spawned by a member of it, at a superstep no later than the GC's, and neither the
   member's LC nor its spawner's predates that superstep; no GC of an epoch names a member
   before the superstep that epoch's GCs say it joined at. No step of a spawned member is
   launched after a GC of its epoch that does not name it (at the superstep before), and
   no LC of one is accepted at an epoch and superstep whose GC does not name it and whose
   previous GC does not either: a member a restore removed is fenced for good.
10. `fork`: a fork made at a GC after a spawn starts with that GC's members and spawned
   members (specs and spawners), and ends `succeeded` with the fault-free run's files,
   team and histories.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from chaos.observe import ForkSeen, GCView, History, Observed, Turn

INVARIANTS = {
    "mixed_restore": "a restore left agents from different GCs",
    "lost_commit": "an acknowledged GC is no longer restorable",
    "fenced_write": "a write from a fenced epoch or attempt was accepted",
    "diverged": "final workspace or histories differ from the fault-free run",
    "effect_not_once": "a committed side effect did not happen exactly once",
    "stuck": "the task did not end succeeded within the bound",
    "process_quit": "a worker or coordinator exited that no fault killed",
    "isolation": "a task that failed in one phase did not run on once the fault was lifted",
    "membership": "a GC's membership, or a write or launch, disagrees with who joined when",
    "fork": "a fork after a spawn lost its members or did not end as the fault-free run",
}


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken invariant, said plainly."""

    invariant: str
    detail: str


def check(
    history: History,
    observed: Observed,
    reference: Observed,
    durability: str,
    ended: bool,
    quits: Sequence[str] = (),
    stranded: Sequence[str] = (),
    forks: Sequence[ForkSeen] = (),
) -> list[Violation]:
    """Every violation of the ten invariants in one run (none: the run passed).

    `quits` says which processes exited on their own (not killed by a fault), and how;
    `stranded`, which second tasks a `poison_task` fault left unfinished, and how;
    `forks`, the forks the harness made of the task, and how they ended.
    """
    found: list[Violation] = [Violation("process_quit", said) for said in quits]
    found += [Violation("isolation", said) for said in stranded]
    found += _restores(history, observed)
    found += _acknowledged(history, observed, durability)
    found += _fencing(history, observed)
    if not ended or observed.status != "succeeded":
        found.append(Violation("stuck", f"ended {observed.status or 'never'}: {observed.reason}"))
    else:
        found += _outcome(observed, reference)
    found += _effects(observed, reference)
    found += membership(history, observed)
    found += [v for seen in forks for v in _fork(seen, reference)]
    return found


def _restores(history: History, observed: Observed) -> list[Violation]:
    found = []
    for r in history.restores:
        restored, target = observed.gcs.get(r.gc), observed.gcs.get(r.to)
        # Only the incarnations the restore saw: a GC Redis lost before it was acknowledged
        # may have had its number given to another (`lost_commit` judges the loss).
        if restored is None or target is None:
            continue
        if not _same(restored, r.epoch) or not _same(target, r.to_epoch):
            continue
        why = _mixed(restored, target, r.epoch)
        if why:
            found.append(Violation("mixed_restore", f"GC {r.gc} (restore to {r.to}): {why}"))
    return found


def _same(view: GCView, epoch: int) -> bool:
    return not view.error and view.epoch == epoch


def _mixed(restored: GCView, target: GCView, epoch: int) -> str | None:
    if restored.members.keys() != target.members.keys():
        return f"members {sorted(restored.members)} ≠ {sorted(target.members)}"
    if restored.spawned != target.spawned:
        return f"spawned {_team(restored)} ≠ {_team(target)}"
    if restored.workspace != target.workspace:
        return "workspace differs from the target's"
    for agent, member in restored.members.items():
        want = target.members[agent]
        if (member.epoch, member.superstep) != (epoch, target.superstep):
            return (
                f"{agent} is at epoch {member.epoch}, superstep {member.superstep}; "
                f"the restore wrote epoch {epoch}, superstep {target.superstep}"
            )
        if member.messages != want.messages:
            return f"{agent}'s history is not the target's"
    return None


def acknowledged(history: History, durability: str) -> tuple[dict[int, int], list[Violation]]:
    """GC number → epoch of every GC acknowledged, replayed in time order.

    Also a violation for each acknowledged GC whose number was later given to another
    (it was lost).

    An archive through N makes every GC up to N committed since durable; so does a
    replica holding N under `replicated`. Under `async` a commit is also acknowledged;
    under `sync` and `replicated` only what is durable is. A FLUSHALL or a failover
    forgets the GCs not durable before it (they may go with it, and their numbers be
    given again): under `async` too, which promises nothing more across a failover.

    A commit logged while two primaries took writes (a split) is never acknowledged here:
    it may have reached the old primary only, and an archive or a replica count logged
    then, by a connection already on the new one, would not have covered it. Its number
    given again after it was acknowledged is still a loss.
    """
    replicated = history.replicated if durability == "replicated" else []
    events = sorted(
        [(at, 0, n, epoch) for at, n, epoch in history.commits]
        + [(at, 1, n, 0) for at, n in [*history.archives, *replicated]]
        + [(at, 2, 0, 0) for at in [*history.flushes, *history.failovers]]
    )
    latest: dict[int, int] = {}
    acked: dict[int, int] = {}
    durable: dict[int, int] = {}
    found = []
    for at, kind, number, epoch in events:
        if kind == 0:
            if acked.get(number, epoch) != epoch:
                found.append(Violation(
                    "lost_commit",
                    f"GC {number} was acknowledged at epoch {acked[number]}, then its number "
                    f"went to another GC (epoch {epoch}): the first was lost",
                ))  # fmt: skip
            if any(lo <= at <= hi for lo, hi in history.splits):
                continue
            latest[number] = epoch
            if durability == "async":
                acked[number] = epoch
        elif kind == 1:
            durable |= {n: e for n, e in latest.items() if n <= number}
            acked |= durable
        else:
            acked = {n: e for n, e in acked.items() if durable.get(n) == e}
            latest = {n: e for n, e in latest.items() if acked.get(n) == e}
    return acked, found


def _acknowledged(history: History, observed: Observed, durability: str) -> list[Violation]:
    acked, found = acknowledged(history, durability)
    for number, epoch in sorted(acked.items()):
        view = observed.gcs.get(number)
        if view is None:
            found.append(Violation("lost_commit", f"GC {number} is gone"))
        elif view.error and not (view.corrupt and history.corrupted):
            found.append(Violation("lost_commit", f"GC {number}: {view.error}"))
        elif not view.error and view.epoch != epoch:
            found.append(Violation(
                "lost_commit", f"GC {number} is now epoch {view.epoch}'s, not {epoch}'s"
            ))  # fmt: skip
    return found


def _accepted(observed: Observed) -> list[Violation]:
    """Replay the audit stream: each accepted write was of the current epoch and attempt."""
    found = []
    epoch, fences = "1", dict[str, str]()  # a task starts at epoch 1, unaudited
    for kind, agent, at, lc in observed.audit:
        if kind == "epoch":
            epoch = at
        elif kind == "fence":
            fences[agent] = at
        elif kind == "lc" and (at.split(":")[0] != epoch or fences.get(agent) != at):
            found.append(Violation(
                "fenced_write",
                f"LC {lc} of {agent} at {at} accepted while epoch {epoch}, "
                f"attempt {fences.get(agent)} were current",
            ))  # fmt: skip
    return found


def _fencing(history: History, observed: Observed) -> list[Violation]:
    found = _accepted(observed)
    restores = {(r.gc, r.epoch) for r in history.restores}
    previous: GCView | None = None
    for number in sorted(observed.gcs):
        view = observed.gcs[number]
        if view.error:
            continue
        # GC 0 is the submission's; a restore's GC is logged as one, and is at a superstep
        # already passed (what tells one whose log line a killed process never wrote).
        restore = (number, view.epoch) in restores or (
            previous is not None and view.superstep <= previous.superstep
        )
        previous = view
        if restore or number == 0:
            continue
        for agent, member in view.members.items():
            if member.superstep != view.superstep:
                continue  # carried over from an earlier GC: the agent did not step
            joined = view.spawned.get(agent)
            if joined is not None and joined.superstep == view.superstep:
                # Its first LC, which its spawner's step wrote: attempt 1, no launch of its own.
                if (member.epoch, member.attempt) != (view.epoch, 1):
                    found.append(Violation(
                        "fenced_write",
                        f"GC {number}: {agent} joined with an LC of epoch {member.epoch} "
                        f"attempt {member.attempt}, not epoch {view.epoch} attempt 1",
                    ))  # fmt: skip
                continue
            current = history.current((view.epoch, view.superstep, agent))
            if member.epoch != view.epoch or member.attempt not in current:
                found.append(Violation(
                    "fenced_write",
                    f"GC {number}: {agent}'s LC is epoch {member.epoch} attempt "
                    f"{member.attempt}; current were epoch {view.epoch} attempt "
                    f"{' or '.join(map(str, sorted(current))) or 'none'}",
                ))  # fmt: skip
    return found


def _outcome(observed: Observed, reference: Observed) -> list[Violation]:
    found = []
    if observed.files != reference.files:
        differ = sorted(
            p for p in observed.files.keys() | reference.files.keys()
            if observed.files.get(p) != reference.files.get(p)
        )  # fmt: skip
        found.append(Violation("diverged", f"files differ: {differ[:5]}"))
    latest, want = _final(observed), _final(reference)
    team, team_wanted = _team(_last(observed)), _team(_last(reference))
    if team != team_wanted:
        found.append(Violation("diverged", f"the team is {team}, not {team_wanted}"))
    found += [
        Violation("diverged", f"{agent}'s history differs")
        for agent in sorted(latest.keys() | want.keys())
        if latest.get(agent) != want.get(agent)
    ]
    return found


def _last(observed: Observed) -> GCView | None:
    readable = [v for v in observed.gcs.values() if not v.error]
    return max(readable, key=lambda v: v.number) if readable else None


def _team(view: GCView | None) -> dict[str, str | None]:
    """Member → who spawned it (None: the spec named it)."""
    if view is None:
        return {}
    return {m: (view.spawned[m].parent if m in view.spawned else None)
            for m in sorted(view.members)}  # fmt: skip


def _final(observed: Observed) -> dict[str, list[Turn]]:
    last = _last(observed)
    return {} if last is None else {agent: m.messages for agent, m in last.members.items()}


def _effects(observed: Observed, reference: Observed) -> list[Violation]:
    found = []
    twice = [key for key, n in Counter(observed.ledger).items() if n > 1]
    if twice:
        found.append(Violation("effect_not_once", f"applied more than once: {twice[:5]}"))
    committed = _committed_keys(observed)
    applied = set(observed.ledger)
    if observed.status == "succeeded" and applied != committed:
        extra, missing = sorted(applied - committed), sorted(committed - applied)
        found.append(Violation(
            "effect_not_once",
            f"ledger ≠ committed calls: not committed {extra[:5]}, never applied {missing[:5]}",
        ))  # fmt: skip
    if observed.status == "succeeded" and committed != _committed_keys(reference):
        found.append(Violation("effect_not_once", "committed calls differ from the fault-free run"))
    return found


def _committed_keys(observed: Observed) -> set[str]:
    readable = [v for v in observed.gcs.values() if not v.error]
    if not readable:
        return set()
    last = max(readable, key=lambda v: v.number)
    return {key for member in last.members.values() for key in member.keys}


def membership(history: History, observed: Observed) -> list[Violation]:
    """Invariant 9: who is a member, per GC, agrees with who joined when, and who ran."""
    found: list[Violation] = []
    readable = [v for v in observed.gcs.values() if not v.error]
    at: dict[tuple[int, int], list[GCView]] = {}  # (epoch, superstep) → its GCs
    joined: dict[tuple[int, str], int] = {}  # (epoch, member) → superstep it joined at
    for view in readable:
        at.setdefault((view.epoch, view.superstep), []).append(view)
        for name, j in view.spawned.items():
            key = (view.epoch, name)
            joined[key] = min(joined.get(key, j.superstep), j.superstep)
            found += [Violation("membership", f"GC {view.number}: {why}")
                      for why in _joined_badly(view, name)]  # fmt: skip
    spawned = {name for _, name in joined}
    for view in readable:
        early = [m for m in view.members if joined.get((view.epoch, m), 0) > view.superstep]
        found += [Violation("membership", f"GC {view.number} (superstep {view.superstep}) "
                            f"names {m}, who joined at superstep {joined[(view.epoch, m)]}")
                  for m in early]  # fmt: skip
    for epoch, superstep, agent in sorted(history.launched):
        before = at.get((epoch, superstep - 1), [])
        if agent in spawned and before and not any(agent in v.members for v in before):
            found.append(Violation(
                "membership",
                f"{agent}'s step of superstep {superstep} was launched at epoch {epoch}, "
                f"after GC {before[0].number}, which does not name it",
            ))  # fmt: skip
    for kind, agent, fence, lc in observed.audit:
        if kind != "lc" or agent not in spawned:
            continue
        epoch, superstep = (int(x) for x in fence.split(":")[:2])
        views = at.get((epoch, superstep - 1), []) + at.get((epoch, superstep), [])
        if at.get((epoch, superstep)) and not any(agent in v.members for v in views):
            found.append(Violation(
                "membership",
                f"LC {lc} of {agent} was accepted at epoch {epoch}, superstep {superstep}, "
                "where no GC names it: a member the restore removed wrote again",
            ))  # fmt: skip
    return found


def _joined_badly(view: GCView, name: str) -> list[str]:
    """Why GC `view`'s record of spawned member `name` cannot be (none: it can)."""
    j = view.spawned[name]
    member, parent = view.members.get(name), view.members.get(j.parent)
    why = []
    if member is None:
        why.append(f"{name} is spawned but no member")
    elif member.superstep < j.superstep:
        why.append(f"{name}'s LC is of superstep {member.superstep}, "
                   f"before it joined ({j.superstep})")  # fmt: skip
    if parent is None:
        why.append(f"{name}'s spawner {j.parent} is no member")
    elif parent.superstep < j.superstep:
        why.append(f"{name}'s spawner {j.parent} is at superstep {parent.superstep}, before "
                   f"the step that spawned {name} ({j.superstep})")  # fmt: skip
    if j.superstep > view.superstep:
        why.append(f"{name} joined at superstep {j.superstep}, after the GC's {view.superstep}")
    return why


def _fork(seen: ForkSeen, reference: Observed) -> list[Violation]:
    """Invariant 10: the fork starts with its source GC's team and ends as the reference."""
    found = []
    start = seen.observed.gcs.get(0)
    name = f"fork {seen.fork}"
    if seen.source.error:
        found.append(Violation("fork", f"{name}: source GC {seen.at}: {seen.source.error}"))
    elif start is None or start.error:
        found.append(Violation("fork", f"{name}: its GC 0 does not read back"))
    elif start.members.keys() != seen.source.members.keys() or start.spawned != seen.source.spawned:
        found.append(Violation(
            "fork",
            f"fork {seen.fork} starts with {_team(start)}, GC {seen.at} has {_team(seen.source)}"
            + ("" if start.spawned == seen.source.spawned else " (or other specs)"),
        ))  # fmt: skip
    if not seen.ended or seen.observed.status != "succeeded":
        ended = seen.observed.status or "never"
        found.append(Violation(
            "fork", f"{name} (at GC {seen.at}) ended {ended}: {seen.observed.reason}"
        ))  # fmt: skip
    else:
        found += [Violation("fork", f"fork {seen.fork}: {v.detail}")
                  for v in _outcome(seen.observed, reference)]  # fmt: skip
    return found
