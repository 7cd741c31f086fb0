"""Tools a package gives Cairn's workers through its `cairn.tools` entry points."""

from __future__ import annotations

import os
from pathlib import Path

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


@tool(effects="external")
def stamp(ctx: ToolContext, label: str) -> str:
    """Stamp `label` in the ledger outside the workspace, once per idempotency key.

    Every call is logged (`<ledger>.calls`); the ledger applies a key once, as a payment
    API's idempotency key would.

    Args:
        ctx: the call's context, which Cairn gives (the model does not)
        label: what to stamp

    """
    ledger = Path(os.environ["CAIRN_TEST_LEDGER"])  # where the test wants it
    with ledger.with_suffix(".calls").open("a") as calls:
        calls.write(f"{ctx.idempotency_key}\t{label}\n")
    applied = ledger.read_text().split("\n") if ledger.exists() else []
    if any(line.startswith(f"{ctx.idempotency_key}\t") for line in applied):
        return f"{label}: stamped already"
    with ledger.open("a") as out:
        out.write(f"{ctx.idempotency_key}\t{label}\n")
    return f"{label}: stamped"
