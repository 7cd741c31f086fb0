"""The workspace stays a valid tree within its limits, whatever an agent does.

Each test is an attack, made by a scripted agent or by hand where the attacker is what the
test writes (a command's leftovers in a worker's tree, a manifest in Redis), and what stops
it: no path is both a file and a directory (at the tools, at the barrier, in a spec, at an
export), a patch applies whole or not at all, no file or workspace grows past its limits
into a blob, no write goes through a hard link, and an export leaves `.git/` out unless
asked.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from cairn import tool
from cairn.agents.barrier import build_gc, runnable
from cairn.agents.sandbox import UNSANDBOXED, process_sandbox, use_sandbox
from cairn.agents.spec import StepPolicy, parse_model
from cairn.agents.step import run_step
from cairn.agents.task import start_task
from cairn.agents.toolkit import builtin_tools
from cairn.agents.tools import TOOLS, ToolContext
from cairn.agents.workspace import (
    Conflict,
    SizeLimits,
    Workspace,
    merge,
    replace_file,
    tree_clashes,
)
from cairn.coordinator.export import export_workspace
from cairn.coordinator.spec import TaskSpec
from cairn.errors import InvalidSpec, InvalidWorkspace, ToolError
from cairn.storage.records import GlobalCheckpoint, Role, WorkspaceManifest
from cairn.storage.store import CheckpointStore
from cairn.testing.redis_server import RedisServer
from tests.agent_harness import drive, files_of, record, scripted, superstep
from tests.cli_harness import cli_runner

MiB = 1024 * 1024


def results(store: CheckpointStore, gc: GlobalCheckpoint, agent: str) -> list[str]:
    """What the agent's tool calls answered, in order, as its LC of `gc` holds them."""
    ref = gc.members[agent]
    state = store.read_state(gc.task, agent, ref.id, ref.checksum)
    return [m.content or "" for m in state.messages if m.role is Role.TOOL]


def created(path: str, text: str) -> str:
    """A unified diff that creates `path` holding the one line `text`."""
    return f"--- /dev/null\n+++ b/{path}\n@@ -0,0 +1 @@\n+{text}\n"


def call(ctx: ToolContext, name: str, **args: str) -> str:
    return TOOLS[name].run(ctx, dict(args))


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    """A tool context over an empty workspace."""
    workspace = Workspace(tmp_path / "cache", "t", "coder")
    return ToolContext(workspace, "coder", ["coder"], 1, StepPolicy(), task="t")


# one path is a file or a directory, never both ------------------------------------------------
def test_the_write_tools_refuse_a_file_where_a_directory_is_or_under_a_file(
    real_store: CheckpointStore, tmp_path: Path
) -> None:
    """A file named as a directory of the workspace, or under one of its files, is refused.

    The step's tree was synced lazily, so neither `adir/` nor `f.txt` is on disk when the
    agent writes: the tools check the manifest the step stands on, plus its own writes.
    """
    turn = {"tools": [
        {"name": "write_file", "args": {"path": "adir", "content": "x"}},
        {"name": "write_file", "args": {"path": "adir/", "content": "x"}},
        {"name": "write_file", "args": {"path": "f.txt/child", "content": "x"}},
        {"name": "apply_patch", "args": {"patch": created("adir", "x")}},
        {"name": "write_file", "args": {"path": "new.txt", "content": "n"}},
        {"name": "write_file", "args": {"path": "new.txt/deeper", "content": "x"}},
        {"name": "write_file", "args": {"path": "./adir//inner.txt", "content": "in2"}},
    ]}  # fmt: skip
    start_task(real_store, record("clash", scripted("coder", [turn])),
               {"adir/inner.txt": b"in", "f.txt": b"f"})  # fmt: skip
    gc = drive(real_store, "clash", tmp_path / "cache")
    assert {"adir/inner.txt": b"in2", "f.txt": b"f", "new.txt": b"n"} == files_of(real_store, gc)
    said = results(real_store, gc, "coder")
    assert said[0] == said[1] == said[3] == "error: adir is a directory; a file cannot replace it"
    assert "error: cannot write f.txt/child: f.txt is a file, not a directory" == said[2]
    assert "error: cannot write new.txt/deeper: new.txt is a file, not a directory" == said[5]


