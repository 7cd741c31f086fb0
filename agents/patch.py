"""Apply unified diffs (`diff -u`, `git diff`) in pure Python, for the agents' `apply_patch` tool.

`parse_patch` turns a diff into `FilePatch`es; `apply_file_patch` applies one to a file's text.
Context and removed lines must match exactly (no fuzz). A hunk that does not match at its stated
line is moved to the only place it matches, as GNU patch does with offsets; when it matches
nowhere or in several places, `PatchError` says which hunk and why, so the model can fix it.
A hunk's line counts are taken from its body when its header's are off (models miscount).
Paths are returned as written (less git's `a/`, `b/`): the caller's workspace jail checks them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cairn.errors import PatchError

_HUNK_HEADER = re.compile(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_BODY_OPS = (" ", "-", "+")


@dataclass(frozen=True)
class Hunk:
    r"""One `@@` block: the old and new line ranges it declares and its body lines.

    `lines` keep their one-character op (`' '`, `'-'`, `'+'`) and lose their newline; the
    `*_missing_newline` flags record a `\ No newline at end of file` marker on that side.
    """

    old_start: int
    old_count: int
    new_start: int
    new_count: int
    lines: list[str]
    old_missing_newline: bool = False
    new_missing_newline: bool = False

    @property
    def old_index(self) -> int:
        """0-based index of the first old line; for a pure insertion, the line it goes before."""
        return self.old_start - 1 if self.old_count else self.old_start

    @property
    def old_lines(self) -> list[str]:
        """The lines the hunk expects in the file (context and removed)."""
        return [line[1:] for line in self.lines if line[0] in " -"]

    @property
    def new_lines(self) -> list[str]:
        """The lines the hunk leaves in their place (context and added)."""
        return [line[1:] for line in self.lines if line[0] in " +"]


@dataclass(frozen=True)
class FilePatch:
    """The hunks for one file; a None path is /dev/null (the file is created or deleted)."""

    old_path: str | None
    new_path: str | None
    hunks: list[Hunk]

    @property
    def path(self) -> str:
        """The name to show for this file: the new path, or the old one when it is deleted."""
        return self.new_path or self.old_path or "/dev/null"


def parse_patch(text: str) -> list[FilePatch]:
    """Split a unified diff into its file patches, in order.

    Lines outside file patches (`diff --git`, `index`, commentary) are ignored. Raises PatchError
    when a header or hunk is malformed, or when the text holds no file patch at all.
    """
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the final newline ends the last line; it is not an empty context line
    patches: list[FilePatch] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith(("Binary files ", "GIT binary patch")):
            raise PatchError(f"binary patches are not supported: {line!r}")
        if line.startswith("@@"):
            raise PatchError(f"malformed patch: hunk {line!r} has no '--- old' / '+++ new' header")
        if not line.startswith("--- "):
            i += 1
            continue
        if i + 1 == len(lines) or not lines[i + 1].startswith("+++ "):
            raise PatchError(
                f"malformed file header at line {i + 1}: {line!r} is not followed by '+++ new'"
            )
        old_path, new_path = _parse_paths(line, lines[i + 1])
        patch, previous_end = FilePatch(old_path, new_path, []), 0
        i += 2
        while i < len(lines) and lines[i].startswith("@@"):
            where = f"hunk {len(patch.hunks) + 1} of {patch.path}"
            hunk, i = _parse_hunk(lines, i, where)
            if hunk.old_index < previous_end:
                raise PatchError(
                    f"malformed {where}: it starts at line {hunk.old_start}, inside or before "
                    "the previous hunk; hunks must go down the file without overlapping"
                )
            patch.hunks.append(hunk)
            previous_end = hunk.old_index + hunk.old_count
        if not patch.hunks:
            raise PatchError(f"malformed patch: {patch.path} has a file header but no '@@' hunk")
        patches.append(patch)
    if not patches:
        raise PatchError("no file patch found: expected '--- old', '+++ new' and '@@' lines")
    return patches


def apply_file_patch(original: str | None, patch: FilePatch) -> str | None:
    r"""Return the file's text after `patch`, or None when the patch deletes the file.

    `original` is None when the file does not exist. Line endings are kept ('\r\n' when the
    file uses it throughout). Raises PatchError when the patch does not fit the file.
    """
    if patch.old_path is None and original is not None:
        raise PatchError(f"cannot create {patch.path}: it already exists")
    if patch.old_path is not None and original is None:
        raise PatchError(f"cannot patch {patch.path}: it does not exist")
    text = original or ""
    eol = "\r\n" if "\n" in text and text.count("\r\n") == text.count("\n") else "\n"
    lines = text.split(eol)
    ends_with_newline = lines[-1] == ""
    if ends_with_newline:
        lines.pop()
    result: list[str] = []
    cursor = offset = 0
    for number, hunk in enumerate(patch.hunks, start=1):
        old, new = _without_cr(hunk.old_lines, eol), _without_cr(hunk.new_lines, eol)
        at_end = hunk.old_missing_newline or hunk.new_missing_newline
        where = f"hunk {number} of {patch.path}"
        at = _locate(lines, old, max(hunk.old_index + offset, cursor), cursor, at_end, where)
        result += lines[cursor:at] + new
        cursor, offset = at + len(old), at - hunk.old_index
        if cursor == len(lines) and hunk.old_missing_newline != hunk.new_missing_newline:
            ends_with_newline = not hunk.new_missing_newline
    result += lines[cursor:]
    if patch.new_path is None:
        if result:
            raise PatchError(
                f"cannot delete {patch.path}: the patch leaves {len(result)} of its lines; "
                "a deletion must remove every line"
            )
        return None
    return eol.join(result) + (eol if result and ends_with_newline else "")


def _parse_paths(old_line: str, new_line: str) -> tuple[str | None, str | None]:
    """The paths of a `---` / `+++` pair (None for /dev/null), less git's `a/` and `b/`."""
    old, new = (_parse_name(line) for line in (old_line, new_line))
    if old is None and new is None:
        raise PatchError("malformed file header: both '---' and '+++' are /dev/null")
    # Strip only when the pair looks like git's: a plain diff of a directory `a/` keeps its name.
    if (old is None or old.startswith("a/")) and (new is None or new.startswith("b/")):
        return (old and old[2:]), (new and new[2:])
    return old, new


