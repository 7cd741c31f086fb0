"""Unified diffs: parsing, applying, offsets, refusals, end-of-file newlines, CRLF, difflib."""

from __future__ import annotations

import difflib
import re

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from cairn.agents.patch import apply_file_patch, parse_patch
from cairn.errors import PatchError, ToolError

ORIGINAL = "".join(f"line {n}\n" for n in range(1, 21))


def apply_one(original: str | None, diff: str) -> str | None:
    """Parse a one-file diff and apply it to `original`."""
    [patch] = parse_patch(diff)
    return apply_file_patch(original, patch)


def unified_diff(original: str, target: str) -> str:
    r"""The difflib diff of two texts, with the `\ No newline at end of file` marker it omits.

    Lines keep their own endings (so `lineterm` only ends the header lines); a last line
    without one gets the marker after it, as GNU diff writes it.
    """
    diff = difflib.unified_diff(
        original.splitlines(keepends=True), target.splitlines(keepends=True), "a/f", "b/f"
    )
    return "".join(
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in diff
    )


def test_modifies_a_file_with_several_hunks() -> None:
    """Each hunk of a git diff replaces its lines; the rest of the file is kept."""
    diff = (
        "diff --git a/src/app.py b/src/app.py\n"
        "index 83db48f..bf269f4 100644\n"
        "--- a/src/app.py\n"
        "+++ b/src/app.py\n"
        "@@ -2,3 +2,3 @@ def main():\n"
        " line 2\n"
        "-line 3\n"
        "+line three\n"
        " line 4\n"
        "@@ -17,4 +17,5 @@\n"
        " line 17\n"
        " line 18\n"
        "+line 18.5\n"
        " line 19\n"
        "-line 20\n"
        "+line twenty\n"
    )
    expected = (
        ORIGINAL.replace("line 3\n", "line three\n")
        .replace("line 19\n", "line 18.5\nline 19\n")
        .replace("line 20\n", "line twenty\n")
    )
    [patch] = parse_patch(diff)
    assert ("src/app.py", "src/app.py") == (patch.old_path, patch.new_path)
    assert expected == apply_file_patch(ORIGINAL, patch)


def test_creates_a_file_from_dev_null() -> None:
    """A patch from /dev/null creates the file; its old path is None."""
    diff = "--- /dev/null\n+++ b/new.txt\n@@ -0,0 +1,2 @@\n+hello\n+world\n"
    [patch] = parse_patch(diff)
    assert (None, "new.txt") == (patch.old_path, patch.new_path)
    assert "hello\nworld\n" == apply_file_patch(None, patch)


def test_deletes_a_file_to_dev_null() -> None:
    """A patch to /dev/null that removes every line deletes the file (the result is None)."""
    diff = "--- a/old.txt\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-hello\n-world\n"
    [patch] = parse_patch(diff)
    assert ("old.txt", None) == (patch.old_path, patch.new_path)
    assert apply_file_patch("hello\nworld\n", patch) is None


def test_refuses_a_deletion_that_leaves_lines() -> None:
    """Deleting a file whose lines the patch does not all remove is refused."""
    diff = "--- a/old.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-hello\n"
    with pytest.raises(PatchError, match=r"cannot delete old\.txt: the patch leaves 1 of"):
        apply_one("hello\nworld\n", diff)


def test_refuses_to_create_an_existing_file_or_patch_a_missing_one() -> None:
    """Creation needs no file, modification needs one."""
    create = "--- /dev/null\n+++ b/f\n@@ -0,0 +1 @@\n+x\n"
    modify = "--- a/f\n+++ b/f\n@@ -1 +1 @@\n-x\n+y\n"
    with pytest.raises(PatchError, match="cannot create f: it already exists"):
        apply_one("", create)
    with pytest.raises(PatchError, match="cannot patch f: it does not exist"):
        apply_one(None, modify)


def test_difflib_diff_gives_the_target() -> None:
    """A diff made by difflib.unified_diff turns the original into the target."""
    target = ORIGINAL.replace("line 5\n", "").replace("line 15\n", "line 15\nextra\n")
    assert target == apply_one(ORIGINAL, unified_diff(ORIGINAL, target))


def test_hunk_at_a_wrong_line_applies_where_it_uniquely_matches() -> None:
    """A hunk whose stated line is off still applies at its one match, and later hunks follow."""
    diff = (
        "--- a/f\n+++ b/f\n"
        "@@ -3,3 +3,3 @@\n line 9\n-line 10\n+ten\n line 11\n"
        "@@ -10,2 +10,2 @@\n line 16\n-line 17\n+seventeen\n"
    )
    expected = ORIGINAL.replace("line 10\n", "ten\n").replace("line 17\n", "seventeen\n")
    assert expected == apply_one(ORIGINAL, diff)


