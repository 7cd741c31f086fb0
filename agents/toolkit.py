"""Tools of users' own (`cairn.tool`), and the set of tools one worker has.

`tool` makes a Python function a `Tool`: its typed arguments become a JSON schema (through
pydantic), its docstring the description, and a call's arguments are validated before it
runs, an invalid one being a `ToolError` the model reads. `load_tools` builds a worker's
`ToolRegistry`: the built-in tools, the tools installed packages declare in the
`cairn.tools` entry point group, and those of modules named explicitly. Only workers build
one: a spec names tools, never code, so nothing in Redis can make a worker import anything.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.metadata
import inspect
import re
import typing
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from types import ModuleType
from typing import Any, Generic, Literal, ParamSpec, TypeVar, overload

from pydantic import ConfigDict, Field, JsonValue, ValidationError, create_model
from pydantic_core import PydanticUndefined, to_json

from cairn.agents.kinds.python import CodeAgent
from cairn.agents.logs import get_logger
from cairn.agents.spec import TOOL_NAME
from cairn.agents.tools import TOOLS, Args, Tool, ToolContext
from cairn.errors import CairnError, InvalidSpec, ToolError
from cairn.storage.public import public
from cairn.storage.records import Effects

ENTRY_POINTS = "cairn.tools"
KIND_ENTRY_POINTS = "cairn.agents"  # agents written in Python (`cairn.agent`)
MAX_RESULT = 1_000_000  # characters of a Python tool's result kept for the model
MAX_ERRORS = 5  # invalid arguments named in one error
EffectsName = Literal["none", "workspace", "external"]
P = ParamSpec("P")
R = TypeVar("R")
_SECTION = re.compile(r"(Args|Arguments|Parameters|Returns?|Raises|Yields?|Examples?|Notes?):")
_ARG = re.compile(r"\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)")  # "name (type): text"

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class FunctionTool(Tool, Generic[P, R]):
    """A tool made of a Python function by `tool`; calling it calls the function."""

    func: Callable[P, R]

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Call the function itself, as if it were not a tool."""
        return self.func(*args, **kwargs)


@overload
def tool(func: Callable[P, R], /) -> FunctionTool[P, R]: ...


@overload
def tool(
    *,
    name: str | None = None,
    effects: Effects | EffectsName = "external",
    description: str | None = None,
) -> Callable[[Callable[P, R]], FunctionTool[P, R]]: ...


@public
def tool(
    func: Callable[P, R] | None = None,
    /,
    *,
    name: str | None = None,
    effects: Effects | EffectsName = "external",
    description: str | None = None,
) -> FunctionTool[P, R] | Callable[[Callable[P, R]], FunctionTool[P, R]]:
    """Make a function a tool: `@tool`, or `@tool(effects="none", name=..., description=...)`.

    Every argument is annotated; one annotated `ToolContext` receives the call's context
    instead of a value from the model. The description is the docstring (less its `Args:`
    section, whose lines describe the arguments) unless given. `effects` is `external`
    unless the tool says otherwise. The function may be sync or async; what it returns
    goes to the model as text (a str as is, anything else as JSON).
    """

    def make(function: Callable[P, R]) -> FunctionTool[P, R]:
        return _function_tool(function, name, Effects(effects), description)

    return make if func is None else make(func)


