"""`python -m cairn.cli ARGS`: the `cairn` command."""

from __future__ import annotations

import sys

from cairn.cli.app import main

if __name__ == "__main__":
    sys.exit(main())
