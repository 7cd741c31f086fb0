"""The mutation check: break each critical check on purpose and see a test fail.

`make mutants` (or `python -m tests.mutants [NAME ...]`) copies the source tree to a
scratch directory and never touches the tree it was started from. There it runs every
mutant's tests once unchanged (they must pass), then, one mutant at a time, replaces an
exact snippet of one file, runs that mutant's tests against the mutated copy, and puts
the file back. A mutant is *killed* when a test fails and *survives* when all pass: a
survivor is a check the suite would let anyone delete. Survivors and broken mutants
(whose tests could not run) make the exit status 1.

A snippet that is not in its file exactly once stops the run before any test runs, so a
mutant cannot rot silently when the code it breaks changes: update the snippet.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("cairn.agents", "cairn.coordinator", "cairn.storage")
# Caches, the virtualenv and state are not source: the scratch copy is small and clean.
NOT_COPIED = shutil.ignore_patterns(
    ".git", ".venv", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache",
    ".hypothesis", ".cairn", "*.egg-info",
)  # fmt: skip
PYTEST_ARGS = ("-x", "-q", "-p", "no:cacheprovider", "--no-header", "-rfE",
               "-o", "addopts=--strict-markers --strict-config")  # fmt: skip


@dataclass(frozen=True, slots=True)
class Mutant:
    """One check broken on purpose: `original` in `path` becomes `replacement`."""

    name: str
    path: str
    original: str
    replacement: str
    tests: tuple[str, ...]  # pytest node ids or files, run in this order
    breaks: str  # what the check guards, in a line


CONFORMANCE = "tests/test_conformance.py::"
RESTORE = "tests/test_restore.py::"
STEP_RULE = 'level == "side_effects" and (external or self.dirty)'
TOOL_LC_TESTS = ("tests/test_tool_checkpoints.py", "tests/test_step.py")

MUTANTS: tuple[Mutant, ...] = (
    # Tool-level checkpoints inside a step.
    Mutant(
        "tool-lc-only-after-an-external-call",
        "agents/context.py",
        STEP_RULE,
        'level == "side_effects" and (self.dirty)',
        TOOL_LC_TESTS,
        "an LC before the first external call: a kill there pays the model turn twice",
    ),
    Mutant(
        "tool-lc-not-after-an-external-call",
        "agents/context.py",
        STEP_RULE,
        'level == "side_effects" and (external)',
        TOOL_LC_TESTS,
        "an LC before a tool that follows an external call: a finished command runs again",
    ),
    Mutant(
        "step-starts-for-any-attempt",
        "agents/step.py",
        'if start.current != f"{at.epoch}:{at.superstep}:{at.attempt}":',
        "if False:",
        ("tests/test_step.py::test_zombie_attempt_is_fenced_before_it_calls_the_model",),
        "a stale attempt is fenced before it pays for a model call",
    ),
    # The archive.
    Mutant(
        "gc-file-before-its-members-sync",
        "storage/backends/disk.py",
        "            self.sync()  # everything the GC names is durable before the GC appears\n",
        "",
        ("tests/test_archive.py",),
        "a GC file is renamed into place only after the directories of what it names synced",
    ),
    Mutant(
        "hot-blob-archived-unverified",
        "storage/archive.py",
        '    store.codec.open(data, f"blob {sha}", expect_digest=sha)\n',
        "",
        ("tests/test_archive_incremental.py", "tests/test_archive.py"),
        "a hot blob is checked against its address before it is archived",
    ),
    # The codec.
    Mutant(
        "codec-ignores-the-digest",
        "storage/codec.py",
        "if not hmac.compare_digest(actual, digest):",
        "if False:",
        ("tests/test_codec.py",),
        "a record whose bytes do not hash to the digest it carries is refused",
    ),
    Mutant(
        "codec-ignores-the-named-digest",
        "storage/codec.py",
        "if expect_digest is not None and not hmac.compare_digest(digest.hex(), expect_digest):",
        "if False:",
        ("tests/test_codec.py", "tests/test_archive_incremental.py"),
        "a sound record is refused where another one (another checksum) was named",
    ),
    Mutant(
        "a-corrupt-hot-copy-is-final",
        "storage/store.py",
        "        except CorruptCheckpoint as exc:\n            failure = failure or exc\n",
        "        except CorruptCheckpoint:\n            raise\n",
        ("tests/test_archive.py::test_a_corrupt_hot_copy_falls_back_to_the_archive",),
        "a record that fails its check in Redis is read from the archive instead",
    ),
    # Fencing in the Lua scripts.
    Mutant(
        "write-lc-ignores-the-epoch",
        "storage/backends/lua/write_lc.lua",
        "if epoch ~= ARGV[1] then",
        "if false then",
        ("tests/test_conformance.py::test_stale_epoch_is_fenced",),
        "an LC written under an epoch a restore left behind is refused",
    ),
    Mutant(
        "write-lc-ignores-the-attempt",
        "storage/backends/lua/write_lc.lua",
        "if current ~= ARGV[3] then",
        "if false then",
        ("tests/test_conformance.py::test_stale_attempt_is_fenced",),
        "an LC written by an attempt that was retried (a zombie) is refused",
    ),
    Mutant(
        "attempts-may-go-back",
        "storage/backends/lua/begin_attempt.lua",
        "if e > epoch or (e == epoch and (s > ns or (s == ns and a > na))) then",
        "if false then",
        ("tests/test_conformance.py::test_attempts_only_move_forward",),
        "a step is never handed back to an older attempt",
    ),
    Mutant(
        "fence-for-an-old-epoch",
        "storage/backends/lua/begin_attempt.lua",
        "if ARGV[5] ~= '' and tonumber(ARGV[5]) ~= epoch then",
        "if false then",
        (CONFORMANCE + "test_a_fence_for_an_epoch_no_longer_current_is_refused",),
        "a retry on behalf of an old epoch cannot fence a restore's staging",
    ),
    Mutant(
        "epoch-may-go-down",
        "storage/backends/lua/raise_epoch.lua",
        "if wanted > current then",
        "if true then",
        ("tests/test_conformance.py::test_raise_epoch_never_lowers",),
        "an epoch only rises, so an old epoch never becomes current again",
    ),
    # The commit's checks.
    Mutant(
        "commit-ignores-the-epoch",
        "storage/backends/lua/commit_gc.lua",
        "if epoch ~= ARGV[2] then\n  return fence('stale epoch",
        "if false then\n  return fence('stale epoch",
        ("tests/test_conformance.py::test_refused_commit_writes_nothing",),
        "a GC of an epoch a restore left behind is not committed",
    ),
    Mutant(
        "commit-ignores-a-members-checksum",
        "storage/backends/lua/commit_gc.lua",
        "if f[1] ~= sum or f[2] ~= agent then",
        "if false then",
        ("tests/test_conformance.py::test_refused_commit_writes_nothing",),
        "a member whose LC has another checksum or agent is refused",
    ),
    Mutant(
        "commit-takes-any-tentative-entry",
        "storage/backends/lua/commit_gc.lua",
        "  if not entry then return false end\n",
        "  if not entry then return false end\n  if entry then return true end\n",
        ("tests/test_conformance.py::test_refused_commit_writes_nothing",),
        "a vote matches its tentative LC by checksum and agent, not by id alone",
    ),
    Mutant(
        "commit-ignores-a-deleted-member",
        "storage/backends/lua/commit_gc.lua",
        "if present ~= #found then",
        "if false then",
        ("tests/test_conformance.py::test_voted_member_whose_lc_was_deleted_is_refused",),
        "a voted member whose LC is gone is refused",
    ),
    Mutant(
        "commit-begins-past-a-newer-attempt",
        "storage/backends/lua/commit_gc.lua",
        "      if ce > e or (ce == e and (cs > ns or (cs == ns and ca > na))) then return nil end",
        "      if false then return nil end",
        (CONFORMANCE + "test_a_commit_whose_next_superstep_would_be_refused_commits_alone",),
        "a commit's begin never hands a step back to an older attempt (its zombie would write)",
    ),
    # Coordinator owner tokens.
    Mutant(
        "commit-ignores-the-owner",
        "storage/backends/lua/commit_gc.lua",
        "if ARGV[7] ~= '' and redis.call('GET', KEYS[9]) ~= ARGV[7] then",
        "if false then",
        (CONFORMANCE + "test_gc_writes_of_a_coordinator_that_lost_the_task_are_refused",),
        "a coordinator that lost the task cannot commit its GCs",
    ),
    Mutant(
        "claim-may-go-back",
        "storage/backends/lua/claim.lua",
        "if current > token then",
        "if false then",
        (
            CONFORMANCE + "test_gc_writes_of_a_coordinator_that_lost_the_task_are_refused",
            "tests/test_coordinator.py::test_a_coordinator_past_its_lease_is_fenced",
        ),
        "a coordinator with an older lease cannot take a task back",
    ),
    Mutant(
        "raise-epoch-ignores-the-owner",
        "storage/backends/lua/raise_epoch.lua",
        "if ARGV[2] ~= '' and redis.call('GET', KEYS[2]) ~= ARGV[2] then",
        "if false then",
        (CONFORMANCE + "test_an_epoch_raise_by_a_coordinator_that_lost_the_task_is_refused",),
        "a coordinator that lost the task cannot fence the new owner's steps",
    ),
    Mutant(
        "run-state-ignores-the-owner",
        "storage/backends/lua/run_write.lua",
        "if ARGV[1] ~= '' and redis.call('GET', KEYS[1]) ~= ARGV[1] then",
        "if false then",
        ("tests/test_coordinator.py::test_a_coordinator_past_its_lease_is_fenced",),
        "a coordinator that lost the task cannot change its run state",
    ),
    # Failure detection.
    Mutant(
        "no-heartbeat-detection",
        "coordinator/jobstate.py",
        "if running > grace and not beating:",
        "if False and running > grace and not beating:",
        (
            "tests/test_coordinator.py::"
            "test_the_retry_of_a_killed_workers_step_starts_within_seconds_of_the_kill",
        ),
        "a dead worker is seen within seconds by its step's heartbeat, not after the timeout",
    ),
    Mutant(
        "heartbeat-stops-after-the-first-beat",
        "agents/heartbeat.py",
        "if not self._beat():",
        "if False:",
        (
            "tests/test_step.py::test_heartbeat_outlives_the_first_beat_of_a_long_step",
            "tests/test_step.py::test_heartbeat_is_alive_while_the_step_runs",
        ),
        "a running step keeps its heartbeat alive",
    ),
    # Coordinated restore.
    Mutant(
        "inline-restore-skips-a-failed-agent",
        "coordinator/restore.py",
        '                    return f"{agent}: {refusal(exc, task, agent)}"',
        "                    continue",
        (
            RESTORE
            + "test_an_inline_restore_with_one_corrupt_agent_of_three_falls_back_for_every_agent",
        ),
        "one agent that cannot be staged inline makes every agent fall back",
    ),
    Mutant(
        "restore-tries-one-gc-only",
        "coordinator/restore.py",
        "return sorted((n for n in committed if to is None or n <= to), reverse=True)",
        "return sorted((n for n in committed if to is None or n <= to), reverse=True)[:1]",
        (RESTORE + "test_a_corrupt_lc_makes_the_restore_fall_back_for_every_agent",),
        "a restore that cannot use a GC falls back to the next older one",
    ),
    # The LangGraph saver.
    Mutant(
        "langgraph-put-ignores-the-head",
        "storage/backends/lua/lg_put.lua",
        "if head and ARGV[3] ~= '1' and head ~= ARGV[2] then",
        "if false then",
        (
            "tests/test_langgraph_saver.py::"
            "test_two_writers_racing_on_one_thread_get_an_error_not_a_silent_fork",
        ),
        "two writers racing on one thread get an error, not two silent branches",
    ),
    Mutant(
        "langgraph-archive-drops-the-whole-writes-hash",
        "storage/backends/lua/lg_archive.lua",
        "redis.call('DEL', KEYS[i + 1])",
        "redis.call('DEL', KEYS[i + 1], KEYS[n + i + 1])",
        (
            "tests/test_langgraph_archive.py::"
            "test_archiving_while_threads_put_and_write_loses_nothing",
        ),
        "a write put while its checkpoint is archived stays in Redis",
    ),
    Mutant(
        "langgraph-archive-drops-a-replaced-write",
        "storage/backends/lua/lg_archive.lua",
        "if redis.call('HGET', writes, ARGV[j]) == ARGV[j + 1] then",
        "if true then",
        (
            "tests/test_langgraph_archive.py::"
            "test_an_archive_cut_short_then_done_again_reads_the_write_replaced_meanwhile",
        ),
        "a write Redis holds with another value than the archive's stays in Redis",
    ),
)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What running a mutant's tests gave."""

    verdict: str  # "killed", "survived" or "broken"
    seconds: float
    detail: str  # the failing tests, or why the tests could not run


