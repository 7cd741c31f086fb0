"""`cairn trace --html` and `cairn watch` on a task that ran on real worker processes.

One task serves the module: the three-agent team of tests/cluster.py on two workers; the
coder's worker is SIGKILLed mid-step (the step is retried), and after the task ends it is
restored to GC 1 and runs on to its end again (a restore GC, in a higher epoch). The HTML
page is opened in headless Chromium (Debian's `chromium`, which CI installs): a missing
browser fails the test rather than skipping it.
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
from pathlib import Path

import pytest

from cairn.cli.timeline_page import render
from coordinator.restore import Restorer
from coordinator.timeline import CheckpointMark, StepCell, Timeline, gather
from storage.redis_server import RedisServer
from tests.cli_harness import Run, cli_runner
from tests.cluster import Cluster, team_spec

ROOT = Path(__file__).resolve().parents[1]
AGENTS = ["planner", "coder", "reviewer"]
CHROMIUM_TIMEOUT = 60


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


def chromium_dom(page: Path, tmp: Path) -> tuple[str, str]:
    """The DOM headless Chromium built from `page` after its scripts ran, and its stderr."""
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
            "--dump-dom",
            page.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=CHROMIUM_TIMEOUT,
        check=False,
    )
    assert 0 == done.returncode, done.stderr[-2000:]
    return done.stdout, done.stderr


def console_errors(dom: str, stderr: str) -> list[str]:
    """The script errors a page had: its own `#cairn-js-error` notes, Chromium's log lines."""
    found = re.findall(r'id="cairn-js-error"[^>]*>([^<]*)<', dom)
    found += [line for line in stderr.splitlines() if "CONSOLE" in line and "Uncaught" in line]
    return found


# the data model ---------------------------------------------------------------------------
def test_gather_finds_steps_the_retry_and_the_restore(ran: Ran) -> None:
    """Agents in team order; the killed step's second attempt; a restore GC in epoch 2."""
    timeline = gather(ran.cluster.client, ran.cluster.store, ran.task)
    assert (AGENTS, "succeeded") == (timeline.agents, timeline.status)
    coder = timeline.cell("coder", 2)
    assert coder is not None
    assert coder.attempt >= 2
    assert coder.duration_ms > 0
    assert coder in timeline.troubled
    assert timeline.slowest[0].duration_ms >= timeline.slowest[-1].duration_ms
    [restore] = timeline.restores
    assert (1, 2) == (restore.superstep, restore.epoch)
    numbers = [mark.number for mark in timeline.checkpoints]
    assert numbers == sorted(numbers)
    assert all(mark.hot or mark.cold for mark in timeline.checkpoints)


def test_every_task_string_is_escaped() -> None:
    """A name carrying markup shows as text: no element, no script of its own."""
    evil = '<img src=x onerror="alert(1)">'
    cell = StepCell(agent=evil, superstep=1, step=1, tools=[evil], errors=["</script><b>"])
    timeline = Timeline(
        task="t",
        status=evil,
        reason=evil,
        agents=[evil],
        supersteps=[1],
        cells=[cell],
        checkpoints=[CheckpointMark(1, 1, "COMMITTED", hot=True, cold=False, epoch=1)],
        slowest=[cell],
        troubled=[cell],
    )
    page = render(timeline)
    assert "<img" not in page
    assert "</script><b>" not in page
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in page


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


def test_chromium_renders_the_page_without_script_errors(ran: Ran, page: Path) -> None:
    """Headless Chromium runs the page's script to its end and shows every agent."""
    dom, stderr = chromium_dom(page, ran.tmp)
    assert [] == console_errors(dom, stderr)
    assert 'id="cairn-ok"' in dom
    summary = re.search(r'id="summary">([^<]*)<', dom)
    assert summary is not None
    assert summary.group(1).startswith("3 agents (planner, coder, reviewer)")
    for agent in AGENTS:
        assert f'data-agent="{agent}"' in dom


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
