"""Files a user hands Cairn are bounded before they are built: size, values, no YAML aliases.

The bombs run `cairn` as a process under a 1 GiB address-space cap, as a small machine
would: an input that expands past it ends in a MemoryError, or worse, not in one line.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cairn.agents.accounting import load_prices
from cairn.agents.spec import StepPolicy, load_policy
from cairn.agents.userfiles import MAX_VALUES
from cairn.coordinator.spec import MAX_SPEC_BYTES, TaskSpec, load_spec
from cairn.errors import InvalidSpec
from cairn.testing.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[1]
CAP = 1 << 30  # bytes of address space the process may take


def _laughs(levels: int = 9) -> str:
    """A YAML flow mapping in which each level is nine aliases of the one before it."""
    parts = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    parts += [f"a{n}: &a{n} [{','.join([f'*a{n - 1}'] * 9)}]" for n in range(1, levels)]
    return "{" + ", ".join(parts) + "}"


# The same bomb where a spec holds JSON the user chose: an agent's params, a turn's args.
BOMBS = {
    "params": (
        f"name: bomb\ngoal: g\nagents:\n  - name: a\n    model: scripted\n    params: {_laughs()}\n"
    ),
    "args": (
        "name: bomb\ngoal: g\nagents:\n  - name: a\n    model: scripted\n    script:\n"
        "      - tools:\n"
        f"          - {{name: read_file, args: {_laughs()}}}\n"
    ),
}


def _capped() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))


def cairn_capped(
    tmp_path: Path, server: RedisServer, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run `cairn ARGS` as a process of its own, its memory capped at `CAP`."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("CAIRN_")}
    return subprocess.run(
        [sys.executable, "-m", "cairn.cli", *args],
        env={
            **base,
            "PYTHONPATH": str(ROOT),
            "CAIRN_REDIS_URL": server.url,
            "CAIRN_STATE_DIR": str(tmp_path / "state"),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
        preexec_fn=_capped,
    )


def assert_refused(done: subprocess.CompletedProcess[str], *words: str) -> None:
    """Exit 2 with one line on stderr naming `words`, no traceback."""
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert 2 == done.returncode, done.stderr[-2000:]
    assert 1 == len(lines), done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    for word in words:
        assert word in lines[0]


@pytest.mark.parametrize("where", sorted(BOMBS))
def test_a_yaml_alias_bomb_is_refused_in_one_line(
    tmp_path: Path, redis_server: RedisServer, where: str
) -> None:
    """Nested YAML aliases in params or a turn's args: exit 2 naming the alias, in 1 GiB."""
    spec = tmp_path / "bomb.yaml"
    spec.write_text(BOMBS[where])
    done = cairn_capped(tmp_path, redis_server, "submit", str(spec))
    assert_refused(done, str(spec), "aliases", "not allowed")


