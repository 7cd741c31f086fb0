"""The task every chaos run submits: four scripted agents whose fault-free result is known.

Every agent works for `TURNS` supersteps, each turn writing a file of its own, recording
an effect in the ledger outside the workspace (through `run_command`, with the call's
idempotency key), and passing a note to the next agent; two agents write one shared file
in the same superstep (a conflict the barrier resolves by team order); every few turns what
its model is sent is compacted (`CONTEXT`). Two of them spawn a member early (`SPAWNS`, with
`spawn_agent`): it works a few turns as they do (a file and a ledger effect each) and
finishes, and its spawner reads its report. The scripts are fixed, so the final workspace,
the team, every agent's history and the ledger of a run with faults must equal those of a
run without.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic import JsonValue

AGENTS = ("planner", "coder", "tester", "reviewer")
TURNS = 8
LATENCY = 0.4  # seconds a model turn takes: long enough for faults to land mid-step
LEDGER_SCRIPT = Path(__file__).with_name("ledger.py")
# What each agent's model is sent is compacted every few turns (so faults land on and
# around compactions, and restores cross them): a small budget, and notes in every turn.
CONTEXT: dict[str, JsonValue] = {"max_tokens": 1_000, "keep_last": 2}
NOTES = "I keep notes of what I did and why. " * 30
# spawned member → (its spawner, the spawner's turn that spawns it): early, so kills,
# restores and forks fall across the spawns, and a spawning step runs in superstep turn + 1.
SPAWNS = {"scout": ("planner", 0), "fixer": ("coder", 2)}
SPAWNED_TURNS = 3  # turns a spawned member works, the last one also calling `finish`
SPAWNER_TOOLS = ["write_file", "run_command", "send_message", "finish", "spawn_agent"]
MEMBERS = (*AGENTS, *SPAWNS)  # every member the team ends with


def spawn_steps() -> set[tuple[str, int]]:
    """(agent, superstep) of each step that spawns a member, or is a spawned one's first."""
    steps = set()
    for name, (parent, turn) in SPAWNS.items():
        steps |= {(parent, turn + 1), (name, turn + 2)}
    return steps


def _ledger_call(effect: str, ledger: Path) -> dict[str, JsonValue]:
    return {"name": "run_command",
            "args": {"command": f'{sys.executable} {LEDGER_SCRIPT} {ledger} '
                                f'"$CAIRN_IDEMPOTENCY_KEY" {effect}'}}  # fmt: skip


def _spawn_call(name: str, parent: str, ledger: Path) -> dict[str, JsonValue]:
    """`parent`'s call spawning `name`: it writes a part and records an effect each turn."""
    script: list[JsonValue] = []
    for turn in range(SPAWNED_TURNS):
        tools: list[JsonValue] = [
            {"name": "write_file",
             "args": {"path": f"{name}/part{turn}.txt", "content": f"{name} wrote part {turn}\n"}},
            _ledger_call(f"{name}-{turn}", ledger),
        ]  # fmt: skip
        if turn == SPAWNED_TURNS - 1:
            tools.append({"name": "finish", "args": {"summary": f"{name}'s parts are in"}})
        script.append({"say": f"{name}, turn {turn}.", "latency": LATENCY, "tools": tools})
    return {"name": "spawn_agent", "args": {
        "name": name, "goal": f"Write {name}'s parts for {parent}.",
        "system": f"You are {name}, spawned by the {parent}.",
        "tools": ["write_file", "run_command", "finish"], "script": script,
    }}  # fmt: skip


