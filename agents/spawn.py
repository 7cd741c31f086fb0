"""Spawning: an agent adds a member to its team at run time.

A step records each spawn in its LC (`spawns`), as `send_message` records a message in
its `outbox`: a retried step discards it and records it again. At the step's barrier the
coordinator makes it real (`cairn.agents.joining`): it writes the new member's first LC,
the GC names it, and it takes its first step in the next superstep. Its history starts
with its system prompt and its spawner's brief; its spec, and who spawned it, are kept
in the GC (`GlobalCheckpoint.spawned`), so a restore to a GC before the spawn removes
the member with everything it did, and a fork carries it.

`spawn` is the seam both ways of spawning go through: `StepContext.spawn` (an agent
kind's code) and the built-in tool `spawn_agent` (a model's call, `spawn_from_args`),
which an agent has only when its spec lists it. A spawn is refused (`SpawnRefused`, which
the spawner reads) for a name that is taken or invalid, a spec that does not parse, or a
task that holds `member_limit` members already, counting this step's spawns; the barrier
checks the name and the limit again across every spawner of the superstep.

When a spawned member finishes, its spawner gets a message with what it gave `finish`
(`report_finish`), delivered at the barrier as any message, so a spawner that rests
until then is woken by it.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from pydantic import JsonValue

from cairn.agents.barrier import SYSTEM_SENDER
from cairn.agents.models.base import json_size
from cairn.agents.spec import LLM_KIND, AgentSpec, parse_model
from cairn.errors import InvalidName, InvalidSpec, SpawnRefused
from cairn.storage.chain import WorkingState
from cairn.storage.ids import new_id
from cairn.storage.keys import check_name
from cairn.storage.records import InboxMessage, Message, Role, SpawnRequest
from cairn.storage.redact import redact

if TYPE_CHECKING:
    from cairn.agents.context import StepContext
    from cairn.storage.records import GlobalCheckpoint
    from cairn.storage.store import CheckpointStore

SPAWN_TOOL = "spawn_agent"
MAX_BRIEF = 100 * 1024  # bytes of a brief, as of a message `send_message` sends
MAX_SPEC_BYTES = 256 * 1024  # of a spawned member's spec as JSON: every GC after holds it
MAX_REPORT = 100 * 1024  # bytes of a finished member's report to its spawner
RESERVED = frozenset({SYSTEM_SENDER})  # messages from it are Cairn's own


def spawn(ctx: StepContext, name: str, spec: AgentSpec, brief: str) -> str:
    """Record the spawn of member `name` (`spec`, its first message `brief`) in the step.

    The member joins at the step's barrier. Returns what the spawner is told; raises
    `SpawnRefused` saying why when the name is taken or invalid, the spec does not parse
    under that name or is too large, or the task is full (`TaskRecord.member_limit`).
    """
    try:
        check_name("agent", name)
    except InvalidName as exc:
        raise SpawnRefused(str(exc)) from None
    if name in RESERVED:
        raise SpawnRefused(f"{name!r} is reserved for Cairn's own messages")
    pending = [s.name for s in ctx.lc.spawns]
    if name in ctx.team or name in pending:
        raise SpawnRefused(f"the name {name!r} is taken: the team is {[*ctx.team, *pending]}")
    limit = ctx.record.member_limit
    held = len(ctx.team) + len(pending)
    if held >= limit:
        raise SpawnRefused(
            f"the task holds at most {limit} members (max_agents) and holds {held}"
            + (f", counting the {len(pending)} spawned in this step" if pending else "")
        )
    size = len(brief.encode(errors="surrogatepass"))
    if size > MAX_BRIEF:
        raise SpawnRefused(f"the brief is {size} bytes; at most {MAX_BRIEF}")
    data = _checked({**spec.model_dump(mode="json", exclude_defaults=True), "name": name}, name)
    ctx.lc.spawns.append(SpawnRequest(name=name, spec=data, brief=brief))
    return (
        f"{name} joins the team at the end of this superstep and starts in the next; "
        "when it finishes, its result comes to you as a message"
    )


def spawn_from_args(ctx: StepContext, args: dict[str, JsonValue]) -> str:
    """`spawn_agent`'s call: a member like its spawner, with the arguments' changes.

    `name` and `goal` (its brief) are required; `system` (its system prompt), `model` (of
    the spawner's provider; default the spawner's) and `tools` (some of the spawner's;
    default all of them but `spawn_agent`) are not. Everything else (base URL, key,
    parameters, limits) is the spawner's, but its budget (which covers the new member).
    A `scripted` member takes a `script` too, for tests and demos. Raises `SpawnRefused`
    as `spawn` does, and for arguments of the wrong type or a model or tool the spawner
    may not give.
    """
    parent = ctx.spec
    name, goal = _string(args, "name"), _string(args, "goal")
    system = _string(args, "system", "")
    model = _model(parent.model, _string(args, "model", parent.model))
    tools = _tools(parent.tools, args.get("tools"))
    data: dict[str, JsonValue] = {
        # Not its budget: the spawner's covers its subtree, the new member included.
        **parent.model_dump(mode="json", exclude={"script", "budget"}),
        "name": name,
        "system": system,
        "model": model,
        "tools": list(tools),
        "approve": [t for t in parent.approve if t in tools],
    }
    if "script" in args:
        if model != "scripted":
            raise SpawnRefused("script is for a scripted member only")
        data["script"] = args["script"]
    return spawn(ctx, name, _parsed(data, name), goal)


def prepare_first_lcs(store: CheckpointStore, state: WorkingState, workspace: str) -> None:
    """Write the first LC of each member `state`'s step spawned; name it in its request.

    Called as the step ends, before its own LC and vote: the LCs are in the superstep's
    epoch and superstep (attempt 1 of the new member), fenced by the step's own attempt
    (a zombie step writes none), so the barrier only names them, as a commit names the
    LCs its steps wrote. A spawn the barrier refuses leaves its LC an
    orphan, swept as any tentative LC; so does a step that fails after writing them.
    """
    waiting = [request for request in state.spawns if request.lc is None]
    if not waiting:
        return
    firsts = [
        first_state(state.task, state.epoch, state.superstep, workspace,
                    AgentSpec.model_validate(request.spec), state.agent, request.brief)
        for request in waiting
    ]  # fmt: skip
    written = store.write_first_lcs(firsts, spawner=(state.agent, state.attempt))
    refs = dict(zip((r.name for r in waiting), written, strict=True))
    state.spawns = [
        request if request.lc is not None else request.model_copy(update={"lc": refs[request.name]})
        for request in state.spawns
    ]


def first_state(
    task: str, epoch: int, superstep: int, workspace: str | None, spec: AgentSpec,
    parent: str, brief: str,
) -> WorkingState:  # fmt: skip
    """A spawned member's first state: its system prompt and its spawner's brief, no step yet.

    A kind in code starts with an empty state: the coordinator never loads users' code.
    """
    from cairn.agents.kinds import kind_of  # noqa: PLC0415 - kinds import the step's context, which imports this

    messages = first_messages(spec, parent, redact(brief))
    initial = kind_of(spec).initial_state(spec) if spec.kind == LLM_KIND else {}
    return WorkingState(task=task, agent=spec.name, epoch=epoch, superstep=superstep,
                        messages=messages, workspace_before=workspace,
                        workspace_after=workspace, kind_state=initial)  # fmt: skip


def first_messages(spec: AgentSpec, parent: str, brief: str) -> list[Message]:
    """A spawned member's history as it joins: its system prompt, then its spawner's brief."""
    system = spec.system or f"You are {spec.name}."
    said = f"Message from {parent}: {brief}"  # as `StepContext.inbox` shows a message
    return [Message(role=Role.SYSTEM, content=system),
            Message(role=Role.USER, name=parent, content=said)]  # fmt: skip


def report_finish(state: WorkingState, gc: GlobalCheckpoint) -> None:
    """Send a spawned member's spawner what it gave `finish` (nothing for a submitted one).

    Put in the step's outbox: delivered at the barrier, as a message `send_message` sent.
    """
    joined = gc.spawned.get(state.agent)
    if joined is None:
        return
    summary, result = _finish_args(state.messages)
    text = f"{state.agent} finished"
    text += f": {summary}" if summary else "."
    if state.result is not None and state.result.superstep == state.superstep:
        result = state.result.value
    if result is not None:
        text += f"\nResult: {json.dumps(result, ensure_ascii=False)}"
    data = text.encode(errors="surrogatepass")
    if len(data) > MAX_REPORT:
        text = data[:MAX_REPORT].decode(errors="ignore") + " … (cut)"
    state.outbox.append(
        InboxMessage(
            id=new_id(),
            seq=0,
            sender=state.agent,
            recipient=joined.parent,
            superstep=state.superstep,
            content=text,
        )
    )


def _finish_args(messages: list[Message]) -> tuple[str, JsonValue]:
    """The summary and result of the last turn's `finish` call ("" and None if none)."""
    turn = next((m for m in reversed(messages) if m.role is Role.ASSISTANT), None)
    for call in [] if turn is None else turn.tool_calls:
        if call.name == "finish":
            summary = call.args.get("summary")
            return (summary if isinstance(summary, str) else ""), call.args.get("result")
    return "", None


