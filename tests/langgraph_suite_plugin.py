"""A pytest plugin for LangGraph's own test suite: its checkpointer fixtures on CairnSaver.

Loaded only inside the scratch copy of LangGraph's tests that `tests/langgraph_suite.py`
prepares: copied there beside their `tests/`, enabled with `-p langgraph_suite_plugin`,
and bound in their `tests/conftest.py` by one appended import line. The line is needed
because pytest takes a fixture from the test's own conftest before any plugin's, so only
names bound in that conftest replace `sync_checkpointer` and `async_checkpointer`.

The saver comes from the environment the runner sets: `cairn` (`cairn.langgraph.CairnSaver`
on the runner's private redis-server, flushed for every use, with an archive directory of
the test's own) or `memory` (LangGraph's own `InMemorySaver` fixture, the baseline).
Each fixture has the saver's name as its one parameter, so it is in every test id, as
upstream's are (`test_x[cairn-sync]`; `[memory...]` is the id their snapshots are stored
under, and they compare them only on `InMemorySaver`).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import BaseCheckpointSaver

SAVER_VARIABLE = "CAIRN_LANGGRAPH_SUITE_SAVER"  # "cairn" or "memory"
REDIS_VARIABLE = "CAIRN_LANGGRAPH_SUITE_REDIS"  # the private server's URL, for "cairn"
CHECKPOINTER_FIXTURES = frozenset({"sync_checkpointer", "async_checkpointer"})
SAVER = os.environ.get(SAVER_VARIABLE, "cairn")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep only the tests that take a checkpointer: the others never touch a saver."""
    kept = [item for item in items if CHECKPOINTER_FIXTURES & set(_fixtures_of(item))]
    dropped = [item for item in items if item not in kept]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = kept


def _fixtures_of(item: pytest.Item) -> list[str]:
    names: list[str] = getattr(item, "fixturenames", [])  # every fixture it needs, transitively
    return names


def _saver(kind: str, tmp_path: Path) -> Iterator[BaseCheckpointSaver[Any]]:
    """A fresh saver of `kind`, on an empty database."""
    if kind == "memory":
        # Their own fixture's saver (an `InMemorySaver` that also checks that checkpoints are
        # never mutated), from their module, which exists only in the suite's copy.
        theirs: Any = importlib.import_module("tests.conftest_checkpointer")
        with theirs._checkpointer_memory() as saver:
            yield saver
        return
    if kind != "cairn":
        raise ValueError(f"{SAVER_VARIABLE} must be cairn or memory, not {kind!r}")
    from cairn.langgraph import CairnSaver  # noqa: PLC0415 - only the `cairn` kind needs it
    from cairn.storage.backends.redis import connect  # noqa: PLC0415

    client = connect(os.environ[REDIS_VARIABLE])
    client.flushdb()  # every use starts from nothing, whatever the last test left
    try:
        yield CairnSaver(client, tmp_path / "cairn-archive")
    finally:
        client.close()


@pytest.fixture(params=[SAVER])
def sync_checkpointer(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[BaseCheckpointSaver[Any]]:
    """The saver under test, fresh for this test (LangGraph's tests call it sync)."""
    yield from _saver(request.param, tmp_path)


@pytest.fixture(params=[SAVER])
def async_checkpointer(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[BaseCheckpointSaver[Any]]:
    """The saver under test, fresh for this test (LangGraph's tests call it async)."""
    yield from _saver(request.param, tmp_path)
