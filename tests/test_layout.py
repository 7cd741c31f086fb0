"""The code's layout: one import package, and imports that point one way.

Cairn installs the one top-level package `cairn`; the root folders `coordinator/`,
`agents/` and `storage/` are its subpackages (docs/design.md#code-layout). Layers import
downwards only: the facade (`cairn` itself: the client, CLI, console, `cairn.testing`) →
`cairn.coordinator` → `cairn.agents` → `cairn.storage`. These tests read the imports from
the code itself.

One module of the facade's level is below them all: `cairn.errors`, the error tree. It is
a leaf (it imports nothing of Cairn's), so every layer raises and catches the same classes
without reaching up into the facade; and the facade loads nothing else until a name of it
is asked for, so importing an engine module does not import the client.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("coordinator", "agents", "storage")  # top to bottom
# Where `agents` is the OpenAI Agents SDK's package, beside Cairn's (its adapter, and the
# test module that imports it beside the checkout's folder: tests/adapter_agents.py).
SDK_AGENTS = ("agents/adapters/openai_agents.py", "tests/adapter_agents.py")
# What each layer may import of Cairn's own: the layers below it and the leaf `cairn.errors`,
# nothing else of the facade.
MAY_IMPORT = {
    "coordinator": {"cairn.errors", "cairn.coordinator", "cairn.agents", "cairn.storage"},
    "agents": {"cairn.errors", "cairn.agents", "cairn.storage"},
    "storage": {"cairn.errors", "cairn.storage"},
}


def imported(path: Path) -> Iterator[tuple[int, str]]:
    """Each absolute module name `path` imports, with its line.

    `from a import b` yields `a` and `a.b`: `b` may be a module (`from cairn import testing`).
    """
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module
            yield from ((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)


def sources(*folders: str) -> list[Path]:
    """Every Python file under the named root folders."""
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


@pytest.mark.parametrize("layer", LAYERS)
def test_each_layer_imports_only_the_layers_below_it(layer: str) -> None:
    """`storage` imports no other layer, `agents` never `coordinator`; the facade only errors."""
    allowed = MAY_IMPORT[layer]
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in sources(layer)
        for line, name in imported(path)
        if name.split(".")[0] == "cairn"
        and not any(name == a or name.startswith(a + ".") for a in allowed)
    ]
    assert [] == wrong


def test_nothing_imports_a_layer_by_a_top_level_name() -> None:
    """`import coordinator` would load a second copy of it; every import says `cairn.`."""
    folders = (*LAYERS, "cairn", "tests", "bench", "chaos", "examples")
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in sources(*folders)
        if "demo/project" not in path.as_posix()
        for line, name in imported(path)
        if name.split(".")[0] in LAYERS
        and not (name.split(".")[0] == "agents" and path.relative_to(ROOT).as_posix() in SDK_AGENTS)
    ]
    assert [] == wrong


def test_the_package_links_to_the_root_folders() -> None:
    """`cairn/coordinator` and its siblings are links to the root folders, not copies."""
    for layer in LAYERS:
        link = ROOT / "cairn" / layer
        assert link.is_symlink(), link
        assert (ROOT / layer).resolve() == link.resolve()


def test_no_layer_imports_the_testing_package() -> None:
    """`cairn.testing` (test doubles, fault hooks) sits on the facade: no layer reaches it."""
    assert (ROOT / "cairn" / "testing").is_dir()
    assert not (ROOT / "cairn" / "testing").is_symlink()
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in sources(*LAYERS)
        for line, name in imported(path)
        if name == "cairn.testing" or name.startswith("cairn.testing.")
    ]
    assert [] == wrong


def test_the_errors_are_a_leaf() -> None:
    """`cairn/errors.py` imports nothing of Cairn's: any layer may import it."""
    assert [] == [name for _, name in imported(ROOT / "cairn" / "errors.py") if "cairn" in name]


def loaded_after(statement: str) -> set[str]:
    """The modules of the facade's level a fresh interpreter holds after `statement`."""
    script = (
        f"import sys\n{statement}\n"
        "print(*sorted(m for m in sys.modules if m.split('.')[0] == 'cairn'"
        " and m.split('.')[1:2] not in (['coordinator'], ['agents'], ['storage'])))"
    )
    found = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return set(found.stdout.split())


@pytest.mark.parametrize(
    "module", ["cairn", "cairn.errors", "cairn.storage.keys", "cairn.coordinator.worker"]
)
def test_importing_the_engine_leaves_the_facade_unloaded(module: str) -> None:
    """The facade is lazy: an engine module or the errors load neither the client nor the CLI."""
    assert {"cairn", "cairn.errors"} == loaded_after(f"import {module}")


def test_a_name_of_the_facade_loads_what_defines_it() -> None:
    """`from cairn import Client` loads the client, on first asking."""
    assert "cairn.client" in loaded_after("from cairn import Client")


def test_the_testing_worker_leaves_the_client_unloaded() -> None:
    """`python -m cairn.testing.worker` (every test's worker) does not pay for the client."""
    loaded = loaded_after("import cairn.testing.worker")
    assert "cairn.testing.worker" in loaded
    assert not {"cairn.client", "cairn.cli", "cairn.testing.local"} & loaded
