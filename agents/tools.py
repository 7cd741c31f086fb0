"""The built-in tools an agent can call, and what every tool is: a `Tool` with its effects.

A tool takes its arguments and a `ToolContext` and returns text for the model. Anything
that goes wrong in a way the model can fix (a bad path, a patch that does not apply, a
missing argument) raises `ToolError`, and its message goes back to the model as the
tool's result; the step goes on. Each tool declares its `Effects`, which decide where a
step takes a tool-level checkpoint (`agents/step.py`). Tools of users' own are made
with `cairn.tool` (`agents/toolkit.py`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import JsonValue

from cairn.agents.handoff import handoff_text
from cairn.agents.models.base import ToolSchema
from cairn.agents.patch import apply_file_patch, parse_patch
from cairn.agents.sandbox import CommandLimits, process_sandbox
from cairn.agents.spec import StepPolicy
from cairn.agents.workspace import Workspace, check_path, replace_file
from cairn.errors import ToolError
from cairn.storage.ids import new_id
from cairn.storage.public import public
from cairn.storage.records import Effects, ImagePart, InboxMessage, Message

MAX_LISTED = 2_000
MAX_READ = 1_000_000
MAX_WRITE = 10 * 1024 * 1024  # bytes of a write_file content or an apply_patch patch
MAX_MESSAGE = 100 * 1024  # bytes of a send_message content
# All a command inherits from the worker: no secrets. In the sandbox, PATH is the sandbox's.
SAFE_ENV = ("PATH", "LANG", "LC_ALL", "TZ")


@public
@dataclass(slots=True)
class ToolContext:
    """What one tool call may touch: the workspace, the team, the step's outputs, its key.

    Each call gets its own: its images and its idempotency key are that call's alone.
    """

    workspace: Workspace
    agent: str
    team: list[str]
    superstep: int
    policy: StepPolicy
    task: str = ""
    outbox: list[InboxMessage] = field(default_factory=list)
    finished: str | None = None  # the summary, once `finish` was called
    handed_to: str | None = None  # the teammate the call handed the conversation to
    history: Sequence[Message] = ()  # the agent's conversation, for a handoff to carry
    # Images the call returned, beside its text, for a model that takes them: the step
    # moves them into the call's result message.
    images: list[ImagePart] = field(default_factory=list)
    # The call's key, or how to work it out: most tools never read it.
    key: str | Callable[[], str] = field(default="", repr=False)
    # Records a spawn of the `spawn_agent` call's arguments (`cairn.agents.spawn`); None
    # where no step stands behind the call.
    spawn: Callable[[dict[str, JsonValue]], str] | None = field(default=None, repr=False)

    @property
    def idempotency_key(self) -> str:
        """The call's key (see `idempotency_key`); "" outside a call."""
        if not isinstance(self.key, str):
            self.key = self.key()
        return self.key

    def path(self, path: str) -> Path:
        """Return where workspace path `path` is on disk; `ToolError` if it leaves the workspace."""
        return self.workspace.resolve(path)


Args = dict[str, JsonValue]


def call_digest(tool: str, args: Args) -> str:
    """A digest of what a call does: its tool and its arguments, in canonical JSON.

    Two calls share it exactly when they name one tool with equal arguments, however the
    model ordered or spaced them and whatever id it gave the call.
    """
    canonical = json.dumps(
        [tool, args], sort_keys=True, separators=(",", ":"), ensure_ascii=True
    )  # ASCII: a lone surrogate in an argument is escaped, never an encoding error
    return hashlib.sha256(canonical.encode()).hexdigest()


def idempotency_key(
    task: str, agent: str, superstep: int, index: int, tool: str, args: Args
) -> str:
    """The key of the call `tool(args)`, the `index`-th of `agent`'s turn in `superstep`.

    `task:agent:superstep:index:digest`, the digest being `call_digest`'s first 16 hex
    digits. It names one call at one place in the task's history, not an execution of
    it: a retry of the step, a resume from a tool-level checkpoint and a replay after a
    restore that makes the same call there all hand the same key, so an external system
    that records the keys it has seen applies the effect once. A different call at that
    place (the model, asked again, chose otherwise) gets a different key. A tool that
    ignores the key is at-least-once.
    """
    return f"{task}:{agent}:{superstep}:{index}:{call_digest(tool, args)[:16]}"


