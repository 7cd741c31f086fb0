"""A streamed chat completion read back into the body the same request has unstreamed.

With `stream: true` and `stream_options: {"include_usage": true}` a chat-completions server
sends `chat.completion.chunk` events: the first choice's `delta`s (text, refusal, tool
calls numbered by `index`, their id and name in the first part, their arguments' JSON text
in pieces), a `finish_reason`, then a chunk with no choices and the call's `usage`, then
`data: [DONE]`. `ChunkReader` puts them together as one `chat.completion` body, which
`cairn.agents.models.openai` parses as it parses any answer: the streamed reply is the
reply. A chunk of `{"error": ...}` breaks the stream (`StreamBroken`, retried).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import orjson
from pydantic import JsonValue

from cairn.agents.models.base import CallSoFar, ReplySoFar
from cairn.agents.models.http import malformed_reply, redact_error, server_message
from cairn.agents.models.sse import Event, StreamBroken, string

DONE = "[DONE]"


class ChunkReader:
    """A `StreamReader` for chat-completions chunks; `on_delta` sees the reply so far."""

    def __init__(
        self,
        on_delta: Callable[[ReplySoFar], None] | None = None,
        blot: Callable[[str], str] = redact_error,
    ) -> None:
        self.so_far = ReplySoFar()
        self._on_delta = on_delta
        self._blot = blot
        self._refusal: list[str] = []
        self._finish: JsonValue = None
        self._usage: JsonValue = None
        self._done = False

    def feed(self, event: Event) -> bool:
        """Take one chunk; True at `[DONE]`."""
        if event.data.strip() == DONE:
            self._done = True
            return True
        raw = event.data.encode()
        try:
            chunk = orjson.loads(raw)
            if isinstance(chunk, dict) and chunk.get("error"):
                raise StreamBroken(server_message(raw, "an error chunk"))
            if chunk.get("usage"):
                self._usage = chunk["usage"]
            for choice in chunk.get("choices") or []:
                if choice.get("index", 0) == 0:
                    self._choice(choice)
        except (ValueError, LookupError, TypeError, AttributeError) as error:
            raise malformed_reply(error, raw, self._blot) from error
        if self._on_delta is not None:
            self._on_delta(self.so_far)
        return False

    def _choice(self, choice: Mapping[str, Any]) -> None:
        """Add one chunk's part of the first choice."""
        delta = choice.get("delta") or {}
        self.so_far.add_text(string(delta, "content"))
        self._refusal.append(string(delta, "refusal"))
        for place, part in enumerate(delta.get("tool_calls") or []):
            call = self.so_far.call(part.get("index", place))
            # Id and name come whole in a call's first part (OpenAI, vLLM, llama.cpp,
            # Ollama); a server that sends them with every part sends the same again.
            function = part.get("function") or {}
            call.id = call.id or string(part, "id")
            call.name = call.name or string(function, "name")
            call.parts.append(string(function, "arguments"))
        if choice.get("finish_reason"):
            self._finish = choice["finish_reason"]

    def body(self) -> bytes:
        """The `chat.completion` body the chunks make."""
        calls: list[JsonValue] = [
            {"id": call.id, "type": "function", "function": _function(call)}
            for call in self.so_far.calls
        ]
        message: dict[str, JsonValue] = {
            "role": "assistant",
            "content": self.so_far.text() if self.so_far.chars else None,
            "refusal": "".join(self._refusal) or None,
        }
        if calls:
            message["tool_calls"] = calls
        choice = {"index": 0, "message": message, "finish_reason": self._finish}
        return orjson.dumps({"choices": [choice], "usage": self._usage})


def _function(call: CallSoFar) -> dict[str, JsonValue]:
    """A call's `function`; without a name if none came, which the parse calls malformed."""
    function: dict[str, JsonValue] = {"arguments": call.arguments()}
    if call.name:
        function["name"] = call.name
    return function