def _parse_name(header: str) -> str | None:
    """The path of one `---` or `+++` line, without timestamp; None for /dev/null."""
    name = header[4:].split("\t", 1)[0].rstrip("\r")
    if not name:
        raise PatchError(f"malformed file header {header!r}: the path is missing")
    return None if name == "/dev/null" else name


def _parse_hunk(lines: list[str], i: int, where: str) -> tuple[Hunk, int]:
    """The hunk whose `@@` header is `lines[i]`, and the index of the line after it.

    The body ends where the header's counts say, when it looks done there; else (the
    counts are off) at the first line that cannot be body, and the counts are the body's.
    """
    header = _HUNK_HEADER.match(lines[i])
    if header is None:
        raise PatchError(
            f"malformed {where}: header {lines[i]!r} is not '@@ -start,count +start,count @@'"
        )
    old_start, new_start = int(header[1]), int(header[3])
    declared = tuple(1 if n is None else int(n) for n in (header[2], header[4]))
    body: list[str] = []
    old_seen = new_seen = blank_tail = 0
    old_missing = new_missing = False
    i += 1
    while i < len(lines):
        line = lines[i] or " "  # an empty context line whose space was stripped
        # A body line the header's counts still expect is body, whatever it looks like (a
        # removed "- " line reads "-- ", as a mail signature does).
        expected = line[0] in _BODY_OPS and (
            old_seen + (line[0] != "+") <= declared[0]
            and new_seen + (line[0] != "-") <= declared[1]
        )
        if line.startswith("\\") and body:
            old_missing |= body[-1][0] != "+"
            new_missing |= body[-1][0] != "-"
        elif (expected and _starts_file(lines, i)) or (
            not expected and _ends_hunk(lines, i, (old_seen, new_seen) == declared)
        ):
            break
        else:
            body.append(line)
            old_seen += line[0] != "+"
            new_seen += line[0] != "-"
            blank_tail = blank_tail + 1 if not lines[i] else 0
        i += 1
    if (old_seen, new_seen) != declared and blank_tail:
        # Empty lines ending a miscounted hunk separate it from what follows: not context.
        del body[-blank_tail:]
        i -= blank_tail
        old_seen, new_seen = old_seen - blank_tail, new_seen - blank_tail
    if not body:
        raise PatchError(f"malformed {where}: it has no lines (' ', '-' or '+')")
    if old_seen and not old_start:
        raise PatchError(f"malformed {where}: old lines cannot start at line 0")
    hunk = Hunk(old_start, old_seen, new_start, new_seen, body, old_missing, new_missing)
    return hunk, i