def _function_tool(
    func: Callable[P, R], name: str | None, effects: Effects, description: str | None
) -> FunctionTool[P, R]:
    name = name or func.__name__
    if not TOOL_NAME.fullmatch(name):
        raise ValueError(f"tool name {name!r} must match {TOOL_NAME.pattern}")
    summary, documented = _read_docstring(inspect.getdoc(func) or "")
    description = description or summary
    if not description:
        raise TypeError(f"tool {name}: give it a docstring or a description; a model reads it")
    hints = typing.get_type_hints(func, include_extras=True)
    context: str | None = None
    fields: dict[str, Any] = {}
    names: dict[str, str] = {}  # field → the argument it is
    for param in inspect.signature(func).parameters.values():
        if param.kind not in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
            raise TypeError(f"tool {name}: argument {param.name} must be passable by name")
        if param.name not in hints:
            raise TypeError(f"tool {name}: argument {param.name} has no type annotation")
        if hints[param.name] is ToolContext:
            context = param.name
            continue
        default = PydanticUndefined if param.default is param.empty else param.default
        # Fields get neutral names, aliased to the arguments': an argument may be called
        # anything, `json` or `model_config` included, without shadowing pydantic's names.
        text = documented.get(param.name)  # else a description the annotation has stays
        info = (
            Field(default, alias=param.name, description=text)
            if text
            else Field(default, alias=param.name)
        )
        names[f"arg{len(fields)}"] = param.name
        fields[f"arg{len(fields)}"] = (hints[param.name], info)
    arguments = create_model(f"{name}_arguments", __config__=ConfigDict(extra="forbid"), **fields)
    schema: dict[str, JsonValue] = arguments.model_json_schema()
    _drop_titles(schema)
    is_async = inspect.iscoroutinefunction(func)
    call = typing.cast("Callable[..., object]", func)  # the arguments are checked above

    def run(ctx: ToolContext, args: Args) -> str:
        try:
            parsed = arguments.model_validate(args)
        except ValidationError as exc:
            raise ToolError(f"invalid arguments for {name}: {_describe_errors(exc)}") from None
        kwargs: dict[str, object] = {names[f]: getattr(parsed, f) for f in names}
        if context is not None:
            ctx.workspace.materialize()  # the tool may look anywhere in the tree
            kwargs[context] = ctx
        try:
            result: object = call(**kwargs)
            if is_async or inspect.isawaitable(result):
                result = _wait(typing.cast("Awaitable[object]", result))
        except (ToolError, CairnError):
            raise
        except Exception as exc:
            log.warning("tool raised", tool=name, exc_info=True)
            raise ToolError(f"{type(exc).__name__}: {exc}") from exc
        return _as_text(result)

    return FunctionTool(name, description, schema, effects, run, func)


def _read_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """A docstring's description (before its sections) and its `Args:` texts by name."""
    summary: list[str] = []
    described: dict[str, str] = {}
    section: str | None = None
    current, indent = "", 0  # the argument being described, and where its line starts
    for line in doc.splitlines():
        text = line.strip()
        heading = _SECTION.fullmatch(text)
        if heading is not None and not line.startswith(" "):
            section, current = heading[1].lower(), ""
        elif section is None:
            summary.append(line)
        elif section in ("args", "arguments", "parameters") and text:
            arg = _ARG.fullmatch(text)
            starts = len(line) - len(text)
            if arg is not None and (not current or starts <= indent):
                current, indent = arg[1], starts
                described[current] = arg[2]
            elif current:
                described[current] += " " + text
    return "\n".join(summary).strip(), {k: v.strip() for k, v in described.items()}


def _drop_titles(schema: dict[str, JsonValue]) -> None:
    """Remove the titles pydantic derives from names: the model has the names already."""
    schema.pop("title", None)
    properties = schema.get("properties")
    if isinstance(properties, dict):
        for prop in properties.values():
            if isinstance(prop, dict):
                prop.pop("title", None)


def _describe_errors(exc: ValidationError) -> str:
    """A validation error in one line: each wrong argument and what is wrong with it."""
    errors = exc.errors(include_url=False)
    parts = [
        f"{'.'.join(str(p) for p in error['loc']) or 'arguments'}: {error['msg']}"
        for error in errors[:MAX_ERRORS]
    ]
    more = f"; and {len(errors) - MAX_ERRORS} more" if len(errors) > MAX_ERRORS else ""
    return "; ".join(parts) + more


def _wait(awaitable: Awaitable[object]) -> object:
    """Run an async tool's awaitable to its end, from a thread with or without a loop."""

    async def resolve() -> object:
        return await awaitable

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(resolve())
    with ThreadPoolExecutor(1) as pool:  # a loop runs here: give the tool a loop of its own
        return pool.submit(asyncio.run, resolve()).result()


def _as_text(result: object) -> str:
    """A tool's result as the model reads it: a str as is, anything else as JSON."""
    text = result if isinstance(result, str) else to_json(result, fallback=str).decode()
    if len(text) > MAX_RESULT:
        return text[:MAX_RESULT] + f"\n… [{len(text) - MAX_RESULT} characters cut]"
    return text