def test_hunk_off_its_line_with_several_matches_is_refused() -> None:
    """A hunk that does not match at its line but matches in two places is ambiguous."""
    diff = "--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n x\n-y\n+z\n"
    with pytest.raises(PatchError, match=r"hunk 1 of f is ambiguous: .* lines 2, 4;"):
        apply_one("a\nx\ny\nx\ny\n", diff)


def test_mismatching_context_names_file_hunk_and_line() -> None:
    """A hunk that matches nowhere is refused with its file, number and first wrong line."""
    diff = (
        "--- a/src/app.py\n+++ b/src/app.py\n"
        "@@ -2 +2 @@\n-line 2\n+two\n"
        "@@ -14,2 +14,2 @@\n line 14\n-return x\n+return z\n"
    )
    message = "hunk 2 of src/app.py does not apply: expected line 15 'return x' but found 'line 15'"
    with pytest.raises(PatchError) as raised:
        apply_one(ORIGINAL, diff)
    assert message == str(raised.value)
    assert isinstance(raised.value, ToolError)


@pytest.mark.parametrize(
    ("diff", "message"),
    [
        ("just words\n", "no file patch found"),
        ("--- a/f\n@@ -1 +1 @@\n-x\n+y\n", "malformed file header at line 1"),
        ("--- a/f\n+++ b/f\n", "malformed patch: f has a file header but no '@@' hunk"),
        ("@@ -1 +1 @@\n-x\n+y\n", "has no '--- old' / '+++ new' header"),
        ("--- a/f\n+++ b/f\n@@ -1,x +1 @@\n-x\n", "malformed hunk 1 of f: header '@@ -1,x"),
        ("--- a/f\n+++ b/f\n@@ -1 +1 @@\n?y\n", "malformed hunk 1 of f: it has no lines"),
        ("--- /dev/null\n+++ /dev/null\n@@ -0,0 +1 @@\n+x\n", "both '---' and '+++' are /dev/null"),
        (
            "--- a/f\n+++ b/f\n@@ -5 +5 @@\n-x\n+y\n@@ -3 +3 @@\n-x\n+y\n",
            "malformed hunk 2 of f: it starts at line 3, inside or before the previous hunk",
        ),
        ("Binary files a/i.png and b/i.png differ\n", "binary patches are not supported"),
    ],
)
def test_malformed_patch_is_refused(diff: str, message: str) -> None:
    """Bad headers, empty hunks and misplaced hunks are refused while parsing."""
    with pytest.raises(PatchError, match=re.escape(message)) as raised:
        parse_patch(diff)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    ("original", "diff", "expected"),
    [
        ("x\n", "@@ -1 +1 @@\n-x\n+y\n+z\n", "y\nz\n"),
        ("x\nw\n", "@@ -1,2 +1,2 @@\n-x\n+y\n", "y\nw\n"),
        ("a\nx\nb\n", "@@ -2,9 +2,1 @@\n a\n-x\n+X\n+Y\n b\n", "a\nX\nY\nb\n"),
        ("x\n", "@@ -1,5 +1,5 @@\n-x\n+y\n\n\nThat is the fix.\n", "y\n"),
        ("x\n", "@@ -1,0 +1,0 @@\n-x\n+y\n-- \n2.43.0\n", "y\n"),
    ],
    ids=["too-few", "too-many", "far-off", "blank-lines-then-words", "mail-signature"],
)
def test_a_hunk_whose_header_miscounts_its_lines_applies_as_its_body_says(
    original: str, diff: str, expected: str
) -> None:
    """The counts are read from the body; empty lines and words after it are not part of it."""
    assert expected == apply_one(original, "--- a/f\n+++ b/f\n" + diff)


def test_a_miscounted_hunk_ends_at_the_next_file() -> None:
    """A hunk that claims more lines than it has stops at the next file's header."""
    diff = (
        "--- a/one\n+++ b/one\n@@ -1,4 +1,4 @@\n-1\n+one\n"
        "--- a/two\n+++ b/two\n@@ -1 +1 @@\n-2\n+two\n+2b\n"
        "@@ -3 +4 @@\n-4\n+four\n"
    )
    one, two = parse_patch(diff)
    assert "one\n" == apply_file_patch("1\n", one)
    assert "two\n2b\n3\nfour\n" == apply_file_patch("2\n3\n4\n", two)


