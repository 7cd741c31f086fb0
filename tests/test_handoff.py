"""Handoff: an agent hands its conversation to a teammate and rests, on real workers.

The pattern of docs/teams.md: a triage agent talks with the goal, then hands the
conversation over to the specialist, who reads it whole and finishes. The triage agent
rests (halted) and is not woken again; the specialist's history holds the transcript.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cairn
from cairn.agents.handoff import handoff_text
from cairn.agents.spec import AgentSpec
from cairn.storage.records import AgentState, Message, Role, ToolCall
from tests import code_agents
from tests.cluster import Cluster

HANDOFF = {
    "name": "handoff",
    "args": {"to": "specialist", "note": "The refund needs a specialist: take it from here."},
}


def triage_team(triage: AgentSpec | dict[str, Any]) -> cairn.Team:
    """Triage (of `triage`: an llm spec or a kind in code) and the specialist who finishes."""
    specialist = {
        "name": "specialist",
        "model": "scripted",
        "tools": ["write_file", "finish"],
        "script": [
            {"say": "Waiting for a case."},
            {
                "say": "Refunding.",
                "tools": [
                    {"name": "write_file", "args": {"path": "REFUND.md", "content": "done\n"}},
                    {"name": "finish", "args": {"summary": "refunded"}},
                ],
            },
        ],
    }
    return cairn.Team("A customer wants a refund for order 42.", [triage, specialist])


def run(cluster: Cluster, spec: cairn.Team) -> str:
    """One worker; the task driven to its end, which must be a success."""
    cluster.start_worker()
    cluster.wait_for_workers(1)
    task = cluster.tasks.submit(spec)
    status = cluster.drive(task, timeout=60)
    assert "succeeded" == status["status"], (status, cluster.worker_logs())
    return task


def check_handed_over(cluster: Cluster, task: str, said: str) -> None:
    """The specialist got the note and the transcript (with `said` in it); triage rests."""
    gc = cluster.store.latest_gc(task)
    assert gc is not None
    assert AgentState.HALTED == gc.statuses["triage"]
    assert AgentState.FINISHED == gc.statuses["specialist"]
    ref = gc.members["specialist"]
    state = cluster.store.read_state(task, "specialist", ref.id, ref.checksum)
    [handed] = [m.content or "" for m in state.messages if m.name == "triage"]
    assert handed.startswith("Message from triage: The refund needs a specialist")
    assert "--- the conversation triage hands over ---" in handed
    assert "[user] A customer wants a refund for order 42." in handed
    assert said in handed
    triage = cluster.store.read_state(task, "triage", gc.members["triage"].id)
    assert 1 == triage.step  # handed over in its first step, and never woken again


def test_a_model_driven_agent_hands_over_with_the_handoff_tool(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A scripted triage agent calls `handoff`; it is halted, not active, after the call."""
    triage = {
        "name": "triage",
        "model": "scripted",
        "tools": ["handoff"],
        "script": [{"say": "This is a refund for order 42.", "tools": [HANDOFF]}],
    }
    task = run(cluster, triage_team(triage))
    check_handed_over(cluster, task, "[assistant] This is a refund for order 42.")


def test_an_agent_in_code_hands_over_with_ctx_handoff(cluster: Cluster) -> None:
    """`return ctx.handoff(...)` sends the conversation and rests the agent."""
    cluster.env.update({"CAIRN_TOOLS": "tests.code_agents"})
    triage = code_agents.triage.spec(
        "triage", model="scripted", tools=["handoff"],
        script=[{"say": "A refund, then: over to the specialist."}],
    )  # fmt: skip
    task = run(cluster, triage_team(triage))
    check_handed_over(cluster, task, "[assistant] A refund, then: over to the specialist.")


def test_a_long_conversation_keeps_its_newest_turns_within_the_limit() -> None:
    """Over the limit, the oldest turns are left out, and the transcript says how many."""
    history = [Message(role=Role.SYSTEM, content="You are triage.")]
    for n in range(200):
        call = ToolCall(id=f"c{n}", name="read_file", args={"path": f"f{n}"})
        history.append(Message(role=Role.ASSISTANT, content=f"turn {n} " + "x" * 100,
                               tool_calls=[call]))  # fmt: skip
    text = handoff_text("triage", "over to you", history, 4_000)
    assert len(text.encode()) <= 4_000
    assert "You are triage" not in text  # the system prompt is the agent's own
    assert "turn 199 " in text
    assert '-> read_file({"path":"f199"})' in text
    assert "turn 0 " not in text
    assert "earlier messages left out]" in text