def _turn(agent: str, turn: int, ledger: Path) -> dict[str, JsonValue]:
    after = AGENTS[(AGENTS.index(agent) + 1) % len(AGENTS)]
    effect = f"{agent}-{turn}"
    tools: list[JsonValue] = [
        {"name": "write_file",
         "args": {"path": f"{agent}/part{turn}.txt", "content": f"{agent} wrote part {turn}\n"}},
        _ledger_call(effect, ledger),
        {"name": "send_message",
         "args": {"to": after, "content": f"{agent} finished part {turn}."}},
    ]  # fmt: skip
    if turn == 1 and agent in ("coder", "tester"):
        # Both write STATUS.md in the same superstep: the tester (later in order) wins.
        tools.append(
            {"name": "write_file", "args": {"path": "STATUS.md", "content": f"{agent} was here\n"}}
        )
    tools += [_spawn_call(name, agent, ledger) for name, (parent, at) in SPAWNS.items()
              if (parent, at) == (agent, turn)]  # fmt: skip
    say = f"{agent}, turn {turn}. " + NOTES  # long enough that the context compacts
    return {"say": say, "latency": LATENCY, "tools": tools}


def team(ledger: Path, durability: str) -> dict[str, JsonValue]:
    """The task spec (as `cairn submit` reads it) recording effects in `ledger`."""
    agents: list[JsonValue] = []
    for agent in AGENTS:
        script: list[JsonValue] = [_turn(agent, turn, ledger) for turn in range(TURNS)]
        last: dict[str, JsonValue] = {"say": f"{agent} is done.", "latency": LATENCY}
        if agent == "reviewer":
            last["tools"] = [{"name": "finish", "args": {"summary": "all parts are in"}}]
        script.append(last)
        spec: dict[str, JsonValue] = {
            "name": agent,
            "model": "scripted",
            "system": f"You are the {agent}.",
            "script": script,
            "context": dict(CONTEXT),  # a copy each: the spec is YAML, with no aliases
        }
        if any(parent == agent for parent, _ in SPAWNS.values()):
            spec["tools"] = list(SPAWNER_TOOLS)
        agents.append(spec)
    parts = " ".join(
        [
            *(f"{a}/part{t}.txt" for a in AGENTS for t in range(TURNS)),
            *(f"{a}/part{t}.txt" for a in SPAWNS for t in range(SPAWNED_TURNS)),
        ]
    )
    return {
        "name": "chaos team",
        "goal": "Every agent writes its parts and records each in the ledger.",
        "files": {"README.md": "The chaos team's workspace.\n"},
        "verify": f"for f in {parts}; do test -f $f || exit 1; done",
        "max_supersteps": 30,
        "step_timeout": 60,
        "agents": agents,
        # hot_keep small, so reads go to the archive; cold_keep large, so nothing an
        # invariant needs is ever trimmed.
        "checkpoints": {"durability": durability, "hot_keep": 2, "cold_keep": 100_000},
    }


def victim() -> dict[str, JsonValue]:
    """A second task for the `poison_task` fault: two agents, a message, a verify.

    Under `durability: sync`, so every phase of the coordinator is on its way: a commit
    closed before the next superstep begins, the verify, the end.
    """
    writer: list[JsonValue] = [
        {"say": "Writing.", "latency": LATENCY, "tools": [
            {"name": "write_file", "args": {"path": "note.txt", "content": "from the writer\n"}},
            {"name": "send_message", "args": {"to": "reader", "content": "note.txt is there."}},
        ]},
        {"say": "Done.", "latency": LATENCY},
    ]  # fmt: skip
    reader: list[JsonValue] = [
        {"say": "Waiting.", "latency": LATENCY},
        {"say": "Reading.", "latency": LATENCY, "tools": [
            {"name": "read_file", "args": {"path": "note.txt"}},
            {"name": "finish", "args": {"summary": "read it"}},
        ]},
    ]  # fmt: skip
    return {
        "name": "chaos victim",
        "goal": "The writer leaves a note; the reader reads it.",
        "verify": "test -f note.txt",
        "agents": [
            {"name": "writer", "model": "scripted", "script": writer},
            {"name": "reader", "model": "scripted", "script": reader},
        ],
        "checkpoints": {"durability": "sync"},
    }
