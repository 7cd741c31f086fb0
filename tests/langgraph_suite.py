"""LangGraph's own test suite, run on CairnSaver: fetched once, run in a scratch copy.

LangGraph's wheel carries no tests; its sdist does, and many of them take a checkpointer
fixture (`sync_checkpointer`, `async_checkpointer`) that upstream parametrizes over its own
savers. `fetch()` (run by `make install` and `make test`, never by a test) downloads the
sdist of the installed langgraph with pip and unpacks its `tests/` and `pyproject.toml` in
`<venv>/langgraph-suite/langgraph-<version>/`. `run()` copies that into a scratch
directory, points the two fixtures at the saver asked for (`tests/langgraph_suite_plugin.py`),
starts a private redis-server on a free port, runs pytest in a subprocess with JUnit XML
output and returns each test's outcome. Only the tests that take a checkpointer run.

    .venv/bin/python -m tests.langgraph_suite fetch
    .venv/bin/python -m tests.langgraph_suite run [--saver memory] [NODE_ID ...]

`tests/test_langgraph_suite.py` is the test that runs it in Cairn's suite.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from importlib.metadata import version
from pathlib import Path
from typing import IO, cast

from cairn.testing.redis_server import RedisServer
from tests.langgraph_suite_plugin import REDIS_VARIABLE, SAVER_VARIABLE

SAVERS = ("cairn", "memory")
PLUGIN = Path(__file__).with_name("langgraph_suite_plugin.py")
# Bound last in their conftest: a fixture in the test's own conftest beats every plugin's,
# so this is the one place the replacements can take effect (langgraph_suite_plugin.py).
CONFTEST_LINE = (
    "\n\n# Cairn: the checkpointer fixtures replaced by the saver under test.\n"
    f"from {PLUGIN.stem} import async_checkpointer, sync_checkpointer  # noqa: E402, F401\n"
)
TEST_TIMEOUT = 120  # seconds, for one of their tests (pytest-timeout)
RUN_TIMEOUT = 1_200  # seconds, for the whole run: about 70 s on 2 cores
PYTEST_ARGS = (
    "-q", "--no-header", "-p", "no:cacheprovider", "-p", PLUGIN.stem,
    # Their addopts without --full-trace: a failure's traceback is short enough to read in
    # an assertion message. Syrupy must not fail the run over the snapshots of the tests
    # that do not take a checkpointer, which are deselected.
    "-o", "addopts=--strict-markers --strict-config --snapshot-warn-unused --tb=short",
    "-o", f"timeout={TEST_TIMEOUT}", "-o", "junit_family=xunit1",  # xunit1 names the file
)  # fmt: skip


class SuiteError(Exception):
    """Raised when LangGraph's suite cannot be fetched or run to its end."""


class Outcome(str, Enum):
    """How one of LangGraph's tests ended; an error in a fixture counts as a failure."""

    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"


@dataclass(frozen=True, slots=True)
class TestResult:
    """One test's outcome, with its short traceback (or why it was skipped)."""

    __test__ = False  # a record, not a test class for pytest to collect

    outcome: Outcome
    detail: str = ""


@dataclass(frozen=True, slots=True)
class SuiteRun:
    """What one run of the suite gave: node id → result, on the saver named."""

    saver: str
    results: dict[str, TestResult]
    seconds: float

    def ids(self, outcome: Outcome) -> list[str]:
        """The node ids of the tests that ended with `outcome`, in the order they ran."""
        return [node for node, result in self.results.items() if result.outcome is outcome]

    def summary(self) -> str:
        """One line: the counts of each outcome and the time the run took."""
        counts = ", ".join(f"{len(self.ids(o))} {o.value}" for o in Outcome)
        return f"LangGraph's suite on {self.saver}: {counts} in {self.seconds:.0f} s"