@pytest.mark.parametrize(
    ("original", "diff", "expected"),
    [
        ("a\nb\n", "@@ -2 +2 @@\n-b\n+c\n\\ No newline at end of file\n", "a\nc"),
        ("a\nb", "@@ -2 +2 @@\n-b\n\\ No newline at end of file\n+c\n", "a\nc\n"),
        ("a\nb", "@@ -1,2 +1,2 @@\n-a\n+z\n b\n\\ No newline at end of file\n", "z\nb"),
        ("a\nb", "@@ -1 +1 @@\n-a\n+z\n", "z\nb"),
    ],
    ids=["drops-newline", "adds-newline", "context-keeps-none", "unmarked-keeps-none"],
)
def test_no_newline_at_end_of_file_marker_is_honoured(
    original: str, diff: str, expected: str
) -> None:
    """The marker sets whether the file ends with a newline; without it the file's state stays."""
    assert expected == apply_one(original, "--- a/f\n+++ b/f\n" + diff)


def test_marker_anchors_the_hunk_to_the_end_of_the_file() -> None:
    """A hunk marked as ending the file does not apply to a line that is not last."""
    diff = "--- a/f\n+++ b/f\n@@ -1 +1 @@\n-a\n\\ No newline at end of file\n+b\n"
    with pytest.raises(PatchError, match="expected the file to end after line 1"):
        apply_one("a\nb\n", diff)


def test_several_files_in_one_patch() -> None:
    """Each file of a multi-file patch gets its own paths and hunks, in order."""
    diff = (
        "--- a/one.txt\t2024-01-01 10:00:00.000000000 +0000\n"
        "+++ b/one.txt\t2024-01-02 10:00:00.000000000 +0000\n"
        "@@ -1 +1 @@\n-1\n+one\n"
        "diff --git a/two.txt b/two.txt\nnew file mode 100644\nindex 0000000..5626abf\n"
        "--- /dev/null\n+++ b/two.txt\n@@ -0,0 +1 @@\n+two\n"
        "--- three.txt\n+++ three.txt\n@@ -1 +0,0 @@\n-3\n"
    )
    patches = parse_patch(diff)
    assert [("one.txt", "one.txt"), (None, "two.txt"), ("three.txt", "three.txt")] == [
        (patch.old_path, patch.new_path) for patch in patches
    ]
    originals: list[str | None] = ["1\n", None, "3\n"]
    assert ["one\n", "two\n", ""] == [
        apply_file_patch(original, patch)
        for original, patch in zip(originals, patches, strict=True)
    ]


def test_paths_keep_a_and_b_unless_both_sides_carry_them() -> None:
    """`a/` and `b/` are stripped as a pair; a plain diff's own `a/` directory is kept."""
    diff = "--- a/x.py\n+++ a/x.py\n@@ -1 +1 @@\n-x\n+y\n"
    assert [("a/x.py", "a/x.py")] == [(p.old_path, p.new_path) for p in parse_patch(diff)]


def test_crlf_line_endings_are_preserved() -> None:
    """A CRLF file stays CRLF whether the patch lines carry CR or not."""
    original = "one\r\ntwo\r\nthree\r\n"
    for eol in ("\n", "\r\n"):
        diff = f"--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n one{eol}-two{eol}+2{eol} three{eol}"
        assert "one\r\n2\r\nthree\r\n" == apply_one(original, diff)


lines_of_text = st.lists(st.text(alphabet="ab -+@", max_size=3), max_size=12)


@given(original=lines_of_text, target=lines_of_text, ends=st.tuples(st.booleans(), st.booleans()))
def test_difflib_round_trip(
    original: list[str], target: list[str], ends: tuple[bool, bool]
) -> None:
    """Any difflib diff, with the no-newline marker added where due, turns original into target."""
    old = "\n".join(original) + ("\n" if ends[0] and original else "")
    new = "\n".join(target) + ("\n" if ends[1] and target else "")
    assume(old != new)
    assert new == apply_one(old, unified_diff(old, new))


@pytest.mark.parametrize(
    ("original", "target"),
    [
        (["- "], []),
        (["keep", "-- x"], ["keep", "++ y"]),
        (["--- a", "b"], ["+++ c", "b"]),
    ],
    ids=["removed-line-reads-as-a-signature", "lines-read-as-a-file-header", "at-the-top"],
)
def test_body_lines_that_look_like_headers_or_signatures_are_body(
    original: list[str], target: list[str]
) -> None:
    """Lines the header's counts still expect are body, even where they read as `-- ` or `---`."""
    old, new = "".join(f"{x}\n" for x in original), "".join(f"{x}\n" for x in target)
    assert new == apply_one(old, unified_diff(old, new))
