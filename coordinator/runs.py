"""A task's run state in Redis: what the coordinator is doing with it right now.

`cairn:{task}:run` holds the status, the superstep in flight (0 between supersteps), the
GC number and epoch it will commit under, and what the coordinator learnt (the reason a
task ended, verify's output, the last archived GC); `cairn:{task}:steps` the steps in
flight. Any coordinator can pick it up. Every change goes through `RunState.write`, which
a coordinator makes with its lease token: once another coordinator has claimed the task
with a newer token, the old one's writes are refused (`FencedWrite`).

The status kept is a `TaskState`, or `RESTORING` while a restore runs (a moment of a
running task: its status reports it as `running`, with `restoring` set).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from enum import Enum
from typing import Self, cast

import redis
from redis.exceptions import NoScriptError

from cairn.agents.logs import get_logger
from cairn.errors import CairnError, CorruptCheckpoint, RecordNotFound
from cairn.storage import keys
from cairn.storage.backends.redis import Lua, parse_ref, script, translated, translating
from cairn.storage.base import HotStore
from cairn.storage.public import public
from cairn.storage.records import GCOrigin, GlobalCheckpoint, LCRef
from cairn.storage.redact import redact
from cairn.storage.store import CheckpointStore

log = get_logger(__name__)


@public
class TaskState(str, Enum):
    """Where a task is: running, paused, waiting for a person, or ended one of four ways."""

    RUNNING = "running"
    PAUSED = "paused"
    WAITING_APPROVAL = "waiting_approval"  # running, but an agent's tool call waits for a person
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    UNRECOVERABLE = "unrecoverable"

    @property
    def ended(self) -> bool:
        """True for the four states a task never leaves on its own."""
        return self in TERMINAL


TERMINAL = frozenset(
    {TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED, TaskState.UNRECOVERABLE}
)
RESTORING = "restoring"  # the run status while a restore runs; reported as running
# The run's field naming the last superstep the task had run when it was last restored:
# the supersteps up to it run again what the restore discarded (their spans say `replayed`).
REPLAY_UNTIL = "replay_until"


# The run fields written for people to read. They quote what failed (a model's error, a
# verify's output), which may hold a secret: each is redacted as `RunState.write` stores it.
TEXT_FIELDS = frozenset({"reason", "verify_output"})


def _text(value: object) -> str:
    """A run field as stored: an enum as its value, anything else as `str` makes it."""
    return str(value.value) if isinstance(value, Enum) else str(value)


def _stored(name: str, value: object) -> str:
    """The text `RunState.write` stores for run field `name`: `_text`, redacted if for people."""
    text = _text(value)
    return redact(text) if name in TEXT_FIELDS else text


class Entry:
    """A dataclass kept in Redis as a JSON object of its fields (a step, a verify in flight)."""

    __slots__ = ()

    def dump(self) -> str:
        """The JSON kept in Redis."""
        return json.dumps(asdict(self))  # type: ignore[call-overload] # subclasses are dataclasses

    @classmethod
    def load(cls, raw: bytes) -> Self:
        """Read the JSON kept in Redis (`TypeError` or `ValueError` when it is not one)."""
        return cls(**json.loads(raw))


@dataclass(slots=True)
class StepRun(Entry):
    """One agent's step of the superstep in flight, as kept in the task's `steps` hash."""

    attempt: int
    job: str = ""
    retry_at: float = 0.0  # > 0: waiting for its backoff before being launched


IN_FLIGHT_KEPT = 100_000  # tasks whose superstep in flight a coordinator keeps, at most


@dataclass(frozen=True, slots=True)
class Look:
    """A task as the coordinator's look at it found it: what `advance` decides from.

    `run` is the run state, `latest` the number of the latest committed GC, `steps` the
    steps in flight (raw JSON by agent), `votes` those of the superstep in flight,
    `taken` when the look read them (`time.monotonic()`), and `outcomes` how many of the
    superstep's attempts said why they ended without a vote (a failure to look into).
    """

    run: dict[str, str]
    latest: int | None
    steps: dict[str, bytes]
    votes: dict[str, LCRef]
    taken: float
    outcomes: int = 0


class RunState:
    """Reads and fenced writes of run states; `token()` says whose writes these are."""

    def __init__(
        self,
        client: redis.Redis,
        hot: HotStore,
        token: Callable[[], int | None] = lambda: None,
    ) -> None:
        self.redis = client
        self.hot = hot
        self.token = token
        self._write = script(client, "run_write")
        # Sent as a plain EVALSHA in `look`'s pipeline: redis-py's registered scripts
        # ask Redis whether it has them (SCRIPT EXISTS) in a round trip of every look.
        self._claim = Lua(lambda: client, "claim")
        # task → the (epoch, superstep) its last look found in flight: the next look reads
        # that superstep's votes in its first round trip
        self._in_flight: dict[str, tuple[int, int]] = {}

    def write(
        self,
        task: str,
        run: Mapping[str, object] | None = None,
        steps: Mapping[str, str] | None = None,
        *,
        clear_steps: bool = False,
        forget: Sequence[str] = (),
        standing_on: int | None = None,
    ) -> None:
        """Set run fields and step entries (after clearing the steps, if asked) in one go.

        The fields for people (`TEXT_FIELDS`) are stored redacted.

        With `standing_on`, only while GC `standing_on` is the task's latest committed GC
        in this Redis, else `CommitRefused`: a decision drawn from that GC (the task's
        end) is not written where it is missing, as on a new primary that never had it.
        """
        token = self.token()
        translating(
            lambda: self._write(
                keys=[keys.owner(task), keys.run(task), keys.steps(task), keys.latest(task)],
                args=[
                    "" if token is None else token,
                    json.dumps({k: _stored(k, v) for k, v in (run or {}).items()}),
                    json.dumps(dict(steps or {})),
                    "1" if clear_steps else "0",
                    json.dumps(list(forget)),
                    "" if standing_on is None else str(standing_on),
                ],
            )
        )

    def read(self, task: str) -> dict[str, str]:
        """Return the task's run state (empty for an unknown task)."""
        return read_run(self.redis, task)

    def look(self, tasks: Sequence[str]) -> dict[str, Look | Exception]:
        """Claim each task and read its `Look`, all tasks in one round trip, or two.

        Claiming owns a task with this coordinator's token: once another coordinator claimed
        it with a newer token, this one's claim and writes are refused. Without a token (a
        person, or a coordinator driven by hand in a test) nothing is claimed. One round
        trip claims the tasks and reads their run states, latest GCs and steps, and the
        votes of the superstep each had in flight at its last look; a second reads the votes
        of those whose superstep in flight is another now. A task whose claim or read failed
        maps to its error (`FencedWrite` for a refused claim); the others are unaffected.
        """
        token = self.token()
        taken = time.monotonic()
        guesses = [self._in_flight.get(task) for task in tasks]
        replies = self._claim_and_read(tasks, token, guesses)
        if any(isinstance(reply, NoScriptError) for reply in replies):  # Redis restarted
            self._claim.load(self.redis)
            replies = self._claim_and_read(tasks, token, guesses)  # the same claim again
        looks, read = self._parse_first(tasks, guesses, replies, token is not None, taken)
        watched = [
            (task, cast(tuple[int, int], _in_flight_at(seen)))
            for task, seen in looks.items()
            if isinstance(seen, Look) and _in_flight_at(seen) is not None and task not in read
        ]
        if watched:
            pipe = self.redis.pipeline(transaction=False)
            for task, (epoch, superstep) in watched:
                pipe.hgetall(keys.votes(task, epoch, superstep))
                pipe.hlen(keys.outcomes(task, epoch, superstep))
            replies = pipe.execute(raise_on_error=False)
            for (task, _), raw, said in zip(watched, replies[::2], replies[1::2], strict=True):
                read[task] = (raw, said)
        for task, (raw, said) in read.items():
            looks[task] = _with_votes(cast(Look, looks[task]), raw, said)
        return looks

    def _parse_first(
        self,
        tasks: Sequence[str],
        guesses: Sequence[tuple[int, int] | None],
        replies: list[object],
        claimed: bool,
        taken: float,
    ) -> tuple[dict[str, Look | Exception], dict[str, tuple[object, object]]]:
        """The looks of `_claim_and_read`'s replies, and the votes read ahead on a right guess.

        Each task's superstep in flight is kept for its next look's guess.
        """
        looks: dict[str, Look | Exception] = {}
        read: dict[str, tuple[object, object]] = {}  # task → its votes and outcomes
        at = 0
        for task, guess in zip(tasks, guesses, strict=True):
            width = claimed + 3  # its claim, run, latest GC and steps
            group, at = replies[at : at + width], at + width
            ahead: list[object] = []
            if guess is not None:  # the votes and outcomes read on that guess
                ahead, at = replies[at : at + 2], at + 2
            failed = next((r for r in group if isinstance(r, Exception)), None)
            if failed is not None:
                looks[task] = _failure(failed)
                continue
            raw_run, latest, steps = group[-3:]
            try:  # what one task's state holds concerns that task alone
                seen = looks[task] = _parse_look(raw_run, latest, steps, taken)
            except (ValueError, TypeError, UnicodeDecodeError) as exc:
                looks[task] = exc
                continue
            now = _in_flight_at(seen)
            if guess is not None and guess == now:
                read[task] = (ahead[0], ahead[1])
            if now is None:
                self._in_flight.pop(task, None)
            else:
                self._in_flight[task] = now
        if len(self._in_flight) > IN_FLIGHT_KEPT:  # tasks that ended in flight: start afresh
            self._in_flight.clear()
        return looks, read

    def _claim_and_read(
        self, tasks: Sequence[str], token: int | None, guesses: Sequence[tuple[int, int] | None]
    ) -> list[object]:
        """`look`'s first round trip: each task's claim (with a token), run, latest GC, steps.

        And, for a task with a guess (epoch, superstep), that superstep's votes and outcomes:
        read after its run state, as the second round trip would read them.
        """
        pipe = self.redis.pipeline(transaction=False)
        for task, guess in zip(tasks, guesses, strict=True):
            if token is not None:
                pipe.execute_command(*self._claim.command([keys.owner(task)], [token]))  # type: ignore[no-untyped-call]
            pipe.hgetall(keys.run(task))
            pipe.get(keys.latest(task))
            pipe.hgetall(keys.steps(task))
            if guess is not None:
                pipe.hgetall(keys.votes(task, *guess))
                pipe.hlen(keys.outcomes(task, *guess))
        return cast(list[object], pipe.execute(raise_on_error=False))


