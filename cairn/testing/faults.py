"""The fault hook tests and the chaos suite install: an armed crash kills the process.

`cairn.agents.faults` holds the points a step passes; a scripted turn's `crash` arms one,
and a file named by the testing worker's `--kill-after-compaction` the compaction's point.
A process that calls `install_fault_hook()` dies there with SIGKILL, as a killed worker
dies: no `finally`, no flush, no goodbye to Redis. A production worker never installs it.
"""

from __future__ import annotations

import os
import signal
from functools import partial
from pathlib import Path

from cairn.agents import faults
from cairn.agents.logs import get_logger

log = get_logger(__name__)


# The testing worker's option naming the file that arms the compaction's point.
KILL_AFTER_COMPACTION = "--kill-after-compaction"


def _kill(crash: faults.Crash, flag: Path | None) -> None:
    if crash.after_tools == faults.COMPACTED:
        if flag is None:
            return
        try:
            flag.unlink()  # one process wins the file: one kill each time it is made
        except FileNotFoundError:
            return
        log.warning("killed right after a compaction: SIGKILL")
    else:
        log.warning("scripted crash: SIGKILL", after_tools=crash.after_tools)
    os.kill(os.getpid(), signal.SIGKILL)


def install_fault_hook(kill_after_compaction: Path | None = None) -> None:
    """Make every armed fault point in this process SIGKILL it.

    With `kill_after_compaction`, the compaction's point is armed by that file: the first
    process of all that share it to pass the point removes it and dies there, so each time
    the file is made, one compaction's worker is killed.
    """
    faults.install(partial(_kill, flag=kill_after_compaction))
