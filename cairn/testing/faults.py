"""The fault hook tests and the chaos suite install: an armed crash kills the process.

`cairn.agents.faults` holds the points a step passes; a scripted turn's `crash` arms one.
A process that calls `install_fault_hook()` dies there with SIGKILL, as a killed worker
dies: no `finally`, no flush, no goodbye to Redis. A production worker never installs it.
"""

from __future__ import annotations

import os
import signal

from cairn.agents import faults
from cairn.agents.logs import get_logger

log = get_logger(__name__)


def _kill(crash: faults.Crash) -> None:
    log.warning("scripted crash: SIGKILL", after_tools=crash.after_tools)
    os.kill(os.getpid(), signal.SIGKILL)


def install_fault_hook() -> None:
    """Make every armed fault point in this process SIGKILL it."""
    faults.install(_kill)