def test_two_agents_making_one_path_a_file_and_a_directory_conflict_and_the_later_wins(
    real_store: CheckpointStore, tmp_path: Path
) -> None:
    """At the barrier the later agent's paths stay; the earlier's clashing ones are dropped.

    The earlier agent is told, as for two agents writing one path.
    """
    alice = scripted("alice", [{"tools": [
        {"name": "write_file", "args": {"path": "x", "content": "alice's x"}},
        {"name": "write_file", "args": {"path": "p/q", "content": "alice's q"}},
        {"name": "write_file", "args": {"path": "mine.txt", "content": "kept"}},
    ]}])  # fmt: skip
    bob = scripted("bob", [{"tools": [
        {"name": "write_file", "args": {"path": "x/y", "content": "bob's y"}},
        {"name": "write_file", "args": {"path": "p", "content": "bob's p"}},
    ]}])  # fmt: skip
    start_task(real_store, record("merge", alice, bob), {"keep.txt": b"k"})
    gc = superstep(real_store, "merge", tmp_path / "cache")
    assert gc is not None
    assert {"keep.txt": b"k", "mine.txt": b"kept", "x/y": b"bob's y", "p": b"bob's p"} == files_of(
        real_store, gc
    )
    told = sorted(m.content for m in gc.inbox if m.recipient == "alice")
    assert 2 == len(told)
    assert "you wrote p/q, but bob wrote p" in told[0]
    assert "you wrote x, but bob wrote x/y" in told[1]
    assert not [m for m in gc.inbox if m.recipient == "bob"]


def test_merge_always_gives_a_tree() -> None:
    """Clashes resolve for the later writer; a change set clashing with the base loses."""
    files, conflicts = merge(
        {"base": "0", "d/old": "1"},
        [
            ("a", {"x": "a1", "y/z": "a2"}),
            ("b", {"x/1": "b1", "y": "b2"}),
            ("c", {"x/1/2": "c1"}),
            ("forged", {"base/evil": "f1"}),  # its own view is no tree: no tool makes it
        ],
    )
    assert {"base": "0", "d/old": "1", "y": "b2", "x/1/2": "c1"} == files
    assert [] == tree_clashes(files)
    assert {
        Conflict("x", "c", "a", clash="x/1/2"),
        Conflict("y/z", "b", "a", clash="y"),
        Conflict("x/1", "c", "b", clash="x/1/2"),
        Conflict("base/evil", "", "forged", clash="base"),
    } == set(conflicts)


@pytest.mark.parametrize(
    ("files", "why"),
    [
        ({"a": "x", "a/b": "y"}, "a is a file and a directory"),
        ({"a": "x", "./a": "y"}, "name one file"),
        ({".": "x"}, "the workspace itself"),
    ],
)
def test_a_spec_whose_files_are_not_a_tree_is_refused(files: dict[str, str], why: str) -> None:
    """A spec's inline files must be a tree: no file under a file, no file named twice."""
    spec = {
        "name": "t",
        "goal": "g",
        "agents": [{"name": "a", "model": "scripted"}],
        "files": files,
    }
    with pytest.raises(InvalidSpec, match=why):
        parse_model(TaskSpec, spec, "task spec")


