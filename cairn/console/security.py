"""Who may use the console, and how a browser is kept from being used against it.

Every request passes `Guard` (an ASGI middleware) before any route:

- **Host.** A console on a loopback address answers only requests whose `Host` names a
  loopback address and its port, so a web page cannot reach it through DNS rebinding.
- **Token.** With `CAIRN_CONSOLE_TOKEN` set (required for a non-loopback address), every
  request (pages, `/api/`, `/static/`) carries it: `Authorization: Bearer <token>`, or the
  cookie a page load with `?token=<token>` sets (HttpOnly, SameSite=Strict; the token is
  then taken out of the address bar by a redirect).
- **CSRF.** A POST (every change; a GET never changes anything) carries `X-Cairn-CSRF`
  with this process's secret, which each page embeds, unless it carries the token as a
  bearer header (which no browser adds by itself); and a browser's `Origin` and
  `Sec-Fetch-Site`, when sent, must say the request came from the console's own pages.
- **Headers.** A Content-Security-Policy that runs only the console's own script (no
  inline script, no other origin), no framing but by the console itself, no referrer,
  no caching of answers.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from base64 import b64encode
from dataclasses import dataclass, field
from urllib.parse import urlencode, urlsplit

from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp

COOKIE = "cairn_console"
CSRF_HEADER = "X-Cairn-CSRF"
SAFE_METHODS = frozenset({"GET", "HEAD"})
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-src 'self'; frame-ancestors 'none'; base-uri 'none'; "
    "form-action 'self'"
)
INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.DOTALL)


def timeline_policy(page: str) -> str:
    """The CSP of a timeline page: its own inline scripts (by hash), framed by the console.

    The timeline (`cairn.cli.timeline_page`) is one self-contained file with inline script
    and style; its task strings are escaped in the markup and in its embedded JSON, so the
    only scripts in it are its own, which the hashes name.
    """
    hashes = " ".join(
        f"'sha256-{b64encode(hashlib.sha256(body.encode()).digest()).decode()}'"
        for body in INLINE_SCRIPT.findall(page)
    )
    return (
        f"default-src 'none'; script-src {hashes}; style-src 'unsafe-inline'; "
        "img-src data:; frame-ancestors 'self'; base-uri 'none'; form-action 'none'"
    )


@dataclass(frozen=True)
class Guard:
    """The console's rules: its token (if any), its CSRF secret, the Hosts it answers."""

    token: str | None
    hosts: frozenset[str] | None  # None: any Host (a token guards a non-loopback console)
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))

    def cookie_value(self) -> str:
        """What the cookie holds: a MAC of the token, so the cookie is not the token."""
        assert self.token is not None
        return hmac.new(self.token.encode(), b"cairn-console-cookie", "sha256").hexdigest()

    def bearer(self, request: Request) -> bool:
        """True when the request carries the token as `Authorization: Bearer`."""
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        return (
            self.token is not None
            and scheme.lower() == "bearer"
            and hmac.compare_digest(given.strip().encode(), self.token.encode())
        )

    def refusal(self, request: Request) -> tuple[int, str] | None:
        """The HTTP status and reason refusing the request, or None to let it through."""
        if self.hosts is not None and request.headers.get("host", "") not in self.hosts:
            return 403, "this console answers only requests to its loopback address"
        if self.token is not None and not self._authenticated(request):
            return 401, "this console needs its token (CAIRN_CONSOLE_TOKEN): see docs/console.md"
        if request.method not in SAFE_METHODS and not self.bearer(request):
            reason = self._cross_site(request)
            return None if reason is None else (403, reason)
        return None

    def _authenticated(self, request: Request) -> bool:
        cookie = request.cookies.get(COOKIE, "")
        return self.bearer(request) or hmac.compare_digest(
            cookie.encode(), self.cookie_value().encode()
        )

    def _cross_site(self, request: Request) -> str | None:
        """Why a change a browser asked for may not have come from the console's pages."""
        given = request.headers.get(CSRF_HEADER.lower(), "")
        if not hmac.compare_digest(given.encode(), self.csrf.encode()):
            return f"a change needs the {CSRF_HEADER} header of the console's pages"
        origin = request.headers.get("origin")
        if origin is not None and urlsplit(origin).netloc != request.headers.get("host"):
            return "a change must come from the console's own pages"
        if request.headers.get("sec-fetch-site", "same-origin") not in {"same-origin", "none"}:
            return "a change must come from the console's own pages"
        return None

    def token_in_query(self, request: Request) -> bool:
        """True when a page load names the right token in `?token=`."""
        given = request.query_params.get("token")
        return (
            self.token is not None
            and request.method in SAFE_METHODS
            and given is not None
            and hmac.compare_digest(given.encode(), self.token.encode())
        )


class GuardMiddleware(BaseHTTPMiddleware):
    """Apply a `Guard` to every request, and the security headers to every response."""

    def __init__(self, app: ASGIApp, guard: Guard) -> None:
        super().__init__(app)
        self.guard = guard

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        """Refuse, redirect (a token in the query becomes a cookie) or serve the request."""
        if self.guard.token_in_query(request):
            response: Response = RedirectResponse(_without_token(request), status_code=303)
            response.set_cookie(
                COOKIE,
                self.guard.cookie_value(),
                httponly=True,
                samesite="strict",
                secure=request.url.scheme == "https",
            )
        elif (refusal := self.guard.refusal(request)) is not None:
            response = refused(request, *refusal)
        else:
            response = await call_next(request)
        response.headers.setdefault("Content-Security-Policy", CSP)
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        response.headers["Cache-Control"] = "no-store"
        return response


def refused(request: Request, status: int, reason: str) -> Response:
    """A refusal: `{"error": reason}` under `/api/`, the reason as text elsewhere."""
    if request.url.path.startswith("/api/"):
        return JSONResponse({"error": reason}, status_code=status)
    return PlainTextResponse(reason, status_code=status)


def _without_token(request: Request) -> str:
    """The request's path and query without its `token` parameter."""
    query = request.query_params.multi_items()
    kept = urlencode([(k, v) for k, v in query if k != "token"])
    return f"{request.url.path}?{kept}" if kept else request.url.path