def _failure(reply: Exception) -> Exception:
    """What a failed reply of a look means: a refusal as Cairn's error, else itself."""
    return translated(reply) if isinstance(reply, redis.ResponseError) else reply


def _with_votes(seen: Look, raw: object, said: object) -> Look | Exception:
    """`seen` with the votes and outcomes count read for its superstep, or their failure."""
    failed = next((r for r in (raw, said) if isinstance(r, Exception)), None)
    if failed is not None:  # a key of the wrong type: that task's trouble
        return _failure(failed)
    votes = cast(dict[bytes, bytes], raw)
    try:
        refs = {a.decode(): cast(LCRef, parse_ref(v)) for a, v in votes.items()}
    except (ValueError, TypeError, UnicodeDecodeError) as exc:
        return exc
    return replace(seen, votes=refs, outcomes=int(cast(int, said)))


def _in_flight_at(seen: Look) -> tuple[int, int] | None:
    """The (epoch, superstep) a look found in flight, or None."""
    superstep = int(seen.run.get("superstep", "0"))
    return (int(seen.run["epoch"]), superstep) if superstep else None


def _parse_look(raw_run: object, latest: object, steps: object, taken: float) -> Look:
    """A task's `Look` from its replies, the votes left to read; `ValueError` if garbled.

    A superstep or epoch that is not a number fails here, not in the votes' read.
    """
    run = {k.decode(): v.decode() for k, v in cast(dict[bytes, bytes], raw_run).items()}
    if int(run.get("superstep", "0")):
        int(run["epoch"])
    return Look(
        run,
        None if latest is None else int(cast(bytes, latest)),
        {k.decode(): v for k, v in cast(dict[bytes, bytes], steps).items()},
        {},
        taken,
    )


