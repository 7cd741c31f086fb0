"""Fork and diff with real workers: a fork of GC N ends as its source restored to N would."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cairn.coordinator.diff import diff
from cairn.coordinator.spec import TaskSpec
from cairn.coordinator.views import Lineage
from cairn.errors import CairnError, InvalidSpec
from cairn.storage.records import GlobalCheckpoint
from tests.agent_harness import files_of
from tests.cluster import TEAM, Cluster, Histories, outcome, team_spec
from tests.test_restore import run_until, states_of

RESTORE_NOTE = "Cairn restored you to checkpoint"


def without_restore_notes(histories: Histories) -> Histories:
    """Histories without the note a restore appends for each agent (a fork appends none)."""
    return {
        agent: [m for m in history if not str(m[1]).startswith(RESTORE_NOTE)]
        for agent, history in histories.items()
    }


def test_a_fork_of_gc_n_ends_as_the_source_restored_to_n(cluster: Cluster, tmp_path: Path) -> None:
    """Same files and histories; the source is untouched by the fork; status names the source."""
    cluster.start_worker()
    cluster.start_worker()
    ledger = tmp_path / "ledger"
    source = cluster.tasks.submit(team_spec(ledger))
    gc1 = run_until(cluster, source, 1)
    kept = {n: cluster.store.read_gc(source, n).checksum for n in range(gc1.number + 1)}

    forked = cluster.tasks.fork(source, at=gc1.number)
    assert (
        Lineage(task_id=source, checkpoint=gc1.number) == cluster.tasks.status(forked).forked_from
    )
    start = cluster.store.read_gc(forked, 0)
    assert (gc1.superstep, gc1.statuses, gc1.inbox) == (
        start.superstep,
        start.statuses,
        start.inbox,
    )
    assert files_of(cluster.store, gc1) == files_of(cluster.store, start)
    assert states_of(cluster, gc1) == states_of(cluster, start)

    assert "succeeded" == cluster.drive(source)["status"]
    assert "succeeded" == cluster.drive(forked)["status"]
    # The fork never wrote to its source: every GC it read is as it was.
    assert kept == {n: cluster.store.read_gc(source, n).checksum for n in kept}

    cluster.coordinator.restorer.restore(source, to=gc1.number)
    assert "succeeded" == cluster.drive(source)["status"]
    files_source, histories_source, _ = outcome(cluster, source, ledger)
    files_fork, histories_fork, _ = outcome(cluster, forked, ledger)
    assert files_source == files_fork
    assert without_restore_notes(histories_source) == histories_fork
    assert histories_source != histories_fork  # the restore's notes were there to drop


def test_a_fork_from_a_checkpoint_only_in_the_archive_runs_to_the_end(
    cluster: Cluster, tmp_path: Path
) -> None:
    """GC 1 left Redis (hot_keep 1): the fork reads it, its LCs and its files from disk."""
    cluster.start_worker()
    spec = team_spec(tmp_path / "ledger").model_copy(deep=True)
    spec.checkpoints.hot_keep = 1
    source = cluster.tasks.submit(spec)
    assert "succeeded" == cluster.drive(source)["status"]
    assert cluster.coordinator.archiver.drain()
    assert 1 not in [info.number for info in cluster.store.hot.list_gcs(source)]
    gc1 = cluster.store.read_gc(source, 1)

    forked = cluster.tasks.fork(source, at=1)
    assert files_of(cluster.store, gc1) == files_of(cluster.store, cluster.store.read_gc(forked, 0))
    assert "succeeded" == cluster.drive(forked)["status"]
    assert (
        outcome(cluster, source, tmp_path / "ledger")[0]
        == outcome(cluster, forked, tmp_path / "ledger")[0]
    )


def test_a_fork_may_change_prompts_but_not_the_team(cluster: Cluster, tmp_path: Path) -> None:
    """A new system prompt replaces the first message; other agents, an absent GC: refused."""
    cluster.start_worker()
    source = cluster.tasks.submit(team_spec(tmp_path / "ledger"))
    gc1 = run_until(cluster, source, 1)
    data = yaml.safe_load(TEAM.replace("LEDGER", str(tmp_path / "ledger")).replace("SLOW", "0"))
    data["agents"][1]["system"] = "You are a careful coder."
    changed = cluster.tasks.fork(source, at=gc1.number, spec=TaskSpec.model_validate(data))
    coder = states_of(cluster, cluster.store.read_gc(changed, 0))["coder"]
    assert ("system", "You are a careful coder.") == coder[0]
    assert states_of(cluster, gc1)["coder"][1:] == coder[1:]

    data["agents"] = data["agents"][:2]
    with pytest.raises(InvalidSpec, match="a fork keeps its team"):
        cluster.tasks.fork(source, spec=TaskSpec.model_validate(data))
    with pytest.raises(InvalidSpec, match="no committed checkpoint 99"):
        cluster.tasks.fork(source, at=99)


@pytest.fixture
def ran(cluster: Cluster, tmp_path: Path) -> tuple[str, str, GlobalCheckpoint]:
    """The team's task run to its end and a fork of its GC 1 run to its end."""
    cluster.start_worker()
    source = cluster.tasks.submit(team_spec(tmp_path / "ledger"))
    assert "succeeded" == cluster.drive(source)["status"]
    forked = cluster.tasks.fork(source, at=1)
    assert "succeeded" == cluster.drive(forked)["status"]
    latest = cluster.store.latest_gc(source)
    assert latest is not None
    return source, forked, latest


