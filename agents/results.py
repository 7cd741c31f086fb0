"""Typed results: the JSON Schema a task declares, the value `finish` takes, the task's result.

A task may declare `result`, a JSON Schema (in Python also a pydantic model class, made its
schema). `check_schema` takes it when the spec is read: bounded, of a dialect jsonschema
knows, valid against that dialect's metaschema, every `$ref` resolving inside the schema
itself. Cairn fetches no schema from anywhere: a `$ref` that points outside is refused,
and every validator built here has a registry that cannot retrieve.

An agent of such a task finishes through `finish_tool`: `finish` with a required `result`,
whose parameters show the model the schema. A value over `MAX_RESULT_BYTES` as JSON,
nested past `MAX_DEPTH`, or that does not fit the schema is a tool error saying where and
why in one bounded line, and the agent is not finished. A value that fits is kept in the
agent's LC (`keep_result`), and in every LC after, so a restore or a fork has the result of
its own branch.

The task's result at a GC is the one given last (`latest_result`): of the members holding
one, the one given in the latest superstep; in one superstep, the later agent in team
order, as the barrier's merge lets the later agent's write win.

jsonschema is imported on first use: what reads no schema never pays for its import.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from itertools import islice
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, JsonValue

from cairn.agents.models.base import json_size
from cairn.agents.tools import TOOLS, Args, Tool, ToolContext
from cairn.errors import ToolError
from cairn.storage.records import AgentResult, Effects, Role, ToolCall

if TYPE_CHECKING:
    from referencing import Registry

    from cairn.storage.chain import WorkingState

MAX_SCHEMA_BYTES = 64 * 1024  # a schema goes into every model request of the task's agents
# Below what one tool call's arguments may be (MAX_ARGS_BYTES), so a value too big is the
# model's to fix, told why, not a reply refused whole.
MAX_RESULT_BYTES = 512 * 1024
MAX_DEPTH = 64  # levels of lists and objects, in a schema or a value
MAX_REASON = 300  # characters of why a schema or a value is refused
MAX_ERRORS = 100  # of a value's errors, those looked at to pick the one to tell
DIALECTS = "draft 3, 4, 6, 7, 2019-09 or 2020-12"
REFS = ("$ref", "$dynamicRef")
# Keywords whose values are maps of names to schemas, and those whose values are data.
SCHEMA_MAPS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
)
DATA = frozenset({"const", "enum", "default", "examples"})
DEFINITIONS = ("$defs", "definitions")
RESULT_AT = "#/properties/result"  # where the schema sits in `finish`'s parameters


def schema_of(source: object) -> object:
    """`source`'s JSON Schema if it is a pydantic model class, else `source` as it is."""
    if isinstance(source, type) and issubclass(source, BaseModel):
        return source.model_json_schema()
    return source


def check_schema(schema: dict[str, JsonValue]) -> dict[str, JsonValue]:
    """Return `schema` if values can be checked against it, else raise `ValueError` saying why.

    At most `MAX_SCHEMA_BYTES` as JSON and `MAX_DEPTH` deep, of a dialect jsonschema knows,
    valid against its metaschema, and every `$ref` a fragment resolving inside it.
    """
    size = json_size(schema)
    if size > MAX_SCHEMA_BYTES:
        raise ValueError(f"{size} bytes as JSON; at most {MAX_SCHEMA_BYTES}")
    if depth(schema) > MAX_DEPTH:
        raise ValueError(f"nests deeper than {MAX_DEPTH} levels")
    dialect = _dialect(schema)
    meta = dialect(dialect.META_SCHEMA, registry=_registry(),
                   format_checker=dialect.FORMAT_CHECKER)  # fmt: skip
    error = _best(meta.iter_errors(schema))
    if error is not None:
        raise ValueError(_cut(f"not a valid JSON Schema: at {error.json_path}: {error.message}"))
    from referencing import Resource  # noqa: PLC0415 - with jsonschema, on first use
    from referencing.exceptions import Unresolvable  # noqa: PLC0415
    from referencing.jsonschema import DRAFT202012  # noqa: PLC0415

    root = Resource.from_contents(schema, default_specification=DRAFT202012)
    resolver = _registry().resolver_with_root(root)
    for ref in _refs(schema):
        if not ref.startswith("#"):
            raise ValueError(_cut(
                f"$ref {ref!r} points outside the schema: Cairn fetches nothing; put what it "
                "names under $defs and refer to it as '#/$defs/<name>'"
            ))  # fmt: skip
        try:
            resolver.lookup(ref)
        except Unresolvable:
            raise ValueError(_cut(f"$ref {ref!r} cannot be resolved in the schema")) from None
    return schema