class ToolRegistry:
    """The tools one worker has, by name, each with where it came from; and its agent kinds.

    `kinds` are the agents written in Python the worker loaded (`cairn.agent`), by name.
    """

    def __init__(self, tools: Iterable[Tool] = (), source: str = "built-in") -> None:
        self._tools: dict[str, Tool] = {}
        self._sources: dict[str, str] = {}
        self.kinds: dict[str, CodeAgent] = {}
        self._kind_sources: dict[str, str] = {}
        for each in tools:
            self.add(each, source)

    def add_kind(self, kind: CodeAgent, source: str) -> None:
        """Register agent kind `kind`; `InvalidSpec` if another kind has its name already."""
        known = self.kinds.get(kind.name)
        if known is not None and known is not kind:
            raise InvalidSpec(f"two agent kinds are named {kind.name!r}: "
                              f"{self._kind_sources[kind.name]} and {source}")  # fmt: skip
        self.kinds[kind.name] = kind
        self._kind_sources.setdefault(kind.name, source)

    def add(self, tool: Tool, source: str) -> None:
        """Register `tool`; `InvalidSpec` if another tool has its name already."""
        known = self._tools.get(tool.name)
        if known is not None and known is not tool:
            raise InvalidSpec(
                f"two tools are named {tool.name!r}: {self._sources[tool.name]} and {source}"
            )
        self._tools[tool.name] = tool
        self._sources.setdefault(tool.name, source)

    def get(self, name: str) -> Tool | None:
        """Return the tool called `name`, or None."""
        return self._tools.get(name)

    def __getitem__(self, name: str) -> Tool:
        """Return the tool called `name`; `KeyError` if there is none."""
        return self._tools[name]

    def __contains__(self, name: object) -> bool:
        """Say whether a tool is called `name`."""
        return name in self._tools

    def __iter__(self) -> Iterator[str]:
        """The tools' names, in the order they were added."""
        return iter(self._tools)

    def __len__(self) -> int:
        """How many tools there are."""
        return len(self._tools)

    def source(self, name: str) -> str:
        """Where the tool called `name` came from (`built-in`, an entry point, a module)."""
        return self._sources[name]

    def missing(self, names: Iterable[str]) -> list[str]:
        """The names among `names` no tool has, in order."""
        return [name for name in names if name not in self._tools]


def builtin_tools() -> ToolRegistry:
    """A registry of the built-in tools alone."""
    return ToolRegistry(TOOLS.values())


def load_tools(modules: Sequence[str], entry_points: bool = True) -> ToolRegistry:
    """Build a worker's tools and agent kinds: built-ins, installed entry points', `modules`'.

    An entry point of the `cairn.tools` or `cairn.agents` group, and each module named,
    gives a tool or agent kind, a list of them, or a module whose tools and kinds (the
    `Tool`s and `CodeAgent`s among its names) all count. Raises `InvalidSpec`, naming the
    culprit, for what cannot be imported or holds neither, and for two tools or two kinds
    of one name: a worker should not start half-equipped.
    """
    registry = builtin_tools()
    if entry_points:
        for group in (ENTRY_POINTS, KIND_ENTRY_POINTS):
            for point in importlib.metadata.entry_points(group=group):
                dist = f" of {point.dist.name}" if point.dist is not None else ""
                source = f"entry point {point.name} = {point.value}{dist}"
                try:
                    loaded = point.load()
                except Exception as exc:
                    raise InvalidSpec(f"cannot load {source}: {type(exc).__name__}: {exc}") from exc
                _register(registry, loaded, source)
    for module in modules:
        try:
            imported = importlib.import_module(module)
        except Exception as exc:
            raise InvalidSpec(
                f"cannot import tools module {module!r}: {type(exc).__name__}: {exc}"
            ) from exc
        _register(registry, imported, f"module {module}")
    return registry


def _register(registry: ToolRegistry, found: object, source: str) -> None:
    """Add the tools and kinds `found` holds (one, a list of them, a module) to `registry`."""
    if isinstance(found, Tool | CodeAgent):
        held: list[object] = [found]
    elif isinstance(found, ModuleType):
        held = [v for v in vars(found).values() if isinstance(v, Tool | CodeAgent)]
    elif isinstance(found, list | tuple):
        held = list(found)
    else:
        raise InvalidSpec(f"{source} is a {type(found).__name__}, not a tool, list or module")
    if not held:
        raise InvalidSpec(f"{source} holds no tool or agent (make one with cairn.tool or "
                          "cairn.agent)")  # fmt: skip
    for each in held:
        if isinstance(each, CodeAgent):
            registry.add_kind(each, source)
        elif isinstance(each, Tool):
            registry.add(each, source)
        else:
            raise InvalidSpec(f"{source} holds a {type(each).__name__}, which is not a tool")


@cache
def installed_tools() -> ToolRegistry:
    """The tools of a worker that names no module: built-ins and installed entry points'."""
    return load_tools(())
