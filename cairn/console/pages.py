"""The console's pages: server-rendered frames that the console's script fills and keeps live.

A page is its structure (headings, empty tables, the action buttons) and the CSRF secret in
a `<meta>`; `static/console.js` reads the JSON API every second and draws the task strings
with `textContent` only, so one code path draws a page on load and every second after.
What the server itself writes of a task (its id) is escaped here with `html.escape`. The
timeline is `cairn trace --html`'s page, served as it is, framed by the task page.
"""

from __future__ import annotations

from html import escape

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import BaseRoute, Route

from cairn.cli.timeline_page import render as render_timeline
from cairn.client import Client
from cairn.console.security import CSP, timeline_policy
from cairn.coordinator.runs import TaskState
from cairn.errors import CairnError, TaskNotFound, one_line

FRAMED_CSP = CSP.replace("frame-ancestors 'none'", "frame-ancestors 'self'")


def _e(value: object) -> str:
    return escape(str(value), quote=True)


def layout(title: str, csrf: str, body: str, **data: str) -> str:
    """A whole page: `body` under the console's header, its script and style, `data-*` set."""
    attributes = "".join(f' data-{name}="{_e(value)}"' for name, value in data.items())
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="cairn-csrf" content="{_e(csrf)}">
<title>{_e(title)} · Cairn console</title>
<link rel="stylesheet" href="/static/console.css">
<script src="/static/console.js" defer></script>
</head><body{attributes}>
<header><a class="brand" href="/">Cairn</a> <nav><a href="/">tasks</a>
<a href="/approvals">approvals <span id="approval-count"></span></a></nav>
<span id="live" class="live" title="live: read every second">…</span></header>
<main>
<div id="outcome" role="status" hidden></div>
{body}
</main>
<noscript><p class="error">The console draws its tables with its script: turn JavaScript
on for this page.</p></noscript>
</body></html>
"""


def tasks_page(csrf: str) -> str:
    """The task list, filtered by state (`?state=`)."""
    options = "".join(f'<option value="{s.value}">{s.value}</option>' for s in TaskState)
    body = f"""<h1>Tasks</h1>
<p class="controls"><label>state <select id="state-filter">
<option value="">every state</option>{options}</select></label>
<span id="task-count"></span></p>
<table id="tasks"><thead><tr><th>task</th><th>state</th><th>superstep</th><th>epoch</th>
<th>latest GC</th><th>tokens</th><th>cost</th><th>agents</th><th>age</th></tr></thead>
<tbody></tbody></table>
"""
    return layout("Tasks", csrf, body, page="tasks")


def task_page(csrf: str, task: str) -> str:
    """One task: status, actions, agents, live replies, approvals, verify, GCs, diff, timeline."""
    t = _e(task)
    body = f"""<h1>Task <span id="task-id">{t}</span></h1>
<p id="summary" class="summary"></p>
<p class="controls" id="task-actions">
<button type="button" data-action="pause" hidden>pause</button>
<button type="button" data-action="resume" hidden>resume</button>
<button type="button" data-action="cancel" hidden>cancel</button></p>
<h2>Agents</h2>
<table id="agents"><thead><tr><th>agent</th><th>status</th><th>step</th><th>tokens</th>
<th>replayed</th><th>retries</th><th>last error</th></tr></thead><tbody></tbody></table>
<h2>Replying now</h2>
<div id="streaming"></div>
<h2>Waiting for approval</h2>
<table id="approvals"><thead><tr><th>agent</th><th>call</th><th>tool</th><th>arguments</th>
<th></th></tr></thead><tbody></tbody></table>
<h2>Verify</h2>
<pre id="verify" class="verify"></pre>
<h2>Checkpoints</h2>
<table id="checkpoints"><thead><tr><th>GC</th><th>status</th><th>superstep</th>
<th>epoch</th><th>members</th><th>origin</th><th>where</th><th>written</th><th>size</th>
<th></th></tr></thead>
<tbody></tbody></table>
<h2>Diff</h2>
<p class="controls"><label>from <select id="diff-a"></select></label>
<label>to <select id="diff-b"></select></label>
<button type="button" id="diff-show">compare</button></p>
<div id="diff"></div>
<h2>Timeline <a class="small" href="/tasks/{t}/timeline" target="_blank">open alone</a>
<button type="button" id="timeline-reload" class="small">reload</button></h2>
<iframe id="timeline" title="timeline of {t}" src="/tasks/{t}/timeline"></iframe>
"""
    return layout(f"Task {task}", csrf, body, page="task", task=task)


def approvals_page(csrf: str) -> str:
    """Every tool call waiting for a person, across the tasks that have not ended."""
    body = """<h1>Waiting for approval</h1>
<table id="approvals"><thead><tr><th>task</th><th>agent</th><th>call</th><th>tool</th>
<th>arguments</th><th></th></tr></thead><tbody></tbody></table>
"""
    return layout("Approvals", csrf, body, page="approvals")


def error_page(csrf: str, status: int, reason: str, *, framed: bool = False) -> HTMLResponse:
    """A page that says, in one line, why there is nothing to show (`framed`: in the console)."""
    body = f'<h1>Nothing to show</h1><p class="error">{_e(reason)}</p>'
    headers = {"Content-Security-Policy": FRAMED_CSP} if framed else None
    return HTMLResponse(layout("Error", csrf, body, page="error"), status, headers)


class Pages:
    """The page routes, over one `Client`."""

    def __init__(self, client: Client, csrf: str) -> None:
        self.client, self.csrf = client, csrf

    def routes(self) -> list[BaseRoute]:
        """The pages' routes."""
        return [
            Route("/", self.tasks),
            Route("/approvals", self.approvals),
            Route("/tasks/{task}", self.task),
            Route("/tasks/{task}/timeline", self.timeline),
        ]

    async def tasks(self, request: Request) -> Response:
        """The task list."""
        return HTMLResponse(tasks_page(self.csrf))

    async def approvals(self, request: Request) -> Response:
        """The approval queue."""
        return HTMLResponse(approvals_page(self.csrf))

    async def task(self, request: Request) -> Response:
        """A task's page; a page saying why for a task Cairn does not know."""
        task = request.path_params["task"]
        try:
            await run_in_threadpool(self.client.task, task)
        except TaskNotFound as exc:
            return error_page(self.csrf, 404, one_line(exc))
        except CairnError as exc:
            return error_page(self.csrf, 400, one_line(exc))
        return HTMLResponse(task_page(self.csrf, task))

    async def timeline(self, request: Request) -> Response:
        """The task's timeline, as `cairn trace --html` writes it, with its own CSP."""
        task = request.path_params["task"]
        try:
            timeline = await run_in_threadpool(lambda: self.client.task(task).timeline())
            page = render_timeline(timeline)
        except TaskNotFound as exc:
            return error_page(self.csrf, 404, one_line(exc), framed=True)
        except CairnError as exc:
            return error_page(self.csrf, 409, one_line(exc), framed=True)
        return HTMLResponse(page, headers={"Content-Security-Policy": timeline_policy(page)})
