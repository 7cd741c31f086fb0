"""The heap of a long-running process: what it built to start is never scanned again.

A coordinator or a worker imports and builds a few hundred thousand objects before it
serves (modules, pydantic's models and validators, RQ, redis-py), and none of them is
garbage. Left in the collector's oldest generation, every full collection walks them
all: 150-480 ms each, measured in the scale bench's processes, a pause that every step
and barrier in flight waits out. `settle` moves them to the permanent generation, which
the collector never scans; what the process allocates from then on is collected as ever.
"""

from __future__ import annotations

import gc


def settle() -> None:
    """Collect once, then freeze what survives: call it when the process is ready to serve."""
    gc.collect()
    gc.freeze()
