"""`cairn`, the command line: parse (`parse`), call `cairn.Client` (`commands`), render.

`main` is the entry point; `python -m cairn.cli` runs it too.
"""

from __future__ import annotations

from cairn.cli.app import main

__all__ = ["main"]
