"""The wheelhouse tests/test_wheel.py installs from, offline: `python -m tests.wheelhouse`.

`make test` runs this when the pins change: it downloads Cairn's dependencies (at
constraints.txt's versions), a setuptools that builds the wheel, and `openai-agents` with
its own dependencies (unconstrained: what a user's pip picks beside Cairn's wheel), into
`.venv/wheelhouse/`. Tests never download.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WHEELHOUSE = ROOT / ".venv" / "wheelhouse"
OPENAI_AGENTS = "0.24.0"  # the SDK whose top-level `agents` Cairn must live beside
STAMP = WHEELHOUSE / ".fetched"


def ready() -> bool:
    """True when the wheelhouse holds this version's downloads."""
    return STAMP.is_file() and STAMP.read_text() == OPENAI_AGENTS


def fetch() -> None:
    """Download the wheelhouse (two resolutions: Cairn's, then the SDK's)."""
    pip = [sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(WHEELHOUSE)]
    constraints = str(ROOT / "constraints.txt")
    subprocess.run([*pip, "-c", constraints, "setuptools>=77", str(ROOT)], check=True)
    subprocess.run([*pip, f"openai-agents=={OPENAI_AGENTS}"], check=True)
    STAMP.write_text(OPENAI_AGENTS)


if __name__ == "__main__":
    fetch()  # make runs this when the pins change: pip skips what it has already
