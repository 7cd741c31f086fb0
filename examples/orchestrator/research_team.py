"""An orchestrator that spawns three researchers and a writer: a team in Python only.

The workers load this module (`cairn worker --tools research_team`, with this directory on
`PYTHONPATH`); `team()` is the task to submit. The orchestrator spawns one researcher per
topic, rests until each has reported back (a spawned member's result reaches its spawner
as a message when it finishes), then spawns the writer with what they found, and
finishes with the writer's report. Every member thinks with the orchestrator's model;
`scripted` (the default) plays canned answers, so the example needs no API key.
"""

from __future__ import annotations

import cairn
from cairn import AgentContext, AgentSpec, Outcome

TOPICS = ("cell chemistry", "manufacturing cost", "safety record")
GOAL = "Write a one-page brief on solid-state batteries."


def _member(kind: cairn.CodeAgent, name: str, ctx: AgentContext, says: str) -> AgentSpec:
    """A member of `kind` thinking with the orchestrator's model (`says`: a script's line)."""
    model = ctx.spec.model
    script = [{"say": says}] if model == "scripted" else []
    return kind.spec(
        name, model=model, script=script, tools=["read_file", "write_file", "list_files"]
    )


@cairn.agent
def researcher(ctx: AgentContext) -> Outcome:
    """Researches the topic its brief names; writes notes/<its name>.md and finishes."""
    brief = ctx.history[-1].content or ""  # a spawned member's history ends with its brief
    reply = ctx.ask(f"{brief}\nAnswer in three sentences.")
    path = f"notes/{ctx.name}.md"
    ctx.write(path, reply.text or "")
    return ctx.finish({"notes": path})


@cairn.agent
def writer(ctx: AgentContext) -> Outcome:
    """Reads every researcher's notes and writes BRIEF.md from them."""
    notes = [ctx.read(path) for path in ctx.files() if path.startswith("notes/")]
    reply = ctx.ask("Write the brief from these notes:\n\n" + "\n\n".join(notes))
    ctx.write("BRIEF.md", reply.text or "")
    return ctx.finish({"brief": "BRIEF.md", "sources": len(notes)})


@cairn.agent
def orchestrator(ctx: AgentContext) -> Outcome:
    """Spawns the researchers, then the writer once all have reported, then finishes."""
    if not ctx.state:  # the first step: one researcher per topic
        for n, topic in enumerate(TOPICS, 1):
            name = f"researcher-{n}"
            says = f"On {topic}: promising, with open questions."
            ctx.spawn(name, _member(researcher, name, ctx, says), f"Research {topic}.")
        ctx.state.update(waiting=[f"researcher-{n}" for n in range(1, len(TOPICS) + 1)])
        return Outcome.HALT  # a report wakes it
    reported = {message.name for message in ctx.inbox()}
    ctx.state["waiting"] = [name for name in ctx.state["waiting"] if name not in reported]
    if ctx.state["waiting"]:
        return Outcome.HALT
    if "writer" not in ctx.team:
        says = "Solid-state batteries: denser and safer, not yet cheap."
        ctx.spawn("writer", _member(writer, "writer", ctx, says), "Write the brief.")
        ctx.state["waiting"] = ["writer"]
        return Outcome.HALT
    return ctx.finish({"brief": "BRIEF.md"})


def team(model: str = "scripted") -> cairn.Team:
    """The task: the orchestrator alone; it grows the team it needs."""
    lead = orchestrator.spec(model=model, script=[], tools=["read_file"])
    return cairn.Team(GOAL, [lead], max_agents=8, max_supersteps=12)