def on_memory(node: str) -> str:
    """`node`'s id in a run on memory: `t[cairn-sync]` is `t[memory-sync]` there.

    Only this way round: `memory` is also a parameter of other fixtures of theirs (their
    cache), so `t[memory-memory]` cannot be told back, but `cairn` is no one else's.
    """
    name, bracket, params = node.partition("[")
    if not bracket:
        return node
    parts = params.removesuffix("]").split("-")
    return f"{name}[{'-'.join('memory' if p == 'cairn' else p for p in parts)}]"


def suites_directory() -> Path:
    """Where `fetch` unpacks suites: beside the environment's packages, one per version."""
    return Path(sys.prefix) / "langgraph-suite"


def suite_directory() -> Path:
    """The unpacked suite of the installed langgraph (which may not be there yet)."""
    return suites_directory() / f"langgraph-{version('langgraph')}"


def fetch() -> Path:
    """Unpack the installed langgraph's tests from its sdist, downloaded by pip unless there.

    Only setup (make) calls this: a test that finds no suite fails and says to run it.
    Other versions' suites are removed.
    """
    target = suite_directory()
    if not (target / "tests" / "conftest.py").is_file():
        shutil.rmtree(target, ignore_errors=True)  # an unpacking cut short
        suites_directory().mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=suites_directory()) as work:
            _unpack(_download(Path(work)), target)
    for other in suites_directory().glob("langgraph-*"):
        if other != target:
            shutil.rmtree(other)
    return target


def _download(work: Path) -> Path:
    """The sdist of the installed langgraph, downloaded by pip into `work`."""
    wanted = f"langgraph=={version('langgraph')}"
    download = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                "--no-binary", ":all:", "--dest", str(work), wanted]  # fmt: skip
    if subprocess.run(download, check=False).returncode != 0:
        raise SuiteError(f"pip could not download the sdist of {wanted} (see above)")
    found = sorted(work.glob("langgraph-*.tar.gz"))
    if len(found) != 1:
        raise SuiteError(f"pip download of {wanted} left {[p.name for p in found]}")
    return found[0]


def _unpack(sdist: Path, target: Path) -> None:
    """Unpack `sdist`'s tests/ and pyproject.toml as `target` (renamed there when whole)."""
    with tarfile.open(sdist) as archive:
        top = archive.getnames()[0].split("/")[0]  # langgraph-<version>
        wanted = (f"{top}/tests/", f"{top}/pyproject.toml")
        members = [m for m in archive.getmembers() if m.name.startswith(wanted)]
        # The "data" filter refuses links, devices and paths that would leave the folder.
        archive.extractall(sdist.parent, members=members, filter="data")
    unpacked = sdist.parent / top
    if not (unpacked / "tests" / "conftest.py").is_file():
        raise SuiteError(f"{sdist.name} holds no tests/conftest.py")
    unpacked.rename(target)


