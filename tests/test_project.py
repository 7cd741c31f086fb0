"""The project's own files: the deployment description and the Lua scripts."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_compose_file_runs_redis_with_aof() -> None:
    """docker-compose.yml parses and runs Redis with the append-only file on, in a volume."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    redis = compose["services"]["redis"]
    assert "--appendonly" in redis["command"]
    assert "yes" == redis["command"][redis["command"].index("--appendonly") + 1]
    volume = redis["volumes"][0].split(":")[0]
    assert volume in compose["volumes"]


def test_lua_scripts_ship_with_the_package() -> None:
    """Every protocol script is package data, so an installed Cairn can load it."""
    lua = resources.files("storage.backends").joinpath("lua")
    names = sorted(p.name for p in lua.iterdir() if p.name.endswith(".lua"))
    expected = ["abort_gc", "beat", "begin_attempt", "claim", "commit_gc", "lg_put"]
    expected += ["prepare_gc", "raise_epoch", "read_chain", "run_write", "spend", "step_start"]
    expected += ["walk_chains", "write_lc"]
    assert [f"{name}.lua" for name in expected] == names


def test_every_lua_script_lives_in_one_folder_and_speaks_one_convention() -> None:
    """One folder of scripts; a refusal is FENCED (the writer lost its right) or REFUSED.

    A lost owner token or a stale epoch is always FENCED, whichever script finds it.
    """
    folder = ROOT / "storage" / "backends" / "lua"
    scattered = [
        str(p.relative_to(ROOT))
        for p in ROOT.rglob("*.lua")
        if p.parent != folder and ".venv" not in p.parts
    ]
    assert [] == scattered
    words: set[str] = set()
    for path in folder.glob("*.lua"):
        source = path.read_text()
        words |= set(re.findall(r"error_reply\('([A-Z]+) ", source))
        words |= {"REFUSED"} if "refuse(" in source else set()
        words |= {"FENCED"} if "fence(" in source else set()
        for line in source.splitlines():
            refusal = "error_reply" in line or "fence(" in line or "refuse(" in line
            if refusal and ("no longer owns" in line or "stale epoch" in line):
                assert "FENCED" in line or "fence(" in line, f"{path.name}: {line.strip()}"
    assert {"ERR", "FENCED", "REFUSED"} >= words
