"""Fault points: where a test harness may make a step die, and nothing else may.

A scripted turn may ask that its worker die mid-step (`crash: {after_tools: N}`): that is
how the tests and the chaos suite show a retry resumes where a tool-level checkpoint left
off. The step itself never kills its process. It passes fault points (before each tool
call of a turn, and once past the last one, before its step checkpoint), and the scripted
model arms a crash for the step it answers. What happens at an armed point is the hook's
business: a production worker installs none, so an armed crash is logged and ignored;
`python -m cairn.testing.worker` installs one that SIGKILLs the process, as a killed
worker dies.

An armed crash belongs to the step that armed it: it lives in a context variable, so
steps running at once on other lanes of the worker (threads) never see it.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass

from cairn.agents.logs import get_logger

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Crash:
    """A crash armed for this step.

    It fires before tool call `after_tools` (0-based) starts, or past the turn's last
    tool call when the turn has no more calls than that.
    """

    after_tools: int


COMPACTED = -1  # `Crash.after_tools` of the compaction's point (`compacted`)
Hook = Callable[[Crash], None]

_armed: ContextVar[Crash | None] = ContextVar("cairn_armed_crash", default=None)
_hook: Hook | None = None


def install(hook: Hook | None) -> None:
    """Make `hook` what an armed fault point calls in this process (None: no hook)."""
    global _hook  # noqa: PLW0603 - one hook a process, set once at its start
    _hook = hook


def arm(crash: Crash | None) -> None:
    """Arm `crash` for the step running in this context (None disarms)."""
    _armed.set(crash)


def before_tool(index: int) -> None:
    """The point before tool call `index` of the turn (0-based), past its checkpoint."""
    crash = _armed.get()
    if crash is not None and crash.after_tools == index:
        _fire(crash)


def past_tools() -> None:
    """The point past the turn's last tool call, before the step's checkpoint."""
    crash = _armed.get()
    if crash is not None:
        _fire(crash)


def compacted() -> None:
    """The point right after a compaction's checkpoint (a retry must not pay for it again).

    No scripted turn arms it: the hook is told of it with `Crash(COMPACTED)` and decides
    (the chaos suite's testing worker kills itself here when told to, by its harness).
    """
    if _hook is not None:
        _hook(Crash(COMPACTED))


def _fire(crash: Crash) -> None:
    _armed.set(None)  # once a step
    if _hook is None:
        log.warning("scripted crash ignored: this worker installs no fault hook",
                    after_tools=crash.after_tools)  # fmt: skip
        return
    _hook(crash)