@dataclass(frozen=True, slots=True)
class Tool:
    """A tool: how a model sees it, what it may change, and what it does."""

    name: str
    description: str
    parameters: dict[str, JsonValue]
    effects: Effects
    run: Callable[[ToolContext, Args], str]

    @property
    def schema(self) -> ToolSchema:
        """The tool as a model sees it."""
        return ToolSchema(self.name, self.description, self.parameters)


def _text(args: Args, name: str, default: str | None = None) -> str:
    value = args.get(name, default)
    if not isinstance(value, str):
        raise ToolError(f"argument {name!r} must be a string")
    return value


def _bounded_text(args: Args, name: str, tool: str, limit: int) -> str:
    """Return string argument `name`, or raise `ToolError` when it is over `limit` bytes."""
    value = _text(args, name)
    size = len(value.encode(errors="surrogatepass"))  # a lone surrogate still counts
    if size > limit:
        raise ToolError(f"{name} is {size} bytes; {tool} takes at most {limit}")
    return value


def _object(optional: tuple[str, ...] = (), **properties: str) -> dict[str, JsonValue]:
    """Return the JSON schema of an object of string arguments, described for the model."""
    described: dict[str, JsonValue] = {
        name: {"type": "string", "description": text} for name, text in properties.items()
    }
    required: list[JsonValue] = [name for name in properties if name not in optional]
    # Closed: an argument of another name is the model's mistake, said before the tool runs.
    return {"type": "object", "properties": described, "required": required,
            "additionalProperties": False}  # fmt: skip


def _handoff_schema() -> dict[str, JsonValue]:
    """`handoff`'s arguments: to whom, the note, and whether the conversation goes along."""
    schema = _object(to="the teammate's name", note="what they should do next")
    properties = schema["properties"]
    assert isinstance(properties, dict)
    along = "send your conversation along (default true; false: the note says it all)"
    properties["include_history"] = {"type": "boolean", "description": along}
    return schema


def list_files(ctx: ToolContext, args: Args) -> str:
    """List the files under a directory of the workspace, one path a line."""
    ctx.workspace.materialize()
    top = ctx.workspace.resolve(_text(args, "path", "."))
    if not top.exists():
        raise ToolError(f"no such directory: {_text(args, 'path', '.')}")
    paths = sorted(
        ctx.workspace.relative(p) for p in top.rglob("*") if p.is_file() and not p.is_symlink()
    )
    shown = paths[:MAX_LISTED]
    more = f"\n… and {len(paths) - MAX_LISTED} more" if len(paths) > MAX_LISTED else ""
    return "\n".join(shown) + more if shown else "(no files)"


def read_file(ctx: ToolContext, args: Args) -> str:
    """Return a file's text."""
    path = ctx.workspace.resolve(_text(args, "path"))
    if not path.is_file():
        raise ToolError(f"no such file: {_text(args, 'path')}")
    data = path.read_bytes()
    if len(data) > MAX_READ:
        raise ToolError(f"file is {len(data)} bytes; read_file returns at most {MAX_READ}")
    return data.decode("utf-8", errors="replace")


def write_file(ctx: ToolContext, args: Args) -> str:
    """Write a file (creating its directories), replacing what was there."""
    name = _text(args, "path")
    data = _bounded_text(args, "content", "write_file", MAX_WRITE).encode()
    where = ctx.workspace.prepare_writes({name: len(data)}, ctx.policy.size_limits())
    replace_file(where[name], data)
    return f"wrote {len(data)} bytes to {name}"


def apply_patch(ctx: ToolContext, args: Args) -> str:
    """Apply a unified diff to the workspace: all of it, or none of it."""
    patches = parse_patch(_bounded_text(args, "patch", "apply_patch", MAX_WRITE))
    if not patches:
        raise ToolError("the patch holds no file changes")
    results: dict[str, bytes | None] = {}  # path → its content after the patch; None: gone
    for patch in patches:
        source = ctx.workspace.resolve(patch.old_path) if patch.old_path else None
        original = source.read_text(encoding="utf-8") if source and source.is_file() else None
        target = patch.new_path or patch.old_path
        assert target is not None  # parse_patch never yields a patch with neither path
        content = apply_file_patch(original, patch)
        path = check_path(target)
        results[path] = None if content is None else content.encode()
        if patch.old_path and patch.new_path and check_path(patch.old_path) != path:
            results[check_path(patch.old_path)] = None  # a rename removes the old name
    # Everything applied in memory and every path checked: only now touch the files.
    sizes = {path: None if data is None else len(data) for path, data in results.items()}
    where = ctx.workspace.prepare_writes(sizes, ctx.policy.size_limits())
    for path, data in results.items():  # removals first: a file gone may make room for a directory
        if data is None:
            where[path].unlink(missing_ok=True)
    for path, data in results.items():
        if data is not None:
            replace_file(where[path], data)
    return "applied to " + ", ".join(sorted(results))


