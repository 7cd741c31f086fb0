"""The built-in tools' reference in docs/tools.md, made from their JSON schemas.

`python -m scripts.tooldocs` writes it between the markers in docs/tools.md;
`python -m scripts.tooldocs --check` exits 1, naming the file, when what is there is not
what the schemas make (tests/test_tooldocs.py checks the same, so the page cannot drift).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pydantic import JsonValue

from cairn.agents.tools import TOOLS, Tool

PAGE = Path(__file__).resolve().parent.parent / "docs" / "tools.md"
BEGIN = "<!-- built-in tools: made by `python -m scripts.tooldocs` from their schemas -->"
END = "<!-- end of the built-in tools -->"


def render_tools(tools: list[Tool]) -> str:
    """The reference of `tools`, in order: each one's description, effects and arguments."""
    parts = []
    for tool in tools:
        rows = [
            "| argument | type | required | what it is |",
            "| --- | --- | --- | --- |",
            *_argument_rows(tool.parameters),
        ]
        parts.append(
            f"### `{tool.name}`\n\n{tool.description} Effects: `{tool.effects.value}`.\n\n"
            + "\n".join(rows)
        )
    return "\n\n".join(parts)


def _argument_rows(schema: dict[str, JsonValue]) -> list[str]:
    """One table row per property of an object schema, the required ones marked."""
    properties, required = schema.get("properties") or {}, schema.get("required") or []
    assert isinstance(properties, dict)
    assert isinstance(required, list)
    rows = []
    for name, prop in properties.items():
        assert isinstance(prop, dict)
        rows.append(f"| `{name}` | {_type_of(prop)} | {'yes' if name in required else 'no'} "
                    f"| {_cell(prop.get('description', ''))} |")  # fmt: skip
    return rows


def _cell(text: JsonValue) -> str:
    """`text` as one Markdown table cell: its pipes escaped, on one line."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _type_of(prop: dict[str, JsonValue]) -> str:
    """A property's JSON type as a person reads it: `string`, `array of string`, ..."""
    items = prop.get("items")
    if prop.get("type") == "array" and isinstance(items, dict):
        return f"array of {items.get('type', 'any')}"
    return str(prop.get("type", "any"))


def with_section(page: str, section: str) -> str:
    """`page` with the text between its markers replaced by `section`."""
    head, found, rest = page.partition(BEGIN)
    _, closed, tail = rest.partition(END)
    if not (found and closed):
        raise SystemExit(f"tooldocs: {PAGE} lacks its markers {BEGIN!r} and {END!r}")
    return f"{head}{BEGIN}\n\n{section}\n\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    """Write the section (or, with --check, say whether it is current); the exit code."""
    parser = argparse.ArgumentParser(prog="python -m scripts.tooldocs", description=__doc__)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    args = parser.parse_args(argv)
    page = PAGE.read_text(encoding="utf-8")
    made = with_section(page, render_tools(list(TOOLS.values())))
    if made == page:
        return 0
    if args.check:
        sys.stderr.write(f"tooldocs: {PAGE} is stale: run `python -m scripts.tooldocs`\n")
        return 1
    PAGE.write_text(made, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
