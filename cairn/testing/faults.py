"""The fault hook tests and the chaos suite install: an armed crash kills the process.

`cairn.agents.faults` holds the points a step passes; a scripted turn's `crash` arms one,
and a file named by `CAIRN_TEST_KILL_AFTER_COMPACTION` arms the compaction's point.
A process that calls `install_fault_hook()` dies there with SIGKILL, as a killed worker
dies: no `finally`, no flush, no goodbye to Redis. A production worker never installs it.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from cairn.agents import faults
from cairn.agents.logs import get_logger

log = get_logger(__name__)


# A file whose path this variable holds arms the compaction's point: the first worker to
# pass it removes the file and dies, so one compaction is killed each time it is created.
KILL_AFTER_COMPACTION = "CAIRN_TEST_KILL_AFTER_COMPACTION"


def _kill(crash: faults.Crash) -> None:
    if crash.after_tools == faults.COMPACTED:
        flag = os.environ.get(KILL_AFTER_COMPACTION)
        if not flag:
            return
        try:
            Path(flag).unlink()  # one process wins the file: one kill each time it is made
        except FileNotFoundError:
            return
        log.warning("killed right after a compaction: SIGKILL")
    else:
        log.warning("scripted crash: SIGKILL", after_tools=crash.after_tools)
    os.kill(os.getpid(), signal.SIGKILL)


def install_fault_hook() -> None:
    """Make every armed fault point in this process SIGKILL it."""
    faults.install(_kill)