def test_an_export_of_a_checkpoint_that_is_not_a_tree_is_refused_in_one_line(
    real_store: CheckpointStore,
    redis_server: RedisServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A manifest a Redis writer made with `a` and `a/b`: exit 2, one line, nothing written."""
    gc0 = start_task(real_store, record("bad", scripted("coder", [])), {"a": b"a"})
    sha = real_store.put_blob("bad", b"b")
    broken = real_store.put_manifest("bad", WorkspaceManifest(files={"a": sha, "a/b": sha}))
    gc1 = gc0.model_copy(update={"number": 1, "superstep": 1, "workspace": broken})
    real_store.prepare_gc(gc1)
    real_store.commit_gc(gc1)
    env = {"CAIRN_REDIS_URL": redis_server.url, "CAIRN_ARCHIVE_DIR": str(tmp_path / "archive")}
    out = tmp_path / "out"
    with cli_runner(env, monkeypatch, capsys) as run:
        code, _, err = run("workspace", "bad", "--out", str(out))
    assert 2 == code
    assert 1 == len(err.strip().splitlines())
    assert "checkpoint 1 is not a tree: a is a file and a directory (a/b)" in err
    assert not out.exists() or not any(out.iterdir())


# a patch applies whole or not at all --------------------------------------------------------
def test_apply_patch_writes_none_of_its_files_when_one_is_refused(
    real_store: CheckpointStore, tmp_path: Path
) -> None:
    """A later file that cannot be written (under a file) stops the earlier ones too.

    And a symlink a command made is gone when the command ends, so no file of a patch
    can lead out of the workspace through it.
    """
    outside = tmp_path / "outside"
    outside.mkdir()
    patch = created("first.txt", "first") + created("a.txt/evil.txt", "evil")
    escape = created("out/evil.txt", "evil")
    turn = {"tools": [
        {"name": "apply_patch", "args": {"patch": patch}},
        {"name": "run_command", "args": {"command": f"ln -s {outside} out"}},
        {"name": "apply_patch", "args": {"patch": escape}},
    ]}  # fmt: skip
    start_task(real_store, record("patch", scripted("coder", [turn])), {"a.txt": b"a"})
    gc = drive(real_store, "patch", tmp_path / "cache")
    assert {"a.txt": b"a", "out/evil.txt": b"evil\n"} == files_of(real_store, gc)
    said = results(real_store, gc, "coder")
    assert said[0].startswith("error: "), said[0]
    assert "a.txt" in said[0]
    assert [] == list(outside.iterdir())


def test_apply_patch_checks_its_files_against_each_other(ctx: ToolContext) -> None:
    """A patch making `d` and `d/e` is refused whole; one moving `a` to `a/b` applies."""
    with pytest.raises(
        ToolError, match="cannot write both d and d/e: d cannot be a file and a directory"
    ):
        call(ctx, "apply_patch", patch=created("d", "d") + created("d/e", "e"))
    assert [] == list(ctx.workspace.tree.iterdir())
    (ctx.workspace.tree / "a").write_text("x\n")
    move = "--- a/a\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n" + created("a/b", "x")
    assert "applied to a, a/b" == call(ctx, "apply_patch", patch=move)
    assert "x\n" == (ctx.workspace.tree / "a" / "b").read_text()


# limits ---------------------------------------------------------------------------------------
def test_the_write_tools_keep_files_and_the_workspace_within_the_policy_limits(
    real_store: CheckpointStore, tmp_path: Path
) -> None:
    """Past `max_file_bytes` or `max_workspace_bytes` a write is an error the agent reads."""
    turn = {"tools": [
        {"name": "write_file", "args": {"path": "big.txt", "content": "b" * 65}},
        {"name": "write_file", "args": {"path": "b.txt", "content": "b" * 64}},
        {"name": "write_file", "args": {"path": "c.txt", "content": "c" * 60}},
        {"name": "edit_file", "args": {"path": "a.txt", "old": "x", "new": "X" * 31}},
        {"name": "apply_patch", "args": {"patch": created("c.txt", "c" * 39)}},
    ]}  # fmt: skip
    policy = StepPolicy(max_file_bytes=64, max_workspace_bytes=160)
    start_task(real_store, record("lim", scripted("coder", [turn]), policy=policy),
               {"a.txt": b"x" + b"a" * 49})  # fmt: skip
    gc = drive(real_store, "lim", tmp_path / "cache")
    assert {"a.txt": b"x" + b"a" * 49, "b.txt": b"b" * 64, "c.txt": b"c" * 39 + b"\n"} == files_of(
        real_store, gc
    )
    said = results(real_store, gc, "coder")
    assert "error: big.txt would be 65 bytes; a workspace file may have at most 64" in said[0]
    assert "error: the workspace would hold 174 bytes; it may hold at most 160" in said[2]
    assert said[3].startswith("error: a.txt would be 80 bytes")


def test_a_spec_sets_the_limits_and_its_own_files_must_keep_them() -> None:
    """The spec's limits reach the steps' policy (by default 64 MiB a file, 1 GiB in all).

    The initial files are held to them.
    """
    spec: dict[str, object] = {
        "name": "t",
        "goal": "g",
        "agents": [{"name": "a", "model": "scripted"}],
    }
    default = parse_model(TaskSpec, spec, "task spec").policy()
    assert (64 * MiB, 1024 * MiB) == (default.max_file_bytes, default.max_workspace_bytes)
    spec |= {"max_file_bytes": 100, "max_workspace_bytes": 500}
    policy = parse_model(TaskSpec, spec, "task spec").record("t").policy
    assert (100, 500) == (policy.max_file_bytes, policy.max_workspace_bytes)
    with pytest.raises(InvalidSpec, match="a is 5 bytes; a file may have at most 4"):
        parse_model(TaskSpec, spec | {"max_file_bytes": 4, "files": {"a": "12345"}}, "task spec")
    with pytest.raises(InvalidSpec, match="files: 600 bytes in all; at most 500"):
        parse_model(TaskSpec, spec | {"files": {"a": "a" * 100, "b": "b" * 500},
                                      "max_file_bytes": 500}, "task spec")  # fmt: skip


@pytest.mark.parametrize("sandboxed", [True, False], ids=["sandboxed", "bare"])
def test_a_command_leaving_a_file_over_the_limit_never_makes_a_blob(
    real_store: CheckpointStore, tmp_path: Path, sandboxed: bool
) -> None:
    """A 600 MiB (sparse) file made by a command never becomes a blob; the agent reads why.

    In the sandbox the file-size limit stops the command as it grows the file; run bare
    (`CAIRN_SANDBOX=off`), the command makes it and `Workspace.enforce_limits` removes it
    once the command ends. Either way the step's checkpoint holds no file over the limit,
    so no task waits on a record that cannot be read back.
    """
    before = process_sandbox()
    if not sandboxed:
        use_sandbox(UNSANDBOXED)
    try:
        turn = {"tools": [{"name": "run_command", "args": {"command": "truncate -s 600M big.bin"}}]}
        start_task(real_store, record("huge", scripted("coder", [turn])), {"a.txt": b"a"})
        drive(real_store, "huge", tmp_path / "cache")
    finally:
        use_sandbox(before)
    gc = real_store.latest_gc("huge")
    assert gc is not None
    files = files_of(real_store, gc)
    assert b"a" == files["a.txt"]
    said = results(real_store, gc, "coder")[0]
    if sandboxed:
        assert b"" == files["big.bin"]  # made, and stopped before it grew
        assert "File size limit exceeded" in said
    else:
        assert "big.bin" not in files
        assert (
            f"removed big.bin (629145600 bytes): a workspace file may have at most {64 * MiB}"
            in said
        )


def test_enforce_limits_removes_what_a_command_left_over_them(
    real_store: CheckpointStore, tmp_path: Path
) -> None:
    """Over a limit, a command's largest files go; synced ones stay; none is read.

    A file over the file limit goes, then (the tree over its limit) the largest new ones.
    """
    real_store.hot.init_task("ws")
    ws = Workspace(tmp_path, "ws", "steps")
    ws.sync(real_store, {"old.bin": real_store.put_blob("ws", b"o" * 400)})
    for name, size in (("huge.bin", 2 * MiB), ("a.bin", 300), ("b.bin", 200), ("c.bin", 100)):
        with (ws.tree / name).open("wb") as sparse:
            sparse.truncate(size)
    said = ws.enforce_limits(SizeLimits(file=MiB, total=800))
    assert [
        f"removed huge.bin ({2 * MiB} bytes): a workspace file may have at most {MiB} bytes",
        "removed a.bin (300 bytes): the workspace may hold at most 800 bytes",
    ] == said.splitlines()
    assert {"b.bin", "c.bin", "old.bin"} == {p.name for p in ws.tree.iterdir()}
    assert {"b.bin", "c.bin"} == set(ws.capture(real_store))


@tool(effects="workspace")
def grow(ctx: ToolContext, files: int, mib: int) -> str:
    """Leave sparse files in the workspace.

    Args:
        ctx: the call's context
        files: how many
        mib: how large each is, in MiB

    """
    for n in range(files):
        with ctx.path(f"big{n}.bin").open("wb") as sparse:
            sparse.truncate(mib * MiB)
    return "grown"


@pytest.mark.parametrize(
    ("files", "mib", "why"),
    [
        (1, 65, r"big0\.bin is 68157440 bytes; a workspace file may have at most 67108864"),
        (17, 64, r"the step made the workspace 1140850688 bytes; it may hold at most 1073741824"),
    ],
    ids=["file", "workspace"],
)
def test_what_reaches_capture_over_the_limits_fails_the_step_with_the_reason(
    real_store: CheckpointStore, tmp_path: Path, files: int, mib: int, why: str
) -> None:
    """A worker's own tool growing a file or the tree past its limit fails the step.

    Nothing is read (the files are sparse: reading 1 GiB would show) and nothing voted.
    """
    registry = builtin_tools()
    registry.add(grow, "this test")
    turn = {"tools": [{"name": "grow", "args": {"files": files, "mib": mib}}]}
    start_task(real_store, record("grow", scripted("coder", [turn], tools=["grow"])), {})
    real_store.hot.begin_attempt("grow", "coder", 1, 1)
    with pytest.raises(InvalidWorkspace, match=why):
        run_step("grow", "coder", 1, 1, 1, store=real_store, cache=tmp_path / "c", tools=registry)
    assert not real_store.hot.get_votes("grow", 1, 1)


# hard links -------------------------------------------------------------------------------------
def test_the_write_tools_replace_a_hard_linked_file_and_leave_the_outside_one_alone(
    ctx: ToolContext, tmp_path: Path
) -> None:
    """write_file, edit_file and apply_patch break a hard link to a file outside the workspace."""
    tree = ctx.workspace.tree
    outside = {name: tmp_path / f"{name}.outside" for name in ("w", "e", "p")}
    for name, path in outside.items():
        path.write_text("secret\n")
        os.link(path, tree / name)
    (tree / "e").chmod(0o750)
    call(ctx, "write_file", path="w", content="written\n")
    call(ctx, "edit_file", path="e", old="secret", new="edited")
    call(ctx, "apply_patch", patch="--- a/p\n+++ b/p\n@@ -1 +1 @@\n-secret\n+patched\n")
    assert {"secret\n"} == {path.read_text() for path in outside.values()}
    assert ["written\n", "edited\n", "patched\n"] == [(tree / n).read_text() for n in "wep"]
    assert 0o750 == (tree / "e").stat().st_mode & 0o777  # the file's mode goes with it


def test_a_sync_replaces_a_hard_linked_file_rather_than_write_through_it(
    real_store: CheckpointStore, tmp_path: Path
) -> None:
    """A command's hard link left in a worker's tree is not written through by the next sync."""
    real_store.hot.init_task("ws")
    ws = Workspace(tmp_path / "cache", "ws", "steps")
    ws.sync(real_store, {"a.txt": real_store.put_blob("ws", b"first")})
    outside = tmp_path / "worker-secret"
    outside.write_bytes(b"secret")
    (ws.tree / "a.txt").unlink()
    os.link(outside, ws.tree / "a.txt")
    ws.sync(real_store, {"a.txt": real_store.put_blob("ws", b"second")})
    assert b"secret" == outside.read_bytes()
    assert b"second" == (ws.tree / "a.txt").read_bytes()


# symlinks a command left ---------------------------------------------------------------------
def run_superstep(store: CheckpointStore, task: str, lanes: dict[str, Path]) -> GlobalCheckpoint:
    """Run one superstep as `superstep` does, each agent's step in a cache (a lane) of its own."""
    gc = store.latest_gc(task)
    assert gc is not None
    order = list(lanes)
    s, epoch, votes = gc.superstep + 1, store.hot.get_epoch(task), {}
    for agent in runnable(store, gc, order):
        store.hot.begin_attempt(task, agent, s, 1)
        votes[agent] = run_step(task, agent, s, epoch, 1, store=store, cache=lanes[agent]).lc
    barrier = build_gc(store, gc, votes, order, number=gc.number + 1, superstep=s, epoch=epoch)
    store.prepare_gc(barrier.gc)
    return store.commit_gc(barrier.gc)


def test_a_symlink_a_command_left_does_not_lead_a_later_sync_out_of_the_tree(
    real_store: CheckpointStore, tmp_path: Path
) -> None:
    """A symlink `d` to outside, left in one worker's tree, is no way out for `d/x`.

    Another worker's agent writes `d/x` (its tree has no symlink); when the first tree is
    next brought up to date for a command, `d/x` lands in the tree, not outside.
    """
    outside = tmp_path / "outside"
    outside.mkdir()
    alice = scripted("alice", [
        {"tools": [{"name": "run_command", "args": {"command": f"ln -s {outside} d"}}]},
        {"tools": [{"name": "run_command", "args": {"command": "cat d/x"}}]},
    ])  # fmt: skip
    bob = scripted(
        "bob", [{"tools": [{"name": "write_file", "args": {"path": "d/x", "content": "x"}}]}]
    )
    start_task(real_store, record("link", alice, bob), {"a.txt": b"a"})
    lanes = {"alice": tmp_path / "lane-a", "bob": tmp_path / "lane-b"}
    run_superstep(real_store, "link", lanes)
    gc = run_superstep(real_store, "link", lanes)
    assert [] == list(outside.iterdir())
    assert {"a.txt": b"a", "d/x": b"x"} == files_of(real_store, gc)
    assert "exit code 0\nx" == results(real_store, gc, "alice")[1]


# a step's own writes survive its tree being materialized -----------------------------------------
def test_listing_the_tree_keeps_the_steps_own_writes(
    real_store: CheckpointStore, tmp_path: Path
) -> None:
    """After a lazy sync, `list_files` (or asking for `.`) does not undo what the step wrote."""
    turn = {"tools": [
        {"name": "write_file", "args": {"path": "new.txt", "content": "new"}},
        {"name": "write_file", "args": {"path": "a.txt", "content": "changed"}},
        {"name": "read_file", "args": {"path": "."}},
        {"name": "list_files", "args": {}},
    ]}  # fmt: skip
    start_task(real_store, record("own", scripted("coder", [turn])), {"a.txt": b"a", "b.txt": b"b"})
    gc = drive(real_store, "own", tmp_path / "cache")
    assert {"a.txt": b"changed", "b.txt": b"b", "new.txt": b"new"} == files_of(real_store, gc)
    assert "a.txt\nb.txt\nnew.txt" == results(real_store, gc, "coder")[3]


# git's files are not exported unless asked ----------------------------------------------------
def test_an_export_leaves_what_makes_a_git_repository_out_unless_asked(
    real_store: CheckpointStore,
    redis_server: RedisServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`cairn workspace` writes no `.git` (config, hooks, a gitfile) nor a bare repo's HEAD.

    Each would make git, run there by a person, run what the agent's config names.
    """
    hostile = "[core]\n\tfsmonitor = touch pwned\n"
    writes = {
        ".git/config": hostile,
        "sub/.git/hooks/post-checkout": "touch pwned",
        "sub/.Git/config": hostile,  # .git, on a disk that ignores case
        "linked/.git": "gitdir: ../bare",  # a gitfile: the repository is elsewhere
        "bare/HEAD": "ref: refs/heads/main",
        "bare/config": hostile,
        "bare/objects/info": "",
        "bare/refs/heads/main": "",
    }
    turn = {"tools": [
        {"name": "write_file", "args": {"path": path, "content": content}}
        for path, content in writes.items()
    ]}  # fmt: skip
    start_task(real_store, record("git", scripted("coder", [turn])), {"src/a.py": b"a"})
    drive(real_store, "git", tmp_path / "cache")
    env = {"CAIRN_REDIS_URL": redis_server.url, "CAIRN_ARCHIVE_DIR": str(tmp_path / "archive")}
    plain, full = tmp_path / "plain", tmp_path / "full"
    with cli_runner(env, monkeypatch, capsys) as run:
        code, out, _ = run("workspace", "git", "--out", str(plain))
        assert (0, True) == (code, "left out 5 file(s) of git repositories" in out)
        assert 0 == run("workspace", "git", "--out", str(full), "--include-git")[0]
    assert ["bare/config", "bare/objects/info", "bare/refs/heads/main", "src/a.py"] == sorted(
        p.relative_to(plain).as_posix() for p in plain.rglob("*") if p.is_file()
    )
    assert hostile == (full / ".git" / "config").read_text()
    done = export_workspace(real_store, "git", None, tmp_path / "api")
    assert [".git/config", "bare/HEAD", "linked/.git", "sub/.Git/config",
            "sub/.git/hooks/post-checkout"] == done.left_out  # fmt: skip


def test_a_tree_a_command_locked_and_linked_is_taken_back_when_not_root(tmp_path: Path) -> None:
    """As a worker not running as root: a command's `chmod 500 d` and its links stop nothing.

    Run as "nobody" in a child process (the suite runs as root, which no mode stops): the
    command's locked directory holding a file over the limit, and a symlink it left where
    a file is, must neither stop `enforce_limits` nor lead a write elsewhere.
    """
    base = Path(tempfile.mkdtemp(prefix="cairn-unpriv-"))
    base.chmod(0o777)
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the worker, as another user than root
        os.close(read)
        said = "ok"
        try:
            os.setgid(65534)
            os.setuid(65534)
            ws = Workspace(base / "cache", "t", "files")
            (ws.tree / "b.txt").write_text("b\n")
            (ws.tree / "d").mkdir()
            (ws.tree / "d" / "big").write_bytes(b"x" * 5000)
            (ws.tree / "d").chmod(0o500)  # what the command did: `chmod 500 d`
            (ws.tree / "a.txt").symlink_to("b.txt")
            ws.reclaim()
            note = ws.enforce_limits(SizeLimits(file=1000, total=10_000))
            assert "removed d/big (5000 bytes)" in note, note
            assert not (ws.tree / "a.txt").is_symlink()
            replace_file(ws.resolve("a.txt"), b"a\n")
            assert "b\n" == (ws.tree / "b.txt").read_text()  # not written through the link
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, which asserts
            said = f"{type(exc).__name__}: {exc}"
        os.write(write, said.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as reply:
        said = reply.read()
    os.waitpid(child, 0)
    shutil.rmtree(base, ignore_errors=True)
    assert "ok" == said
