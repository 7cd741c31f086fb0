"""The HTML timeline of a task (`cairn trace TASK --html FILE`), one self-contained page.

Each agent is a lane; each step a bar placed in time from its model turn's start to its
last tool call's end, its tool calls drawn inside; a retried step is orange and its lost
attempt shaded before it, a step a restore undid is hatched; the global checkpoints are
markers on the time axis (a restore's purple). A click on a step shows its messages, tool
calls and usage; a click on one GC marker and then another (or the two selects) shows
their diff. `#step=<lc id>` and `#diff=<a>,<b>` in the URL open the same views.

The diff is computed in the page, not embedded: the page carries each LC's additions to
its agent's history (pooled, so a message is held once), each GC's members and manifest,
and the files' text within limits (`cairn.coordinator.timeline`), and its script finds the
common prefixes and draws line diffs as `cairn.coordinator.diff` does. That grows with the
task's history, where embedded diffs of all pairs grow with the square of its checkpoints
and repeat the same messages in every pair; and any two checkpoints can be compared.

Inline CSS, script and data; no network, no external asset. Every string from the task is
escaped with `html.escape` in the markup, the data is JSON with `<`, `>` and `&` escaped
(nothing in a task can close the script element), and the script writes task strings with
`textContent` and `setAttribute` only. The script marks the page when it ran: `#cairn-ok`
when every part of it ran without an exception, `#cairn-js-error` (with the message) when
one was thrown; a headless browser's dump of the DOM shows which.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from datetime import datetime
from html import escape

from cairn.cli.timeline_script import DIFF_SCRIPT, EARLY_SCRIPT, SCRIPT
from cairn.coordinator.diff import MAX_DIFF_LINES
from cairn.coordinator.timeline import CheckpointMark, StepCell, Timeline

TEXT_LIMIT = 20_000  # characters of one string (a message, a tool result) the page carries
WIDTH = 100.0  # percent: places on the time track run from 0 to this
TRACK_PX = 1100  # the time track's width the GC markers are spread for (it only grows)
MARKER_PX = 24  # a GC marker's width: closer markers go to the next row
MARKER_ROWS = 4
TICKS = 10  # at most, on the time axis
MS_PER_S = 1000
CLOCK_FROM_S = 120  # a track this long or longer labels its ticks as a clock

CSS = """
body{font:14px system-ui,sans-serif;margin:1.2em;color:#222;background:#fafafa}
h1{font-size:1.3em;margin:0 0 .2em} h2{font-size:1.05em;margin:1.2em 0 .4em}
h3{font-size:.95em;margin:1em 0 .3em}
.meta{color:#555;margin-bottom:.5em}
.status-succeeded{color:#1a7f37} .status-failed,.status-unrecoverable{color:#c62828}
.status-running,.status-paused{color:#0366d6}
table{border-collapse:collapse;background:#fff}
th,td{border:1px solid #ddd;padding:3px 6px;vertical-align:top;text-align:left}
pre{margin:0;white-space:pre-wrap;word-break:break-word;font-size:12px}
.legend{font-size:12px;color:#444;margin:.4em 0} .legend>span{margin-right:1.2em}
.swatch{display:inline-block;width:14px;height:9px;border-radius:2px;vertical-align:middle}
.controls{margin:.5em 0;font-size:13px} .controls button,.controls select{font-size:12px}
.scroll{overflow-x:auto;border:1px solid #ddd;background:#fff}
.chart{display:grid;grid-template-columns:130px 1fr;position:relative;min-width:100%}
.label{position:sticky;left:0;z-index:3;background:#f4f4f4;border-bottom:1px solid #e4e4e4;
  padding:0 6px;font-size:12px;display:flex;align-items:center;overflow:hidden;white-space:nowrap}
.track{position:relative;border-bottom:1px solid #eee;height:36px}
.axis{height:22px;overflow:hidden}
.axis .tick{position:absolute;top:0;bottom:0;border-left:1px solid #ccc;font-size:11px;
  color:#666;padding-left:2px;white-space:nowrap}
.gc-mark{position:absolute;z-index:2;transform:translateX(-50%);height:18px;min-width:20px;
  padding:0 3px;font-size:11px;border-radius:3px;border:1px solid #6d8fd6;background:#e6eefc;
  cursor:pointer}
.gc-mark.restore{background:#efdffc;border-color:#9c6ad0}
.gc-mark.ABORTED{background:#fde8e8;border-color:#d77}
.gc-mark.picked{outline:2px solid #0366d6;font-weight:bold}
.gc-lines{position:absolute;left:130px;right:0;top:0;bottom:0;pointer-events:none;z-index:1}
.gc-line{position:absolute;top:22px;bottom:0;border-left:1px dashed #b9c8ea}
.gc-line.restore{border-left:2px solid #b78be0} .gc-line.ABORTED{border-left-color:#e9a0a0}
.bar{position:absolute;top:13px;height:18px;min-width:3px;border-radius:3px;cursor:pointer;
  box-sizing:border-box;z-index:2;overflow:hidden}
.bar.ok{background:#8fd19e;border:1px solid #3c9a52}
.bar.retried{background:#ffd27f;border:1px solid #d08a00}
.bar.failed{background:#f4a3a3;border:1px solid #c62828}
.bar.undone{opacity:.55;background-image:repeating-linear-gradient(45deg,transparent 0 4px,
  rgba(0,0,0,.18) 4px 6px)}
.bar.selected{outline:2px solid #0366d6;z-index:4}
.bar .turn{position:absolute;top:0;bottom:0;background:rgba(255,255,255,.45)}
.bar .tool{position:absolute;top:3px;bottom:3px;min-width:2px;background:#2f5d8a}
.bar .tool.err{background:#c62828}
.lost{position:absolute;top:19px;height:6px;background:repeating-linear-gradient(90deg,
  #f0a020 0 3px,transparent 3px 6px);z-index:1}
.badge{position:absolute;top:0;font-size:10px;color:#b36b00;white-space:nowrap;z-index:2}
#detail{margin-top:1em;padding:.6em .9em;background:#fff;border:1px solid #ddd;min-height:3em}
.msg{border-left:3px solid #ccc;margin:.4em 0;padding:.1em .5em}
.msg.assistant{border-color:#3c9a52} .msg.tool{border-color:#2f5d8a}
.msg.user{border-color:#d08a00} .msg.system{border-color:#999}
.who{font-size:11px;color:#666} .call{font-size:12px;color:#2f5d8a}
.udiff .add{color:#1a7f37;background:#eefbee} .udiff .del{color:#b31d28;background:#fdeeee}
.udiff .hunk{color:#6f42c1} .udiff span{display:block}
.err{color:#c62828;font-size:12px}
td.cell{min-width:110px;cursor:pointer} td.ok{background:#eef8ee}
td.retried{background:#fff6e0} td.failed{background:#fde8e8} td.empty{background:#f7f7f7}
.tools{color:#666;font-size:12px} .tag{font-size:11px;padding:0 3px;border-radius:2px}
.hot{background:#ffd8b0} .cold{background:#cfe3ff}
#cairn-js-error{color:#c62828;font-weight:bold}
"""


def _e(value: object) -> str:
    return escape(str(value), quote=True)


def _ms(value: float) -> str:
    return f"{value / MS_PER_S:.2f} s" if value >= MS_PER_S else f"{value:.1f} ms"


class _Scale:
    """Where an instant sits on the time track, in percent of its width."""

    def __init__(self, stamps: list[str]) -> None:
        instants = [datetime.fromisoformat(s) for s in stamps]
        start, end = min(instants), max(instants)
        span = max((end - start).total_seconds(), 0.001)
        self.start = start
        self.origin = start.timestamp() - span * 0.01  # a margin either side
        self.span = span * 1.03

    def at(self, stamp: str | None) -> float:
        """The instant's place, 0 to 100."""
        return 0.0 if stamp is None else self.place(datetime.fromisoformat(stamp).timestamp())

    def place(self, seconds: float) -> float:
        """The place of a POSIX time, 0 to 100."""
        return (seconds - self.origin) / self.span * WIDTH

    def ticks(self) -> list[tuple[float, str]]:
        """Round instants from the start to the track's end, with their labels."""
        raw = self.span / TICKS
        power = 10 ** math.floor(math.log10(raw))
        step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
        found: list[tuple[float, str]] = []
        offset = 0.0
        while (x := self.place(self.start.timestamp() + offset)) < WIDTH:
            found.append((x, self.label(offset)))
            offset = round(offset + step, 9)
        return found

    def label(self, offset: float) -> str:
        """Seconds since the start: `+1.5 s`, or `+1:02:30` on a track of minutes or more."""
        if self.span < CLOCK_FROM_S:
            return f"+{offset:g} s"
        minutes, seconds = divmod(round(offset), 60)
        hours, minutes = divmod(minutes, 60)
        return f"+{hours}:{minutes:02}:{seconds:02}" if hours else f"+{minutes}:{seconds:02}"


def _pos(left: float, width: float | None = None) -> str:
    style = f"left:{left:.3f}%"
    return style if width is None else f"{style};width:{max(width, 0.0):.3f}%"


def _axis(scale: _Scale) -> str:
    ticks = "".join(
        f'<span class="tick" style="{_pos(x)}">{_e(label)}</span>' for x, label in scale.ticks()
    )
    start = scale.start.strftime("%Y-%m-%d %H:%M:%S UTC")
    return (
        f'<div class="label" title="{_e(start)}">time from {_e(start[11:19])}</div>'
        f'<div class="track axis">{ticks}</div>'
    )


def _mark_title(mark: CheckpointMark) -> str:
    title = f"GC {mark.number}: {mark.status}, superstep {mark.superstep}, epoch {mark.epoch}"
    if mark.restore:
        title += f", a restore (restates superstep {mark.superstep})"
    where = " and ".join(w for w, on in (("Redis", mark.hot), ("the archive", mark.cold)) if on)
    title += f"; in {where}" if where else ""
    return title + (f"; {mark.error}" if mark.error else "") + f"; at {mark.at}"


def _markers(timeline: Timeline, scale: _Scale) -> tuple[str, str]:
    """The GC markers' row and the lines they draw down the lanes."""
    ends = [-math.inf] * MARKER_ROWS
    markers, lines = [], []
    for index, mark in enumerate(timeline.checkpoints):
        x = scale.at(mark.at)
        px = x * TRACK_PX / WIDTH
        row = next((r for r, end in enumerate(ends) if px - end >= MARKER_PX), index % MARKER_ROWS)
        ends[row] = px
        kind = " ".join([_e(mark.status), "restore" if mark.restore else ""]).strip()
        label = f"{mark.number}" + (" ↺" if mark.restore else "")
        label += " ✗" if mark.status == "ABORTED" else ""
        markers.append(
            f'<button type="button" class="gc-mark {kind}" data-gc="{mark.number}" '
            f'style="{_pos(x)};top:{2 + row * 20}px" title="{_e(_mark_title(mark))}">'
            f"{_e(label)}</button>"
        )
        lines.append(f'<i class="gc-line {kind}" style="{_pos(x)}"></i>')
    height = 4 + 20 * (1 + max((i for i, end in enumerate(ends) if end > -math.inf), default=0))
    track = (
        '<div class="label">checkpoints</div>'
        f'<div class="track gcs" style="height:{height}px">{"".join(markers)}</div>'
    )
    return track, f'<div class="gc-lines">{"".join(lines)}</div>'


def _step_title(cell: StepCell) -> str:
    title = (
        f"{cell.agent} · step {cell.step} · superstep {cell.superstep} · epoch {cell.epoch}"
        f" · attempt {cell.attempt} · {cell.status} · {_ms(cell.duration_ms)}"
    )
    if cell.undone:
        title += " · undone by a restore"
    if cell.tools:
        title += f"\ntools: {', '.join(cell.tools)}"
    if cell.compacted:
        title += f"\ncontext compacted: {cell.compacted} messages left out of what is sent"
    return title + "".join(f"\nerror: {error}" for error in cell.errors)


def _bar(timeline: Timeline, cell: StepCell, scale: _Scale) -> str:
    start, end = scale.at(cell.started_at), scale.at(cell.finished_at)
    inner = []
    length = max(end - start, 1e-9)
    for index in timeline.histories[cell.lc].trace:
        record = timeline.records[index]
        left = (scale.at(record["started_at"]) - start) / length * WIDTH
        width = (scale.at(record["finished_at"]) - scale.at(record["started_at"])) / length * WIDTH
        if record.get("tool") is None:
            inner.append(f'<i class="turn" style="{_pos(left, width)}"></i>')
            continue
        kind = "tool err" if record.get("error") else "tool"
        title = f"{record['tool']} · {_ms(float(record.get('duration_ms') or 0))}"
        inner.append(f'<i class="{kind}" style="{_pos(left, width)}" title="{_e(title)}"></i>')
    classes = " ".join([_e(cell.status), "undone" if cell.undone else ""]).strip()
    return (
        f'<div class="bar {classes}" data-step="{_e(cell.lc)}" style="{_pos(start, end - start)}"'
        f' title="{_e(_step_title(cell))}">{"".join(inner)}</div>'
    )


def _retry(timeline: Timeline, cell: StepCell, scale: _Scale) -> str:
    """A retried step's badge, and its lost attempts shaded from the barrier before it."""
    start = scale.at(cell.started_at)
    before = [x for x in (scale.at(m.at) for m in timeline.checkpoints if m.at) if x < start]
    lost = ""
    if before:
        title = f"attempts 1 to {cell.attempt - 1} lost; the step ran again"
        lost = (
            f'<div class="lost" style="{_pos(max(before), start - max(before))}" '
            f'title="{_e(title)}"></div>'
        )
    return f'{lost}<span class="badge" style="{_pos(start)}">↻{cell.attempt}</span>'


def _who(timeline: Timeline, agent: str) -> str:
    """An agent's name, and who spawned it if one did."""
    parent = timeline.spawned.get(agent)
    return agent if parent is None else f"{agent}, spawned by {parent}"


def _by(timeline: Timeline, agent: str) -> str:
    parent = timeline.spawned.get(agent)
    return "" if parent is None else f'<div class="tools">spawned by {_e(parent)}</div>'


def _lanes(timeline: Timeline, scale: _Scale) -> str:
    rows = []
    for agent in timeline.agents:
        cells = [c for c in timeline.steps if c.agent == agent]
        bars = "".join(_bar(timeline, c, scale) for c in cells)
        retries = "".join(_retry(timeline, c, scale) for c in cells if c.attempt > 1)
        rows.append(
            f'<div class="label lane-label" title="{_e(_who(timeline, agent))}">{_e(agent)}</div>'
            f'<div class="track lane" data-agent="{_e(agent)}">{retries}{bars}</div>'
        )
    return "".join(rows)


def _chart(timeline: Timeline) -> str:
    stamps = [s for c in timeline.steps for s in (c.started_at, c.finished_at) if s]
    stamps += [m.at for m in timeline.checkpoints if m.at]
    if not stamps:
        return "<p>Nothing to place in time: no step and no checkpoint could be read.</p>"
    scale = _Scale(stamps)
    markers, lines = _markers(timeline, scale)
    options = "".join(
        f'<option value="{m.number}">GC {m.number} · superstep {m.superstep} · epoch {m.epoch}'
        "</option>"
        for m in timeline.checkpoints
        if m.files is not None
    )
    pick_a, pick_b = (
        f'<select id="{side}"><option value="">GC …</option>{options}</select>'
        for side in ("gc-a", "gc-b")
    )
    return (
        '<div class="controls">zoom <button type="button" data-zoom="out">&minus;</button>'
        '<button type="button" data-zoom="in">+</button>'
        f'<button type="button" data-zoom="fit">fit</button> · compare {pick_a} with {pick_b}'
        " (or click one checkpoint, then another)</div>"
        f'<div class="scroll"><div class="chart" id="chart">{_axis(scale)}{markers}'
        f"{_lanes(timeline, scale)}{lines}</div></div>"
    )


LEGEND = (
    '<div class="legend"><span><i class="swatch" style="background:#8fd19e"></i> step</span>'
    '<span><i class="swatch" style="background:#ffd27f"></i> retried ↻n (its lost attempt'
    " shaded before it)</span>"
    '<span><i class="swatch" style="background:#f4a3a3"></i> failed</span>'
    '<span><i class="swatch" style="background:#ccc;opacity:.6"></i> undone by a restore'
    " (hatched)</span>"
    '<span><i class="swatch" style="background:#2f5d8a"></i> tool call</span>'
    '<span><i class="swatch" style="background:#e6eefc;border:1px solid #6d8fd6"></i> GC</span>'
    '<span><i class="swatch" style="background:#efdffc;border:1px solid #9c6ad0"></i>'
    " GC ↺ a restore</span><span>✗ aborted</span></div>"
)


def _cell(cell: StepCell | None) -> str:
    if cell is None:
        return '<td class="cell empty">·</td>'
    parts = [f"<b>step {cell.step}</b> · {_ms(cell.duration_ms)} · {_e(cell.status)}"]
    if cell.attempt > 1:
        parts.append(f'<div class="err">attempt {cell.attempt}</div>')
    if cell.tools:
        parts.append(f'<div class="tools">{_e(", ".join(cell.tools))}</div>')
    if cell.compacted:
        parts.append(f'<div class="tools">compacted {cell.compacted} messages</div>')
    parts.extend(f'<div class="err">{_e(error)}</div>' for error in cell.errors)
    return (
        f'<td class="cell {_e(cell.status)}" data-step="{_e(cell.lc)}" '
        f'title="{_e(_step_title(cell))}">{"".join(parts)}</td>'
    )


def _grid(timeline: Timeline) -> str:
    head = "".join(f"<th>{superstep}</th>" for superstep in timeline.supersteps)
    body = "".join(
        f'<tr data-agent="{_e(agent)}"><th title="{_e(_who(timeline, agent))}">{_e(agent)}'
        f"{_by(timeline, agent)}</th>"
        f"{''.join(_cell(timeline.cell(agent, s)) for s in timeline.supersteps)}</tr>"
        for agent in timeline.agents
    )
    return (
        "<h2>Agents &times; supersteps (the latest checkpoint's history)</h2>"
        f'<table id="grid"><tr><th>agent \\ superstep</th>{head}</tr>{body}</table>'
    )


def _ranked(title: str, cells: list[StepCell], empty: str) -> str:
    if not cells:
        return f"<h2>{_e(title)}</h2><p>{_e(empty)}</p>"
    rows = "".join(
        f'<tr data-step="{_e(c.lc)}"><td>{_e(c.agent)}</td><td>{c.superstep}</td><td>{c.step}</td>'
        f"<td>{_e(c.epoch)}</td><td>{_ms(c.duration_ms)}</td><td>{c.attempt}</td>"
        f"<td>{len(c.errors)}</td><td>{'undone' if c.undone else ''}</td>"
        f"<td>{_e('; '.join(c.errors))}</td></tr>"
        for c in cells
    )
    return (
        f"<h2>{_e(title)}</h2><table><tr><th>agent</th><th>superstep</th><th>step</th>"
        "<th>epoch</th><th>duration</th><th>attempts</th><th>errors</th><th></th>"
        f"<th>error</th></tr>{rows}</table>"
    )


def _checkpoints(timeline: Timeline) -> str:
    rows = "".join(
        f"<tr><td>{m.number}</td><td>{m.superstep}</td><td>{_e(m.epoch)}</td>"
        f"<td>{_e(m.status)}</td><td>{'yes' if m.hot else ''}</td><td>{'yes' if m.cold else ''}"
        f"</td><td>{'restore' if m.restore else ''}</td><td>{_e(m.at or '')}</td>"
        f"<td>{_e(m.error or '')}</td></tr>"
        for m in timeline.checkpoints
    )
    return (
        '<h2>Global checkpoints</h2><table id="checkpoints"><tr><th>GC</th><th>superstep</th>'
        "<th>epoch</th><th>status</th><th>hot</th><th>cold</th><th>restore</th>"
        f"<th>at</th><th>error</th></tr>{rows}</table>"
    )


def _attempts(timeline: Timeline) -> str:
    """The failed attempts and what the coordinator made of them, as they were recorded."""
    if not timeline.attempts:
        return '<h2>Failed attempts</h2><p id="attempts">no attempt failed</p>'
    rows = "".join(
        f'<tr data-agent="{_e(e.agent)}" data-event="{_e(e.event.value)}">'
        f"<td>{_e(e.at.isoformat())}</td><td>{_e(e.agent)}</td><td>{e.superstep}</td>"
        f"<td>{e.epoch}</td><td>{e.attempt}</td><td>{_e(e.event.value.replace('_', ' '))}</td>"
        f"<td>{_e(e.error_class or '')}</td><td>{_e(e.error)}</td>"
        f"<td>{_e(e.process or '')}</td></tr>"
        for e in reversed(timeline.attempts)
    )
    return (
        '<h2>Failed attempts</h2><table id="attempts"><tr><th>at</th><th>agent</th>'
        "<th>superstep</th><th>epoch</th><th>attempt</th><th>what</th><th>class</th>"
        f"<th>error</th><th>recorded by</th></tr>{rows}</table>"
    )


def _clip(value: object) -> object:
    """A JSON value with each string past TEXT_LIMIT characters cut, saying how much was."""
    if isinstance(value, str) and len(value) > TEXT_LIMIT:
        return f"{value[:TEXT_LIMIT]}… ({len(value) - TEXT_LIMIT} more characters)"
    if isinstance(value, list):
        return [_clip(item) for item in value]
    if isinstance(value, dict):
        return {key: _clip(item) for key, item in value.items()}
    return value


def _checkpoints_data(timeline: Timeline) -> list[dict[str, object]]:
    """The GCs for the script, each one's files as changes to the previous comparable GC's.

    So the page grows with what the workspace changed, not with checkpoints times files.
    """
    rows: list[dict[str, object]] = []
    before: dict[str, str] = {}
    for mark in timeline.checkpoints:
        row = dict(vars(mark))  # shallow: `asdict` would copy every manifest whole
        if mark.files is not None:
            changed = {path: sha for path, sha in mark.files.items() if before.get(path) != sha}
            row["files"] = {"set": changed, "removed": sorted(before.keys() - mark.files.keys())}
            before = mark.files
        rows.append(row)
    return rows


def _data(timeline: Timeline) -> str:
    data = {
        "task": timeline.task,
        "agents": timeline.agents,
        "steps": [{**asdict(c), "status": c.status} for c in timeline.steps],
        "checkpoints": _checkpoints_data(timeline),
        "histories": {lc: [h.parent, h.messages, h.trace] for lc, h in timeline.histories.items()},
        "messages": _clip(timeline.messages),
        "records": _clip(timeline.records),
        "files": {sha: asdict(version) for sha, version in timeline.files.items()},
        "failed": timeline.failures,
        "retries": timeline.retries,
    }
    text = json.dumps(data, default=str, separators=(",", ":"))
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def render(timeline: Timeline) -> str:
    """The page: the lanes in time, a step's or a diff's detail, and the analytics tables."""
    status = _e(timeline.status)
    reason = f" — {_e(timeline.reason)}" if timeline.reason else ""
    error = f'<p class="err">{_e(timeline.error)}</p>' if timeline.error else ""
    if timeline.forked_from:
        reason += f" · forked from {_e(timeline.forked_from)}"
    constants = f"var MAX_DIFF_LINES = {MAX_DIFF_LINES}, MAX_EDITS = {MAX_DIFF_LINES};"
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
{LEGEND}
{_chart(timeline)}
<section id="detail" data-view="none"><p>Click a step for its messages, tool calls and usage;
click two checkpoints (or pick them above) for what changed between them.</p></section>
{_grid(timeline)}
{_attempts(timeline)}
{_checkpoints(timeline)}
{_ranked("Slowest steps", timeline.slowest, "no steps")}
{_ranked("Most failing or retried steps", timeline.troubled, "no step failed or was retried")}
<script type="application/json" id="cairn-data">{_data(timeline)}</script>
<script>{constants}{DIFF_SCRIPT}{SCRIPT}</script>
</body></html>
"""
