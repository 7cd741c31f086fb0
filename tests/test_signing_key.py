"""A weak or empty `CAIRN_SIGNING_KEY` stops every Cairn process at its start.

A key shorter than 32 bytes can be guessed, and an empty one set on purpose is most often
a secret that never reached the process: either way records would be signed with nothing
worth the name, so each entry point refuses it in one line, exit 2, before touching Redis.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cairn import Client
from cairn.coordinator.settings import load_settings
from cairn.errors import InvalidSpec
from cairn.testing.redis_server import RedisServer
from tests.cluster import ROOT

SHORT_KEY = "short-signing-key-" + "k" * 13  # 31 bytes: one short
GOOD_KEY = "k" * 32
BIN = Path(sys.executable).parent
PROCESSES = {
    "cli": [sys.executable, "-m", "cairn.cli", "status", "some-task"],
    "coordinator": [sys.executable, "-m", "cairn.coordinator"],
    "worker": [sys.executable, "-m", "cairn.coordinator.worker", "--burst"],
    "rq worker": [
        str(BIN / "rq"),
        "worker",
        "--burst",
        "-w",
        "cairn.coordinator.worker.CairnWorker",
        "-j",
        "cairn.coordinator.worker.CairnJob",
        "-S",
        "rq.serializers.JSONSerializer",
        "cairn-steps",
    ],
}


@pytest.fixture
def no_key(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No CAIRN_* from the outside; a scratch state directory."""
    for name in [n for n in os.environ if n.startswith("CAIRN_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("CAIRN_STATE_DIR", str(tmp_path / "state"))


@pytest.mark.usefixtures("no_key")
@pytest.mark.parametrize("key", ["Ω", SHORT_KEY], ids=["2 bytes in 1 character", "31 bytes"])
def test_a_signing_key_under_32_bytes_is_refused_without_showing_it(
    monkeypatch: pytest.MonkeyPatch, key: str
) -> None:
    """The settings refuse a short key, naming the variable and how to make a good one."""
    monkeypatch.setenv("CAIRN_SIGNING_KEY", key)
    with pytest.raises(InvalidSpec) as refused:
        load_settings()
    message = str(refused.value)
    assert message.startswith("invalid setting CAIRN_SIGNING_KEY: ")
    assert f"at least 32 bytes, not {len(key.encode())}" in message
    assert "openssl rand -hex 32" in message
    assert key not in message


@pytest.mark.usefixtures("no_key")
def test_an_empty_signing_key_set_explicitly_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """`CAIRN_SIGNING_KEY=` is refused, saying it is empty, not read as 'do not sign'."""
    monkeypatch.setenv("CAIRN_SIGNING_KEY", "")
    with pytest.raises(InvalidSpec, match=r"CAIRN_SIGNING_KEY: .*set but empty"):
        load_settings()


@pytest.mark.usefixtures("no_key")
def test_a_32_byte_key_signs_and_an_unset_one_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """32 bytes is enough; with the variable unset, records are hashed, not signed."""
    assert load_settings().key() is None
    monkeypatch.setenv("CAIRN_SIGNING_KEY", GOOD_KEY)
    assert GOOD_KEY.encode() == load_settings().key()


@pytest.mark.usefixtures("no_key")
def test_the_client_refuses_a_short_signing_key(
    monkeypatch: pytest.MonkeyPatch, redis_server: RedisServer
) -> None:
    """`cairn.Client()` raises `InvalidSpec` for a short key, even with its Redis answering."""
    monkeypatch.setenv("CAIRN_SIGNING_KEY", SHORT_KEY)
    with pytest.raises(InvalidSpec, match=r"CAIRN_SIGNING_KEY: .*at least 32 bytes"):
        Client(redis_server.url)


@pytest.mark.parametrize("key", [SHORT_KEY, ""], ids=["short", "empty"])
@pytest.mark.parametrize("process", list(PROCESSES))
def test_every_process_refuses_a_weak_signing_key_at_start_in_one_line(
    redis_server: RedisServer, tmp_path: Path, process: str, key: str
) -> None:
    """Each entry point exits 2 with one line naming the variable, and no traceback.

    The CLI, `python -m cairn.coordinator`, `python -m cairn.coordinator.worker`, stock `rq worker`
    with Cairn's worker class. Their Redis answers: without the check each would start
    and serve with that key.
    """
    env = {name: value for name, value in os.environ.items() if not name.startswith("CAIRN_")}
    env |= {
        "PYTHONPATH": str(ROOT),
        "CAIRN_SIGNING_KEY": key,
        "CAIRN_REDIS_URL": redis_server.url,
        "RQ_REDIS_URL": redis_server.url,
        "CAIRN_STATE_DIR": str(tmp_path / "state"),
    }
    try:
        done = subprocess.run(
            PROCESSES[process], env=env, capture_output=True, text=True, timeout=60, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"{process} started with a weak key: {exc.stderr!r}") from None
    lines = done.stderr.strip().splitlines()
    assert 2 == done.returncode, done.stderr
    assert 1 == len(lines), done.stderr
    assert "CAIRN_SIGNING_KEY" in lines[0]
    assert "Traceback" not in done.stderr