def _string(args: dict[str, JsonValue], name: str, default: str | None = None) -> str:
    value = args.get(name, default)
    if not isinstance(value, str):
        raise SpawnRefused(f"argument {name!r} must be a string")
    return value


def _model(parent: str, asked: str) -> str:
    """The model a spawned member thinks with: of its spawner's provider, whose key it uses."""
    provider = parent.split(":", 1)[0]
    if parent == "scripted" or asked == "scripted":
        if asked != parent:
            raise SpawnRefused(f"model must be {parent!r}, the spawner's provider")
        return asked
    model = asked if ":" in asked else f"{provider}:{asked}"
    if model.split(":", 1)[0] != provider:
        raise SpawnRefused(f"model must be one of the spawner's provider, {provider}:")
    return model


def _tools(parent: list[str], asked: JsonValue) -> list[str]:
    """The spawned member's tools: some of its spawner's (default: all but spawn_agent)."""
    if asked is None:
        return [t for t in parent if t != SPAWN_TOOL]
    if not isinstance(asked, list) or not all(isinstance(t, str) for t in asked):
        raise SpawnRefused("argument 'tools' must be a list of tool names")
    names = [t for t in asked if isinstance(t, str)]
    foreign = [t for t in names if t not in parent]
    if foreign:
        raise SpawnRefused(f"tools {foreign} are not the spawner's: it has {parent}")
    return names


def _parsed(data: dict[str, JsonValue], name: str) -> AgentSpec:
    try:
        return parse_model(AgentSpec, data, f"spec of {name}")
    except InvalidSpec as exc:
        raise SpawnRefused(str(exc)) from None


def _checked(data: dict[str, JsonValue], name: str) -> dict[str, JsonValue]:
    """`data` if it parses as an agent spec within `MAX_SPEC_BYTES`; else `SpawnRefused`."""
    _parsed(data, name)
    size = json_size(data)
    if size > MAX_SPEC_BYTES:
        raise SpawnRefused(f"the spec of {name} is {size} bytes as JSON; at most {MAX_SPEC_BYTES}")
    return data
