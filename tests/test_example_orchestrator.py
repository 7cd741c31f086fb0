"""examples/orchestrator/: an orchestrator spawns three researchers and a writer, on workers.

Python only: the team is `research_team.team()`, its agents are `cairn.agent` functions
the workers load from the example's module, as its README says. The orchestrator starts
alone; the members it spawns join at barriers, report back when they finish, and the
task ends with the writer's brief in the workspace.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.cluster import ROOT, Cluster

EXAMPLE = ROOT / "examples" / "orchestrator"


@pytest.fixture
def research_team(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> object:
    """The example's module, importable here and loaded by the cluster's workers."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    cluster.env.update({"PYTHONPATH": os.pathsep.join([str(ROOT), str(EXAMPLE)]),
                        "CAIRN_TOOLS": "research_team"})  # fmt: skip
    import research_team  # noqa: PLC0415 - from the example's directory, put on the path above

    yield research_team
    sys.modules.pop("research_team", None)


def test_the_orchestrator_spawns_researchers_then_a_writer(
    cluster: Cluster, research_team: object, tmp_path: Path
) -> None:
    """Three researchers and a writer join, each reports back, the brief is written."""
    for _ in range(2):
        cluster.start_worker()
    cluster.wait_for_workers(2)
    task = cluster.tasks.submit(research_team.team())  # type: ignore[attr-defined]
    status = cluster.drive(task, timeout=90)
    assert "succeeded" == status["status"], (status, cluster.worker_logs())
    gc = cluster.store.latest_gc(task)
    assert gc is not None
    researchers = ["researcher-1", "researcher-2", "researcher-3"]
    assert ["orchestrator", *researchers, "writer"] == sorted(gc.members)
    assert dict.fromkeys([*researchers, "writer"], "orchestrator") == {
        name: joined.parent for name, joined in gc.spawned.items()
    }
    files = {p: cluster.store.get_blob(task, sha) for p, sha in
             cluster.store.read_manifest(task, gc.workspace).files.items()}  # fmt: skip
    assert [f"notes/{name}.md" for name in researchers] == sorted(p for p in files if "notes/" in p)
    assert b"Solid-state batteries: denser and safer, not yet cheap." == files["BRIEF.md"]
    lead = cluster.store.read_state(task, "orchestrator", gc.members["orchestrator"].id)
    reports = [m.name or "" for m in lead.messages if m.content and " finished" in m.content]
    assert sorted(reports) == sorted([*researchers, "writer"])
    assert {"brief": "BRIEF.md"} == (lead.result.value if lead.result else None)
    spawns = [row for row in lead.trace if row.tool == "spawn"]
    assert [*researchers, "writer"] == [row.arguments["name"] for row in spawns]
