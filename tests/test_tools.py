"""Tools on a real directory: the workspace jail, patches, commands, messages."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from cairn.agents.sandbox import WORKDIR
from cairn.agents.spec import TOOL_NAMES, StepPolicy
from cairn.agents.tools import TOOLS, ToolContext
from cairn.agents.workspace import Workspace
from cairn.errors import ToolError
from cairn.storage.records import Effects


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    """A tool context over an empty workspace, in a team of three."""
    workspace = Workspace(tmp_path / "cache", "t", "coder")
    policy = StepPolicy(command_timeout=1.0, output_limit=300)
    return ToolContext(workspace, "coder", ["planner", "coder", "reviewer"], 1, policy)


def call(ctx: ToolContext, name: str, **args: str) -> str:
    return TOOLS[name].run(ctx, dict(args))


@pytest.mark.parametrize("path", ["/etc/passwd", "../outside.txt", "a/../../x", "", "a\x00b"])
def test_paths_leaving_the_workspace_are_refused(ctx: ToolContext, path: str) -> None:
    """Absolute paths, `..` and NUL bytes are refused with an error for the model."""
    with pytest.raises(ToolError):
        call(ctx, "write_file", path=path, content="x")
    with pytest.raises(ToolError):
        call(ctx, "read_file", path=path)


def test_symlinks_leading_out_are_refused(ctx: ToolContext, tmp_path: Path) -> None:
    """A symlink inside the workspace that points outside cannot be read or written through."""
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cret")
    tree = ctx.workspace.tree
    (tree / "link").symlink_to(secret)
    (tree / "dir").symlink_to(tmp_path)
    with pytest.raises(ToolError, match="outside the workspace"):
        call(ctx, "read_file", path="link")
    with pytest.raises(ToolError, match="outside the workspace"):
        call(ctx, "write_file", path="dir/new.txt", content="x")
    assert "s3cret" == secret.read_text()
    assert not (tmp_path / "new.txt").exists()


def test_write_read_list(ctx: ToolContext) -> None:
    """Files written can be read back and are listed, directories created on the way."""
    assert "wrote 6 bytes to src/a.py" == call(ctx, "write_file", path="src/a.py", content="print1")
    call(ctx, "write_file", path="b.txt", content="b")
    assert "print1" == call(ctx, "read_file", path="src/a.py")
    assert "b.txt\nsrc/a.py" == call(ctx, "list_files")
    assert "src/a.py" == call(ctx, "list_files", path="src")
    with pytest.raises(ToolError, match="no such file"):
        call(ctx, "read_file", path="missing.txt")


def test_a_patch_that_does_not_apply_changes_nothing(ctx: ToolContext) -> None:
    """A patch failing on its second file leaves the first file untouched too."""
    call(ctx, "write_file", path="a.txt", content="one\ntwo\n")
    call(ctx, "write_file", path="b.txt", content="three\n")
    patch = (
        "--- a/a.txt\n+++ b/a.txt\n@@ -1,2 +1,2 @@\n one\n-two\n+TWO\n"
        "--- a/b.txt\n+++ b/b.txt\n@@ -1 +1 @@\n-nope\n+x\n"
    )
    with pytest.raises(ToolError, match=r"b\.txt"):
        call(ctx, "apply_patch", patch=patch)
    assert "one\ntwo\n" == call(ctx, "read_file", path="a.txt")


def test_a_patch_applies_and_can_create_files(ctx: ToolContext) -> None:
    """A good patch edits one file and creates another."""
    call(ctx, "write_file", path="a.txt", content="one\ntwo\n")
    patch = (
        "--- a/a.txt\n+++ b/a.txt\n@@ -1,2 +1,2 @@\n one\n-two\n+TWO\n"
        "--- /dev/null\n+++ b/new/c.txt\n@@ -0,0 +1 @@\n+c\n"
    )
    assert "applied to a.txt, new/c.txt" == call(ctx, "apply_patch", patch=patch)
    assert "one\nTWO\n" == call(ctx, "read_file", path="a.txt")
    assert "c\n" == call(ctx, "read_file", path="new/c.txt")


def test_a_patch_cannot_escape(ctx: ToolContext) -> None:
    """A patch naming a path outside the workspace is refused."""
    with pytest.raises(ToolError, match="leaves the workspace"):
        call(ctx, "apply_patch", patch="--- /dev/null\n+++ b/../evil.txt\n@@ -0,0 +1 @@\n+x\n")


def test_run_command_reports_exit_code_and_output(ctx: ToolContext) -> None:
    """A command runs in the workspace; its exit code and merged output come back."""
    call(ctx, "write_file", path="in.txt", content="hello")
    assert "exit code 3\nhello!\n" == call(
        ctx, "run_command", command="cat in.txt; echo '!'; exit 3"
    )


def test_run_command_timeout_kills_the_whole_process_group(ctx: ToolContext) -> None:
    """A command past the timeout is killed with its children; the model reads why."""
    marker = ctx.workspace.tree / "late"  # the one place a sandboxed command can write
    started = time.monotonic()
    with pytest.raises(ToolError, match="timed out after 1 s"):
        call(ctx, "run_command", command="(sleep 3; touch late) & sleep 30")
    assert time.monotonic() - started < 10
    time.sleep(3.5)
    assert not marker.exists()  # the background child died too


def test_run_command_sees_no_secrets(ctx: ToolContext, monkeypatch: pytest.MonkeyPatch) -> None:
    """The environment of a command carries PATH and locale, not the worker's secrets."""
    monkeypatch.setenv("CAIRN_SIGNING_KEY", "top-secret-" + "k" * 32)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    out = call(ctx, "run_command", command="env")
    assert "secret" not in out
    assert f"HOME={WORKDIR}" in out  # the workspace, as the sandbox shows it
    assert "\nPATH=" in out


