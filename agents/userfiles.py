"""Reading what a user hands Cairn as a file: task specs, price tables, MCP configs, policies.

Every such input is bounded before it is trusted with memory. A file is read up to its
limit and no further, so `/dev/zero` or an endless pipe is refused like a large file. A
YAML or JSON document holds at most `MAX_VALUES` values (scalars, lists and mappings,
keys included): a YAML document's are counted as they are built (PyYAML spends about a
kilobyte on each, so 16 MiB of `[],` would take gigabytes), a JSON document's once
parsed (the stdlib's parser builds 16 MiB into some hundreds of megabytes at most).
YAML aliases (`*name`, and so `<<` merge keys) are refused: an alias shares one value
where it is used, and validation copies it at each use, so a few kilobytes of nested
aliases ("billion laughs") become gigabytes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

import yaml

from cairn.errors import InvalidSpec

MAX_VALUES = 100_000
# Where each value of a YAML document starts, by its path of keys and list indexes: 1-based
# line and column (a mapping's entry at its key).
Marks = dict[tuple[str | int, ...], tuple[int, int]]


def read_at_most(path: str | os.PathLike[str], limit: int) -> bytes:
    """Return the file's first `limit + 1` bytes at most: more than `limit` says it is too large.

    Raises `OSError` when it cannot be read.
    """
    with open(path, "rb") as stream:  # noqa: PTH123 - a path or a device, read in one call
        return stream.read(limit + 1)


def read_bounded(path: str | os.PathLike[str], limit: int, name: str) -> bytes:
    """Return the file's bytes, at most `limit`; `InvalidSpec` naming `name` else.

    One line either way: "cannot read NAME: why", or "NAME is over LIMIT bytes".
    """
    try:
        data = read_at_most(path, limit)
    except OSError as exc:
        raise InvalidSpec(f"cannot read {name}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise InvalidSpec(f"{name} is over {limit} bytes")
    return data


class _BoundedLoader(yaml.SafeLoader):  # type: ignore[misc] # PyYAML has no type hints
    """PyYAML's safe loader that refuses aliases and documents of over `MAX_VALUES` values."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.values = 0

    def compose_node(self, parent: Any, index: Any) -> Any:  # noqa: ANN401 - PyYAML's nodes
        """Compose the next node, refusing it if it is an alias or one value too many."""
        event = self.peek_event()
        where = f"line {event.start_mark.line + 1}, column {event.start_mark.column + 1}"
        if isinstance(event, yaml.AliasEvent):
            raise yaml.composer.ComposerError(
                None, None, f"{where}: aliases (*{event.anchor}) are not allowed", event.start_mark
            )
        self.values += 1
        if self.values > MAX_VALUES:
            raise yaml.composer.ComposerError(
                None, None, f"{where}: more than {MAX_VALUES} values", event.start_mark
            )
        return super().compose_node(parent, index)


def load_yaml(text: str) -> object:
    """Parse one YAML document as `yaml.safe_load` does, within the bounds above.

    Raises `yaml.YAMLError` for bad YAML, an alias, too many values or too deep a nesting.
    """
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    except RecursionError:
        raise yaml.YAMLError("nested too deeply") from None
    finally:
        loader.dispose()


def load_yaml_marked(text: str) -> tuple[object, Marks]:
    """Parse one YAML document as `load_yaml` does, with where each of its values starts."""
    loader = _BoundedLoader(text)
    try:
        node = loader.get_single_node()
        data = None if node is None else loader.construct_document(node)
    except RecursionError:
        raise yaml.YAMLError("nested too deeply") from None
    finally:
        loader.dispose()
    marks: Marks = {}
    pending: list[tuple[Any, tuple[str | int, ...]]] = [] if node is None else [(node, ())]
    while pending:
        current, path = pending.pop()
        marks.setdefault(path, (current.start_mark.line + 1, current.start_mark.column + 1))
        if isinstance(current, yaml.MappingNode):
            for key, value in current.value:
                if isinstance(key, yaml.ScalarNode):
                    marks[(*path, key.value)] = (key.start_mark.line + 1, key.start_mark.column + 1)
                    pending.append((value, (*path, key.value)))
        elif isinstance(current, yaml.SequenceNode):
            pending.extend((item, (*path, index)) for index, item in enumerate(current.value))
    return data, marks


def load_json(text: str | bytes) -> object:
    """Parse one JSON document, of at most `MAX_VALUES` values.

    Raises `ValueError` for bad JSON, too many values or too deep a nesting.
    """
    try:
        document: object = json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    count, pending = 1, [document]
    while pending:
        value = pending.pop()
        if isinstance(value, dict):
            count += 2 * len(value)  # its keys and its values
            inner: Iterable[object] = value.values()
        elif isinstance(value, list):
            count += len(value)
            inner = value
        else:
            continue
        if count > MAX_VALUES:
            raise ValueError(f"more than {MAX_VALUES} values")
        pending.extend(inner)
    return document
