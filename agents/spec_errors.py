"""Specs a user writes (`Strict`, `UserSpec`), and what is wrong with one, in one line.

pydantic's `ValidationError` lists every error, locates each by keys and list indexes
(`agents.1.modle`) and is phrased for programmers. A person is told the first mistake,
an agent by its name (`agents[coder].timeout`), and for a field that is not one, the
field meant (`unknown field 'modle' (did you mean 'model'?)`); a misspelt field is a
missing one too, so an unknown field is told first.
"""

from __future__ import annotations

import difflib
import json
import re
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.config import ExtraValues

from cairn.errors import InvalidSpec

Location = tuple[str | int, ...]
# An agent's `name` shown in place of its index: one a reader can take for nothing else.
LABEL = re.compile(r"[A-Za-z0-9_.-]{1,64}")
NAMED_LISTS = ("agents",)  # lists whose items are told by their name
UNION = (typing.Union, types.UnionType)


class Strict(BaseModel):
    """Base of spec models: unknown fields are mistakes, not extensions."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class UserSpec(Strict):
    """Base of the specs a user writes: an invalid one raises `InvalidSpec`, in one line.

    Built (`AgentSpec(...)`) or validated (`model_validate`, `model_validate_json`), a bad
    spec is told as the CLI tells the same mistake in a file, never as pydantic's
    `ValidationError`. Nested in another spec, it is validated as part of that one.
    """

    described_as: ClassVar[str] = "spec"  # what its messages call it: "invalid task spec: ..."

    def __init__(self, /, **data: Any) -> None:  # noqa: ANN401 - the fields, as pydantic's
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise invalid(exc, self.described_as, data, type(self)) from None

    # pydantic calls a model's own `__init__` to build it nested in another model, where an
    # `InvalidSpec` would become a "Value error" of the outer one: marked as pydantic marks
    # its own, this one runs only when called, and nested specs are validated as fields.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    @classmethod
    def model_validate(
        cls,
        obj: Any,  # noqa: ANN401 - pydantic's signature
        *,
        strict: bool | None = None,
        extra: ExtraValues | None = None,
        from_attributes: bool | None = None,
        context: Any | None = None,  # noqa: ANN401 - pydantic's signature
        by_alias: bool | None = None,
        by_name: bool | None = None,
    ) -> Self:
        """Validate `obj` as this spec, or raise `InvalidSpec` naming the first bad field."""
        try:
            return super().model_validate(
                obj, strict=strict, extra=extra, from_attributes=from_attributes,
                context=context, by_alias=by_alias, by_name=by_name,
            )  # fmt: skip
        except ValidationError as exc:
            raise invalid(exc, cls.described_as, obj, cls) from None

    @classmethod
    def model_validate_json(
        cls,
        json_data: str | bytes | bytearray,
        *,
        strict: bool | None = None,
        extra: ExtraValues | None = None,
        context: Any | None = None,  # noqa: ANN401 - pydantic's signature
        by_alias: bool | None = None,
        by_name: bool | None = None,
    ) -> Self:
        """Validate the JSON `json_data` as this spec, or raise `InvalidSpec` as above."""
        try:
            return super().model_validate_json(
                json_data, strict=strict, extra=extra, context=context, by_alias=by_alias,
                by_name=by_name,
            )  # fmt: skip
        except ValidationError as exc:
            try:  # the document, to name its list items: parsed only when it is refused
                data: object = json.loads(json_data)
            except (ValueError, RecursionError):
                data = None
            raise invalid(exc, cls.described_as, data, cls) from None


def invalid(
    exc: ValidationError, what: str, data: object = None, model: type[BaseModel] | None = None
) -> InvalidSpec:
    """`InvalidSpec` saying, in one line, the first bad field of `what` and what is wrong.

    `data` is what was validated (its agents are told by their `name`), `model` the
    class it was validated as (its field names are offered for an unknown one). The
    error's `field` is the bad field's location.
    """
    errors = exc.errors()
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    field: Location = tuple(first["loc"])
    if first["type"] == "extra_forbidden" and field:
        where = describe(field[:-1], data)
        reason = f"unknown field {_quoted(field[-1])}{_suggestion(model, field)}"
    else:
        where = describe(field, data)
        reason = first["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
    return InvalidSpec(f"invalid {what}: {where + ': ' if where else ''}{reason}", field=field)


def describe(field: Location, data: object) -> str:
    """`field` as a person reads it: `agents[coder].script[0].say` (an agent by its name)."""
    text = ""
    value = data
    for index, part in enumerate(field):
        item = _child(value, part)
        if isinstance(part, int) and index and field[index - 1] in NAMED_LISTS:
            name = item.get("name") if isinstance(item, Mapping) else getattr(item, "name", None)
            shown = name if isinstance(name, str) and LABEL.fullmatch(name) else str(part)
            text += f"[{shown}]"
        elif isinstance(part, int):
            text += f"[{part}]"
        else:
            text += ("." if text else "") + _printable(part)
        value = item
    return text


def _child(value: object, part: str | int) -> object:
    """The value at `part` in `value`, None where there is none."""
    if isinstance(part, int) and isinstance(value, Sequence) and not isinstance(value, str):
        return value[part] if -len(value) <= part < len(value) else None
    if isinstance(value, Mapping):
        return value.get(part)
    return None


def _suggestion(model: type[BaseModel] | None, field: Location) -> str:
    """` (did you mean 'model'?)`: the field of that name's model closest to its last part."""
    fields = _fields_at(model, field[:-1])
    close = difflib.get_close_matches(str(field[-1]), fields, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _fields_at(model: type[BaseModel] | None, path: Location) -> list[str]:
    """The field names of the model at `path` inside `model`; none where it cannot be told."""
    kind: object = model
    for part in path:
        kind = _inner(kind, part)
    found = _model_in(kind)
    return [] if found is None else list(found.model_fields)


def _inner(kind: object, part: str | int) -> object:
    """The type of the value at `part` of a value of type `kind` (None: unknown)."""
    found = _model_in(kind)
    if found is not None:
        field = found.model_fields.get(part) if isinstance(part, str) else None
        return None if field is None else field.annotation
    arguments = typing.get_args(kind)
    if typing.get_origin(kind) in UNION:  # `list[X] | None`: the one member not None
        kept = [a for a in arguments if a is not type(None)]
        return _inner(kept[0], part) if len(kept) == 1 else None
    return arguments[-1] if arguments else None  # a list's item, a mapping's value


def _model_in(kind: object) -> type[BaseModel] | None:
    """The model class `kind` is, or holds beside None (`X | None`)."""
    if isinstance(kind, type) and issubclass(kind, BaseModel):
        return kind
    if typing.get_origin(kind) in UNION:
        models = [m for m in map(_model_in, typing.get_args(kind)) if m is not None]
        return models[0] if len(models) == 1 else None
    return None


def _quoted(part: str | int) -> str:
    return repr(part) if isinstance(part, str) else str(part)


def _printable(part: str) -> str:
    # A key of the user's (a file name) may hold a newline: quoted, the message keeps one line.
    return part if part.isprintable() else repr(part)
