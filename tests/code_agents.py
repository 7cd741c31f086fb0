"""Agents written in Python, and a tool, for tests/test_code_agents.py's worker processes.

Workers load this module as a user's (`CAIRN_TOOLS=tests.code_agents`). The world
outside is a directory, `CODE_AGENTS_DIR`: the `stamp` tool's ledger, and one-shot marker
files that make an agent kill its own worker (`die-<agent>`) or raise (`raise-<agent>`)
at a point of its step, once.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import cairn
from cairn import AgentContext, ToolContext


def _outside() -> Path:
    return Path(os.environ["CODE_AGENTS_DIR"])


def _once(marker: str) -> bool:
    """Whether marker file `marker` was there (it is gone now): a fault fires once."""
    path = _outside() / marker
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


@cairn.tool(effects="external")
def stamp(label: str, ctx: ToolContext) -> str:
    """Record `label` and the call's idempotency key in the ledger outside the workspace.

    Args:
        label: what to record.
        ctx: the call's context (its idempotency key).

    """
    with (_outside() / "ledger.jsonl").open("a") as ledger:
        ledger.write(json.dumps({"label": label, "key": ctx.idempotency_key}) + "\n")
    return f"stamped {label}"


@cairn.agent
def planner(ctx: AgentContext) -> cairn.Outcome:
    """Asks its model for a plan, writes it down, and hands the work to the writer."""
    reply = ctx.ask("Plan the work in one line.")
    ctx.write("PLAN.md", (reply.text or "") + "\n")
    ctx.send("writer", f"Please write hello.txt; the plan: {reply.text}")
    return ctx.finish()


@cairn.agent
def writer(ctx: AgentContext) -> str:
    """Waits for the plan; then asks, stamps twice, writes, and finishes with a result."""
    notes = ctx.inbox()
    ctx.state["woken"] = ctx.state.get("woken", 0) + 1
    if not notes:
        return "halt"
    reply = ctx.ask("Say what you will write.")
    ctx.tool("stamp", label="first")
    ctx.tool("stamp", label="second")  # a tool-level checkpoint before it holds the first
    if _once("die-writer"):
        os.kill(os.getpid(), signal.SIGKILL)  # the worker dies mid-step, as a killed one does
    ctx.write("hello.txt", f"{reply.text}\n")
    ctx.state["files"] = ctx.files()
    return ctx.finish({"wrote": "hello.txt"})


@cairn.agent
def flaky(ctx: AgentContext) -> str:
    """Writes a file, then raises once (a bug that passes); finishes on its retry."""
    ctx.write("before.txt", "written before the error\n")
    if _once("raise-flaky"):
        _ = 1 // 0
    ctx.write("after.txt", "written after\n")
    return "finish"


@cairn.agent
def wrong(ctx: AgentContext) -> object:
    """Returns what is no outcome."""
    return 42


@cairn.agent
def hoarder(ctx: AgentContext) -> str:
    """Keeps a value in its state that is not JSON."""
    ctx.state["seen"] = {"plan": [1, {2}]}  # a set: not JSON
    return "continue"


@cairn.agent
def careful(ctx: AgentContext) -> cairn.Outcome:
    """Lets its model call tools, a person approving each write; finishes after."""
    if ctx.state.get("done"):
        return cairn.Outcome.FINISH
    reply = ctx.ask("Write the note.", tools=True)
    ctx.run_calls(reply)  # the step stops here until a person decides
    ctx.state["done"] = True
    return ctx.finish({"calls": [call.name for call in reply.calls]})


@cairn.agent
def triage(ctx: AgentContext) -> cairn.Outcome:
    """Looks at the case with its model, then hands the conversation to the specialist."""
    ctx.ask()
    return ctx.handoff("specialist", "The refund needs a specialist: take it from here.")


@cairn.agent
def runaway(ctx: AgentContext) -> str:
    """Asks its model every step and goes on; finishes at its third step."""
    ctx.ask("More, please.")
    if ctx.state.get("steps", 0) >= 2:
        return ctx.finish({"steps": 3})
    ctx.state["steps"] = ctx.state.get("steps", 0) + 1
    return "continue"


@cairn.agent
def spawner(ctx: AgentContext) -> str:
    """Spawns `runaway` (with the budget its own state's brief says) once; then rests."""
    if ctx.superstep == 1:
        child = ctx.spec.budget is None  # a spawner without a budget gives its child one
        budget = {"steps": 2} if child else None
        spec = runaway.spec(model="scripted", budget=budget, tools=["read_file"])
        ctx.spawn("runaway", spec, "Work until you are stopped.")
        return "halt"
    return ctx.finish() if any(m.name == "runaway" for m in ctx.inbox()) else "halt"


@cairn.agent
def steady(ctx: AgentContext) -> str:
    """Works five steps, then finishes: a member no budget holds."""
    ctx.state["steps"] = ctx.state.get("steps", 0) + 1
    return "finish" if ctx.state["steps"] >= 5 else "continue"
