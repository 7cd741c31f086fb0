"""JSON over HTTP for the built-in providers: a POST under a deadline, retried with backoff.

One `Endpoint` is what `openai:` and `anthropic:` share, on the stdlib's `http.client`
rather than a provider's SDK (docs/models.md says why): the whole call, from connecting to
the last byte of the answer, retries and their waits included, runs under one deadline
(`timeout`), so a long generation is never cut by a per-read socket timeout, a server
that trickles bytes cannot hold a worker past it, and a step's model call has a bound the
task's `step_timeout` can be set above. Timeouts, dropped connections, 408, 409, 429 and
5xx are retried with exponential backoff and full jitter, honouring `Retry-After`; any
other status is fatal, and 400, 404, 413 and 422 say the request itself was refused.
Every error is one line, bounded, with the API key and secrets of known shapes blotted out;
bodies are read up to a cap. Proxies come from the `environ` given (`https_proxy`,
`http_proxy`, `no_proxy`).

`Endpoint.stream` asks for the answer as Server-Sent Events (`cairn.agents.models.sse`)
and reads them under the same deadline, up to a cap on the whole stream: a stream cut
before its last event (a dropped connection, a body that just ends, an `error` event) is
retried like a dropped connection, so nothing partial is ever returned.
"""

from __future__ import annotations

import base64
import http.client
import random
import re
import socket
import ssl
import time
import urllib.parse
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import orjson

from cairn.agents.models.sse import EventDecoder, StreamBroken, StreamReader
from cairn.errors import ModelError
from cairn.storage.redact import redact

# 408 timeout, 409 conflict (OpenAI's "try again"), 429 rate limit; every 5xx as well.
RETRYABLE_STATUSES = frozenset({408, 409, 429})
# The request itself is wrong (malformed, no such model, too large, unprocessable): the
# same bytes sent again are refused again, however late (`ModelError.refused`).
REFUSED_STATUSES = frozenset({400, 404, 413, 422})
FIRST_SERVER_ERROR = 500
# How an error body says the prompt is over the context window (`says_overflow`).
OVERFLOW_WORDS = re.compile(
    r"context[ _-]?(length|window)|prompt is too long|maximum context|too many (input )?tokens"
    r"|input token count|exceeds the (model's )?(max|context)",
    re.IGNORECASE,
)
MAX_ERROR_CHARS = 300
MAX_RESPONSE_BYTES = 16 * 1024 * 1024  # of a 2xx body; a reply within check_reply's is far less
MAX_ERROR_BODY_BYTES = 64 * 1024  # of an error body, of which MAX_ERROR_CHARS are shown
# Of a whole event stream: each part of a reply comes wrapped in a JSON event of its own
# (a few hundred bytes for a few characters), so a reply within check_reply's takes more
# than MAX_RESPONSE_BYTES streamed.
MAX_STREAM_BYTES = 128 * 1024 * 1024
EVENT_STREAM = "text/event-stream"
READ_CHUNK = 64 * 1024
DEFAULT_TIMEOUT = 600.0  # seconds for a whole model call, retries included


