"""The exit codes of `cairn`, as its help's epilog states them."""

from __future__ import annotations

from enum import IntEnum


class Exit(IntEnum):
    """What a `cairn` command's exit status means."""

    OK = 0  # success
    FAILED = 1  # the operation or the task failed
    BAD_INPUT = 2  # an invalid spec, an unknown task, bad arguments
    UNAVAILABLE = 3  # Redis does not answer: worth retrying
    TIMED_OUT = 4  # `--wait --timeout` ran out before the task ended (it runs on)


EPILOG = """\
exit codes:
  0  success
  1  the operation or the task failed
  2  bad input: an invalid spec, an unknown task, bad arguments
  3  Redis is unreachable, or none is configured (worth retrying)
  4  --wait ran out (--timeout) before the task ended; the task runs on
Every failure is one line on stderr, never a traceback (--log-level debug adds it).
"""
