"""Tools a package gives Cairn's workers through its `cairn.tools` entry points."""

from __future__ import annotations

from cairn import ToolContext, tool


@tool(effects="none")
def shout(text: str) -> str:
    """Say `text` loudly.

    Args:
        text: what to say

    """
    return text.upper() + "!"


@tool(effects="workspace")
def tally(ctx: ToolContext, word: str, times: int = 1) -> dict[str, int]:
    """Add `word` to the workspace's tally.txt, `times` times; return the counts.

    Args:
        ctx: the call's context, which Cairn gives (the model does not)
        word: the word to count
        times: how many times to count it

    """
    path = ctx.path("tally.txt")
    words = path.read_text().split() if path.exists() else []
    words += [word] * times
    path.write_text("".join(f"{w}\n" for w in words))
    return {w: words.count(w) for w in sorted(set(words))}