def edit_file(ctx: ToolContext, args: Args) -> str:
    """Replace the one occurrence of a text in a file; zero or several are an error."""
    name = _text(args, "path")
    old = _bounded_text(args, "old", "edit_file", MAX_WRITE)
    new = _bounded_text(args, "new", "edit_file", MAX_WRITE)
    if not old:
        raise ToolError("old is empty: give the exact text to replace (write_file makes files)")
    path = ctx.workspace.resolve(name)
    if not path.is_file():
        raise ToolError(f"no such file: {name}")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise ToolError(f"{name} is not UTF-8 text") from None
    if old not in text and "\r\n" in text:  # a CRLF file, edited with the model's "\n"
        old, new = (s.replace("\r\n", "\n").replace("\n", "\r\n") for s in (old, new))
    found = _first_occurrences(text, old, 5)
    if not found:
        raise ToolError(f"old occurs 0 times in {name}; it must occur exactly once, as written")
    if len(found) > 1:
        count = max(text.count(old), len(found))  # overlapping occurrences count too
        lines = ", ".join(str(_line_of(text, at)) for at in found)
        more = ", …" if count > len(found) else ""
        raise ToolError(
            f"old occurs {count} times in {name} (at lines {lines}{more}); it must occur "
            "exactly once: add surrounding lines to make it unique"
        )
    at = found[0]
    data = (text[:at] + new + text[at + len(old) :]).encode()
    if len(data) > MAX_WRITE:
        raise ToolError(f"the edit makes {name} {len(data)} bytes; at most {MAX_WRITE}")
    where = ctx.workspace.prepare_writes({name: len(data)}, ctx.policy.size_limits())
    replace_file(where[name], data)
    return f"replaced the text at line {_line_of(text, at)} of {name}"


def _line_of(text: str, at: int) -> int:
    """The 1-based line of `text` that character `at` is on."""
    return text.count("\n", 0, at) + 1


def _first_occurrences(text: str, old: str, limit: int) -> list[int]:
    """Where the first `limit` occurrences of `old` start in `text`, overlapping ones too."""
    found: list[int] = []
    at = text.find(old)
    while at != -1 and len(found) < limit:
        found.append(at)
        at = text.find(old, at + 1)
    return found


def run_command(ctx: ToolContext, args: Args) -> str:
    """Run a shell command on the workspace in the sandbox; return exit code and output (cut)."""
    command = _text(args, "command")
    ctx.workspace.materialize()  # a command may look at any file
    env = {k: os.environ[k] for k in SAFE_ENV if k in os.environ}
    env["CAIRN_IDEMPOTENCY_KEY"] = ctx.idempotency_key  # one call, across retries: docs/design.md
    # No __pycache__ in the workspace: it would be checkpointed as the agent's change, and a
    # module rewritten to the same size within a second would run from its stale bytecode.
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    limits = CommandLimits(
        ctx.policy.command_timeout, ctx.policy.output_limit, file_bytes=ctx.policy.max_file_bytes
    )
    try:
        finished = process_sandbox().run(
            command, ctx.workspace.tree, limits, network=ctx.policy.network, env=env
        )
    except ToolError as exc:  # timed out: what it left is held to the limits all the same
        ctx.workspace.reclaim()
        removed = ctx.workspace.enforce_limits(ctx.policy.size_limits())
        raise ToolError(f"{exc}\n{removed}" if removed else str(exc)) from None
    # The tree is the worker's again (modes, no links), and what the command left past
    # the task's size limits never reaches a checkpoint.
    ctx.workspace.reclaim()
    removed = ctx.workspace.enforce_limits(ctx.policy.size_limits())
    return f"{finished.report()}\n{removed}" if removed else finished.report()