def prepare(scratch: Path) -> Path:
    """Copy the unpacked suite into `scratch` with the fixtures replaced; return the copy."""
    suite = suite_directory()
    if not (suite / "tests" / "conftest.py").is_file():
        raise SuiteError(
            f"LangGraph's test suite is not unpacked in {suite}: run `make install` "
            "(or .venv/bin/python -m tests.langgraph_suite fetch)"
        )
    copy = scratch / "suite"
    shutil.copytree(suite, copy, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(PLUGIN, copy / PLUGIN.name)
    conftest = copy / "tests" / "conftest.py"
    text = conftest.read_text()
    missing = [f for f in ("sync_checkpointer", "async_checkpointer") if f"def {f}(" not in text]
    if missing:  # a new langgraph moved them: the replacement would silently not apply
        raise SuiteError(f"{conftest.name} of {suite.name} defines no {', '.join(missing)}")
    conftest.write_text(text + CONFTEST_LINE)
    return copy


def run(saver: str = "cairn", tests: Sequence[str] = (), *, keep: Path | None = None) -> SuiteRun:
    """Run the suite's checkpointer tests (or the node ids `tests`) on `saver`.

    `saver` is `cairn` (CairnSaver on a private redis-server) or `memory` (LangGraph's
    `InMemorySaver` fixture). Raises `SuiteError` unless pytest ran to its end; a test
    that fails is a result, not an error. With `keep`, the scratch copy is made there and
    left for a look.
    """
    return start(saver, tests, keep=keep).finish()


def start(
    saver: str = "cairn", tests: Sequence[str] = (), *, keep: Path | None = None, nice: int = 0
) -> Running:
    """`run`, started: pytest runs in its subprocess until `finish()` waits for it.

    With `nice`, the subprocess runs at that lower priority: started early beside Cairn's
    own tests, it takes only the CPU they leave idle while they wait on their processes.
    """
    if saver not in SAVERS:
        raise SuiteError(f"saver must be one of {', '.join(SAVERS)}, not {saver!r}")
    temporary = None if keep else tempfile.TemporaryDirectory(prefix="cairn-langgraph-suite-")
    scratch = keep or Path(cast(tempfile.TemporaryDirectory[str], temporary).name)
    try:
        copy = prepare(scratch)
        server = RedisServer(scratch / "redis").start()
    except BaseException:
        if temporary is not None:
            temporary.cleanup()
        raise
    running = Running(saver, copy, scratch / "junit.xml", scratch / "pytest.out", server,
                      temporary)  # fmt: skip
    with running.output.open("w") as output:  # the child holds its own descriptor
        running.process = _pytest(copy, saver, server.url, running.report, output, tests, nice)
    return running


@dataclass(slots=True)
class Running:
    """One run of the suite under way: its subprocess, its Redis and its scratch copy."""

    saver: str
    copy: Path
    report: Path
    output: Path  # what pytest printed: a file, as nobody reads a pipe while it runs
    server: RedisServer
    temporary: tempfile.TemporaryDirectory[str] | None
    process: subprocess.Popen[str] | None = None
    started: float = field(default_factory=time.monotonic)

    def finish(self) -> SuiteRun:
        """Wait for pytest (up to `RUN_TIMEOUT` from the start) and read what it reported.

        Raises `SuiteError` unless pytest ran to its end. Stops the Redis and removes the
        scratch copy (unless it was to be kept), whatever happens.
        """
        assert self.process is not None
        try:
            left = max(1.0, RUN_TIMEOUT - (time.monotonic() - self.started))
            try:
                self.process.wait(timeout=left)
            except subprocess.TimeoutExpired as exc:
                raise SuiteError(
                    f"LangGraph's suite ran past {RUN_TIMEOUT} s in {self.copy}"
                ) from exc
            seconds = time.monotonic() - self.started
            # 0: all passed, 1: some failed; anything else (a collection error, no tests, an
            # internal error) means the results would not say what the suite says.
            if self.process.returncode not in (0, 1) or not self.report.is_file():
                said = self.output.read_text(errors="replace")
                tail = "\n".join(said.strip().splitlines()[-15:])
                raise SuiteError(
                    f"pytest in {self.copy} ended with exit {self.process.returncode}:\n{tail}"
                )
            return SuiteRun(self.saver, read_junit(self.report), seconds)
        finally:
            self.stop()

    def stop(self) -> None:
        """End pytest if it still runs, stop the Redis, remove the scratch copy."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.server.stop()
        if self.temporary is not None:
            self.temporary.cleanup()
            self.temporary = None


def _pytest(
    copy: Path,
    saver: str,
    url: str,
    report: Path,
    output: IO[str],
    tests: Sequence[str],
    nice: int = 0,
) -> subprocess.Popen[str]:
    """Start pytest in `copy`: their `tests` package first on the path, ahead of Cairn's."""
    path = os.pathsep.join(filter(None, [str(copy), os.environ.get("PYTHONPATH")]))
    # The caller's pytest options are for Cairn's suite, not this one (a `-k`, a `-x`).
    inherited = {
        k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")
    }
    env = {
        **inherited,
        "PYTHONPATH": path,
        "PYTHONDONTWRITEBYTECODE": "1",
        "NO_DOCKER": "true",  # their switch: no PostgreSQL, no Redis on port 6379
        SAVER_VARIABLE: saver,
        REDIS_VARIABLE: url,
    }
    command = [sys.executable, "-m", "pytest", *PYTEST_ARGS, f"--junitxml={report}",
               *(tests or ["tests"])]  # fmt: skip
    process = subprocess.Popen(
        command, cwd=copy, env=env, stdout=output, stderr=subprocess.STDOUT, text=True
    )
    if nice:
        os.setpriority(os.PRIO_PROCESS, process.pid, nice)
    return process


def read_junit(report: Path) -> dict[str, TestResult]:
    """Node id → result, from pytest's JUnit XML (xunit1, which names each test's file)."""
    results: dict[str, TestResult] = {}
    tree = ET.parse(report)  # noqa: S314 - pytest wrote it, in our scratch directory
    for case in tree.iter("testcase"):
        node = _node_id(case)
        bad = [e for e in case if e.tag in ("failure", "error")]
        skipped = case.find("skipped")
        if bad:
            result = TestResult(Outcome.FAILED, "\n".join(_text(e) for e in bad))
        elif skipped is not None:
            result = TestResult(Outcome.SKIPPED, skipped.get("message", ""))
        else:
            result = TestResult(Outcome.PASSED)
        earlier = results.get(node)  # a teardown error is reported apart from the call
        if earlier is not None and earlier.outcome is Outcome.FAILED:
            result = TestResult(Outcome.FAILED, f"{earlier.detail}\n{result.detail}".strip())
        results[node] = result
    return results


def _node_id(case: ET.Element) -> str:
    """`tests/test_x.py::Class::test_y[params]` from a testcase's file, classname and name."""
    file, classname, name = case.get("file", ""), case.get("classname", ""), case.get("name", "")
    module = file.removesuffix(".py").replace("/", ".")
    if name == module:  # the module itself: skipped or broken as it was collected
        return file
    classes = classname.removeprefix(module).strip(".")
    return "::".join(filter(None, [file or classname, *classes.split("."), name]))


def _text(element: ET.Element) -> str:
    return (element.text or element.get("message") or "").strip()


def describe(failures: dict[str, str], head: int = 2, tail: int = 10) -> str:
    """Each failed test's id and its traceback's first and last lines, for a message."""
    parts = []
    for node, detail in failures.items():
        lines = detail.splitlines()
        if len(lines) > head + tail + 1:  # where the test failed, then what was raised
            lines = [*lines[:head], "...", *lines[-tail:]]
        parts.append("\n".join([f"--- {node}", *(f"    {line}" for line in lines)]))
    return "\n".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    """`fetch` the suite, or `run` it and print its failures; 1 if any test failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("fetch", help="unpack the installed langgraph's tests (downloads)")
    running = commands.add_parser("run", help="run the checkpointer tests on a saver")
    running.add_argument("--saver", choices=SAVERS, default="cairn")
    running.add_argument("--keep", type=Path, help="make the scratch copy here and keep it")
    running.add_argument("tests", nargs="*", help="node ids (default: every test)")
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch":
            print(f"LangGraph's tests in {fetch()}")
            return 0
        done = run(args.saver, args.tests, keep=args.keep)
    except SuiteError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    failed = {node: done.results[node].detail for node in done.ids(Outcome.FAILED)}
    if failed:
        print(describe(failed))
    if failed and done.saver == "cairn":
        print("\nAs lines of EXCLUDED (tests/test_langgraph_suite.py):")
        print("\n".join(f'    "{node}": BUG,' for node in failed))
    print(done.summary())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
