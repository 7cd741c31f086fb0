"""Reading records of an older schema: one upcaster per version step.

A record carries the `schema_version` of the code that wrote it. A change of any stored
record's schema raises `SCHEMA_VERSION` (storage/records.py) and adds here the step from
the version before: `ADDITIVE` when it only added fields that have defaults (an older
record then parses as it is: the fields take their defaults), else a function that turns
the older record's JSON object into the newer one's (renamed or moved fields, changed
meanings). A record of a version newer than the code is refused (storage/codec.py), never
misread. tests/golden/ holds records of every version, read by every change.

Steps:
  1 → 2: a local checkpoint keeps its history's running model usage (`usage`, None
         before: the reader adds up the trace), and usage carries `cost_usd`; task
         documents gained `prices` and `budget`. All added, with defaults.
  2 → 3: a message keeps a tool result's images (`images`, empty before, and left out
         of the stored form while empty). Added, with a default.
  3 → 4: a local checkpoint keeps its agent kind's own state (`kind_state`, empty
         before, and left out of the stored form while empty). Added, with a default.
  4 → 5: a tool result says whether its call failed (`error`); a local checkpoint keeps
         what the model is sent of its history once compacted (`context`) and the result
         the agent gave `finish` (`result`); a trace record says how many messages a
         compaction folded (`compacted`); usage counts cache writes (`cache_write_tokens`).
         All added, with defaults, and left out of the stored form while unset.
  5 → 6: a local checkpoint keeps the members its step spawned (`spawns`), a global
         checkpoint those spawned at run time, with their specs and spawners
         (`spawned`), and a task's record its `max_agents`. All added, with defaults,
         and left out of the stored form while unset.
  6 → 7: a global checkpoint says what wrote it (`origin`: superstep, restore, rollback
         or fork) and which GC a restore, rollback or fork started from (`source`, with
         `source_task` for a fork); its `created_at` is when it was written, where a
         restore's GC of schema 6 carried its source's. Added, with defaults: an older
         GC's `origin` is None, unknown (shown as "-"), since schema 6 wrote a restore's
         GC as it wrote a barrier's. A task's archive may keep `AbortedGCs`, a new record.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from cairn.storage.records import SCHEMA_VERSION

Json = dict[str, Any]
Upcaster = Callable[[Json], Json]


def _additive(record: Json) -> Json:
    return record


ADDITIVE: Final[Upcaster] = _additive
# version → the step from it to the next one
UPCASTERS: dict[int, Upcaster] = {
    1: ADDITIVE,
    2: ADDITIVE,
    3: ADDITIVE,
    4: ADDITIVE,
    5: ADDITIVE,
    6: ADDITIVE,
}


def needs_json(version: int) -> bool:
    """True when a record of `version` must be upcast as JSON (some step is not additive)."""
    return any(UPCASTERS[v] is not ADDITIVE for v in range(version, SCHEMA_VERSION))


def upcast(record: Json) -> Json:
    """`record` (a JSON object of an older schema) as the current schema has it.

    Raises `KeyError` for a version no step starts from (older than any this code reads).
    """
    version = record.get("schema_version", 1)
    for step in range(version, SCHEMA_VERSION):
        record = UPCASTERS[step](record)
    return record
