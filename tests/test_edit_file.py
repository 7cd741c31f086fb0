"""`edit_file`: replace one exact, unique piece of text in a workspace file, or say why not."""

from __future__ import annotations

from pathlib import Path

import pytest

from cairn.agents.spec import StepPolicy
from cairn.agents.task import start_task
from cairn.agents.tools import TOOLS, ToolContext
from cairn.agents.workspace import Workspace
from cairn.errors import ToolError
from cairn.storage.store import CheckpointStore
from tests.agent_harness import drive, files_of, record, scripted

CODE = "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n"


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    """A tool context over a workspace holding calc.py."""
    workspace = Workspace(tmp_path / "cache", "t", "coder")
    (workspace.tree / "calc.py").write_text(CODE)
    return ToolContext(workspace, "coder", ["coder"], 1, StepPolicy())


def edit(ctx: ToolContext, path: str, old: str, new: str) -> str:
    return TOOLS["edit_file"].run(ctx, {"path": path, "old": old, "new": new})


def content(ctx: ToolContext, path: str = "calc.py") -> bytes:
    return (ctx.workspace.tree / path).read_bytes()


def test_a_unique_text_is_replaced_and_its_line_named(ctx: ToolContext) -> None:
    """The one occurrence, over several lines, becomes the new text; the rest stays."""
    old = "def add(a, b):\n    return a - b"
    assert "replaced the text at line 1 of calc.py" == edit(
        ctx, "calc.py", old, "def add(a, b):\n    return a + b"
    )
    assert CODE.replace("a - b", "a + b", 1).encode() == content(ctx)
    at_5 = "replaced the text at line 5 of calc.py"
    assert at_5 == edit(ctx, "calc.py", "def sub", "def minus")
    assert at_5 == edit(ctx, "calc.py", "def minus(a, b):\n", "")  # a deletion
    assert b"def add(a, b):\n    return a + b\n\n\n    return a - b\n" == content(ctx)


def test_a_text_that_is_not_there_is_an_error_and_nothing_changes(ctx: ToolContext) -> None:
    """Zero matches: the model is told so (whitespace counts) and the file is untouched."""
    with pytest.raises(ToolError, match=r"^old occurs 0 times in calc\.py; it must occur exactly"):
        edit(ctx, "calc.py", "return  a - b", "return a + b")
    assert CODE.encode() == content(ctx)


def test_a_text_found_several_times_is_an_error_naming_the_lines(ctx: ToolContext) -> None:
    """Several matches: how many, on which lines, and how to make the text unique."""
    with pytest.raises(ToolError) as raised:
        edit(ctx, "calc.py", "return a - b", "return a + b")
    assert (
        "old occurs 2 times in calc.py (at lines 2, 6); it must occur exactly once: add "
        "surrounding lines to make it unique"
    ) == str(raised.value)
    assert CODE.encode() == content(ctx)


def test_overlapping_and_many_matches_are_counted(ctx: ToolContext) -> None:
    """`aa` in `aaa` is two matches; past five the lines shown end with an ellipsis."""
    edit(ctx, "calc.py", CODE, "aaa\n" + "x\n" * 7)
    with pytest.raises(ToolError, match=r"old occurs 2 times in calc\.py \(at lines 1, 1\)"):
        edit(ctx, "calc.py", "aa", "b")
    with pytest.raises(ToolError, match=r"old occurs 7 times .* \(at lines 2, 3, 4, 5, 6, …\)"):
        edit(ctx, "calc.py", "x", "y")


def test_a_crlf_file_is_edited_with_the_models_newlines_and_stays_crlf(ctx: ToolContext) -> None:
    """A text whose lines end in LF matches a CRLF file's lines; the new text gets CRLF too."""
    (ctx.workspace.tree / "win.txt").write_bytes(b"one\r\ntwo\r\nthree\r\n")
    assert "replaced the text at line 2 of win.txt" == edit(ctx, "win.txt", "two\nthree", "2\n3")
    assert b"one\r\n2\r\n3\r\n" == content(ctx, "win.txt")


@pytest.mark.parametrize(
    ("path", "old", "message"),
    [
        ("missing.py", "x", "no such file: missing.py"),
        ("sub", "x", "no such file: sub"),
        ("calc.py", "", "old is empty"),
        ("bin.dat", "x", "bin.dat is not UTF-8 text"),
    ],
)
def test_what_cannot_be_edited_is_an_error_for_the_model(
    ctx: ToolContext, path: str, old: str, message: str
) -> None:
    """A missing file, a directory, an empty old text and a binary file are refused."""
    (ctx.workspace.tree / "sub").mkdir()
    (ctx.workspace.tree / "bin.dat").write_bytes(b"\xff\xfex")
    with pytest.raises(ToolError, match=message):
        edit(ctx, path, old, "y")


@pytest.mark.parametrize("path", ["/etc/passwd", "../calc.py", "a/../../x", "", "a\x00b"])
def test_paths_leaving_the_workspace_are_refused(ctx: ToolContext, path: str) -> None:
    """Absolute paths, `..`, empty paths and NUL bytes never reach a file."""
    with pytest.raises(ToolError, match=r"leaves the workspace|empty or contains a NUL"):
        edit(ctx, path, "root", "toor")


def test_a_symlink_leading_out_is_refused(ctx: ToolContext, tmp_path: Path) -> None:
    """A link inside the workspace to a file outside it cannot be edited through."""
    secret = tmp_path / "secret.txt"
    secret.write_text("password=hunter2\n")
    (ctx.workspace.tree / "link").symlink_to(secret)
    (ctx.workspace.tree / "dir").symlink_to(tmp_path)
    for path in ("link", "dir/secret.txt"):
        with pytest.raises(ToolError, match="outside the workspace"):
            edit(ctx, path, "hunter2", "x")
    assert "password=hunter2\n" == secret.read_text()


def test_an_edit_in_a_step_reaches_the_global_checkpoint(
    real_store: CheckpointStore, tmp_path: Path
) -> None:
    """The edited file is in the workspace the barrier commits; a failed edit changes nothing."""
    turn = {"tools": [
        {"name": "edit_file", "args": {"path": "calc.py", "old": "return a - b", "new": "x"}},
        {"name": "edit_file", "args": {"path": "calc.py", "old": "add(a, b):\n    return a -",
                                       "new": "add(a, b):\n    return a +"}},
    ]}  # fmt: skip
    start_task(real_store, record("edit", scripted("coder", [turn])), {"calc.py": CODE.encode()})
    gc = drive(real_store, "edit", tmp_path / "cache")
    assert CODE.replace("a - b", "a + b", 1).encode() == files_of(real_store, gc)["calc.py"]
