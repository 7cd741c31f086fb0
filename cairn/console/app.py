"""The console as a Starlette application: pages, the JSON API and the two static files.

`build_app` wires the routes of `cairn.console.pages` and `cairn.console.api` behind the
`Guard` of `cairn.console.security`, itself behind the body limit of
`cairn.console.limits`; `cairn.console.launch` serves it with uvicorn.
"""

from __future__ import annotations

from importlib.resources import files

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from cairn.client import Client
from cairn.console.api import Api
from cairn.console.limits import BodyLimit
from cairn.console.pages import Pages
from cairn.console.security import Guard, GuardMiddleware, refused

STATIC_TYPES = {
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
}


def _static_files() -> dict[str, bytes]:
    """The console's script and style, read once from the package."""
    folder = files("cairn.console").joinpath("static")
    return {name: folder.joinpath(name).read_bytes() for name in STATIC_TYPES}


def build_app(client: Client, guard: Guard) -> Starlette:
    """The console over `client`, every request passing `guard` first."""
    static = _static_files()

    async def serve_static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in static:
            return PlainTextResponse("no such file", status_code=404)
        return Response(static[name], media_type=STATIC_TYPES[name])

    async def http_error(request: Request, exc: Exception) -> Response:
        # Starlette's own 404 and 405 (no route, wrong method) in the API's shape too.
        code = exc.status_code if isinstance(exc, HTTPException) else 500
        detail = exc.detail if isinstance(exc, HTTPException) else "unexpected error"
        return refused(request, code, detail)

    return Starlette(
        routes=[
            *Pages(client, guard.csrf).routes(),
            *Api(client).routes(),
            Route("/static/{name}", serve_static),
        ],
        # The body limit first: every body is read (or refused) before any answer, the
        # Guard's refusals included, so no answer is cut off by a reset.
        middleware=[Middleware(BodyLimit), Middleware(GuardMiddleware, guard=guard)],
        exception_handlers={HTTPException: http_error},
    )
