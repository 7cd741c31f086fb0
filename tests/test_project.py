"""The project's own files: the deployment description and the Lua scripts."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml

from cairn.coordinator.settings import load_settings

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ("docker-compose", "-f", str(ROOT / "docker-compose.yml"))
OTHERS = frozenset({"redis", "jaeger"})  # the services that are not Cairn's
COMPOSE_SECRETS = ("CAIRN_REDIS_PASSWORD", "CAIRN_SIGNING_KEY", "CAIRN_CONSOLE_TOKEN")


def outside_env() -> dict[str, str]:
    """The environment without what compose or Cairn would take from a shell."""
    return {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("CAIRN_", "COMPOSE_", "OPENAI_", "OTEL_"))
    }


def make_compose_env(folder: Path) -> subprocess.CompletedProcess[str]:
    """Run `make compose-env` in `folder` (the project's Makefile, this Python)."""
    return subprocess.run(
        ["make", "-s", "-f", str(ROOT / "Makefile"), "-C", str(folder), "compose-env"],
        env={**outside_env(), "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def read_env_file(path: Path) -> dict[str, str]:
    """The `NAME=value` lines of an env file."""
    lines = [line for line in path.read_text().splitlines() if line and line[0] != "#"]
    return dict(line.split("=", 1) for line in lines)


def compose_config(env_file: Path) -> subprocess.CompletedProcess[str]:
    """`docker-compose config` of the project's compose file with `env_file` as its .env."""
    return subprocess.run(
        [*COMPOSE, "--env-file", str(env_file), "config"],
        env=outside_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def made_env(tmp_path: Path) -> Path:
    """An .env written by `make compose-env` in a scratch folder."""
    done = make_compose_env(tmp_path)
    assert 0 == done.returncode, done.stderr
    return tmp_path / ".env"


@pytest.fixture
def resolved(made_env: Path) -> dict[str, Any]:
    """The compose file as docker-compose resolves it with the made .env."""
    done = compose_config(made_env)
    assert 0 == done.returncode, done.stderr
    config: dict[str, Any] = yaml.safe_load(done.stdout)
    return config


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
    lua = resources.files("cairn.storage.backends").joinpath("lua")
    names = sorted(p.name for p in lua.iterdir() if p.name.endswith(".lua"))
    expected = ["abort_gc", "beat", "begin_attempt", "claim", "commit_gc", "lg_archive", "lg_put"]
    expected += ["prepare_gc", "raise_epoch", "read_chain", "run_write", "ship_log", "spend"]
    expected += ["step_start", "take_jobs"]
    expected += ["walk_chains", "write_lc", "write_spawned_lc"]
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


def test_compose_has_jaeger_only_in_the_traces_profile(resolved: dict[str, Any]) -> None:
    """Jaeger runs with `--profile traces`, its UI on this host; Cairn exports only when told."""
    raw = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["jaeger"]
    assert ["traces"] == raw["profiles"]
    assert ["127.0.0.1:16686:16686"] == raw["ports"]
    for name in ("coordinator", "worker"):
        assert "" == resolved["services"][name]["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"]


def test_compose_keeps_redis_on_its_network_behind_the_env_password(
    made_env: Path, resolved: dict[str, Any]
) -> None:
    """Redis publishes no port to the host and requires the password from .env.

    Every Cairn service reaches it with that password, and its healthcheck authenticates.
    """
    password = read_env_file(made_env)["CAIRN_REDIS_PASSWORD"]
    raw = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["redis"]
    redis = resolved["services"]["redis"]
    assert "ports" not in raw
    assert "ports" not in redis
    assert password == redis["command"][redis["command"].index("--requirepass") + 1]
    assert password == redis["environment"]["REDISCLI_AUTH"]  # the healthcheck's redis-cli
    cairn = {name: s for name, s in resolved["services"].items() if name not in OTHERS}
    assert {"coordinator", "worker", "console"} <= set(cairn)
    for name, service in cairn.items():
        url = f"redis://:{password}@redis:6379/0"
        assert url == service["environment"]["CAIRN_REDIS_URL"], name


def test_every_cairn_service_gets_the_signing_key_from_the_env(
    made_env: Path, resolved: dict[str, Any]
) -> None:
    """Coordinator, workers and console get CAIRN_SIGNING_KEY from .env, the same for all."""
    key = read_env_file(made_env)["CAIRN_SIGNING_KEY"]
    cairn = {name: s for name, s in resolved["services"].items() if name not in OTHERS}
    assert dict.fromkeys(cairn, key) == {
        name: service["environment"]["CAIRN_SIGNING_KEY"] for name, service in cairn.items()
    }
    assert "CAIRN_CONSOLE_TOKEN" not in resolved["services"]["worker"]["environment"]
    token = read_env_file(made_env)["CAIRN_CONSOLE_TOKEN"]
    assert token == resolved["services"]["console"]["environment"]["CAIRN_CONSOLE_TOKEN"]


@pytest.mark.parametrize("missing", COMPOSE_SECRETS)
def test_compose_refuses_to_start_without_a_secret(
    made_env: Path, tmp_path: Path, missing: str
) -> None:
    """Without one of the .env's secrets (or with it empty), compose stops, naming it."""
    values = read_env_file(made_env)
    for absent in (True, False):
        partial = tmp_path / "partial.env"
        kept = {name: value for name, value in values.items() if name != missing}
        lines = [f"{name}={value}" for name, value in kept.items()]
        partial.write_text("\n".join(lines + ([] if absent else [f"{missing}="])) + "\n")
        done = compose_config(partial)
        assert 0 != done.returncode, done.stdout
        assert missing in done.stderr
        assert "make compose-env" in done.stderr


def test_make_compose_env_writes_fresh_private_secrets(made_env: Path, tmp_path: Path) -> None:
    """`make compose-env` writes .env with mode 0600, a valid signing key and a password.

    A second folder gets other values: the secrets are random, not a shipped default.
    """
    assert 0o600 == stat.S_IMODE(made_env.stat().st_mode)
    values = read_env_file(made_env)
    assert set(COMPOSE_SECRETS) == set(values)
    assert len(values["CAIRN_SIGNING_KEY"].encode()) >= 32
    assert len(values["CAIRN_REDIS_PASSWORD"]) >= 32
    settings = load_settings(signing_key=values["CAIRN_SIGNING_KEY"])
    assert values["CAIRN_SIGNING_KEY"].encode() == settings.key()
    other = tmp_path / "other"
    other.mkdir()
    assert 0 == make_compose_env(other).returncode
    again = read_env_file(other / ".env")
    assert all(values[name] != again[name] for name in COMPOSE_SECRETS)


def test_make_compose_env_never_overwrites_an_existing_env(made_env: Path) -> None:
    """Run again, or over an .env of the user's own, it leaves the file as it is."""
    before = made_env.read_bytes()
    done = make_compose_env(made_env.parent)
    assert 0 == done.returncode, done.stderr
    assert "left as it is" in done.stderr
    assert before == made_env.read_bytes()
    made_env.write_text("MINE=1\n")
    made_env.chmod(0o644)
    assert 0 == make_compose_env(made_env.parent).returncode
    assert "MINE=1\n" == made_env.read_text()
    assert 0o644 == stat.S_IMODE(made_env.stat().st_mode)


def test_the_env_file_stays_out_of_git_and_of_the_image_build() -> None:
    """.env, where `make compose-env` puts the secrets, is ignored by git and by docker build."""
    assert ".env" in (ROOT / ".gitignore").read_text().splitlines()
    assert ".env" in (ROOT / ".dockerignore").read_text().splitlines()


def test_what_the_readme_tours_write_stays_out_of_git() -> None:
    """The tours' `task.export("out/")` and `--html timeline.html` leave the clone clean."""
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert {"/out/", "/timeline.html", "/at-gc-1/"} <= set(ignored)
