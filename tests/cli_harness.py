"""Calling `cairn` in this process, as tests do: `main(argv)` → (exit code, stdout, stderr)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping

import pytest
import structlog

from coordinator.cli import main

Run = Callable[..., tuple[int, str, str]]


@contextlib.contextmanager
def cli_runner(
    env: Mapping[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Iterator[Run]:
    """Yield a caller of `main` with `env` set; structlog's set-up is given back after."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    saved = structlog.get_config()

    def call(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    try:
        yield call
    finally:
        structlog.configure(**saved)  # each command configures logging its own way
