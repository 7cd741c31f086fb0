"""The specs under examples/ load, and the scripted team runs to success on real workers.

The specs on real models (OpenAI, Anthropic) are only loaded: running them needs a
network and a key.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from cairn.cli.parse import build_parser
from cairn.coordinator.spec import load_spec
from tests.agent_harness import files_of
from tests.cluster import ROOT, Cluster

EXAMPLES = ROOT / "examples"
SPECS = sorted(p for p in EXAMPLES.iterdir() if p.suffix in {".yaml", ".yml", ".json"})


def test_there_are_the_three_example_specs() -> None:
    """The scripted team and the same team on an OpenAI-compatible model and on Claude."""
    assert {"team.yaml", "team-openai.yaml", "team-anthropic.yaml"} <= {p.name for p in SPECS}


@pytest.mark.parametrize("path", SPECS, ids=[p.name for p in SPECS])
def test_every_example_spec_loads(path: Path) -> None:
    """Each spec is valid and its workspace can be read."""
    spec = load_spec(path)
    assert spec.workspace_files(path.parent)
    assert spec.verify


@pytest.mark.parametrize(("name", "provider"), [("openai", "openai:"), ("anthropic", "anthropic:")])
def test_the_real_model_teams_are_the_scripted_team(name: str, provider: str) -> None:
    """Same task, files, verify and agents; a model and a prompt instead of scripts."""
    scripted = load_spec(EXAMPLES / "team.yaml")
    real = load_spec(EXAMPLES / f"team-{name}.yaml")
    assert (scripted.goal, scripted.files, scripted.verify) == (
        real.goal,
        real.files,
        real.verify,
    )
    assert [a.name for a in scripted.agents] == [a.name for a in real.agents]
    for agent in real.agents:
        assert agent.model.startswith(provider)
        assert not agent.script
        assert len(agent.system) > 100  # enough for a real model to know its part


def test_the_scripted_team_succeeds_on_two_workers(cluster: Cluster) -> None:
    """The planner, coder and reviewer fix the bug; `verify` passes; the files show it."""
    cluster.start_worker()
    cluster.start_worker()
    path = EXAMPLES / "team.yaml"
    task = cluster.tasks.submit(load_spec(path), base=path.parent)
    status = cluster.drive(task, timeout=30)
    assert "succeeded" == status["status"], status
    gc = cluster.store.latest_gc(task)
    assert gc is not None
    files = files_of(cluster.store, gc)
    assert b"return len(text.split())" in files["words.py"]
    written = {name for name in files if not name.startswith("__pycache__/")}  # tests ran
    assert {"PLAN.md", "REVIEW.md", "test_words.py", "words.py"} == written
    assert load_spec(path).files["test_words.py"].encode() == files["test_words.py"]


# The compose network's Redis, with the password from .env (`make compose-env`).
REDIS_URL = re.compile(r"redis://:\$\{CAIRN_REDIS_PASSWORD:\?[^}]*\}@redis:6379/0")


def test_the_compose_services_run_real_cairn_commands_and_share_the_archive() -> None:
    """docker-compose.yml: commands the CLI accepts, one archive volume, Redis with AOF."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    redis = services["redis"]
    assert ["--appendonly", "yes", "--appendfsync", "everysec"] == redis["command"][1:5]
    assert "redis-cli ping" in " ".join(redis["healthcheck"]["test"])
    for name in ("coordinator", "worker"):
        service = services[name]
        assert "cairn" == service["command"][0]
        assert name == build_parser().parse_args(service["command"][1:]).command
        assert REDIS_URL.fullmatch(service["environment"]["CAIRN_REDIS_URL"])
        assert "archive:/data/archive" in service["volumes"]
        assert "service_healthy" == service["depends_on"]["redis"]["condition"]
        assert "container_name" not in service  # `--scale worker=N` needs none
    assert {"redis-data", "archive"} == set(compose["volumes"])
    assert 'CMD ["cairn", "coordinator"]' in (ROOT / "Dockerfile").read_text()
    console = services["console"]
    assert "console" == build_parser().parse_args(console["command"][1:]).command
    assert ["console"] == console["profiles"]  # started only when asked for
    assert ["127.0.0.1:8737:8737"] == console["ports"]
    assert "CAIRN_CONSOLE_TOKEN" in console["environment"]
    assert REDIS_URL.fullmatch(console["environment"]["CAIRN_REDIS_URL"])
    assert "CAIRN_CONSOLE_TOKEN" not in services["worker"]["environment"]
    assert "'.[console,otel]'" in (ROOT / "Dockerfile").read_text()  # and traces