def check_value(schema: dict[str, JsonValue], value: JsonValue) -> None:
    """Raise `ToolError`, saying where and why in one bounded line, unless `value` fits `schema`.

    A value over `MAX_RESULT_BYTES` as JSON or `MAX_DEPTH` deep is refused before the schema
    looks at it.
    """
    size = json_size(value)
    if size > MAX_RESULT_BYTES:
        raise ToolError(f"result is {size} bytes as JSON; at most {MAX_RESULT_BYTES}")
    if depth(value) > MAX_DEPTH:
        raise ToolError(f"result nests deeper than {MAX_DEPTH} levels")
    from referencing.exceptions import Unresolvable  # noqa: PLC0415 - on first use

    try:
        error = _best(result_validator(schema).iter_errors(value))
    except Unresolvable as exc:  # a `$ref` no check at submit saw: still nothing is fetched
        raise ToolError(_cut(
            f"the task's schema names {getattr(exc, 'ref', '?')!r}, which cannot be resolved "
            "without fetching it: fix the task's `result` schema"
        )) from None  # fmt: skip
    except RecursionError:  # a schema that refers to itself, deeper than Python's stack
        raise ToolError("result nests too deeply for the task's schema to check") from None
    if error is not None:
        raise ToolError(
            _cut(f"result does not fit the task's schema: at {error.json_path}: {error.message}")
        )


def result_validator(schema: dict[str, JsonValue]) -> Any:  # noqa: ANN401 - jsonschema's
    """A jsonschema validator of `schema`'s dialect, which never fetches a `$ref`."""
    return _dialect(schema)(schema, registry=_registry())


def finish_tool(schema: dict[str, JsonValue]) -> Tool:
    """`finish` for a task whose result has `schema`: it takes `result`, which must fit."""

    def run(ctx: ToolContext, args: Args) -> str:
        if "result" not in args:
            raise ToolError("finish takes `result`: the task's result, as its schema says")
        check_value(schema, args["result"])
        return TOOLS["finish"].run(ctx, args)

    described = "Say your part is done, with a short summary, and give the task's result."
    return Tool("finish", described, finish_parameters(schema), Effects.NONE, run)


def finish_parameters(schema: dict[str, JsonValue]) -> dict[str, JsonValue]:
    """`finish`'s parameters: `summary`, and `result` with `schema`.

    The schema's definitions move to the parameters' root, where its `#/$defs/...` refs
    then point; its other fragment refs are moved to where the schema sits.
    """
    shown: dict[str, JsonValue] = {
        key: value
        for key, value in schema.items()
        if key not in ("$schema", "$id", "id", *DEFINITIONS)
    }
    shown.setdefault("description", "the task's result, as this schema says")
    parameters: dict[str, JsonValue] = {
        "type": "object",
        "properties": {
            "summary": {"type": "string", "description": "what you did"},
            "result": _rebased(shown),
        },
        "required": ["result"],
    }
    for key in DEFINITIONS:
        found = schema.get(key)
        if isinstance(found, dict):
            parameters[key] = {name: _rebased(each) for name, each in found.items()}
    return parameters


def keep_result(state: WorkingState, call: ToolCall) -> None:
    """Keep the result a `finish` call gave, if the call (its result last in history) worked."""
    answer = state.messages[-1] if state.messages else None
    if answer is None or answer.role is not Role.TOOL or answer.tool_call_id != call.id:
        return
    if not answer.error:
        state.result = AgentResult(value=call.args.get("result"), superstep=state.superstep)