def test_run_command_output_is_truncated(ctx: ToolContext) -> None:
    """Output past the limit keeps its head and tail and says how much was cut."""
    out = call(ctx, "run_command", command="seq 1 5000")
    assert out.startswith("exit code 0\n1\n2\n")
    assert out.rstrip().endswith("5000")
    assert "characters cut" in out
    assert len(out) < 400


def test_send_message_goes_to_the_outbox(ctx: ToolContext) -> None:
    """A message to a teammate waits in the outbox; unknown or self recipients are refused."""
    call(ctx, "send_message", to="reviewer", content="please review")
    assert [("coder", "reviewer", "please review")] == [
        (m.sender, m.recipient, m.content) for m in ctx.outbox
    ]
    for bad in ("nobody", "coder"):
        with pytest.raises(ToolError, match="unknown recipient"):
            call(ctx, "send_message", to=bad, content="x")


def test_tools_declare_their_effects() -> None:
    """Readers have none; the step's tree and outbox are the workspace; a command is external."""
    assert {
        "list_files": Effects.NONE,
        "read_file": Effects.NONE,
        "write_file": Effects.WORKSPACE,
        "edit_file": Effects.WORKSPACE,
        "apply_patch": Effects.WORKSPACE,
        "run_command": Effects.EXTERNAL,
        "send_message": Effects.WORKSPACE,
        "handoff": Effects.WORKSPACE,
        "finish": Effects.NONE,
        "spawn_agent": Effects.WORKSPACE,  # the spawn waits in the step's LC for the barrier
    } == {name: tool.effects for name, tool in TOOLS.items()}
    # A spec's default tools are the built-ins but those a spec must list to have.
    assert list(TOOL_NAMES) == [name for name in TOOLS if name not in ("handoff", "spawn_agent")]


def test_missing_arguments_are_errors_for_the_model(ctx: ToolContext) -> None:
    """A call without a required argument is a ToolError, not a crash."""
    with pytest.raises(ToolError, match="'content' must be a string"):
        call(ctx, "write_file", path="x")


def test_python_run_by_a_command_leaves_no_bytecode_in_the_workspace(ctx: ToolContext) -> None:
    """No __pycache__ to checkpoint as a change, nor stale bytecode for a rewritten module."""
    call(ctx, "write_file", path="mod.py", content="X = 1\n")
    out = call(ctx, "run_command", command="python3 -c 'import mod; print(mod.X)'")
    assert "exit code 0\n1\n" == out
    assert [] == list(ctx.workspace.tree.rglob("__pycache__"))
