"""docs/tools.md's reference of the built-in tools is the one their schemas make."""

from __future__ import annotations

from cairn.agents.tools import TOOLS
from scripts import tooldocs


def test_the_built_in_tools_reference_is_what_their_schemas_make() -> None:
    """The committed page equals `python -m scripts.tooldocs`'s output: the docs cannot drift."""
    page = tooldocs.PAGE.read_text(encoding="utf-8")
    assert tooldocs.with_section(page, tooldocs.render_tools(list(TOOLS.values()))) == page
    assert 0 == tooldocs.main(["--check"])


def test_every_built_in_and_each_argument_is_documented() -> None:
    """Each built-in has its heading, and each of its arguments a row, on the page."""
    page = tooldocs.PAGE.read_text(encoding="utf-8")
    for tool in TOOLS.values():
        section = page.split(f"### `{tool.name}`\n", 1)[1].split("###", 1)[0]
        properties = tool.parameters["properties"]
        assert isinstance(properties, dict)
        assert all(f"| `{name}` |" in section for name in properties), tool.name