def latest_result(
    results: Mapping[str, AgentResult | None], order: Sequence[str]
) -> tuple[str, AgentResult] | None:
    """The agent whose result is the task's, and that result; None when none gave one.

    The latest superstep's; in one superstep, the later agent in `order` (team order).
    """
    given = [
        (found.superstep, place, name, found)
        for place, name in enumerate(order)
        if (found := results.get(name)) is not None
    ]
    if not given:
        return None
    _, _, name, found = max(given, key=lambda each: (each[0], each[1]))
    return name, found


def depth(value: JsonValue) -> int:
    """How many lists and objects nest in `value` (0 for a scalar); past `MAX_DEPTH`, stops."""
    deepest, pending = 0, [(value, 0)]
    while pending:
        node, above = pending.pop()
        if isinstance(node, list | dict):
            level = above + 1
            if level > MAX_DEPTH:
                return level
            deepest = max(deepest, level)
            items = node if isinstance(node, list) else node.values()
            pending.extend((item, level) for item in items)
    return deepest


def _dialect(schema: dict[str, JsonValue]) -> Any:  # noqa: ANN401 - a jsonschema class
    """The validator class of the dialect `schema` names (2020-12 when it names none)."""
    from jsonschema import validators  # noqa: PLC0415 - ~50 ms, only for a task with a result

    named = schema.get("$schema")
    if named is None:
        return validators.Draft202012Validator
    found = validators.validator_for(schema, default=None) if isinstance(named, str) else None
    if found is None:
        shown = named if isinstance(named, str) else str(named)
        raise ValueError(
            _cut(f"$schema {shown!r} is not a JSON Schema dialect Cairn knows ({DIALECTS})")
        )
    return found


def _registry() -> Registry[Any]:
    """A registry of schemas that retrieves none: Cairn fetches nothing.

    A registry made with no `retrieve` raises `NoSuchResource` for any URI it lacks; a
    validator made with none at all would fetch a remote `$ref` over the network.
    """
    from referencing import Registry  # noqa: PLC0415 - with jsonschema, on first use

    return Registry()


def _best(errors: Iterator[Any]) -> Any:  # noqa: ANN401 - a jsonschema error, or None
    """The error jsonschema ranks most telling, of the first `MAX_ERRORS`; None if none."""
    from jsonschema.exceptions import best_match  # noqa: PLC0415 - on first use

    return best_match(list(islice(errors, MAX_ERRORS)))


def _refs(schema: JsonValue) -> Iterator[str]:
    """Every `$ref` and `$dynamicRef` in `schema`, but in values that are data (`const`...)."""
    pending = [schema]
    while pending:
        node = pending.pop()
        if isinstance(node, list):
            pending.extend(node)
        elif isinstance(node, dict):
            for key, value in node.items():
                if key in REFS and isinstance(value, str):
                    yield value
                elif key in SCHEMA_MAPS and isinstance(value, dict):
                    pending.extend(value.values())
                elif key not in DATA:
                    pending.append(value)


def _rebased(node: JsonValue) -> JsonValue:
    """`node` (part of a result's schema) as it reads where `finish`'s parameters hold it."""
    if isinstance(node, list):
        return [_rebased(item) for item in node]
    if not isinstance(node, dict):
        return node
    moved: dict[str, JsonValue] = {}
    for key, value in node.items():
        if key in REFS and isinstance(value, str):
            moved[key] = _moved(value)
        elif key in SCHEMA_MAPS and isinstance(value, dict):
            moved[key] = {name: _rebased(each) for name, each in value.items()}
        elif key in DATA:
            moved[key] = value
        else:
            moved[key] = _rebased(value)
    return moved


def _moved(ref: str) -> str:
    """A ref of the result's schema, pointing where it did once the schema is `result`."""
    if ref == "#":
        return RESULT_AT
    if ref.startswith(tuple(f"#/{key}/" for key in DEFINITIONS)):
        return ref  # the definitions move to the parameters' root
    return RESULT_AT + ref[1:] if ref.startswith("#/") else ref


def _cut(text: str) -> str:
    """`text` on one line, at most `MAX_REASON` characters."""
    line = " ".join(text.splitlines())
    return line if len(line) <= MAX_REASON else line[: MAX_REASON - 1] + "…"
