"""One `Settings` for every process: read from `CAIRN_*` in one module, handed down from there."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
import redis
from rq.job import Job

from cairn.coordinator import jobs
from cairn.coordinator.jobs import ALLOWED_JOBS
from cairn.coordinator.settings import load_settings, open_store, process_settings, use_settings
from cairn.coordinator.worker import CairnJob
from cairn.errors import RefusedJob

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("cairn", "coordinator", "agents", "storage")
SETTINGS_MODULE = "coordinator/settings.py"
READERS = {"environ", "environb", "getenv"}
# Modules that copy variables into a child's environment, which is not configuration.
CHILD_ENVIRONMENTS = {
    "agents/tools.py": "run_command's child gets PATH and locale, never the worker's secrets",
}


def _environment_reads(path: Path) -> list[int]:
    """The lines of `path` that touch the process environment (`os.environ`, `os.getenv`)."""
    lines: list[int] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            named = node.value.id == "os" and node.attr in READERS
            lines += [node.lineno] if named else []
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            imported = {alias.name for alias in node.names} & READERS
            lines += [node.lineno] if imported else []
    return lines


def test_no_module_but_the_settings_reads_the_process_environment() -> None:
    """Only `coordinator/settings.py` reads `os.environ`; everything else is handed values."""
    readers = {
        f"{path.relative_to(ROOT)}:{line}"
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        for line in _environment_reads(path)
        if str(path.relative_to(ROOT)) not in {SETTINGS_MODULE, *CHILD_ENVIRONMENTS}
    }
    assert set() == readers
    assert _environment_reads(ROOT / SETTINGS_MODULE), "the settings module is the one reader"


def test_every_process_builds_its_store_in_one_place() -> None:
    """No process path of Cairn (or the chaos harness) assembles a checkpoint store itself."""
    builders = {
        f"{path.relative_to(ROOT)}"
        for folder in (*PACKAGES, "chaos")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if str(path.relative_to(ROOT)) != SETTINGS_MODULE
        and any(
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in {"CheckpointStore", "MeteredStore"}
            for node in ast.walk(ast.parse(path.read_text()))
        )
    }
    assert set() == builders


def test_the_store_signs_audits_and_archives_as_the_settings_say(
    monkeypatch: pytest.MonkeyPatch, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """CAIRN_SIGNING_KEY, CAIRN_AUDIT and CAIRN_ARCHIVE_DIR reach the store `open_store` opens."""
    monkeypatch.setenv("CAIRN_SIGNING_KEY", "s3cret-" + "k" * 32)
    monkeypatch.setenv("CAIRN_AUDIT", "1")
    monkeypatch.setenv("CAIRN_ARCHIVE_DIR", str(tmp_path / "archive"))
    store = open_store(load_settings(), redis_client)
    assert store.codec.signs
    assert store.hot.audit  # type: ignore[attr-defined]  # the Redis hot store's flag
    assert tmp_path / "archive" == store.cold.root  # type: ignore[attr-defined]
    monkeypatch.delenv("CAIRN_SIGNING_KEY")
    monkeypatch.delenv("CAIRN_AUDIT")
    plain = open_store(load_settings(), redis_client)
    assert not plain.codec.signs
    assert not plain.hot.audit  # type: ignore[attr-defined]


def test_the_settings_keep_the_environment_they_were_read_from(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`Settings.environ` is a snapshot: a model's key read later is the one read at entry."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-at-entry")
    settings = load_settings()
    monkeypatch.setenv("OPENAI_API_KEY", "sk-later")
    assert "sk-at-entry" == settings.environ["OPENAI_API_KEY"]
    assert "sk-at-entry" == settings.child_env("redis://127.0.0.1:1/0")["OPENAI_API_KEY"]
    with pytest.raises(TypeError):
        settings.environ["OPENAI_API_KEY"] = "sk-changed"  # type: ignore[index]


def test_job_functions_take_the_settings_their_process_was_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a worker's entry point read is what its jobs use, whatever the variables say later."""
    monkeypatch.setenv("CAIRN_METRICS_PORT", "9400")
    given = load_settings(redis_url="redis://127.0.0.1:7000/0")
    saved = process_settings()
    try:
        use_settings(given)
        monkeypatch.setenv("CAIRN_METRICS_PORT", "9500")
        assert given is process_settings()
        assert 9400 == process_settings().metrics_port
    finally:
        use_settings(saved)


def test_a_worker_runs_cairns_three_job_functions_and_no_other(redis_client: redis.Redis) -> None:
    """Each allowed name is a function of `cairn.coordinator.jobs`; any other name is refused."""
    expected = {
        "cairn.coordinator.jobs.step_job",
        "cairn.coordinator.jobs.stage_job",
        "cairn.coordinator.jobs.verify_job",
    }
    assert expected == ALLOWED_JOBS
    for name in ALLOWED_JOBS:
        module, function = name.rsplit(".", 1)
        assert jobs is importlib.import_module(module)
        assert callable(getattr(jobs, function))
    for name in (
        *ALLOWED_JOBS,
        "cairn.coordinator.restore.stage_job",
        "cairn.coordinator.verify.run_verify",
        "os.system",
    ):
        job = CairnJob(connection=redis_client)  # never saved
        job._func_name = name  # what a job loaded from Redis names
        if name in ALLOWED_JOBS:
            assert callable(job.func)
        else:
            with pytest.raises(RefusedJob):
                _ = job.func
    assert issubclass(CairnJob, Job)
