"""`cairn trace --html` and `cairn watch` on a task that ran on real worker processes.

One task serves the module: the three-agent team of tests/cluster.py on two workers; the
coder's worker is SIGKILLed mid-step (the step is retried), and after the task ends it is
restored to GC 1 and runs on to its end again (a restore GC, in a higher epoch). The HTML
page is opened in headless Chromium (Debian's `chromium`, which CI installs): a missing
browser fails the test rather than skipping it. Chromium is driven through the page's own
deep links (`#step=<lc>`, `#diff=<a>,<b>`) and, for clicks, a copy of the page with a few
lines of script that click and wait; `--dump-dom` then shows what the page drew.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from html import unescape
from html.parser import HTMLParser
from pathlib import Path

import pytest

from cairn.cli.timeline_page import render
from cairn.coordinator import views
from cairn.coordinator.diff import diff
from cairn.coordinator.restore import Restorer
from cairn.coordinator.timeline import (
    CheckpointMark,
    FileVersion,
    History,
    StepCell,
    Timeline,
    gather,
)
from cairn.storage.records import GCStatus
from cairn.testing.redis_server import RedisServer
from tests.cli_harness import Run, cli_runner
from tests.cluster import Cluster, team_spec

ROOT = Path(__file__).resolve().parents[1]
AGENTS = ["planner", "coder", "reviewer"]
CHROMIUM_TIMEOUT = 60
EVIL = '<img src=x onerror="alert(1)">'


@dataclass
class Ran:
    """The module's finished task and the cluster it ran on."""

    cluster: Cluster
    task: str
    tmp: Path


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ran]:
    """The team's task, through a killed worker (a retry) and a restore, to its end."""
    tmp = tmp_path_factory.mktemp("timeline")
    server = RedisServer(tmp / "redis", appendonly=True).start()
    cluster = Cluster(server, tmp)
    try:
        cluster.start_worker()
        cluster.start_worker()
        task = cluster.tasks.submit(team_spec(tmp / "ledger", slow=1.5))
        os.kill(cluster.wait_for_step(task, "coder", superstep=2), signal.SIGKILL)
        assert "succeeded" == cluster.drive(task)["status"]
        Restorer(cluster.client, cluster.store, workers=False).restore(task, 1)
        assert "succeeded" == cluster.drive(task)["status"]
        yield Ran(cluster, task, tmp)
    finally:
        cluster.close()
        server.stop()


