"""The names in a tool call, checked against the tool's JSON Schema before the tool runs.

A model that calls `write_file` with `text` where the tool takes `content` should read that
it gave an unknown argument and left a required one out, not what the tool makes of the
gap. `check_names` says both, in one line, from the schema's `properties`, `required` and
`additionalProperties` (checked by `jsonschema`, so `patternProperties` count too): the
values are left to the tool, which knows what it takes (a Python tool's pydantic model
converts `"2"` to `2`; a JSON Schema validator would refuse it). A schema that allows
other properties (MCP servers' often do, by leaving `additionalProperties` out) has no
unknown arguments.
"""

from __future__ import annotations

import difflib
import functools
import json
from collections.abc import Iterable

from jsonschema import Draft202012Validator
from pydantic import JsonValue

from cairn.errors import ToolError

# The root keywords that decide which names a call may give and must give.
NAME_KEYWORDS = ("properties", "patternProperties", "additionalProperties", "required")
MAX_NAMED = 5  # names listed in one error


def check_names(tool: str, schema: dict[str, JsonValue], args: dict[str, JsonValue]) -> None:
    """Raise `ToolError` naming `args`' unknown and missing required arguments, if any.

    E.g. "write_file: unknown argument 'text'; missing required argument 'content' (did
    you mean 'content'?)". A schema that cannot be read that way is left to the tool.
    """
    unknown, missing = find_mistakes(schema, args)
    if not unknown and not missing:
        return
    parts = []
    if unknown:
        parts.append(f"unknown {_plural('argument', unknown)} {_quoted(unknown)}")
    if missing:
        parts.append(f"missing required {_plural('argument', missing)} {_quoted(missing)}")
    message = f"{tool}: " + "; ".join(parts)
    guesses = _guesses(unknown, missing, [n for n in _properties(schema) if n not in args])
    if guesses:
        message += f" (did you mean {guesses}?)"
    raise ToolError(message)


@functools.lru_cache(maxsize=256)
def _validator(names: str) -> Draft202012Validator:
    """The validator of the names schema `names` (canonical JSON): built once per schema.

    Building one costs more than checking a call's few names with it.
    """
    return Draft202012Validator(json.loads(names))


def find_mistakes(
    schema: dict[str, JsonValue], args: dict[str, JsonValue]
) -> tuple[list[str], list[str]]:
    """The names in `args` that `schema` does not allow, and its required names `args` lack."""
    names = {key: schema[key] for key in NAME_KEYWORDS if key in schema}
    # Only which names appear is checked: every property's own schema is replaced by `true`.
    names["properties"] = dict.fromkeys(_properties(schema), True)
    patterns = schema.get("patternProperties")
    if isinstance(patterns, dict):
        names["patternProperties"] = dict.fromkeys(patterns, True)
    extra = names.get("additionalProperties")
    if extra is not None and not isinstance(extra, bool):
        names["additionalProperties"] = True  # a schema for the others' values: any name goes
    try:
        errors = list(_validator(json.dumps(names, sort_keys=True)).iter_errors(args))
    except Exception:  # noqa: BLE001 - a schema jsonschema cannot read: the tool decides
        return [], []
    unknown: list[str] = []
    missing: list[str] = []
    for error in errors:
        if error.validator == "additionalProperties":
            unknown = [name for name in args if _unknown(name, names)]
        elif error.validator == "required" and isinstance(error.validator_value, list):
            missing = [str(n) for n in error.validator_value if n not in args]
    return unknown, missing


def _unknown(name: str, names: dict[str, JsonValue]) -> bool:
    """True when no property and no pattern of the name-only schema `names` takes `name`."""
    return not Draft202012Validator(
        {**names, "required": [], "additionalProperties": False}
    ).is_valid({name: None})


def _properties(schema: dict[str, JsonValue]) -> list[str]:
    properties = schema.get("properties")
    return list(properties) if isinstance(properties, dict) else []


def _guesses(unknown: list[str], missing: list[str], free: list[str]) -> str:
    """What each unknown name was likely meant to be: "'content'", or "'a' for 'b', …".

    One unknown name and one missing: the model renamed it. Otherwise the closest spelling
    among the tool's arguments that were not given (`free`).
    """
    if len(unknown) == 1 and len(missing) == 1:
        return repr(missing[0])
    meant = {
        name: close[0]
        for name in unknown
        if (close := difflib.get_close_matches(name, free, n=1, cutoff=0.6))
    }
    if len(unknown) == 1 and meant:
        return repr(meant[unknown[0]])
    return ", ".join(f"{guess!r} for {name!r}" for name, guess in meant.items())


def _plural(word: str, names: list[str]) -> str:
    return word if len(names) == 1 else word + "s"


def _quoted(names: Iterable[str]) -> str:
    shown = list(names)
    more = f" and {len(shown) - MAX_NAMED} more" if len(shown) > MAX_NAMED else ""
    return ", ".join(repr(name) for name in shown[:MAX_NAMED]) + more
