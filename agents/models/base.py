"""The `Model` protocol: messages and tool schemas in; text, tool calls and usage out.

A model either answers with a `ModelReply` or raises `storage.errors.ModelError`, whose
`retryable` flag tells the coordinator whether a retry of the step may help.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from pydantic import JsonValue

from storage.records import Message, ToolCall, Usage


@dataclass(frozen=True, slots=True)
class ToolSchema:
    """A tool as a model sees it (the chat-completions `function` shape)."""

    name: str
    description: str
    parameters: dict[str, JsonValue]


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """One model turn to take: the history, the tools on offer, and who asks."""

    messages: list[Message]
    tools: list[ToolSchema]
    agent: str = ""
    attempt: int = 1


@dataclass(frozen=True, slots=True)
class ModelReply:
    """A model's answer: text, tool calls, tokens used.

    `crash_after_tools` is fault injection for the scripted model only: the step kills
    its own process with SIGKILL once that many of this turn's tool calls have run.
    """

    content: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    crash_after_tools: int | None = None


class Model(Protocol):
    """Anything that takes a model turn."""

    def complete(self, request: ModelRequest) -> ModelReply:
        """Answer one turn, or raise `ModelError` (retryable or fatal)."""
