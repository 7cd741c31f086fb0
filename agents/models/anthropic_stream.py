"""A streamed Messages API answer read back into the body the same request has unstreamed.

With `stream: true` the API sends `message_start` (the message, its usage so far), then
for each content block a `content_block_start`, its `content_block_delta`s (`text_delta`,
`input_json_delta` pieces of a tool call's input, `thinking_delta`, `signature_delta`) and
a `content_block_stop`; then `message_delta` (the `stop_reason`, the final usage) and
`message_stop`, with `ping`s anywhere. `EventReader` puts them together as one `message`
body, which `cairn.agents.models.anthropic` parses as it parses any answer. An `error`
event (`overloaded_error`, ...) breaks the stream (`StreamBroken`, retried); event types
it does not know are passed over, as the API's versioning policy asks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import orjson
from pydantic import JsonValue

from cairn.agents.models.base import ReplySoFar
from cairn.agents.models.http import malformed_reply, redact_error
from cairn.agents.models.sse import Event, StreamBroken, string


class EventReader:
    """A `StreamReader` for Messages API events; `on_delta` sees the reply so far."""

    def __init__(
        self,
        on_delta: Callable[[ReplySoFar], None] | None = None,
        blot: Callable[[str], str] = redact_error,
    ) -> None:
        self.so_far = ReplySoFar()
        self._on_delta = on_delta
        self._blot = blot
        self._texts = False  # a text block began: the body has text, if only ""
        self._inputs: dict[int, JsonValue] = {}  # a tool_use block's input as it began
        self._stop: JsonValue = None
        self._usage: dict[str, JsonValue] = {}

    def feed(self, event: Event) -> bool:
        """Take one event; True at `message_stop`."""
        raw = event.data.encode()
        try:
            data = orjson.loads(raw)
            kind = data.get("type") or event.event
            if kind == "error" or event.event == "error":
                error = data.get("error") or {}
                raise StreamBroken(f"{error.get('type', 'error')}: {error.get('message', '')}")
            if kind == "message_stop":
                return True
            self._take(kind, data)
        except (ValueError, LookupError, TypeError, AttributeError) as error:
            raise malformed_reply(error, raw, self._blot) from error
        if self._on_delta is not None:
            self._on_delta(self.so_far)
        return False

    def _take(self, kind: str, data: Mapping[str, Any]) -> None:
        """Add one event's part to the reply so far."""
        if kind == "message_start":
            self._add_usage(data["message"].get("usage"))
        elif kind == "content_block_start":
            index, block = data["index"], data["content_block"]
            if block["type"] == "text":
                self._texts = True
                self.so_far.add_text(string(block, "text"))
            elif block["type"] == "tool_use":
                call = self.so_far.call(index)
                call.id, call.name = string(block, "id"), string(block, "name")
                self._inputs[call.index] = block.get("input")
        elif kind == "content_block_delta":
            delta = data["delta"]
            if delta["type"] == "text_delta":
                self.so_far.add_text(string(delta, "text"))
            elif delta["type"] == "input_json_delta":
                self.so_far.call(data["index"]).parts.append(string(delta, "partial_json"))
            # Thinking, its signature and citations have no place in Cairn's history.
        elif kind == "message_delta":
            self._stop = (data.get("delta") or {}).get("stop_reason")
            self._add_usage(data.get("usage"))

    def _add_usage(self, usage: Mapping[str, JsonValue] | None) -> None:
        """Take the counts `usage` gives; a later event's count replaces an earlier one."""
        self._usage.update({k: v for k, v in (usage or {}).items() if v is not None})

    def body(self) -> bytes:
        """The `message` body the events make."""
        content: list[JsonValue] = []
        if self._texts:
            content.append({"type": "text", "text": self.so_far.text()})
        for call in self.so_far.calls:
            began = self._inputs.get(call.index)
            use: dict[str, JsonValue] = {"type": "tool_use", "id": call.id,
                                         "input": _input(call.arguments(), began)}  # fmt: skip
            if call.name:  # none when its block never began: the parse calls that malformed
                use["name"] = call.name
            content.append(use)
        body = {"type": "message", "role": "assistant", "content": content,
                "stop_reason": self._stop, "usage": self._usage}  # fmt: skip
        return orjson.dumps(body)


def _input(text: str, began: JsonValue) -> JsonValue:
    """A tool call's input: its pieces' JSON, else what its block began with.

    Pieces that make no JSON come back as `{"_raw": text}`, as an OpenAI call's do.
    """
    if not text:
        return began if began is not None else {}
    try:
        parsed: JsonValue = orjson.loads(text)
    except orjson.JSONDecodeError:
        return {"_raw": text}
    return parsed