def read_run(client: redis.Redis, task: str) -> dict[str, str]:
    """Return the task's run state (empty for an unknown task)."""
    raw = cast(dict[bytes, bytes], client.hgetall(keys.run(task)))
    return {k.decode(): v.decode() for k, v in raw.items()}


def abort_in_flight(runs: RunState, store: CheckpointStore, task: str) -> None:
    """Abort the superstep in flight, if any: its GC is marked ABORTED, its LCs dropped.

    Its jobs must already be fenced (a raised epoch) or be allowed to fail.
    """
    run = runs.read(task)
    superstep = int(run.get("superstep", "0"))
    if superstep and "number" in run:
        try:
            intent = _in_flight(store, task, int(run["number"]), superstep, int(run["epoch"]))
            store.abort_gc(intent, runs.token())
        except CairnError as exc:  # e.g. it committed in the meantime, or nothing is readable
            log.info("superstep in flight not aborted", task=task, why=str(exc))
    runs.write(task, {"superstep": 0}, clear_steps=True)


def _in_flight(
    store: CheckpointStore, task: str, number: int, superstep: int, epoch: int
) -> GlobalCheckpoint:
    """The GC of the superstep in flight, to abort: the latest GC, renumbered, as its shape.

    Written now, by a superstep (`GlobalCheckpoint.written`): not a copy of the latest's
    time and origin.

    A latest GC that cannot be read (damaged in Redis and on disk, which a restore falls
    back past) lends no shape; the record prepared for the superstep does. Raises
    `CorruptCheckpoint` or `RecordNotFound` when neither can be read.
    """
    at = {"number": number, "superstep": superstep, "epoch": epoch}
    try:
        latest = store.latest_gc(task)
    except (CorruptCheckpoint, RecordNotFound) as exc:
        log.warning("latest GC unreadable; aborting from the prepared one", task=task,
                    why=str(exc))  # fmt: skip
        latest = None
    shape = latest if latest is not None else store.read_gc(task, number)
    return shape.written(GCOrigin.SUPERSTEP, **at)
