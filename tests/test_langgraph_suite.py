"""LangGraph's own test suite on CairnSaver: every one of its tests that takes a checkpointer.

The suite is the tests of the installed langgraph's sdist (`make install` and `make test`
unpack them); it runs once for this module, in a subprocess on a private redis-server
(`tests/langgraph_suite.py`). A test of theirs may fail on CairnSaver only if EXCLUDED
names it, with the reason. Set CAIRN_LANGGRAPH_SUITE_BASELINE=1 to also run the whole
selection on LangGraph's `InMemorySaver` fixture (another ~70 s; not in CI).
"""

from __future__ import annotations

import os

import pytest

from tests import langgraph_suite
from tests.conftest import LANGGRAPH_SUITE
from tests.langgraph_suite import Outcome, SuiteRun, describe, on_memory

BUG = "CairnSaver bug being fixed"
# Upstream's timing tests: they may fail on a busy machine whatever the saver, so neither
# outcome is judged, but each must still exist.
WALL_CLOCK = "asserts when each chunk arrives, to 0.1 s of wall clock"
MAY_PASS = frozenset({WALL_CLOCK})

# Their tests that may fail on CairnSaver: node id (as a failure message below, or
# `.venv/bin/python -m tests.langgraph_suite run`, prints it) → why. When a fix lands, its
# tests pass and the stale-exclusion test names the lines to delete here.
EXCLUDED: dict[str, str] = {
    "tests/test_pregel.py::test_stream_subgraphs_during_execution[cairn]": WALL_CLOCK,
    "tests/test_pregel.py::test_stream_buffering_single_node[cairn]": WALL_CLOCK,
    "tests/test_pregel_async.py::test_stream_subgraphs_during_execution[cairn]": WALL_CLOCK,
    "tests/test_pregel_async.py::test_stream_buffering_single_node[cairn]": WALL_CLOCK,
}

MIN_RAN = 600  # 648 of langgraph 1.2.22's tests take a checkpointer (and run here)
BASELINE_VARIABLE = "CAIRN_LANGGRAPH_SUITE_BASELINE"

# The run takes about 70 s on 2 cores; its own limit is the subprocess's.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(langgraph_suite.RUN_TIMEOUT + 120)]


@pytest.fixture(scope="module")
def on_cairn(request: pytest.FixtureRequest) -> SuiteRun:
    """One run of LangGraph's suite on CairnSaver, shared by this module's tests.

    The run the session started in the background (tests/conftest.py), else one now.
    """
    started = request.config.stash.get(LANGGRAPH_SUITE, None)
    if started is not None:
        del request.config.stash[LANGGRAPH_SUITE]
    run = started.finish() if started is not None else langgraph_suite.run("cairn")
    print(run.summary())
    return run


def test_langgraphs_tests_pass_on_cairnsaver_unless_excluded(on_cairn: SuiteRun) -> None:
    """Every test of theirs that takes a checkpointer passes on CairnSaver, or is EXCLUDED."""
    unexpected = {
        node: on_cairn.results[node].detail
        for node in on_cairn.ids(Outcome.FAILED)
        if node not in EXCLUDED
    }
    if unexpected:  # their tracebacks, not this test's, say what went wrong
        lines = "\n".join(f'    "{node}": BUG,' for node in unexpected)
        pytest.fail(
            f"{len(unexpected)} of LangGraph's tests fail on CairnSaver ({on_cairn.summary()}):\n"
            f"{describe(unexpected)}\nto exclude them while a fix is made, add to EXCLUDED:\n"
            f"{lines}",
            pytrace=False,
        )


def test_every_exclusion_names_a_test_that_still_fails(on_cairn: SuiteRun) -> None:
    """An EXCLUDED test must exist and still fail: a stale line would hide a regression."""
    gone = [node for node in EXCLUDED if node not in on_cairn.results]
    passed = on_cairn.ids(Outcome.PASSED)
    fixed = [node for node, why in EXCLUDED.items() if node in passed and why not in MAY_PASS]
    skipped = [node for node in EXCLUDED if node in on_cairn.ids(Outcome.SKIPPED)]
    unexplained = [node for node, reason in EXCLUDED.items() if not reason.strip()]
    stale = {"no longer in the suite": gone, "passes now": fixed, "skipped": skipped,
             "excluded without a reason": unexplained}  # fmt: skip
    found = {why: nodes for why, nodes in stale.items() if nodes}
    listed = "\n".join(f"  {why}: {node}" for why, nodes in found.items() for node in nodes)
    if found:
        pytest.fail(
            f"delete (or give a reason to) these lines of EXCLUDED:\n{listed}", pytrace=False
        )


def test_langgraphs_suite_ran_its_checkpointer_tests(on_cairn: SuiteRun) -> None:
    """The selection is not silently empty: hundreds of their tests ran on CairnSaver."""
    ran = len(on_cairn.ids(Outcome.PASSED)) + len(on_cairn.ids(Outcome.FAILED))
    assert ran >= MIN_RAN, f"only {ran} of LangGraph's tests ran ({on_cairn.summary()})"


@pytest.mark.skipif(
    os.environ.get(BASELINE_VARIABLE) != "1", reason=f"the baseline runs with {BASELINE_VARIABLE}=1"
)
def test_inmemorysaver_fails_only_what_exclusions_say(on_cairn: SuiteRun) -> None:
    """The same tests on InMemorySaver: none fails there but the wall-clock ones."""
    baseline = langgraph_suite.run("memory")
    print(f"{baseline.summary()}\n{on_cairn.summary()}")
    as_on_cairn = {on_memory(node): node for node in on_cairn.results}
    assert set(as_on_cairn) == set(baseline.results), "both savers ran the same tests"
    may_fail = {node for node, reason in EXCLUDED.items() if reason in MAY_PASS}
    unexpected = {node: baseline.results[node].detail for node in baseline.ids(Outcome.FAILED)
                  if as_on_cairn[node] not in may_fail}  # fmt: skip
    assert not unexpected, f"fail on InMemorySaver:\n{describe(unexpected)}"


def test_an_id_on_memory_changes_only_the_savers_parameter() -> None:
    """`cairn` becomes `memory`; their cache's own `memory` parameter stays as it is."""
    assert "tests/t.py::f[memory-memory]" == on_memory("tests/t.py::f[cairn-memory]")
    assert "tests/t.py::f[sync-memory-3]" == on_memory("tests/t.py::f[sync-cairn-3]")
    assert "tests/t.py::f" == on_memory("tests/t.py::f")