@pytest.fixture
def run(
    ran: Ran, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Iterator[Run]:
    """Call `main(argv)` in this process against the module's Redis; (code, out, err)."""
    env = {
        "CAIRN_REDIS_URL": ran.cluster.server.url,
        "CAIRN_ARCHIVE_DIR": str(ran.tmp / "archive"),
        "CAIRN_CACHE_DIR": str(ran.tmp / "cli-cache"),
        "CAIRN_STATE_DIR": str(ran.tmp / "state"),
    }
    with cli_runner(env, monkeypatch, capsys) as call:
        yield call


def chromium(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Headless Chromium run with `args` (the page's URL last), which must exit 0."""
    browser = shutil.which("chromium")
    assert browser is not None, "chromium is missing: apt-get install chromium (CI does)"
    done = subprocess.run(
        [
            browser,
            "--headless",
            "--disable-gpu",
            "--no-sandbox",
            "--disable-dev-shm-usage",
            "--no-first-run",
            f"--user-data-dir={tmp / 'chromium-profile'}",
            "--enable-logging=stderr",
            "--v=0",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=CHROMIUM_TIMEOUT,
        check=False,
    )
    assert 0 == done.returncode, done.stderr[-2000:]
    return done


def chromium_dom(page: Path, tmp: Path, fragment: str = "", wait: bool = False) -> tuple[str, str]:
    """The DOM headless Chromium built from `page#fragment` after its scripts ran, and its stderr.

    With `wait`, Chromium runs the page's timers and events out (virtual time) first.
    """
    budget = ["--virtual-time-budget=5000"] if wait else []
    url = page.resolve().as_uri() + (f"#{fragment}" if fragment else "")
    done = chromium(tmp, *budget, "--dump-dom", url)
    return done.stdout, done.stderr


class Elements(HTMLParser):
    """Every start tag of a document with its attributes, and every piece of its text."""

    def __init__(self, document: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.texts: list[str] = []
        self.feed(document)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        """Keep the tag and its attributes (a bare attribute's value is "")."""
        self.tags.append((tag, {name: value or "" for name, value in attrs}))

    def handle_data(self, data: str) -> None:
        """Keep the text, as the document shows it."""
        self.texts.append(data)

    def having(self, css_class: str) -> list[dict[str, str]]:
        """The attributes of the elements carrying `css_class`, in document order."""
        return [a for _, a in self.tags if css_class in a.get("class", "").split()]

    def one(self, css_class: str) -> dict[str, str]:
        """The attributes of the one element carrying `css_class`."""
        [found] = self.having(css_class)
        return found


def detail(dom: str) -> str:
    """The markup of the page's detail panel."""
    found = re.search(r'<section id="detail".*?</section>', dom, re.S)
    assert found is not None
    return found.group(0)


def udiff(dom: str, path: str) -> str:
    """The text of the unified diff the page drew for `path`."""
    drawn = {
        unescape(value): body
        for value, body in re.findall(
            r'<pre class="udiff" data-path="([^"]*)">(.*?)</pre>', dom, re.S
        )
    }
    assert path in drawn, f"no diff of {path}"
    lines = re.findall(r"<span[^>]*>(.*?)</span>", drawn[path], re.S)
    return "".join(unescape(line) + "\n" for line in lines)


def console_errors(dom: str, stderr: str) -> list[str]:
    """The script errors a page had: its own `#cairn-js-error` notes, Chromium's log lines."""
    found = re.findall(r'id="cairn-js-error"[^>]*>([^<]*)<', dom)
    found += [line for line in stderr.splitlines() if "CONSOLE" in line and "Uncaught" in line]
    return found


# the data model ---------------------------------------------------------------------------
def steps_in_store(ran: Ran) -> tuple[set[tuple[str, int, int, str]], set[tuple[str, int]]]:
    """Every step some committed GC's history holds, and (agent, superstep) of the latest's.

    Read apart from `gather`: each GC's members' whole histories, a step named by its
    agent, superstep, step and its model turn's start; the latest through `views.trace`.
    """
    store, task = ran.cluster.store, ran.task
    steps = set()
    for info in store.list_gcs(task):
        if info.status is not GCStatus.COMMITTED:
            continue
        for agent, ref in store.read_gc(task, info.number).members.items():
            trace = store.read_state(task, agent, ref.id, ref.checksum).trace
            steps |= {
                (agent, r.superstep, r.step, r.started_at.isoformat())
                for r in trace
                if r.tool is None
            }
    latest = {(row.agent, row.superstep) for row in views.trace(store, task)}
    return steps, latest


def killed(timeline: Timeline) -> StepCell:
    """The coder's step whose worker the fixture killed, as its next attempt ran it.

    Other steps may be retried too (a loaded machine can miss a heartbeat): not this one.
    """
    [step] = [c for c in timeline.steps if (c.agent, c.superstep, c.epoch) == ("coder", 2, 1)]
    return step


def test_gather_finds_steps_the_retry_and_the_restore(ran: Ran) -> None:
    """Every step any GC kept, the ones the restore undid marked; the retry; the restore GC."""
    timeline = gather(ran.cluster.client, ran.cluster.store, ran.task)
    assert (AGENTS, "succeeded") == (timeline.agents, timeline.status)
    every, latest = steps_in_store(ran)
    assert every == {(c.agent, c.superstep, c.step, c.started_at) for c in timeline.steps}
    assert latest == {(c.agent, c.superstep) for c in timeline.cells}
    assert [c for c in timeline.steps if c not in timeline.cells] == [
        c for c in timeline.steps if c.undone
    ]
    retried = killed(timeline)
    assert retried.attempt >= 2
    assert retried.undone  # the restore to GC 1 undid it
    assert retried in timeline.troubled
    coder = timeline.cell("coder", 2)  # the same step, run again after the restore
    assert coder is not None
    assert (2, 1, False) == (coder.epoch, coder.attempt, coder.undone)
    assert coder.duration_ms > 0
    assert ["write_file", "run_command", "send_message"] == coder.tools
    assert coder.usage is not None
    assert coder.usage["prompt_tokens"] > 0
    assert timeline.slowest[0].duration_ms >= timeline.slowest[-1].duration_ms
    [restore] = timeline.restores
    assert (1, 2) == (restore.superstep, restore.epoch)
    numbers = [mark.number for mark in timeline.checkpoints]
    assert numbers == sorted(numbers)
    assert all(mark.hot or mark.cold for mark in timeline.checkpoints)


def test_gather_keeps_what_a_diff_of_any_two_checkpoints_needs(ran: Ran) -> None:
    """Each GC's members and files; each member's history rebuilt from the LCs' additions."""
    timeline = gather(ran.cluster.client, ran.cluster.store, ran.task)
    store, task = ran.cluster.store, ran.task
    for mark in timeline.checkpoints:
        gc = store.read_gc(task, mark.number)
        assert {agent: ref.id for agent, ref in gc.members.items()} == mark.members
        assert store.read_manifest(task, gc.workspace).files == mark.files
        for agent, ref in gc.members.items():
            messages: list[int] = []
            lc: str | None = ref.id
            while lc is not None:
                history = timeline.histories[lc]
                messages[:0] = history.messages
                lc = history.parent
            state = store.read_state(task, agent, ref.id, ref.checksum)
            expected = [m.model_dump(mode="json", exclude_defaults=True) for m in state.messages]
            assert expected == [timeline.messages[i] for i in messages]
    assert "print('hi')\n" in {f.text for f in timeline.files.values()}


def test_a_fork_starts_with_its_source_history_and_no_step(ran: Ran) -> None:
    """A fork's first LCs copy its source's history: no step of theirs, the lineage named."""
    fork = ran.cluster.tasks.fork(ran.task, 3)  # not driven: it stays at its GC 0
    timeline = gather(ran.cluster.client, ran.cluster.store, fork)
    assert ([], [0], f"{ran.task}@3") == (
        timeline.steps,
        [mark.number for mark in timeline.checkpoints],
        timeline.forked_from,
    )
    source = gather(ran.cluster.client, ran.cluster.store, ran.task)
    for agent, lc in timeline.checkpoints[0].members.items():
        history = timeline.histories[lc]
        assert history.parent is None
        expected: list[int] = []
        at: str | None = source.checkpoints[3].members[agent]
        while at is not None:
            expected[:0] = source.histories[at].messages
            at = source.histories[at].parent
        assert [source.messages[i] for i in expected] == [
            timeline.messages[i] for i in history.messages
        ]
    assert f"forked from {ran.task}@3" in render(timeline)


def hostile() -> Timeline:
    """A timeline whose every string from the task is markup: names, messages, files, tools."""
    at = ("2026-01-01T00:00:00+00:00", "2026-01-01T00:00:01+00:00")
    record = {"step": 1, "superstep": 1, "tool": EVIL, "arguments": {"path": EVIL},
              "result": EVIL, "error": "</script><b>", "effects": None, "duration_ms": 1.0,
              "started_at": at[0], "finished_at": at[1], "usage": None}  # fmt: skip
    turn = {**record, "tool": None, "error": None, "usage": {"prompt_tokens": 7}}
    cell = StepCell(EVIL, 1, 1, started_at=at[0], finished_at=at[1], tools=[EVIL],
                    errors=["</script><b>"], lc="lc-1", usage={"prompt_tokens": 7})  # fmt: skip
    marks = [
        CheckpointMark(n, n, "COMMITTED", hot=True, cold=False, epoch=1, created_at=at[n],
                       members={EVIL: f"lc-{n}"},
                       files={EVIL: f"sha-{n}", "logo.png": f"png-{n}", "big.txt": f"big-{n}"})
        for n in (0, 1)
    ]  # fmt: skip
    return Timeline(
        task="t",
        status=EVIL,
        reason=EVIL,
        agents=[EVIL],
        supersteps=[1],
        cells=[cell],
        checkpoints=marks,
        slowest=[cell],
        troubled=[cell],
        error=EVIL,
        steps=[cell],
        histories={"lc-0": History(EVIL, None, [0]), "lc-1": History(EVIL, "lc-0", [1], [0, 1])},
        messages=[
            {"role": "user", "content": EVIL, "name": EVIL},
            {
                "role": "assistant",
                "content": "</script>",
                "tool_calls": [{"id": "c", "name": EVIL}],
            },
        ],
        records=[turn, record],
        files={  # big-0 left out of the timeline, big-1 past the size limit
            "sha-0": FileVersion(2, text="a\n"),
            "sha-1": FileVersion(30, text=EVIL + "\n"),
            "png-0": FileVersion(9, binary=True),
            "png-1": FileVersion(9, binary=True),
            "big-1": FileVersion(300_000),
        },
    )


def test_every_task_string_is_escaped() -> None:
    """A name carrying markup shows as text: no element, no script of its own."""
    page = render(hostile())
    assert "<img" not in page
    assert "</script><b>" not in page
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in page


@pytest.mark.parametrize("fragment", ["step=lc-1", "diff=0,1"])
def test_chromium_shows_hostile_strings_as_text(tmp_path: Path, fragment: str) -> None:
    """Drawn by the script too (a step's messages and calls, a diff), markup stays text."""
    path = tmp_path / "hostile.html"
    path.write_text(render(hostile()), encoding="utf-8")
    dom, stderr = chromium_dom(path, tmp_path, fragment)
    assert [] == console_errors(dom, stderr)
    assert 'id="cairn-ok"' in dom
    elements = Elements(dom)
    assert [] == [a for tag, a in elements.tags if tag == "img" or "onerror" in a]
    assert EVIL in elements.texts
    view = re.search(r'data-view="(\w+)"', detail(dom))
    assert view is not None
    assert fragment.partition("=")[0] == view.group(1)


def test_a_diff_names_binary_files_and_leaves_large_ones_to_cairn_diff(tmp_path: Path) -> None:
    """A binary file is named, as `cairn diff` names it; one the page lacks points there."""
    path = tmp_path / "files.html"
    path.write_text(render(hostile()), encoding="utf-8")
    dom, stderr = chromium_dom(path, tmp_path, "diff=0,1")
    assert [] == console_errors(dom, stderr)
    assert "Binary files a/logo.png and b/logo.png differ\n" == udiff(dom, "logo.png")
    assert udiff(dom, "big.txt").startswith("big.txt: not diffed in this page")
    assert "cairn diff t 0 1" in udiff(dom, "big.txt")
    assert f"-a\n+{EVIL}\n" in udiff(dom, EVIL)


# trace --html -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def page(ran: Ran) -> Path:
    """The task's timeline page, written by `cairn trace TASK --html FILE` as a process."""
    path = ran.tmp / "timeline.html"
    env = {
        **os.environ,
        "CAIRN_REDIS_URL": ran.cluster.server.url,
        "CAIRN_ARCHIVE_DIR": str(ran.tmp / "archive"),
        "CAIRN_CACHE_DIR": str(ran.tmp / "cli-cache"),
        "CAIRN_STATE_DIR": str(ran.tmp / "state"),
        "PYTHONPATH": str(ROOT),
    }
    done = subprocess.run(
        [sys.executable, "-m", "cairn.cli", "trace", ran.task, "--html", str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert 0 == done.returncode, done.stderr
    return path


@pytest.fixture(scope="module")
def timeline(ran: Ran) -> Timeline:
    """The module's task's timeline, as the page was drawn from."""
    return gather(ran.cluster.client, ran.cluster.store, ran.task)


def test_trace_html_is_self_contained(ran: Ran, page: Path, run: Run) -> None:
    """Every agent and every GC number is on the page, and nothing is fetched from anywhere."""
    text = page.read_text(encoding="utf-8")
    for agent in AGENTS:
        assert f'data-agent="{agent}"' in text
    code, out, err = run("checkpoints", ran.task, "--json")
    assert 0 == code, err
    for row in json.loads(out):
        assert f'data-gc="{row["number"]}"' in text
    assert [] == re.findall(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", text)
    assert "http://" not in text
    assert "https://" not in text
    assert "<link" not in text
    assert "ABORTED" in text or "restore" in text


def test_trace_html_json_names_the_file(ran: Ran, run: Run) -> None:
    """`--json` says where the page went; an unknown task is bad input."""
    path = ran.tmp / "again.html"
    code, out, err = run("trace", ran.task, "--html", str(path), "--json")
    assert (0, str(path)) == (code, json.loads(out)["html"]), err
    assert path.stat().st_size > 0
    assert 2 == run("trace", "no-such-task", "--html", str(path))[0]


def test_chromium_draws_every_lane_step_and_checkpoint(
    ran: Ran, page: Path, run: Run, timeline: Timeline
) -> None:
    """One lane per agent, one bar per step the store holds, one marker per GC; no error."""
    dom, stderr = chromium_dom(page, ran.tmp)
    assert [] == console_errors(dom, stderr)
    assert 'id="cairn-ok"' in dom
    summary = re.search(r'id="summary">([^<]*)<', dom)
    assert summary is not None
    assert summary.group(1).startswith("3 agents (planner, coder, reviewer)")
    elements = Elements(dom)
    assert AGENTS == [lane["data-agent"] for lane in elements.having("lane")]
    every, latest = steps_in_store(ran)
    bars = elements.having("bar")
    assert len(every) == len(bars)
    assert len(latest) == len([bar for bar in bars if "undone" not in bar["class"].split()])
    retried = [bar["data-step"] for bar in bars if "retried" in bar["class"].split()]
    assert sorted(c.lc for c in timeline.steps if c.status == "retried") == sorted(retried)
    assert killed(timeline).lc in retried
    code, out, err = run("checkpoints", ran.task, "--json")
    assert 0 == code, err
    numbers = [str(row["number"]) for row in json.loads(out)]
    assert numbers == [marker["data-gc"] for marker in elements.having("gc-mark")]
    restores = [m["data-gc"] for m in elements.having("gc-mark") if "restore" in m["class"]]
    assert [str(mark.number) for mark in timeline.restores] == restores


def test_a_step_shows_its_messages_tool_calls_and_usage(
    ran: Ran, page: Path, timeline: Timeline
) -> None:
    """`#step=<lc>`: the coder's step, what it was told and said, its calls, its tokens."""
    coder = timeline.cell("coder", 2)
    assert coder is not None
    dom, stderr = chromium_dom(page, ran.tmp, f"step={coder.lc}")
    assert [] == console_errors(dom, stderr)
    panel = detail(dom)
    assert f'data-view="step" data-step="{coder.lc}"' in panel
    assert "Message from planner: Please make it say Hello." in panel
    assert "<pre>Coding.</pre>" in panel
    elements = Elements(panel)
    calls = [a["data-tool"] for tag, a in elements.tags if "data-tool" in a]
    assert ["write_file", "run_command", "send_message"] == calls
    assert "wrote 15 bytes to greet.py" in elements.texts
    [turn] = [
        row
        for row in views.trace(ran.cluster.store, ran.task, "coder")
        if (row.superstep, row.tool) == (2, None)
    ]
    usage = re.search(r'data-usage="prompt_tokens"><th>[^<]*</th><td>(\d+)<', panel)
    assert usage is not None
    assert turn.usage is not None
    assert turn.usage.prompt_tokens == int(usage.group(1))
    assert ["selected"] == [
        c for c in Elements(dom).one("selected")["class"].split() if c == "selected"
    ]


def test_two_checkpoints_show_their_diff(ran: Ran, page: Path, timeline: Timeline) -> None:
    """`#diff=0,<latest>`: greet.py's change as a unified diff, and what `cairn diff` says."""
    latest = timeline.checkpoints[-1].number
    dom, stderr = chromium_dom(page, ran.tmp, f"diff=0,{latest}")
    assert [] == console_errors(dom, stderr)
    assert f'data-view="diff" data-a="0" data-b="{latest}"' in detail(dom)
    text = udiff(dom, "greet.py")
    assert "-print('hi')\n+print('Hello')\n" in text
    expected = diff(ran.cluster.store, ran.task, 0, ran.task, latest)
    assert expected.files.changed["greet.py"] == text
    elements = Elements(detail(dom))
    changes = {a["data-path"]: a["data-change"] for a in elements.having("file")}
    assert {**dict.fromkeys(expected.files.added, "added"), "greet.py": "changed"} == changes
    added = {
        a["data-agent"]: (int(a["data-messages-added"]), int(a["data-tool-calls-added"]))
        for a in elements.having("agent-diff")
    }
    assert {
        agent: (len(d.messages_added), len(d.tool_calls_added))
        for agent, d in expected.agents.items()
    } == added


CLICKS = """<script>
window.addEventListener('load', function () {
  document.querySelector('.bar[data-step="STEP"]').click();
  setTimeout(function () {
    var panel = document.getElementById('detail');
    document.body.setAttribute('data-after-click', panel.getAttribute('data-step'));
    document.querySelector('.gc-mark[data-gc="LATEST"]').click();
    document.querySelector('.gc-mark[data-gc="0"]').click();
  }, 50);
});
</script></body>"""


def test_clicks_open_a_step_and_a_diff(ran: Ran, page: Path, timeline: Timeline) -> None:
    """A click on a bar opens its step; one on a GC marker, then another, their diff."""
    coder = timeline.cell("coder", 2)
    assert coder is not None
    latest = str(timeline.checkpoints[-1].number)
    clicking = ran.tmp / "clicks.html"
    script = CLICKS.replace("STEP", coder.lc).replace("LATEST", latest)
    clicking.write_text(page.read_text(encoding="utf-8").replace("</body>", script))
    dom, stderr = chromium_dom(clicking, ran.tmp, wait=True)
    assert [] == console_errors(dom, stderr)
    assert f'data-after-click="{coder.lc}"' in dom
    assert f'data-view="diff" data-a="0" data-b="{latest}"' in detail(dom)
    assert ["0", latest] == [a["data-gc"] for a in Elements(dom).having("picked")]


def test_screenshot_of_the_timeline(
    ran: Ran, page: Path, timeline: Timeline, tmp_path: Path
) -> None:
    """A picture of the page, the retried step open, for people to look at."""
    shot = tmp_path / "timeline.png"
    url = f"{page.resolve().as_uri()}#step={killed(timeline).lc}"
    chromium(ran.tmp, f"--screenshot={shot}", "--window-size=1400,900", url)
    print(f"timeline screenshot: {shot}")
    assert shot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert shot.stat().st_size > 20_000


def test_chromium_check_catches_a_script_error(ran: Ran, page: Path) -> None:
    """The detector itself: a page whose script throws is reported, and not marked ok."""
    broken = ran.tmp / "broken.html"
    text = page.read_text(encoding="utf-8")
    broken.write_text(text.replace("(function () {", "(function () { noSuchThing();", 1))
    dom, stderr = chromium_dom(broken, ran.tmp)
    assert 'id="cairn-ok"' not in dom
    errors = console_errors(dom, stderr)
    assert errors
    assert any("noSuchThing" in error for error in errors)


# watch ------------------------------------------------------------------------------------
def test_watch_json_on_a_finished_task(ran: Ran, run: Run) -> None:
    """One JSON line, the final status, exit 0 because the task succeeded."""
    code, out, err = run("watch", ran.task, "--json")
    assert 0 == code, err
    [line] = [json.loads(text) for text in out.splitlines()]
    assert ("succeeded", ran.task, 2) == (line["status"], line["task_id"], line["epoch"])
    assert sorted(AGENTS) == sorted(agent["name"] for agent in line["agents"])
    assert {"halted", "finished"} >= {agent["status"] for agent in line["agents"]}
    assert 2 == run("watch", "no-such-task")[0]
