"""docs/testing-your-agents.md: its example module runs as it stands, and passes.

The example is read from the doc itself, so the doc cannot drift from what works.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "testing-your-agents.md"


def example() -> str:
    """The doc's first Python block: the example test module."""
    blocks = re.findall(r"^```python\n(.*?)^```$", DOC.read_text(), re.MULTILINE | re.DOTALL)
    assert blocks, f"{DOC} has no Python example"
    return str(blocks[0])


def example_tests() -> list[str]:
    """The names of the example module's test functions."""
    return re.findall(r"^def (test_\w+)\(", example(), re.MULTILINE)


def test_the_doc_shows_both_tests() -> None:
    """The example keeps its two tests: a team that succeeds, and one whose worker dies."""
    assert [
        "test_the_writer_writes_hello",
        "test_the_team_survives_its_worker_killed_mid_step",
    ] == example_tests()


@pytest.mark.slow
@pytest.mark.parametrize("name", example_tests())
def test_the_docs_example_passes(name: str, tmp_path: Path) -> None:
    """Each test of the doc's example module, run as pytest would run it."""
    namespace: dict[str, object] = {"__name__": "testing_your_agents_example"}
    exec(compile(example(), str(DOC), "exec"), namespace)  # noqa: S102 - our own doc's code
    test = namespace[name]
    assert callable(test)
    test(tmp_path)