def send_message(ctx: ToolContext, args: Args) -> str:
    """Send a message to a teammate; it is delivered at the end of this superstep."""
    to = _text(args, "to")
    if to not in ctx.team or to == ctx.agent:
        raise ToolError(
            f"unknown recipient {to!r}; the team is {[a for a in ctx.team if a != ctx.agent]}"
        )
    ctx.outbox.append(
        InboxMessage(
            id=new_id(),
            seq=0,  # numbered per recipient when the barrier delivers it
            sender=ctx.agent,
            recipient=to,
            superstep=ctx.superstep,
            content=_bounded_text(args, "content", "send_message", MAX_MESSAGE),
        )
    )
    return f"message to {to} will be delivered at the end of this superstep"


def handoff(ctx: ToolContext, args: Args) -> str:
    """Hand the conversation to a teammate (`cairn.agents.handoff`); the agent then rests."""
    note = _bounded_text(args, "note", "handoff", MAX_MESSAGE // 2)
    along = args.get("include_history", True)
    if not isinstance(along, bool):
        raise ToolError("argument 'include_history' must be true or false")
    text = handoff_text(ctx.agent, note, ctx.history, MAX_MESSAGE) if along else note
    send_message(ctx, {"to": args.get("to"), "content": text})
    ctx.handed_to = _text(args, "to")
    return f"handed over to {ctx.handed_to}; you rest until a message wakes you"


def spawn_agent(ctx: ToolContext, args: Args) -> str:
    """Add a member to the team; it joins at the end of this superstep (`cairn.agents.spawn`)."""
    if ctx.spawn is None:
        raise ToolError("spawn_agent runs only in an agent's step")
    return ctx.spawn(args)


SPAWN_PARAMETERS: dict[str, JsonValue] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "the new member's name, unique in the team"},
        "goal": {"type": "string", "description": "its brief: what it is to do, its first message"},
        "system": {"type": "string", "description": "its system prompt"},
        "model": {"type": "string", "description": "its model (default: yours)"},
        "tools": {"type": "array", "items": {"type": "string"},
                  "description": "its tools, some of yours (default: yours but spawn_agent)"},
    },
    "required": ["name", "goal"],
    # Open: a scripted member's spawn takes its `script` too (`cairn.agents.spawn`), which
    # a model is not offered.
}  # fmt: skip


def finish(ctx: ToolContext, args: Args) -> str:
    """Say the agent's part is done; it rests until a message wakes it."""
    ctx.finished = _text(args, "summary", "")
    return "finished"


NONE, WORKSPACE, EXTERNAL = Effects.NONE, Effects.WORKSPACE, Effects.EXTERNAL
TOOLS: dict[str, Tool] = {
    t.name: t
    for t in (
        Tool("list_files", "List files under a directory of the workspace.",
             _object(("path",), path="directory to list (default: all)"), NONE, list_files),
        Tool("read_file", "Read a text file of the workspace.",
             _object(path="file to read"), NONE, read_file),
        Tool("write_file", "Create or replace a file of the workspace.",
             _object(path="file to write", content="the whole new content"), WORKSPACE,
             write_file),
        Tool("edit_file", "Replace one exact, unique piece of text in a file of the workspace.",
             _object(path="file to edit", old="the exact text to replace; it must occur once",
                     new="the text to put in its place"), WORKSPACE, edit_file),
        Tool("apply_patch", "Apply a unified diff (as `diff -u` or `git diff` print it).",
             _object(patch="the unified diff"), WORKSPACE, apply_patch),
        Tool("run_command", "Run a shell command in the workspace; returns exit code and output.",
             _object(command="the command line"), EXTERNAL, run_command),
        Tool("send_message", "Send a message to a teammate (delivered at the end of the round).",
             _object(to="the teammate's name", content="the message"), WORKSPACE, send_message),
        Tool("handoff", "Hand the conversation to a teammate, who takes it from here; "
             "you rest until a message wakes you.",
             _handoff_schema(), WORKSPACE, handoff),
        Tool("finish", "Say your part is done, with a short summary.",
             _object(("summary",), summary="what you did"), NONE, finish),
        Tool("spawn_agent", "Add a member to the team to work on a goal; it starts next round, "
             "and its result comes to you as a message when it finishes.", SPAWN_PARAMETERS,
             WORKSPACE, spawn_agent),
    )
}  # fmt: skip