def test_a_diff_of_two_checkpoints_shows_messages_tool_calls_and_files(
    cluster: Cluster, ran: tuple[str, str, GlobalCheckpoint]
) -> None:
    """GC 1 → the last: the coder's write and command, greet.py's change, REVIEW.md added."""
    source, _, latest = ran
    found = diff(cluster.store, source, 1, source, latest.number).to_json()
    assert {"a", "b", "agents", "files", "members"} == found.keys()
    assert {"joined": {}, "left": []} == found["members"]  # the same three agents
    coder = found["agents"]["coder"]
    assert ["write_file", "run_command", "send_message"] == [
        c["tool"] for c in coder["tool_calls_added"]
    ]
    assert any(m.get("content") == "Coding." for m in coder["messages_added"])
    assert ["REVIEW.md"] == found["files"]["added"]
    assert [] == found["files"]["removed"]
    change = found["files"]["changed"]["greet.py"]
    assert "--- a/greet.py\n+++ b/greet.py\n" in change
    assert "-print('hi')\n+print('Hello')\n" in change
    nothing = diff(cluster.store, source, 2, source, 2).to_json()
    assert all(
        a == {"messages_added": [], "tool_calls_added": [], "compactions_added": []}
        for a in nothing["agents"].values()
    )
    assert {"added": [], "removed": [], "changed": {}} == nothing["files"]


def test_a_diff_within_a_task_reads_only_the_tails_of_the_chains(
    cluster: Cluster, ran: tuple[str, str, GlobalCheckpoint], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No whole history is rebuilt; each LC read is one past the common one, at most."""
    source, _, latest = ran
    reads: list[str] = []
    real = cluster.store.read_lc_fields

    def counted(task: str, agent: str, ref: object, view: type) -> object:
        reads.append(agent)
        return real(task, agent, ref, view)  # type: ignore[arg-type]

    def refused(*_: object) -> None:
        raise AssertionError("a whole history was read")

    monkeypatch.setattr(cluster.store, "read_lc_fields", counted)
    monkeypatch.setattr(cluster.store, "read_state", refused)
    found = diff(cluster.store, source, latest.number - 1, source, latest.number)
    assert found.agents["reviewer"].tool_calls_added  # the last superstep: the review
    agents = len(latest.members)
    # Per agent: both heads, then one parent each until they meet (one superstep apart).
    assert len(reads) <= 3 * agents, reads


def test_a_diff_across_a_fork(cluster: Cluster, ran: tuple[str, str, GlobalCheckpoint]) -> None:
    """The fork's GC 0 is its source's GC 1; both ends agree on what was done after it."""
    source, forked, latest = ran
    same = diff(cluster.store, source, 1, forked, 0)
    assert all(not a.messages_added and not a.tool_calls_added for a in same.agents.values())
    assert ([], [], {}) == (same.files.added, same.files.removed, same.files.changed)
    theirs = diff(cluster.store, source, 1, forked, None)
    ours = diff(cluster.store, source, 1, source, latest.number)
    assert ours.files == theirs.files
    for agent, added in ours.agents.items():
        assert [c["tool"] for c in added.tool_calls_added] == [
            c["tool"] for c in theirs.agents[agent].tool_calls_added
        ]


def test_a_fork_of_an_unknown_task_is_refused(cluster: Cluster) -> None:
    """The source must exist; nothing is created."""
    with pytest.raises(CairnError, match="nosuch"):
        cluster.tasks.fork("nosuch-0123456789ab")
