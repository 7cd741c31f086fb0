"""Compaction: what an agent's model is sent once its whole history would not fit.

An agent's history only grows (every LC keeps it whole, and so does the archive); what its
model is sent is a view of it (`ContextView`): the head (system prompt and goal), one
message standing for the turns compacted so far, and the history from `start` on. A
compaction moves `start` forward to the last `keep_last` turns: a turn begins at an
assistant message, so a tool result always travels with the call it answers, and a call
still waiting for its result is in the last turn, which is always kept. The folded turns
become a summary (a model call of the step, counted and traced like any other) or, with
`truncate`, a marker saying they were left out.

Sizes are estimated before a call: the prompt the provider counted for the agent's last
call, plus what came since at `CHARS_PER_TOKEN` characters a token (English runs near 4,
code and JSON nearer 3: the estimate errs high), `MESSAGE_TOKENS` of framing a message and
`IMAGE_TOKENS` an image. With no count yet (a first call, a view just changed) the whole
prompt is estimated so, tools included. A script whose tokens run shorter (CJK text runs
one to two characters a token) may still overflow: the provider's "too long" answer makes
the step compact and ask once more.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import orjson
from pydantic import JsonValue

from cairn.agents.models.base import ToolSchema, json_size
from cairn.agents.spec import AgentSpec
from cairn.storage.records import ContextView, Message, Role

CHARS_PER_TOKEN = 3
MESSAGE_TOKENS = 4  # a message's role and separators
IMAGE_TOKENS = 1_600  # an image, as Anthropic counts one of about 1.15 megapixels
BUDGET_SHARE = 0.75  # of a known window: room for the reply and the estimate's error
MAX_SUMMARY_CHARS = 16_000  # of a summary kept in place of the folded turns
MAX_ITEM_CHARS = 4_000  # of one message in the transcript a summary is made from
MAX_TRANSCRIPT_CHARS = 400_000  # of that transcript: its most recent part is kept
# Context windows of the models Cairn knows, by the start of their `model:` (first match).
WINDOWS: tuple[tuple[str, int], ...] = (
    ("anthropic:claude-", 200_000),
    ("openai:gpt-4.1", 1_047_576),
    ("openai:gpt-5", 400_000),
    ("openai:gpt-4o", 128_000),
    ("openai:o1", 200_000),
    ("openai:o3", 200_000),
    ("openai:o4", 200_000),
)
SUMMARY_PROMPT = (
    "You compact the working memory of {agent}, an agent in a team. The messages below are "
    "its earlier turns, which it will no longer see. Write the summary it will work from "
    "instead: what the goal needs and how far it got, decisions made and why, the files "
    "read or written and what in them matters, commands run and what they showed, messages "
    "from others, open problems, and what it meant to do next. Keep exact names, paths, "
    "numbers and errors; leave out what no longer matters. Reply with the summary only."
)


@dataclass(frozen=True, slots=True)
class Fold:
    """A compaction to make: keep `head` messages, fold `folded`, send from `start` on."""

    head: int
    start: int
    folded: Sequence[Message]


def budget(spec: AgentSpec) -> int | None:
    """The most an agent's prompt may hold, in estimated tokens; None: no limit known.

    `context.max_tokens`, else `BUDGET_SHARE` of the model's window where `WINDOWS` knows
    it; None with `strategy: off`.
    """
    policy = spec.context
    if policy.strategy == "off":
        return None
    if policy.max_tokens is not None:
        return policy.max_tokens
    window = next((tokens for start, tokens in WINDOWS if spec.model.startswith(start)), None)
    return None if window is None else int(window * BUDGET_SHARE)


def estimate(messages: Iterable[Message]) -> int:
    """Tokens `messages` come to, by the module's estimate (see its docstring)."""
    tokens = 0
    for message in messages:
        chars = len(message.content or "")
        chars += sum(len(call.name) + json_size(call.args) for call in message.tool_calls)
        tokens += MESSAGE_TOKENS + -(-chars // CHARS_PER_TOKEN)
        tokens += IMAGE_TOKENS * len(message.images)
    return tokens


def sent(history: Sequence[Message], view: ContextView | None) -> list[Message]:
    """What the model is sent of `history` under `view`."""
    if view is None or not view.start:
        return list(history)
    summary = [] if view.summary is None else [summary_message(view.summary)]
    return [*history[: view.head], *summary, *history[view.start :]]


def size(history: Sequence[Message], view: ContextView | None, tools: list[ToolSchema]) -> int:
    """The estimated prompt of the next call: the last count and what came since, if any."""
    if view is not None and view.counted and view.counted_at <= len(history):
        return view.counted + estimate(history[view.counted_at :])
    schemas: list[JsonValue] = [
        {"name": t.name, "description": t.description, "parameters": t.parameters} for t in tools
    ]
    return estimate(sent(history, view)) + -(-json_size(schemas) // CHARS_PER_TOKEN)


def plan(history: Sequence[Message], view: ContextView | None, keep_last: int) -> Fold | None:
    """The compaction keeping the last `keep_last` turns, or None when nothing is left to fold."""
    folded_before = view is not None and view.start > 0
    head = view.head if view is not None and folded_before else head_of(history)
    first = view.start if view is not None and folded_before else head
    turns = [i for i in range(first, len(history)) if history[i].role is Role.ASSISTANT]
    if len(turns) <= keep_last:
        return None
    start = turns[-keep_last]
    return Fold(head, start, history[first:start])


def head_of(history: Sequence[Message]) -> int:
    """How many messages open `history` and are always sent: system messages, then the goal."""
    index = 0
    while index < len(history) and history[index].role is Role.SYSTEM:
        index += 1
    if index < len(history) and history[index].role is Role.USER:
        index += 1
    return index


def folded_view(view: ContextView | None, fold: Fold, summary: str) -> ContextView:
    """The view after `fold`, `summary` standing for every turn folded so far."""
    before = 0 if view is None else view.folded
    return ContextView(head=fold.head, start=fold.start, summary=summary[:MAX_SUMMARY_CHARS],
                       folded=before + len(fold.folded))  # fmt: skip


def summary_message(summary: str) -> Message:
    """The message the model is sent in place of the folded turns."""
    return Message(role=Role.USER, name="cairn", content=summary)


def marker(folded: int) -> str:
    """What `truncate` sends in place of the `folded` messages it left out."""
    return (f"[{folded} earlier messages of this conversation were left out to fit the "
            "model's context window. The workspace holds the work they did.]")  # fmt: skip


def summary_text(summary: str, folded: int) -> str:
    """A summary as the model is sent it, saying what it stands for."""
    return f"[Summary of the {folded} earlier messages of this conversation]\n{summary}"


def summary_request(agent: str, view: ContextView | None, fold: Fold) -> list[Message]:
    """The messages asking a model to summarize `fold` (after the summary it replaces)."""
    parts = [] if view is None or not view.summary else [f"Summary so far:\n{view.summary}"]
    parts.append("Messages to summarize:\n" + _transcript(fold.folded))
    return [
        Message(role=Role.SYSTEM, content=SUMMARY_PROMPT.format(agent=agent)),
        Message(role=Role.USER, content="\n\n".join(parts)),
    ]


def _transcript(messages: Sequence[Message]) -> str:
    """`messages` as text, each cut at `MAX_ITEM_CHARS`, the whole at `MAX_TRANSCRIPT_CHARS`."""
    lines = []
    for message in messages:
        who = message.role.value + (f" ({message.name})" if message.name else "")
        text = _cut(message.content or "", MAX_ITEM_CHARS)
        calls = "".join(
            f"\n-> {call.name}({_cut(orjson.dumps(call.args).decode(), MAX_ITEM_CHARS)})"
            for call in message.tool_calls
        )
        lines.append(f"[{who}] {text}{calls}")
    whole = "\n".join(lines)
    if len(whole) <= MAX_TRANSCRIPT_CHARS:
        return whole
    return "[the oldest part is left out]\n" + whole[-MAX_TRANSCRIPT_CHARS:]


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]} [... {len(text) - limit} more]"
