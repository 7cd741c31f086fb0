"""The project's own files: the deployment description and the Lua scripts."""

from __future__ import annotations

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
    expected += ["prepare_gc"]
    expected += ["raise_epoch"]
    expected += ["read_chain", "step_start", "walk_chains", "write_lc"]
    assert [f"{name}.lua" for name in expected] == names


def test_coordinator_scripts_ship_with_the_package() -> None:
    """The coordinator's fencing scripts are package data too."""
    lua = resources.files("coordinator").joinpath("lua")
    assert ["run_write.lua"] == sorted(p.name for p in lua.iterdir())
