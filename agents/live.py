"""A streamed reply shown while it streams: what `cairn watch` and the console show live.

While an agent with `stream: true` waits for its model, the step publishes the reply so far
(`cairn.agents.models.base.ReplySoFar`) to a short-lived key of its own in the hot store
(`cairn.storage.keys.live`): the end of its text and of each tool call's arguments, at
most every `PUBLISH_EVERY` seconds, from a thread of its own so that a slow Redis never
slows the stream. The key is deleted when the model call ends, however it ends, and
lapses by itself (`LIVE_TTL_MS`) if the worker dies. What is shown is never part of a
checkpoint: the reply is, once whole. Publishing never fails the step: a Redis that does
not answer is logged, once a call.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from functools import partial
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cairn.agents.logs import get_logger
from cairn.agents.models.base import ReplySoFar, ReplyView
from cairn.storage.base import HotStore
from cairn.storage.chain import WorkingState
from cairn.storage.public import public
from cairn.storage.redact import redact

log = get_logger(__name__)
T = TypeVar("T")
PUBLISH_EVERY = 0.2  # seconds between two publications of one reply, at least
REFRESH_EVERY = 10.0  # seconds: a reply that has not moved is published again, to stay shown
LIVE_TTL_MS = 30_000  # a reply not published again within this lapses (its worker died)
TEXT_CHARS = 4_000  # of the text's end shown
ARGUMENT_CHARS = 1_000  # of each tool call's arguments' end shown
MARGIN = 200  # characters more than shown are redacted, so a secret cut at the start shows not
JOIN_S = 2.0  # the most a step waits for its last publication before it clears the key


@public
class LiveCall(BaseModel):
    """A tool call as far as a streaming reply got: its name, its arguments' JSON text so far."""

    model_config = ConfigDict(frozen=True)

    name: str
    arguments: str = Field(description=f"the end of the arguments so far, {ARGUMENT_CHARS} at most")


@public
class LiveReply(BaseModel):
    """What a model has replied so far while its reply streams (`Task.live_replies`).

    `text` is the end of the reply's text so far (`chars` long in all), `tool_calls` the
    calls begun, with the end of their arguments; secrets of known shapes are blotted out.
    """

    model_config = ConfigDict(frozen=True)

    superstep: int
    attempt: int
    text: str = ""
    chars: int = 0
    tool_calls: list[LiveCall] = Field(default_factory=list)
    at: datetime

    def last_line(self, width: int = 100) -> str:
        """The reply's last line so far, its end kept: a call being made, else the text's."""
        if self.tool_calls:
            call = self.tool_calls[-1]
            line = f"{call.name}({' '.join(call.arguments.split())}"
        else:
            lines = [part for part in self.text.splitlines() if part.strip()]
            line = lines[-1].strip() if lines else ""
        return line if len(line) <= width else "…" + line[len(line) - width + 1 :]


def snapshot(view: ReplyView, state: WorkingState) -> LiveReply:
    """What is shown of a reply as `view` saw it, a reply of the step `state` is in."""
    calls = [
        LiveCall(name=c.name, arguments=_shown(c.tail(ARGUMENT_CHARS + MARGIN), ARGUMENT_CHARS))
        for c in view.calls
    ]
    return LiveReply(superstep=state.superstep, attempt=state.attempt,
                     text=_shown(view.tail(TEXT_CHARS + MARGIN), TEXT_CHARS),
                     chars=view.chars, tool_calls=calls, at=datetime.now(UTC))  # fmt: skip


def _shown(tail: str, limit: int) -> str:
    """The last `limit` characters of `tail`, secrets blotted out first."""
    text = redact(tail)
    return text[len(text) - limit :] if len(text) > limit else text


class LivePublisher:
    """Publishes a reply as it streams, for one model call; `close` ends it and clears the key.

    Called on the model's thread after each part, it only notes how far the reply got
    (`ReplySoFar.view`); a thread of its own makes what is shown of the latest view and
    writes it, at most every `every` seconds, and again every `REFRESH_EVERY` seconds
    while the call runs, so that a reply that stalls still shows its last words.
    """

    def __init__(self, hot: HotStore, state: WorkingState, every: float = PUBLISH_EVERY) -> None:
        self._hot, self._state, self._every = hot, state, every
        self._latest: ReplyView | None = None  # the view not yet shown
        self._lock = threading.Lock()
        self._wake = threading.Event()  # a new view, or the end
        self._closing = threading.Event()
        self._failed = False  # a failure is logged once a call
        self._thread: threading.Thread | None = None

    def __call__(self, so_far: ReplySoFar) -> None:
        """Note the reply so far, to be shown."""
        view = so_far.view()
        with self._lock:
            self._latest = view
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="cairn-live", daemon=True)
            self._thread.start()
        self._wake.set()

    def close(self) -> None:
        """Show nothing more, then clear what is shown (waiting `JOIN_S` at most)."""
        self._closing.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(JOIN_S)
        self._quietly(partial(self._hot.clear_live, self._state.task, self._state.agent))

    def _run(self) -> None:
        """Show the latest view whenever there is one, at most every `every` seconds."""
        shown: bytes | None = None
        since = -self._every  # when it last wrote (monotonic seconds)
        while True:
            self._wake.wait(REFRESH_EVERY)
            wait = since + self._every - time.monotonic()
            if wait > 0:
                self._closing.wait(wait)
            self._wake.clear()  # before the view is taken: a later one wakes it again
            with self._lock:
                view, self._latest = self._latest, None
            if self._closing.is_set():
                return
            if view is not None:
                shown = self._quietly(partial(self._encode, view))
            if shown is not None:
                self._quietly(partial(self._put, shown))
                since = time.monotonic()

    def _encode(self, view: ReplyView) -> bytes:
        """What is shown of `view`, as stored."""
        return snapshot(view, self._state).model_dump_json().encode()

    def _put(self, data: bytes) -> None:
        """Show `data` for `LIVE_TTL_MS`."""
        self._hot.put_live(self._state.task, self._state.agent, data, LIVE_TTL_MS)

    def _quietly(self, work: Callable[[], T]) -> T | None:
        """`work()`, or None: what it raises is logged (once a call), never raised."""
        try:
            return work()
        except Exception as exc:  # noqa: BLE001 - a live view must never fail the step
            if not self._failed:
                self._failed = True
                # From the publishing thread too, which has none of the step's bound context.
                state = self._state
                log.warning("live reply not shown", task=state.task, agent=state.agent,
                            error=f"{type(exc).__name__}: {exc}")  # fmt: skip
            return None


@contextlib.contextmanager
def live_reply(
    hot: HotStore, state: WorkingState, stream: bool
) -> Iterator[Callable[[ReplySoFar], None] | None]:
    """The `on_delta` of one model call of a step: a `LivePublisher` if the agent streams.

    Its key is cleared as the block ends, however it ends. None when the agent does not
    stream: nothing is published, nothing cleared.
    """
    if not stream:
        yield None
        return
    publisher = LivePublisher(hot, state)
    try:
        yield publisher
    finally:
        publisher.close()


def read_live(hot: HotStore, task: str, agents: Iterable[str]) -> dict[str, LiveReply]:
    """The replies `agents` are streaming now, by agent; one that does not parse is left out."""
    shown: dict[str, LiveReply] = {}
    for agent, data in hot.get_live(task, agents).items():
        with contextlib.suppress(ValidationError):
            shown[agent] = LiveReply.model_validate_json(data)
    return shown