def copy_tree(scratch: Path) -> Path:
    """Copy the source tree under `scratch`; return the copy's root."""
    tree = scratch / "tree"
    shutil.copytree(ROOT, tree, ignore=NOT_COPIED, symlinks=True)
    return tree


def environment(tree: Path) -> dict[str, str]:
    """The environment tests run in: the copy first on the import path, for subprocesses too.

    The editable install's finder comes after `PYTHONPATH` on `sys.path`, so the copy's
    packages are the ones imported, by pytest and by every process a test starts.
    """
    return {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}


def check_imports(tree: Path, env: dict[str, str]) -> None:
    """Exit unless a process started in the copy imports the copy's packages."""
    code = (
        "import importlib, sys\n"
        "for name in sys.argv[1:]:\n"
        "    print(importlib.import_module(name).__file__)\n"
    )
    found = subprocess.run(
        [sys.executable, "-c", code, *PACKAGES],
        cwd=tree, env=env, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    stray = [path for path in found if not Path(path).is_relative_to(tree)]
    if stray or len(found) != len(PACKAGES):
        sys.exit(f"the scratch copy is not what gets imported: {found}")


def check_snippets(tree: Path, mutants: Sequence[Mutant]) -> None:
    """Exit naming every mutant whose snippet is not in its file exactly once."""
    rotten = []
    for mutant in mutants:
        count = (tree / mutant.path).read_text().count(mutant.original)
        if count != 1 or mutant.original == mutant.replacement:
            rotten.append(f"  {mutant.name}: its snippet is in {mutant.path} {count} times")
    if rotten:
        sys.exit("mutants out of date with the code (update their snippets):\n" + "\n".join(rotten))


def run_tests(tree: Path, env: dict[str, str], tests: Sequence[str]) -> Outcome:
    """Run `tests` in the copy, stopping at the first failure."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *PYTEST_ARGS, *tests],
        cwd=tree, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    seconds = time.monotonic() - started
    failed = [line.split(" - ")[0] for line in done.stdout.splitlines()
              if line.startswith(("FAILED ", "ERROR "))]  # fmt: skip
    if done.returncode == 0:
        return Outcome("survived", seconds, "")
    if done.returncode == 1 and failed:
        return Outcome("killed", seconds, ", ".join(failed))
    tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
    return Outcome("broken", seconds, f"pytest exit {done.returncode}: " + " | ".join(tail))


def try_mutant(tree: Path, env: dict[str, str], mutant: Mutant) -> Outcome:
    """Apply `mutant` to the copy, run its tests, and put the file back whatever happens."""
    path = tree / mutant.path
    original = path.read_text()
    path.write_text(original.replace(mutant.original, mutant.replacement, 1))
    try:
        return run_tests(tree, env, mutant.tests)
    finally:
        path.write_text(original)


def unique_tests(mutants: Sequence[Mutant]) -> list[str]:
    """Every test the mutants name, once: a node id is dropped when its whole file is named."""
    names = list(dict.fromkeys(t for m in mutants for t in m.tests))
    return [t for t in names if "::" not in t or t.split("::")[0] not in names]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the mutants named (default: all); return 1 if any survived or was broken."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="mutants to run (default: all)")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip running the tests unchanged first")  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="keep the scratch copy")
    args = parser.parse_args(argv)
    known = {m.name: m for m in MUTANTS}
    if args.list:
        for mutant in MUTANTS:
            print(f"{mutant.name:40} {mutant.path}\n{'':40} {mutant.breaks}")
        return 0
    unknown = [n for n in args.names if n not in known]
    if unknown:
        parser.error(f"unknown mutants {unknown}; --list shows them")
    mutants = [known[n] for n in args.names] if args.names else list(MUTANTS)
    scratch = Path(tempfile.mkdtemp(prefix="cairn-mutants-"))
    started = time.monotonic()
    outcomes: dict[str, Outcome] = {}
    try:
        tree = copy_tree(scratch)
        env = environment(tree)
        check_imports(tree, env)
        check_snippets(tree, mutants)
        print(f"{len(mutants)} mutants, in a copy of the tree at {tree}", flush=True)
        if not args.no_baseline:
            baseline = run_tests(tree, env, unique_tests(mutants))
            if baseline.verdict != "survived":
                print(f"the tests fail on the unchanged code: {baseline.detail}")
                return 1
            print(f"{'(unchanged code)':40} passes   {baseline.seconds:6.1f} s", flush=True)
        for mutant in mutants:
            outcome = outcomes[mutant.name] = try_mutant(tree, env, mutant)
            print(f"{mutant.name:40} {outcome.verdict:8} {outcome.seconds:6.1f} s  "
                  f"{outcome.detail}", flush=True)  # fmt: skip
    finally:
        if args.keep:
            print(f"scratch copy kept at {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    killed = [n for n, o in outcomes.items() if o.verdict == "killed"]
    bad = {n: o for n, o in outcomes.items() if o.verdict != "killed"}
    print(f"\n{len(killed)} of {len(mutants)} mutants killed in "
          f"{time.monotonic() - started:.0f} s")  # fmt: skip
    for name, outcome in bad.items():
        mutant = known[name]
        if outcome.verdict == "survived":
            print(f"SURVIVED {name} ({mutant.path}): no test fails when this check is gone: "
                  f"{mutant.breaks}")  # fmt: skip
        else:
            print(f"BROKEN {name} ({mutant.path}): {outcome.detail}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