class Endpoint:
    """POSTs JSON to one URL under a deadline and returns a 2xx body, or raises `ModelError`.

    `timeout` bounds the whole of `post`: every attempt, and the waits between them; a
    retry whose wait would end past it is not made. Before retry n (from 0) it sleeps a
    uniform random time in [0, min(max_backoff, backoff * 2**n)]; a `Retry-After` header
    raises that to at least the server's wish, and no wait exceeds `max_backoff`.
    `secret` (the API key) is blotted out of every error it raises.
    """

    def __init__(
        self,
        url: str,
        headers: Mapping[str, str],
        *,
        secret: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        max_retries: int = 4,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        environ: Mapping[str, str] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        split = urllib.parse.urlsplit(url)
        if split.scheme not in {"http", "https"} or not split.hostname:
            raise ValueError(f"base_url must be an http(s) URL, not {url!r}")
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, not {timeout!r}")
        for name, value in headers.items():
            if not name.isascii() or not name.isprintable() or not value.isprintable():
                # The value may be the API key: name the header, never show the value.
                raise ValueError(f"header {name!r} has characters a header cannot carry")
        self.url = url
        self._split = split
        self._headers = {
            "Content-Type": "application/json",
            "Accept": "application/json",
            **headers,
        }
        self._secret = secret
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self._proxy = proxy_for(split, environ or {})
        if self._proxy is not None and split.scheme == "http":
            # Absolute-form requests through the proxy (see _connection).
            self._target = url
            self._headers.update(_proxy_auth(self._proxy))
        else:
            self._target = urllib.parse.urlunsplit(("", "", split.path or "/", split.query, ""))
        self._sleep = sleep

    def post(self, payload: bytes) -> bytes:
        """POST `payload`, retrying transient failures; return the body of a 2xx answer."""
        return self._call(payload, _read_body, "application/json")

    def stream(self, payload: bytes, reader: Callable[[], StreamReader]) -> bytes:
        """POST `payload`, which asks for a stream; return the body its events make.

        Each attempt reads the events with a new `reader()`, which makes the body the
        answer would have had unstreamed; a 2xx answer that is not an event stream (a
        server that does not stream) is that body already. Retried as `post` is, and
        also when the stream breaks before its last event.
        """

        def read(response: http.client.HTTPResponse, sock: socket.socket, deadline: float) -> bytes:
            if response.headers.get_content_type() != EVENT_STREAM:
                return _read_body(response, sock, deadline)
            return _read_events(response, sock, deadline, reader())

        return self._call(payload, read, EVENT_STREAM)

    def _call(self, payload: bytes, read: _BodyReader, accept: str) -> bytes:
        """POST `payload` until an attempt's 2xx answer is `read`, or raise `ModelError`."""
        deadline = time.monotonic() + self.timeout
        retry = 0
        while True:
            try:
                return self._post_once(payload, deadline, read, accept)
            except _TransientError as error:
                delay = self._delay(retry, error.retry_after)
                if retry >= self.max_retries or time.monotonic() + delay >= deadline:
                    raise ModelError(
                        f"model call failed after {retry + 1} attempts: {error}", retryable=True
                    ) from error
                self._sleep(delay)
                retry += 1

    def redact(self, text: str) -> str:
        """`redact_error` with this endpoint's API key blotted out should a server echo it."""
        return redact_error(text, self._secret)

    def _post_once(self, payload: bytes, deadline: float, read: _BodyReader, accept: str) -> bytes:
        """One request under `deadline`; raise `_TransientError` or a fatal `ModelError`."""
        connection = self._connection(_remaining(deadline))
        response: http.client.HTTPResponse | None = None
        try:
            headers = {**self._headers, "Accept": accept}
            connection.request("POST", self._target, payload, headers)
            # The response reads through this socket, even once the connection hands it over.
            sock: socket.socket = connection.sock
            sock.settimeout(_remaining(deadline))
            response = connection.getresponse()
            if 200 <= response.status < 300:  # noqa: PLR2004 - the success range
                return read(response, sock, deadline)
            error_body = _read(response, sock, deadline, MAX_ERROR_BODY_BYTES)
            status = response.status
            message = f"HTTP {status}: {self.redact(server_message(error_body, response.reason))}"
            if status in RETRYABLE_STATUSES or status >= FIRST_SERVER_ERROR:
                raise _TransientError(message, parse_retry_after(response.headers))
            refused = status in REFUSED_STATUSES
            overflow = refused and says_overflow(error_body)
            raise ModelError(message, retryable=False, refused=refused, overflow=overflow)
        except TimeoutError as error:
            raise _TransientError(f"timed out after {self.timeout:g} s") from error
        except StreamBroken as error:
            raise _TransientError(self.redact(f"the stream broke: {error}")) from error
        except ssl.SSLCertVerificationError as error:  # another attempt meets the same cert
            reason = self.redact(f"TLS: {error.verify_message}")
            raise ModelError(reason, retryable=False) from error
        except (OSError, http.client.HTTPException) as error:
            # Refused and reset connections, TLS failures, a server that hangs up mid-answer.
            detail = str(error) or repr(error)
            raise _TransientError(self.redact(f"{type(error).__name__}: {detail}")) from error
        finally:
            if response is not None:
                response.close()  # the socket stays open while the response holds it
            connection.close()

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        """A connection to the server, or to the proxy that reaches it."""
        target = self._split
        https = target.scheme == "https"
        host, port = target.hostname or "", target.port
        if self._proxy is not None:
            proxy = self._proxy
            proxy_host, proxy_port = proxy.hostname or "", proxy.port or 80
            if not https:  # absolute-form requests through the proxy (see __init__)
                return http.client.HTTPConnection(proxy_host, proxy_port, timeout=timeout)
            tunnel = http.client.HTTPSConnection(
                proxy_host, proxy_port, timeout=timeout, context=ssl.create_default_context()
            )
            tunnel.set_tunnel(host, port or 443, headers=_proxy_auth(proxy))
            return tunnel
        if https:
            return http.client.HTTPSConnection(
                host, port, timeout=timeout, context=ssl.create_default_context()
            )
        return http.client.HTTPConnection(host, port, timeout=timeout)

    def _delay(self, retry: int, retry_after: float | None) -> float:
        """Seconds before retry `retry` (from 0): the larger of jitter and Retry-After, capped."""
        ceiling = min(self.max_backoff, self.backoff * 2**retry)
        jittered = random.uniform(0, ceiling)  # noqa: S311 - jitter needs no cryptographic strength
        return min(self.max_backoff, max(jittered, retry_after or 0.0))


class _TransientError(Exception):
    """Raised by one attempt that a retry may fix; carries the server's Retry-After."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def _remaining(deadline: float) -> float:
    """Seconds left before `deadline`; raise `TimeoutError` once none are."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("deadline passed")
    return left


_BodyReader = Callable[[http.client.HTTPResponse, socket.socket, float], bytes]


def _read_body(response: http.client.HTTPResponse, sock: socket.socket, deadline: float) -> bytes:
    """A 2xx answer's body, up to `MAX_RESPONSE_BYTES` (a retryable `ModelError` past it)."""
    body = _read(response, sock, deadline, MAX_RESPONSE_BYTES + 1)
    if len(body) > MAX_RESPONSE_BYTES:
        # Retryable as a malformed reply is (see check_reply); nothing more is read.
        raise ModelError(f"response body is over {MAX_RESPONSE_BYTES} bytes", retryable=True)
    return body


def _read_events(
    response: http.client.HTTPResponse, sock: socket.socket, deadline: float, reader: StreamReader
) -> bytes:
    """Feed a 2xx event stream to `reader` until its last event; the body it makes.

    Every read is bounded by what is left of the call, the whole stream by
    `MAX_STREAM_BYTES`. A stream that ends before `reader` saw its last event is broken.
    """
    decoder = EventDecoder()
    size = 0
    while True:
        sock.settimeout(_remaining(deadline))
        chunk = response.read1(READ_CHUNK)
        if not chunk:
            raise StreamBroken("it ended before its last event")
        size += len(chunk)
        if size > MAX_STREAM_BYTES:
            raise ModelError(f"response stream is over {MAX_STREAM_BYTES} bytes", retryable=True)
        for event in decoder.feed(chunk):
            if reader.feed(event):
                return reader.body()


def _read(
    response: http.client.HTTPResponse, sock: socket.socket, deadline: float, limit: int
) -> bytes:
    """Up to `limit` bytes of `response`'s body, every read bounded by what is left of the call."""
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        sock.settimeout(_remaining(deadline))
        chunk = response.read1(min(READ_CHUNK, limit - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def redact_error(text: str, secret: str | None = None) -> str:
    """`text` on one line, bounded, with `secret` and secrets of known shapes blotted out.

    Blotted out before it is cut, so no secret is cut short of what makes it known.
    """
    text = " ".join(text.split())
    if secret:
        text = text.replace(secret, "***")
    return redact(text)[:MAX_ERROR_CHARS]


def malformed_reply(
    error: Exception, body: bytes, blot: Callable[[str], str] = redact_error
) -> ModelError:
    """The retryable `ModelError` for a 2xx `body` holding no reply, quoting its start.

    A server may answer with anything, an echo of the request's headers among it: `blot`
    (an endpoint's `redact`, by default `redact_error`) makes the text of the error.
    """
    start = body[:MAX_ERROR_BODY_BYTES].decode(errors="replace")
    return ModelError(blot(f"malformed response ({error!r}): {start}"), retryable=True)


def server_message(body: bytes, reason: str) -> str:
    """The server's `error.message` (OpenAI's and Anthropic's shape), else its body or `reason`."""
    try:
        detail = orjson.loads(body)["error"]
        return str(detail["message"] if isinstance(detail, dict) else detail)
    except (ValueError, LookupError, TypeError):
        return body.decode(errors="replace") or reason


def says_overflow(body: bytes) -> bool:
    """Whether an error body says the prompt is longer than the model's context window.

    OpenAI's code `context_length_exceeded`, Anthropic's "prompt is too long", and the
    wordings of the servers that speak their dialects (vLLM, llama.cpp, LiteLLM).
    """
    try:
        detail = orjson.loads(body)["error"]
        if isinstance(detail, dict) and detail.get("code") == "context_length_exceeded":
            return True
    except (ValueError, LookupError, TypeError):
        pass
    return OVERFLOW_WORDS.search(body[:MAX_ERROR_BODY_BYTES].decode(errors="replace")) is not None


def parse_retry_after(headers: http.client.HTTPMessage) -> float | None:
    """Seconds a `Retry-After` header asks us to wait (delta-seconds or an HTTP date), or None."""
    value = headers.get("Retry-After")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def proxy_for(
    target: urllib.parse.SplitResult, environ: Mapping[str, str]
) -> urllib.parse.SplitResult | None:
    """The proxy `environ` names for `target` (lower-case names first, as curl), or None."""

    def variable(name: str) -> str:
        return environ.get(name) or environ.get(name.upper()) or ""

    host = (target.hostname or "").lower()
    for raw in variable("no_proxy").split(","):
        entry = raw.strip().lower().lstrip(".")
        if entry == "*" or (entry and (host == entry or host.endswith("." + entry))):
            return None
    proxy = variable(f"{target.scheme}_proxy")
    if not proxy:
        return None
    split = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    return split if split.hostname else None


def _proxy_auth(proxy: urllib.parse.SplitResult) -> dict[str, str]:
    """A Proxy-Authorization header for a proxy URL with credentials, else none."""
    if proxy.username is None:
        return {}
    user = urllib.parse.unquote(proxy.username)
    password = urllib.parse.unquote(proxy.password or "")
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Proxy-Authorization": f"Basic {token}"}