def test_dev_zero_as_a_spec_is_refused_in_one_line(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """`cairn submit /dev/zero` reads no more than the limit: exit 2, in 1 GiB."""
    done = cairn_capped(tmp_path, redis_server, "submit", "/dev/zero")
    assert_refused(done, "/dev/zero", f"over {MAX_SPEC_BYTES} bytes")


def test_a_spec_of_small_values_up_to_the_size_limit_is_refused(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """16 MiB of `[],` in YAML (a kilobyte each to PyYAML) is refused by count, in 1 GiB."""
    spec = tmp_path / "flood.yaml"
    head = "name: flood\ngoal: g\nagents: [{name: a, model: scripted, params: {p: ["
    count = (MAX_SPEC_BYTES - len(head) - 10) // 3
    spec.write_text(head + "[]," * count + "[]]}}]\n")
    done = cairn_capped(tmp_path, redis_server, "submit", str(spec))
    assert_refused(done, f"more than {MAX_VALUES} values")


def _script(fmt: str, turns: int) -> str:
    """A valid spec whose agent's script is `turns` empty turns, as YAML or JSON."""
    if fmt == "json":
        empty = ",".join(["{}"] * turns)
        agent = f'{{"name": "a", "model": "scripted", "script": [{empty}]}}'
        return f'{{"name": "t", "goal": "g", "agents": [{agent}]}}'
    return (
        "name: t\ngoal: g\nagents:\n  - name: a\n    model: scripted\n    script:\n"
        + "      - {}\n" * turns
    )


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_a_spec_of_more_values_than_allowed_is_refused(tmp_path: Path, fmt: str) -> None:
    """A spec otherwise valid (a script of empty turns) is refused past `MAX_VALUES` values."""
    spec = tmp_path / f"long.{fmt}"
    spec.write_text(_script(fmt, 10))
    assert 10 == len(load_spec(spec).agents[0].script)
    spec.write_text(_script(fmt, MAX_VALUES))
    with pytest.raises(InvalidSpec, match=f"more than {MAX_VALUES} values"):
        load_spec(spec)


def test_a_spec_over_the_size_limit_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    """A file one byte over `MAX_SPEC_BYTES` is refused for its size, whatever it holds."""
    spec = tmp_path / "big.json"
    agents = '"agents": [{"name": "a", "model": "scripted"}]'
    head = '{"name": "big", "goal": "g", ' + agents + ', "files": {"a.txt": "'
    spec.write_text(head + "x" * (MAX_SPEC_BYTES - len(head) - 3) + '"}}')
    assert MAX_SPEC_BYTES == spec.stat().st_size
    assert isinstance(load_spec(spec), TaskSpec)  # at the limit: read
    with spec.open("a") as grown:
        grown.write("\n")
    with pytest.raises(InvalidSpec, match=f"is over {MAX_SPEC_BYTES} bytes"):
        load_spec(spec)


HARMLESS_ALIASES = {
    "shared prompt": (
        "name: t\ngoal: &g Count.\nagents:\n  - {name: a, system: *g, model: scripted}\n",
        4,
        23,
    ),
    "merge key": (
        "name: t\ngoal: g\nagents:\n  - &a {name: a, model: scripted}\n  - {<<: *a, name: b}\n",
        5,
        10,
    ),
}


@pytest.mark.parametrize("case", sorted(HARMLESS_ALIASES))
def test_an_alias_is_refused_where_the_spec_would_be_valid(tmp_path: Path, case: str) -> None:
    """An alias is refused even where it is harmless (a shared prompt, a merge key)."""
    text, line, column = HARMLESS_ALIASES[case]
    spec = tmp_path / "alias.yaml"
    spec.write_text(text)
    with pytest.raises(InvalidSpec, match=f"line {line}, column {column}: aliases"):
        load_spec(spec)
    assert TaskSpec.model_validate(yaml.safe_load(text))  # valid, its aliases expanded


def test_a_price_table_is_bounded_like_a_spec(tmp_path: Path, redis_server: RedisServer) -> None:
    """`CAIRN_PRICES` as /dev/zero or an alias bomb: `cairn submit` exits 2, in 1 GiB."""
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: t\ngoal: g\nagents: [{name: a, model: scripted}]\n")
    done = cairn_capped(tmp_path, redis_server, "submit", str(spec), CAIRN_PRICES="/dev/zero")
    assert_refused(done, "price table /dev/zero is over")
    bomb = tmp_path / "prices.yaml"
    bomb.write_text(_laughs())
    done = cairn_capped(tmp_path, redis_server, "submit", str(spec), CAIRN_PRICES=str(bomb))
    assert_refused(done, "price table", "aliases")
    with pytest.raises(InvalidSpec, match="aliases"):
        load_prices(bomb)


def test_an_mcp_config_is_read_up_to_its_limit(tmp_path: Path, redis_server: RedisServer) -> None:
    """`cairn worker --mcp-config /dev/zero` exits 2 in one line, in 1 GiB."""
    done = cairn_capped(tmp_path, redis_server, "worker", "--mcp-config", "/dev/zero")
    assert_refused(done, "MCP config /dev/zero", "over")


def test_an_alias_in_a_policy_is_refused() -> None:
    """A step policy's YAML may not use aliases either."""
    text = "full_every: &n 60\ntriggers: {model_reply: true}\nheartbeat_ms: *n\n"
    assert StepPolicy.model_validate(yaml.safe_load(text))  # valid, its alias expanded
    with pytest.raises(InvalidSpec, match="aliases"):
        load_policy(text)
