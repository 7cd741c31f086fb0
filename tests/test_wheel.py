"""The built wheel: one top-level package, installed next to the OpenAI Agents SDK.

The SDK's import package is `agents`, the name Cairn's engine once had at the top level.
This test builds Cairn's wheel from a copy of the sources, installs it beside
`openai-agents` in a fresh virtualenv from the wheelhouse `make test` downloads
(`tests/wheelhouse.py`; tests never download), and there runs `cairn demo`: a task of three
agents to its end, through a killed worker and a rollback, on its own redis-server.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import venv
import zipfile
from pathlib import Path

import pytest

from tests.wheelhouse import OPENAI_AGENTS, WHEELHOUSE, ready

ROOT = Path(__file__).resolve().parent.parent
Completed = subprocess.CompletedProcess[str]
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "cairn", "coordinator", "agents", "storage")

pytestmark = pytest.mark.slow


def attempt(*args: str | Path, cwd: Path, timeout: float = 300) -> Completed:
    """Run a command in `cwd` with no CAIRN_* or PYTHON* variables of ours.

    Never in the checkout, whose `agents/` folder would shadow the SDK's package.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CAIRN_", "PYTHON"))}
    return subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip


def run(*args: str | Path, cwd: Path, timeout: float = 300) -> str:
    """`attempt` that must succeed: its stdout, or fail with its output."""
    done = attempt(*args, cwd=cwd, timeout=timeout)
    assert 0 == done.returncode, f"{args}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def home(python: Path) -> Path:
    """The directory of the virtualenv whose interpreter is `python`."""
    return python.parent.parent


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the wheel, the python of a fresh virtualenv holding it and openai-agents).

    Every command runs in the virtualenv's own directory, away from the checkout.
    """
    if not ready():
        if os.environ.get("CI", "").lower() in {"true", "1"}:
            pytest.fail(f"no wheelhouse at {WHEELHOUSE} in CI: `make test` downloads it")
        pytest.skip(f"no wheelhouse at {WHEELHOUSE}: `make test` downloads it")
    base = tmp_path_factory.mktemp("wheel")
    source = base / "source"
    for name in SOURCES:  # a clean tree: the checkout's build/ and egg-info stay out
        item = ROOT / name
        if item.is_dir():
            shutil.copytree(item, source / name, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
        else:
            source.mkdir(exist_ok=True)
            shutil.copy2(item, source / name)
    venv.create(base / "venv", with_pip=True)
    python = base / "venv" / "bin" / "python"
    offline = ("--no-index", "--find-links", WHEELHOUSE, "--disable-pip-version-check")
    run(python, "-m", "pip", "wheel", *offline, "--no-deps", "-w", base / "dist", source, cwd=base)
    (wheel,) = (base / "dist").glob("cairn_agents-*.whl")
    run(
        python, "-m", "pip", "install", *offline, wheel, f"openai-agents=={OPENAI_AGENTS}", cwd=base
    )
    return wheel, python


def test_the_wheel_holds_one_top_level_package(installed: tuple[Path, Path]) -> None:
    """Only `cairn` (and the wheel's metadata) at the top; the layers are inside it."""
    wheel, _ = installed
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert {"cairn"} == {t for t in tops if not t.endswith(".dist-info")}
    inside = ("cairn/coordinator/jobs.py", "cairn/agents/step.py", "cairn/cli/demo/team.yaml",
              "cairn/storage/backends/lua/commit_gc.lua")  # fmt: skip
    assert set(inside) <= set(names)


def test_agents_is_the_sdk_and_cairn_is_whole_beside_it(installed: tuple[Path, Path]) -> None:
    """`import agents` is the OpenAI Agents SDK; every Cairn module still imports."""
    _, python = installed
    probe = (
        "import agents, cairn, cairn.agents.mcp, cairn.coordinator.worker, cairn.storage.store\n"
        "from agents import Agent, Runner\n"
        "from cairn.agents.mcp import load_mcp_config\n"
        "print(agents.__file__)\n"
        "print(cairn.agents.__file__)\n"
    )
    sdk, ours = run(python, "-c", probe, cwd=home(python)).split()
    site = Path(sdk).parent.parent
    assert Path(sdk) == site / "agents" / "__init__.py"
    assert Path(ours) == site / "cairn" / "agents" / "__init__.py"


def test_a_task_runs_to_its_end_beside_the_sdk(installed: tuple[Path, Path]) -> None:
    """`cairn demo` from the installed wheel: the team's task succeeds with the fix in place."""
    _, python = installed
    cairn = python.parent / "cairn"
    out = run(cairn, "demo", cwd=home(python), timeout=240)
    assert "task succeeded" in out, out[-2000:]


def test_removing_the_sdk_leaves_cairn_whole(installed: tuple[Path, Path]) -> None:
    """The two distributions share no file: uninstalling the SDK leaves Cairn importable."""
    _, python = installed
    run(python, "-m", "pip", "uninstall", "--yes", "openai-agents", cwd=home(python))
    run(
        python,
        "-c",
        "import cairn.agents.mcp, cairn.coordinator.worker, cairn.cli",
        cwd=home(python),
    )
    gone = attempt(python, "-c", "import agents", cwd=home(python))
    assert "No module named 'agents'" in gone.stderr