def _ends_hunk(lines: list[str], i: int, counted: bool) -> bool:
    """True when the hunk's body ends before `lines[i]`; `counted`: the header's counts are met.

    Where the counts are met the body ends unless the line plainly goes on with it; else it
    ends only at a line that cannot be body.
    """
    if counted and not _continues_hunk(lines, i):
        return True
    line = lines[i] or " "
    return line[0] not in _BODY_OPS or _starts_file(lines, i) or _is_signature(lines, i)


def _starts_file(lines: list[str], i: int) -> bool:
    """True when `lines[i]` is a `--- old` line followed by its `+++ new` line and a hunk.

    The `@@` after them tells a file header from a removed `-- ` line and an added `++ `.
    """
    return (
        lines[i].startswith("--- ")
        and i + 2 < len(lines)
        and lines[i + 1].startswith("+++ ")
        and lines[i + 2].startswith("@@")
    )


def _is_signature(lines: list[str], i: int) -> bool:
    """True when `lines[i]` is the `-- ` that ends a `git format-patch` mail, not body."""
    return lines[i] == "-- " and (i + 1 == len(lines) or not lines[i + 1].startswith(_BODY_OPS))


def _continues_hunk(lines: list[str], i: int) -> bool:
    """True when `lines[i]` looks like more hunk body, not a next header or a git signature."""
    if i == len(lines) or not lines[i].startswith(_BODY_OPS) or lines[i] == "-- ":
        return False
    next_header = i + 1 < len(lines) and lines[i + 1].startswith("+++ ")
    return not (lines[i].startswith("--- ") and next_header)


def _without_cr(lines: list[str], eol: str) -> list[str]:
    """Hunk lines as they read in a file split on `eol`: a CRLF file's lines have no CR."""
    return [line.removesuffix("\r") for line in lines] if eol == "\r\n" else lines


def _locate(
    lines: list[str], old: list[str], expected: int, cursor: int, at_end: bool, where: str
) -> int:
    """Where `old` sits in `lines`: at `expected` if it matches there, else its one match.

    Matches start at `cursor` or later; `at_end` requires the match to end the file.
    """

    def fits(at: int) -> bool:
        end = at + len(old)
        return end <= len(lines) and lines[at:end] == old and (end == len(lines) or not at_end)

    if fits(expected):
        return expected
    if not old:
        place = " at the end of the file" if at_end else ""
        raise PatchError(
            f"{where} does not apply: it inserts after line {expected}{place} "
            f"but the file has {len(lines)} lines"
        )
    matches = [at for at in range(cursor, len(lines) - len(old) + 1) if fits(at)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        found = ", ".join(str(at + 1) for at in matches[:5])
        raise PatchError(
            f"{where} is ambiguous: it does not match at line {expected + 1} but matches at "
            f"lines {found}; add context lines to make it unique"
        )
    raise PatchError(f"{where} does not apply: {_describe_mismatch(lines, old, expected)}")


def _describe_mismatch(lines: list[str], old: list[str], at: int) -> str:
    """The first line where `old` differs from `lines` read from `at`."""
    for k, want in enumerate(old, start=at):
        if k >= len(lines):
            return f"expected line {k + 1} {want!r} but the file has only {len(lines)} lines"
        if lines[k] != want:
            return f"expected line {k + 1} {want!r} but found {lines[k]!r}"
    return f"expected the file to end after line {at + len(old)}"
