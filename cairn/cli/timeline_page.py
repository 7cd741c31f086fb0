"""The HTML timeline of a task (`cairn trace TASK --html FILE`), one self-contained page.

Inline CSS, SVG and script; no network, no external asset. Every string that comes from
the task is escaped with `html.escape`; the data the script reads is JSON with `<`, `>`
and `&` escaped, so nothing in a task can close the script element.

The script marks the page when it ran: `#cairn-ok` when every part of it ran without an
exception, `#cairn-js-error` (with the message) when one was thrown; a headless browser's
dump of the DOM shows which.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from html import escape

from coordinator.timeline import CheckpointMark, StepCell, Timeline

BAR_WIDTH = 120  # px of the longest step's duration bar
MS_PER_S = 1000

CSS = """
body{font:14px system-ui,sans-serif;margin:1.5em;color:#222;background:#fafafa}
h1{font-size:1.3em;margin:0 0 .2em} h2{font-size:1.05em;margin:1.4em 0 .4em}
.meta{color:#555;margin-bottom:.8em}
.status-succeeded{color:#1a7f37} .status-failed,.status-unrecoverable{color:#c62828}
.status-running,.status-paused{color:#0366d6}
table{border-collapse:collapse;background:#fff}
th,td{border:1px solid #ddd;padding:4px 6px;vertical-align:top;text-align:left}
th.agent{background:#f0f0f0;white-space:nowrap}
td.cell{min-width:130px} td.cell svg{display:block;margin:2px 0}
td.ok{background:#eef8ee} td.retried{background:#fff6e0} td.failed{background:#fde8e8}
td.empty{background:#f7f7f7;color:#aaa}
.gc{display:inline-block;margin:1px 2px;padding:0 4px;border-radius:3px;font-size:12px;
    background:#e6eefc;border:1px solid #9bb4e8}
.gc.ABORTED{background:#fde8e8;border-color:#e59a9a}
.gc.restore{background:#f3e6fc;border-color:#b88be0}
.tag{font-size:11px;padding:0 3px;border-radius:2px;margin-left:2px}
.hot{background:#ffd8b0} .cold{background:#cfe3ff}
.err{color:#c62828;font-size:12px} .tools{color:#666;font-size:12px}
.legend span{margin-right:1em}
tr.highlight th,tr.highlight td{outline:2px solid #0366d6}
#cairn-js-error{color:#c62828;font-weight:bold}
"""

EARLY_SCRIPT = """
window.cairnErrors = [];
window.onerror = function (message) {
  window.cairnErrors.push(String(message));
  var note = document.createElement('div');
  note.id = 'cairn-js-error';
  note.textContent = 'script error: ' + message;
  (document.body || document.documentElement).appendChild(note);
  return false;
};
"""

SCRIPT = """
(function () {
  var data = JSON.parse(document.getElementById('cairn-data').textContent);
  var summary = document.getElementById('summary');
  var steps = data.cells.length;
  var retries = data.cells.reduce(function (n, c) { return n + c.attempt - 1; }, 0);
  var failed = data.cells.filter(function (c) { return c.errors.length > 0; }).length;
  var restores = data.checkpoints.filter(function (m) { return m.restore; }).length;
  summary.textContent = data.agents.length + ' agents (' + data.agents.join(', ') + '), ' +
    steps + ' steps, ' + data.checkpoints.length + ' checkpoints, ' + failed +
    ' failed steps, ' + retries + ' retries, ' + restores + ' restores';
  var rows = document.querySelectorAll('tr[data-agent]');
  rows.forEach(function (row) {
    row.addEventListener('click', function () { row.classList.toggle('highlight'); });
  });
  if (window.cairnErrors.length === 0) {
    var ok = document.createElement('div');
    ok.id = 'cairn-ok';
    ok.setAttribute('data-agents', String(data.agents.length));
    ok.hidden = true;
    document.body.appendChild(ok);
  }
})();
"""


def _e(value: object) -> str:
    return escape(str(value), quote=True)


def _ms(value: float) -> str:
    return f"{value / MS_PER_S:.2f} s" if value >= MS_PER_S else f"{value:.0f} ms"


def _bar(cell: StepCell, longest: float) -> str:
    width = 0 if longest <= 0 else max(1, round(BAR_WIDTH * cell.duration_ms / longest))
    colour = {"ok": "#4caf50", "retried": "#f0a020", "failed": "#e53935"}[cell.status]
    return (
        f'<svg width="{BAR_WIDTH}" height="6" role="img" aria-label="duration">'
        f'<rect width="{width}" height="6" rx="2" fill="{colour}"/></svg>'
    )


def _mark(mark: CheckpointMark) -> str:
    classes = ["gc", _e(mark.status)] + (["restore"] if mark.restore else [])
    title = f"GC {mark.number}: {mark.status}, superstep {mark.superstep}, epoch {mark.epoch}"
    if mark.restore:
        title += f" (a restore: restates superstep {mark.superstep})"
    if mark.error:
        title += f"; {mark.error}"
    tags = ""
    if mark.hot:
        tags += '<span class="tag hot" title="in Redis">hot</span>'
    if mark.cold:
        tags += '<span class="tag cold" title="archived on disk">cold</span>'
    label = f"GC {mark.number}" + (" ↺" if mark.restore else "")
    label += " ✗" if mark.status == "ABORTED" else ""
    return (
        f'<span class="{" ".join(classes)}" title="{_e(title)}" data-gc="{mark.number}">'
        f"{_e(label)} e{_e(mark.epoch)}{tags}</span>"
    )


def _cell(cell: StepCell | None, longest: float) -> str:
    if cell is None:
        return '<td class="cell empty">·</td>'
    parts = [
        f"<b>step {cell.step}</b> · {_ms(cell.duration_ms)} · {_e(cell.status)}",
        _bar(cell, longest),
    ]
    if cell.attempt > 1:
        parts.append(f'<span class="err">attempt {cell.attempt}</span>')
    if cell.tools:
        parts.append(f'<div class="tools">{_e(", ".join(cell.tools))}</div>')
    parts.extend(f'<div class="err">{_e(error)}</div>' for error in cell.errors)
    title = f"{cell.agent}, superstep {cell.superstep}, epoch {cell.epoch}"
    return f'<td class="cell {_e(cell.status)}" title="{_e(title)}">{"".join(parts)}</td>'


def _grid(timeline: Timeline) -> str:
    longest = max((c.duration_ms for c in timeline.cells), default=0.0)
    head = ["<tr><th>agent \\ superstep</th>"]
    for superstep in timeline.supersteps:
        gcs = "".join(_mark(m) for m in timeline.checkpoints if m.superstep == superstep)
        head.append(f'<th data-superstep="{superstep}">{superstep}<br>{gcs}</th>')
    head.append("</tr>")
    body = []
    for agent in timeline.agents:
        cells = "".join(_cell(timeline.cell(agent, s), longest) for s in timeline.supersteps)
        body.append(f'<tr data-agent="{_e(agent)}"><th class="agent">{_e(agent)}</th>{cells}</tr>')
    return f'<table id="grid">{"".join(head)}{"".join(body)}</table>'


def _ranked(title: str, cells: list[StepCell], empty: str) -> str:
    if not cells:
        return f"<h2>{_e(title)}</h2><p>{_e(empty)}</p>"
    rows = "".join(
        f"<tr><td>{_e(c.agent)}</td><td>{c.superstep}</td><td>{c.step}</td>"
        f"<td>{_ms(c.duration_ms)}</td><td>{c.attempt}</td><td>{len(c.errors)}</td>"
        f"<td>{_e('; '.join(c.errors))}</td></tr>"
        for c in cells
    )
    return (
        f"<h2>{_e(title)}</h2><table><tr><th>agent</th><th>superstep</th><th>step</th>"
        f"<th>duration</th><th>attempts</th><th>errors</th><th>error</th></tr>{rows}</table>"
    )


def _checkpoints(timeline: Timeline) -> str:
    rows = "".join(
        f"<tr><td>{m.number}</td><td>{m.superstep}</td><td>{_e(m.epoch)}</td>"
        f"<td>{_e(m.status)}</td><td>{'yes' if m.hot else ''}</td><td>{'yes' if m.cold else ''}"
        f"</td><td>{'restore' if m.restore else ''}</td><td>{_e(m.created_at or '')}</td></tr>"
        for m in timeline.checkpoints
    )
    return (
        '<h2>Global checkpoints</h2><table id="checkpoints"><tr><th>GC</th><th>superstep</th>'
        "<th>epoch</th><th>status</th><th>hot</th><th>cold</th><th>restore</th>"
        f"<th>created</th></tr>{rows}</table>"
    )


def _data(timeline: Timeline) -> str:
    data = {
        "task": timeline.task,
        "agents": timeline.agents,
        "cells": [asdict(c) for c in timeline.cells],
        "checkpoints": [asdict(m) for m in timeline.checkpoints],
    }
    text = json.dumps(data, default=str)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def render(timeline: Timeline) -> str:
    """The page: the grid of agents by supersteps, the checkpoints, the analytics tables."""
    status = _e(timeline.status)
    reason = f" — {_e(timeline.reason)}" if timeline.reason else ""
    error = f'<p class="err">{_e(timeline.error)}</p>' if timeline.error else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Cairn timeline: {_e(timeline.task)}</title>
<style>{CSS}</style>
<script>{EARLY_SCRIPT}</script>
</head><body>
<h1>Task {_e(timeline.task)}</h1>
<div class="meta">status <b class="status-{status}">{status}</b>{reason}</div>
<div class="meta" id="summary">{len(timeline.agents)} agents</div>
{error}
<div class="legend"><span>cell: step · duration · ok / retried / failed</span>
<span>GC n ↺: a restore (its epoch rose)</span><span>✗: aborted</span>
<span><span class="tag hot">hot</span> in Redis</span>
<span><span class="tag cold">cold</span> archived</span></div>
<h2>Agents &times; supersteps</h2>
{_grid(timeline)}
{_checkpoints(timeline)}
{_ranked("Slowest steps", timeline.slowest, "no steps")}
{_ranked("Most failing or retried steps", timeline.troubled, "no step failed or was retried")}
<script type="application/json" id="cairn-data">{_data(timeline)}</script>
<script>{SCRIPT}</script>
</body></html>
"""
