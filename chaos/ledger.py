"""An external system that honours Cairn's idempotency keys: `ledger.py DIR KEY VALUE`.

It stands for anything outside the workspace a tool changes (a payment, a ticket, an
email). Every call is logged in `DIR/calls.log`; an effect is applied (a line in
`DIR/applied.log`) only the first time its key is seen, so a step that runs again after
a crash, a zombie that wakes up, or a replay after a restore applies nothing twice. It
answers the same either way, as an idempotent API does. Standalone on purpose: it runs
under `run_command`'s scrubbed environment, with no access to Cairn's packages.
"""

from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path


def record(directory: Path, key: str, value: str) -> bool:
    """Log the call; apply `value` unless `key` was applied before. True when applied."""
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / "lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one writer at a time, across processes
        with (directory / "calls.log").open("a") as calls:
            calls.write(f"{key}\t{value}\n")
        applied = directory / "applied.log"
        seen = {line.split("\t", 1)[0] for line in applied.read_text().splitlines()} \
            if applied.exists() else set()  # fmt: skip
        if key in seen:
            return False
        with applied.open("a") as out:
            out.write(f"{key}\t{value}\n")
            out.flush()
            os.fsync(out.fileno())  # applied means applied, crash or not
        return True


def main(argv: list[str]) -> int:
    """Run the command line; exit 2 without a key (a caller that does not pass one)."""
    if len(argv) != 4 or not argv[2]:
        print("usage: ledger.py DIR KEY VALUE (KEY: $CAIRN_IDEMPOTENCY_KEY)", file=sys.stderr)
        return 2
    record(Path(argv[1]), argv[2], argv[3])
    print(f"recorded {argv[3]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
