"""What a request may send the console: a body of at most `MAX_BODY_BYTES`.

`BodyLimit` (an ASGI middleware, the console's outermost) reads each request's body before
the Guard and the routes do, and hands it on whole. A body over the limit reaches neither:
the client gets a 413 with a one-line JSON error and `Connection: close`, and the server
closes the connection only once it has read what the client sent (up to
`MAX_DRAINED_BYTES`). A server that closes on unread bytes makes the kernel reset the
connection, and a client that sends its whole body before reading (most do) then sees
the reset instead of the answer.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

MAX_BODY_BYTES = 64 * 1024  # of a POST: an action's few fields
# A refused body is read and dropped up to this much; past it the connection is closed
# unread (the sender of so much gets a reset, and costs the console no more).
MAX_DRAINED_BYTES = 32 * 1024 * 1024
# The refusal is answered before the Guard's middleware, which adds these to the others.
REFUSAL_HEADERS = {"X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"}


class BodyLimit:
    """Refuse a request whose body is over `limit` bytes with a 413; pass the rest on."""

    def __init__(self, app: ASGIApp, limit: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Read the body (at most `limit` bytes), then run the app on it, or refuse."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if _declared_length(headers) > self.limit:
            # Told by the headers: a client waiting for `100 Continue` sends nothing more.
            waiting = headers.get("expect", "").lower() == "100-continue"
            await self._refuse(scope, receive, send, drain=not waiting)
            return
        body, more = bytearray(), True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client is gone: nobody to answer
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.limit:
                await self._refuse(scope, receive, send, drain=more, read=len(body))
                return
        await self.app(scope, _replay(bytes(body), receive), send)

    async def _refuse(
        self, scope: Scope, receive: Receive, send: Send, *, drain: bool, read: int = 0
    ) -> None:
        """Read and drop the rest of the body (bounded), then answer 413 and close."""
        more = drain
        while more and read <= MAX_DRAINED_BYTES:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            read += len(message.get("body", b""))
            more = message.get("more_body", False)
        reason = f"the request body is over the console's limit of {self.limit} bytes"
        headers = {"Connection": "close", **REFUSAL_HEADERS}
        refusal = JSONResponse({"error": reason}, status_code=413, headers=headers)
        await refusal(scope, receive, send)


def _declared_length(headers: Headers) -> int:
    """The Content-Length the client declared; 0 when none (chunked) or not a number."""
    try:
        return int(headers.get("content-length", "0"))
    except ValueError:
        return 0  # the server refuses a malformed length before the app is called


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives `body` as one message, then what `receive` gives."""
    given = False

    async def replayed() -> Message:
        nonlocal given
        if given:
            return await receive()
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replayed
