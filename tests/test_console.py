"""The web console (`cairn console`) in headless Chromium, over a real Redis and real workers.

One stack serves the module: a private redis-server, a coordinator process, two worker
processes and a `cairn console` process on a free loopback port; a second console on
0.0.0.0 with a token shows the token's rules. Chromium is Debian's `chromium`, driven by
Playwright's Python API through `executable_path` (no browser is downloaded); a missing
browser fails the tests rather than skipping them. Screenshots of the task list and a
task page are written into the module's tmp directory.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Dialog, Page, Playwright, expect, sync_playwright

from cairn.coordinator.spec import TaskSpec
from cairn.testing.redis_server import RedisServer, free_port
from tests.cli_harness import cairn, spawn, stop
from tests.cluster import Cluster, files_and_histories, team_spec
from tests.test_spawn import WORKERS, orchestrator

ROOT = Path(__file__).resolve().parents[1]
EVIL = "<img src=x onerror=alert(1)>"  # no quotes: JSON shows it as it is
TOKEN = "console-test-token-3f9a"  # noqa: S105 - a test's own token
WAIT_S = 30.0  # for a task to reach a state, a page to show it
HTTP_OK = 200


@dataclass
class Stack:
    """The module's Redis, coordinator, workers and console."""

    cluster: Cluster
    tmp: Path
    env: dict[str, str]
    url: str  # the console's, without a trailing slash
    consoles: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def submit(self, spec: TaskSpec) -> str:
        """Submit a task to the cluster; return its id."""
        return self.cluster.tasks.submit(spec)

    def status(self, task: str) -> dict[str, Any]:
        """The task's status as `cairn status --json` prints it."""
        return self.cluster.status(task)

    def wait_for(self, task: str, *states: str) -> dict[str, Any]:
        """Wait until the task is in one of `states`; return its status."""
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            status = self.status(task)
            if status["status"] in states:
                return status
            time.sleep(0.1)
        raise AssertionError(f"task {task} never became {states}: {self.status(task)}")


def start_console(
    env: dict[str, str], log: Path, *args: str
) -> tuple[subprocess.Popen[bytes], str]:
    """Start `cairn console ARGS --port <free>`; return it and its URL once it answers."""
    port = free_port()
    process = spawn(["console", "--port", str(port), *args], env, log)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the console exited: {log.read_text()}")
        try:
            http("GET", url + "/static/console.css", {"Authorization": f"Bearer {TOKEN}"})
        except OSError:
            time.sleep(0.1)
            continue
        return process, url
    raise AssertionError(f"the console never answered: {log.read_text()}")


def http(
    method: str, url: str, headers: dict[str, str] | None = None, body: object = None
) -> tuple[int, dict[str, str], bytes]:
    """One request; (status, headers, body), whatever the status."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})  # noqa: S310 - the tests' own console
    try:
        with urllib.request.urlopen(request, timeout=WAIT_S) as answer:  # noqa: S310
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as refused:
        return refused.code, dict(refused.headers), refused.read()


def api(stack: Stack, path: str) -> Any:
    """GET an API path of the module's console; its JSON (which must be a 200)."""
    status, _, body = http("GET", stack.url + path)
    assert HTTP_OK == status, body
    return json.loads(body)


def waiting_spec(name: str) -> TaskSpec:
    """One agent writes a hostile file, says hostile things, then waits for a person."""
    return TaskSpec.model_validate({
        "name": name,
        "goal": f"Deploy {EVIL}",
        "files": {"notes.md": "harmless\n"},
        "verify": "cat deploy.sh",
        "agents": [{
            "name": "deployer", "model": "scripted",
            "approve": ["write_file"],
            "tools": ["write_file", "apply_patch", "read_file"],
            "script": [
                {"say": f"First {EVIL}", "tools": [
                    {"name": "apply_patch", "args": {"patch": (
                        "--- a/notes.md\n+++ b/notes.md\n@@ -1 +1 @@\n-harmless\n+" + EVIL + "\n"
                    )}},
                ]},
                {"say": f"Deploying {EVIL}", "tools": [
                    {"name": "write_file", "args": {"path": "deploy.sh", "content": EVIL}},
                ]},
                {"say": "Deployed."},
            ],
        }],
    })  # fmt: skip


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A private Redis, a coordinator and two workers, and a `cairn console` on them."""
    tmp = tmp_path_factory.mktemp("console")
    server = RedisServer(tmp / "redis", appendonly=True).start()
    cluster = Cluster(server, tmp)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "CAIRN_REDIS_URL": server.url,
        "CAIRN_ARCHIVE_DIR": str(tmp / "archive"),
        "CAIRN_STATE_DIR": str(tmp / "state"),
        "CAIRN_CACHE_DIR": str(tmp / "cli-cache"),
        "CAIRN_LOG_FORMAT": "json",
    }
    env.pop("CAIRN_CONSOLE_TOKEN", None)
    consoles: list[subprocess.Popen[bytes]] = []
    try:
        cluster.start_coordinator("console-test")
        cluster.start_worker()
        cluster.start_worker()
        console, url = start_console(env, tmp / "console.log")
        consoles.append(console)
        yield Stack(cluster, tmp, env, url, consoles)
    finally:
        for process in consoles:
            stop(process)
        cluster.close()
        server.stop()


@pytest.fixture(scope="module")
def finished(stack: Stack) -> str:
    """The three-agent team, succeeded, its verify printing a hostile line (read only)."""
    spec = team_spec(stack.tmp / "finished.ledger")
    verify = f"{spec.verify} && echo '{EVIL}'"
    task = stack.submit(spec.model_copy(update={"verify": verify}))
    stack.wait_for(task, "succeeded")
    return task


@pytest.fixture(scope="module")
def waiting(stack: Stack) -> str:
    """A task whose agent waits for approval of a hostile write, left waiting (read only)."""
    task = stack.submit(waiting_spec("Waiting"))
    stack.wait_for(task, "waiting_approval")
    return task


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Debian's headless Chromium under Playwright; a missing browser fails the test."""
    executable = shutil.which("chromium")
    assert executable is not None, "chromium is missing: apt-get install chromium (CI does)"
    with sync_playwright() as playwright:
        launched = _launch(playwright, executable)
        yield launched
        launched.close()


def _launch(playwright: Playwright, executable: str) -> Browser:
    return playwright.chromium.launch(
        executable_path=executable, args=["--no-sandbox", "--disable-dev-shm-usage"]
    )


@dataclass
class Seen:
    """What a page showed besides itself: dialogs (and what they asked), script errors."""

    dialogs: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    answer: str = ""  # a prompt's answer (a reject's reason)


@pytest.fixture
def page(browser: Browser) -> Iterator[tuple[Page, Seen]]:
    """A fresh page that accepts every confirm() and records dialogs and script errors."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    opened = context.new_page()
    seen = Seen()

    def on_dialog(dialog: Dialog) -> None:
        seen.dialogs.append(f"{dialog.type}: {dialog.message}")
        dialog.accept(seen.answer) if dialog.type == "prompt" else dialog.accept()

    opened.on("dialog", on_dialog)
    opened.on("pageerror", lambda exc: seen.errors.append(str(exc)))
    yield opened, seen
    context.close()


def live(page: Page) -> None:
    """Wait until the page's script has read the API (it marks the header `live`)."""
    expect(page.locator("#live")).to_have_text("live", timeout=WAIT_S * 1000)


# the task list -----------------------------------------------------------------------------


def test_the_list_shows_a_running_team_turn_succeeded_without_a_reload(
    stack: Stack, page: tuple[Page, Seen]
) -> None:
    """A team submitted after the page loaded shows `running`, then `succeeded`, live."""
    tab, seen = page
    tab.goto(stack.url + "/")
    live(tab)
    tab.evaluate("window.loadedOnce = true")  # gone if the page reloads
    task = stack.submit(team_spec(stack.tmp / "list.ledger", slow=2.0))
    state = tab.locator(f'tr[data-task="{task}"] .state-cell')
    expect(state).to_have_text("running", timeout=WAIT_S * 1000)
    tab.screenshot(path=stack.tmp / "console-tasks-running.png", full_page=True)
    expect(state).to_have_text("succeeded", timeout=WAIT_S * 1000)
    assert tab.evaluate("window.loadedOnce === true")
    assert "succeeded" == stack.status(task)["status"]
    tab.select_option("#state-filter", "running")
    expect(tab.locator(f'tr[data-task="{task}"]')).to_have_count(0)
    assert tab.url.endswith("/?state=running")
    tab.select_option("#state-filter", "succeeded")
    expect(tab.locator(f'tr[data-task="{task}"]')).to_have_count(1)
    tab.screenshot(path=stack.tmp / "console-tasks.png", full_page=True)
    assert ([], []) == (seen.dialogs, seen.errors)


# actions -------------------------------------------------------------------------------------


def test_an_approval_made_on_the_page_lets_the_waiting_agent_go_on(
    stack: Stack, page: tuple[Page, Seen]
) -> None:
    """The queue shows the waiting call; approving it there runs it and the task succeeds."""
    tab, seen = page
    task = stack.submit(waiting_spec("Approve"))
    stack.wait_for(task, "waiting_approval")
    tab.goto(stack.url + "/approvals")
    row = tab.locator(f'#approvals tbody tr:has(a[href="/tasks/{task}"])')
    expect(row).to_have_count(1, timeout=WAIT_S * 1000)
    expect(tab.locator("#approval-count")).not_to_have_text("")
    row.locator("button.approve").click()
    expect(tab.locator("#outcome")).to_have_text(
        "approved write_file (call_1_0) of deployer", timeout=WAIT_S * 1000
    )
    assert [f"confirm: Approve write_file (call_1_0) of deployer in {task}?"] == seen.dialogs
    status = stack.wait_for(task, "succeeded", "failed")
    assert "succeeded" == status["status"]
    assert EVIL in (status["verify_output"] or "")  # the approved write ran
    expect(row).to_have_count(0, timeout=WAIT_S * 1000)  # gone from the queue, live


def test_a_reject_made_on_the_page_sends_the_reason_to_the_model(
    stack: Stack, page: tuple[Page, Seen]
) -> None:
    """Rejecting with a reason on the task page: the call never runs, the agent goes on."""
    tab, seen = page
    task = stack.submit(waiting_spec("Reject"))
    stack.wait_for(task, "waiting_approval")
    tab.goto(f"{stack.url}/tasks/{task}")
    seen.answer = "not on a Friday"
    tab.locator('#approvals tr[data-agent="deployer"] button.reject').click()
    expect(tab.locator("#outcome")).to_have_text(
        "rejected write_file (call_1_0) of deployer", timeout=WAIT_S * 1000
    )
    assert seen.dialogs[0].startswith("prompt: Reject write_file (call_1_0) of deployer")
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        files, histories = files_and_histories(stack.cluster, task)
        if any(text == "error: rejected by a person: not on a Friday"
               for _, text, _ in histories["deployer"]):  # fmt: skip
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the model never read the reason: {histories['deployer']}")
    assert "deploy.sh" not in files
    stack.cluster.tasks.cancel(task)  # its verify would fail until max_supersteps


def test_a_restore_to_gc_1_made_on_the_page_puts_the_task_back(
    stack: Stack, page: tuple[Page, Seen]
) -> None:
    """Restore on GC 1's row, confirmed: the epoch rises, the page shows it, the task reruns."""
    tab, seen = page
    task = stack.submit(team_spec(stack.tmp / "restore.ledger"))
    before = stack.wait_for(task, "succeeded")
    tab.goto(f"{stack.url}/tasks/{task}")
    live(tab)
    expect(tab.locator("#epoch")).to_have_text(str(before["epoch"]))
    tab.screenshot(path=stack.tmp / "console-task.png", full_page=True)
    tab.locator('#checkpoints tr[data-gc="1"] button.restore').click()
    outcome = tab.locator("#outcome")
    expect(outcome).to_contain_text(f"{task} restored to checkpoint 1", timeout=WAIT_S * 1000)
    assert [f"confirm: Restore every agent and file of {task} to GC 1?"] == seen.dialogs
    after = stack.status(task)
    assert after["epoch"] > before["epoch"]
    expect(tab.locator("#epoch")).to_have_text(str(after["epoch"]), timeout=WAIT_S * 1000)
    assert "succeeded" == stack.wait_for(task, "succeeded", "failed")["status"]
    assert [] == seen.errors


def test_the_diff_pickers_offer_committed_checkpoints_only(
    stack: Stack, page: tuple[Page, Seen]
) -> None:
    """A restore made mid-superstep aborts its GC: listed ABORTED, never offered to diff.

    The table shows each GC's epoch, members and origin (the restore's GC: `restore of 0`).
    """
    tab, seen = page
    task = stack.submit(team_spec(stack.tmp / "aborted.ledger", slow=3.0))
    deadline = time.monotonic() + WAIT_S
    while int(stack.status(task)["superstep"] or 0) < 1:  # then the coder's slow step runs
        assert time.monotonic() < deadline, stack.status(task)
        time.sleep(0.05)
    # In this process: a CLI's start-up may outlast the step.
    stack.cluster.coordinator.restorer.restore(task, to=0)
    stack.wait_for(task, "succeeded")
    rows = json.loads(cairn("checkpoints", task, "--json", env=stack.env).stdout)
    aborted = [row["number"] for row in rows if row["status"] == "ABORTED"]
    committed = [str(row["number"]) for row in rows if row["status"] == "COMMITTED"]
    assert 1 == len(aborted), rows
    tab.goto(f"{stack.url}/tasks/{task}")
    live(tab)
    expect(tab.locator(f'#checkpoints tr[data-gc="{aborted[0]}"]')).to_contain_text("ABORTED")
    restore = tab.locator(f'#checkpoints tr[data-gc="{aborted[0] + 1}"]')
    expect(restore.locator("td.origin")).to_have_text("restore of 0")
    expect(restore.locator("td.members")).to_have_text("coder, planner, reviewer")
    for picker in ("#diff-a", "#diff-b"):
        options = tab.locator(f"{picker} option")
        expect(options).to_have_count(len(committed))
        assert committed == [options.nth(i).get_attribute("value") for i in range(len(committed))]
    assert [] == seen.errors


def test_the_task_page_shows_who_spawned_whom(stack: Stack, page: tuple[Page, Seen]) -> None:
    """A lead that spawns three workers: each worker's row names its spawner."""
    tab, seen = page
    task = stack.submit(orchestrator())
    stack.wait_for(task, "succeeded")
    tab.goto(f"{stack.url}/tasks/{task}")
    live(tab)
    for name in WORKERS:
        row = tab.locator(f'#agents tr[data-agent="{name}"] td').first
        expect(row).to_have_text(f"{name} (spawned by lead)", timeout=WAIT_S * 1000)
    expect(tab.locator('#agents tr[data-agent="lead"] td').first).to_have_text("lead")
    assert [] == seen.errors


def test_the_task_page_shows_an_agents_retries_and_last_error_while_it_fails(
    stack: Stack, page: tuple[Page, Seen]
) -> None:
    """A model at a closed port: the writer's row counts its retries and shows the error."""
    tab, seen = page
    task = stack.submit(TaskSpec.model_validate({
        "name": "Unreachable", "goal": "Say hello.",
        "agents": [{"name": "writer", "model": "openai:gpt-test", "timeout": 1,
                    "base_url": f"http://127.0.0.1:{free_port()}/v1", "max_retries": 20}],
    }))  # fmt: skip
    try:
        tab.goto(f"{stack.url}/tasks/{task}")
        live(tab)
        row = tab.locator('#agents tr[data-agent="writer"]')
        expect(row.locator(".last-error")).to_contain_text(
            "ModelError: model call failed", timeout=WAIT_S * 1000
        )
        expect(row.locator(".last-error")).to_contain_text("ConnectionRefusedError")
        expect(row.locator(".retries")).not_to_have_text("0", timeout=WAIT_S * 1000)
        assert "running" == stack.status(task)["status"]
        tab.click("#timeline-reload")  # the timeline counts the failed attempts too
        summary = tab.frame_locator("#timeline").locator("#summary")
        expect(summary).to_contain_text(re.compile(r"[1-9]\d* failures?, [1-9]\d* retr"))
        expect(tab.frame_locator("#timeline").locator("#attempts")).to_contain_text("retried")
        tab.screenshot(path=stack.tmp / "console-failing.png", full_page=True)
    finally:
        stack.cluster.tasks.cancel(task)
    assert [] == seen.errors


def test_a_fork_made_on_the_page_starts_a_new_task(
    stack: Stack, finished: str, page: tuple[Page, Seen]
) -> None:
    """Fork on GC 1's row: a new task, forked from GC 1, linked from the outcome; it runs."""
    tab, seen = page
    tab.goto(f"{stack.url}/tasks/{finished}")
    live(tab)
    tab.locator('#checkpoints tr[data-gc="1"] button.fork').click()
    link = tab.locator("#outcome a")
    expect(link).to_have_count(1, timeout=WAIT_S * 1000)
    new = (link.text_content() or "").removeprefix("open ")
    assert new != finished
    assert {"task_id": finished, "checkpoint": 1} == stack.status(new)["forked_from"]
    assert "succeeded" == stack.wait_for(new, "succeeded", "failed")["status"]
    link.click()
    expect(tab.locator("#task-id")).to_have_text(new)
    expect(tab.locator("#summary a")).to_have_text(finished, timeout=WAIT_S * 1000)
    assert "succeeded" == stack.status(finished)["status"]  # the source is untouched
    assert [f"confirm: Start a new task from GC 1 of {finished}?"] == seen.dialogs


def test_a_failed_action_shows_the_line_the_cli_prints(
    stack: Stack, waiting: str, page: tuple[Page, Seen]
) -> None:
    """Resuming a task that is not paused shows `cairn resume`'s one line; nothing changes."""
    tab, _ = page
    tab.goto(f"{stack.url}/tasks/{waiting}")
    live(tab)
    tab.locator('#task-actions button[data-action="resume"]').click()
    outcome = tab.locator("#outcome.error")
    expect(outcome).to_have_count(1, timeout=WAIT_S * 1000)
    done = cairn("resume", waiting, env=stack.env)
    assert 2 == done.returncode
    assert done.stderr.strip().removeprefix("cairn: ") == outcome.text_content()
    assert "waiting_approval" == stack.status(waiting)["status"]


def test_an_ended_task_offers_no_pause_resume_or_cancel(
    stack: Stack, finished: str, waiting: str, page: tuple[Page, Seen]
) -> None:
    """A task that ended shows no action its state refuses; one that runs shows all three."""
    tab, _ = page
    actions = tab.locator("#task-actions button")
    tab.goto(f"{stack.url}/tasks/{waiting}")
    live(tab)
    for button in actions.all():
        expect(button).to_be_visible(timeout=WAIT_S * 1000)
        expect(button).to_be_enabled()
    tab.goto(f"{stack.url}/tasks/{finished}")
    live(tab)
    expect(tab.locator("#summary")).to_contain_text("succeeded", timeout=WAIT_S * 1000)
    assert 3 == actions.count()
    for button in actions.all():
        expect(button).to_be_hidden()


# what a task shows, and how -----------------------------------------------------------------


def test_the_summary_names_the_superstep_running_and_the_last_gc(
    stack: Stack, page: tuple[Page, Seen]
) -> None:
    """Mid-superstep, the task page names the superstep running, and the GC before it."""
    tab, seen = page
    task = stack.submit(team_spec(stack.tmp / "summary.ledger", slow=4.0))
    tab.goto(f"{stack.url}/tasks/{task}")
    live(tab)
    summary = tab.locator("#summary")
    # GC 1 closes superstep 1; superstep 2 (the coder's slow turn) runs for 4 s after it.
    expect(summary).to_contain_text("latest GC 1 at superstep 1", timeout=WAIT_S * 1000)
    expect(tab.locator("#superstep")).to_have_text(" running superstep 2")
    expect(summary).to_contain_text("succeeded", timeout=WAIT_S * 1000)
    expect(tab.locator("#superstep")).not_to_contain_text("running")
    assert ([], []) == (seen.dialogs, seen.errors)


def test_hostile_task_strings_render_as_text(
    stack: Stack, waiting: str, finished: str, page: tuple[Page, Seen]
) -> None:
    """Messages, files, tool arguments and verify output with markup show it as text."""
    tab, seen = page
    tab.goto(f"{stack.url}/tasks/{waiting}")
    live(tab)
    arguments = tab.locator('#approvals tr[data-agent="deployer"] pre.arguments')
    expect(arguments).to_contain_text(EVIL, timeout=WAIT_S * 1000)
    tab.select_option("#diff-a", "0")
    tab.locator("#diff-show").click()
    expect(tab.locator('#diff .file-diff[data-path="notes.md"]')).to_contain_text("+" + EVIL)
    expect(tab.locator("#diff .msg.assistant").first).to_contain_text(f"First {EVIL}")
    timeline = tab.frame_locator("#timeline")
    expect(timeline.locator("#cairn-ok")).to_have_count(1, timeout=WAIT_S * 1000)
    timeline.locator(".bar").first.click()  # the first step: its messages in the detail
    expect(timeline.locator("#detail")).to_contain_text(f"First {EVIL}")
    assert 0 == timeline.locator("img").count()
    assert 0 == tab.locator("img").count()
    tab.goto(f"{stack.url}/tasks/{finished}")
    live(tab)
    expect(tab.locator("#verify")).to_contain_text(EVIL)
    assert 0 == tab.locator("img").count()
    assert ([], []) == (seen.dialogs, seen.errors)  # no alert() ran, no script failed


def test_the_api_answers_what_the_cli_prints_with_json(
    stack: Stack, finished: str, waiting: str
) -> None:
    """Status, checkpoints, one checkpoint, a diff and approvals: `cairn ... --json`'s JSON."""
    for path, argv in (
        (f"/api/tasks/{finished}", ["status", finished]),
        (f"/api/tasks/{finished}/checkpoints", ["checkpoints", finished]),
        (f"/api/tasks/{finished}/checkpoints/1", ["checkpoint", finished, "1"]),
        (f"/api/tasks/{finished}/diff?a=1&b=2", ["diff", finished, "1", "2"]),
        (f"/api/tasks/{finished}/trace?agent=coder", ["trace", finished, "--agent", "coder"]),
        (f"/api/tasks/{waiting}/approvals", ["approvals", waiting]),
    ):
        done = cairn(*argv, "--json", env=stack.env)
        assert 0 == done.returncode, done.stderr
        assert json.loads(done.stdout) == api(stack, path), path
    table = cairn("approvals", env={**stack.env, "COLUMNS": "200"})  # for people
    assert (0, True) == (table.returncode, waiting in table.stdout), table.stderr
    assert "decide with `cairn approve|reject TASK AGENT CALL`" in table.stdout
    queue = api(stack, "/api/approvals")
    assert {waiting} <= {call["task_id"] for call in queue}
    assert all(call["task_id"] != finished for call in queue)
    listed = api(stack, "/api/tasks?state=succeeded")
    assert finished in {s["task_id"] for s in listed}
    assert {"succeeded"} == {s["status"] for s in listed}


def test_api_errors_are_one_line_with_a_fitting_status(stack: Stack, finished: str) -> None:
    """404 for an unknown task, 400 for bad input, 405 for a GET of an action: one line each."""
    base = stack.url
    csrf = _csrf(stack)
    post = {"X-Cairn-CSRF": csrf, "Content-Type": "application/json"}
    for method, path, body, status, error in (
        ("GET", "/api/tasks/nope", None, 404, "unknown task 'nope'"),
        ("GET", "/api/tasks?state=lost", None, 400, "state: 'lost' is not one of the task states"),
        ("GET", f"/api/tasks/{finished}/diff?a=x", None, 400, "a: 'x' is not a checkpoint number"),
        ("POST", f"/api/tasks/{finished}/restore", {"to": 99}, 400,
         f"task {finished} has no checkpoint 99"),
        ("POST", f"/api/tasks/{finished}/restore", {"to": "1"}, 400,
         "invalid restore: to: Input should be a valid integer"),
        ("POST", f"/api/tasks/{finished}/explode", {}, 404,
         "no action 'explode': one of approve, reject, pause, resume, cancel, restore, fork"),
        ("GET", f"/api/tasks/{finished}/pause", None, 405, "Method Not Allowed"),
    ):  # fmt: skip
        got, _, answer = http(method, base + path, post if method == "POST" else None, body)
        assert (status, {"error": error}) == (got, json.loads(answer)), path
    got, _, answer = http("GET", f"{base}/tasks/nope")
    assert (404, True) == (got, b"unknown task &#x27;nope&#x27;" in answer)


def _csrf(stack: Stack) -> str:
    """The CSRF secret a page of the module's console embeds."""
    _, _, page = http("GET", stack.url + "/")
    marker = b'name="cairn-csrf" content="'
    start = page.index(marker) + len(marker)
    return page[start : page.index(b'"', start)].decode()


# security ----------------------------------------------------------------------------------


def test_a_post_without_the_csrf_header_is_refused_and_changes_nothing(
    stack: Stack, waiting: str
) -> None:
    """No header, a wrong one, or another origin: 403 and the task still waits."""
    url = f"{stack.url}/api/tasks/{waiting}/pause"
    csrf = _csrf(stack)
    for headers in (
        {},
        {"X-Cairn-CSRF": "guessed"},
        {"X-Cairn-CSRF": csrf, "Origin": "http://evil.example"},
        {"X-Cairn-CSRF": csrf, "Sec-Fetch-Site": "cross-site"},
    ):
        got, _, answer = http("POST", url, headers, {})
        assert 403 == got, headers
        assert "error" in json.loads(answer)
    assert "waiting_approval" == stack.status(waiting)["status"]
    got, _, _ = http("POST", url.replace("/pause", "/approve"), {}, {"agent": "deployer"})
    assert 403 == got
    assert "waiting_approval" == stack.status(waiting)["status"]


def test_a_loopback_console_answers_only_its_own_host(stack: Stack) -> None:
    """A request naming another Host (DNS rebinding) is refused; the page sets a strict CSP."""
    got, _, _ = http("GET", stack.url + "/api/tasks", {"Host": "evil.example"})
    assert 403 == got
    got, headers, _ = http("GET", stack.url + "/")
    assert HTTP_OK == got
    assert "script-src 'self'" in headers["content-security-policy"]
    assert "frame-ancestors 'none'" in headers["content-security-policy"]


def test_a_non_local_console_without_a_token_refuses_to_start(stack: Stack) -> None:
    """`cairn console --host 0.0.0.0` and no CAIRN_CONSOLE_TOKEN: one line, exit 2."""
    done = cairn("console", "--host", "0.0.0.0", "--port", str(free_port()), env=stack.env)  # noqa: S104
    assert 2 == done.returncode
    assert [
        "cairn: console: 0.0.0.0 is not a loopback address: set CAIRN_CONSOLE_TOKEN to serve "
        "it there, or bind 127.0.0.1"
    ] == done.stderr.splitlines()


def test_a_non_local_console_refuses_every_request_without_its_token(
    stack: Stack, page: tuple[Page, Seen]
) -> None:
    """Pages, API and static files: 401 without the token; a bearer header or the cookie works."""
    env = {**stack.env, "CAIRN_CONSOLE_TOKEN": TOKEN}
    console, url = start_console(env, stack.tmp / "token-console.log", "--host", "0.0.0.0")  # noqa: S104
    stack.consoles.append(console)
    paths = ["/", "/approvals", "/api/tasks", "/api/approvals", "/static/console.js", "/tasks/x"]
    for path in paths:
        assert 401 == http("GET", url + path)[0], path
        assert 401 == http("GET", url + path, {"Authorization": "Bearer wrong"})[0], path
    assert 401 == http("POST", url + "/api/tasks/x/pause", {}, {})[0]
    for path in paths[:-1]:
        assert HTTP_OK == http("GET", url + path, {"Authorization": f"Bearer {TOKEN}"})[0], path
    tab, seen = page
    tab.goto(url + "/?token=wrong")
    assert "needs its token" in (tab.text_content("body") or "")
    tab.goto(url + "/?state=succeeded&token=" + TOKEN)
    assert tab.url == url + "/?state=succeeded"  # the token left the address bar
    live(tab)
    cookie = next(c for c in tab.context.cookies() if c["name"] == "cairn_console")
    assert (True, "Strict") == (cookie["httpOnly"], cookie["sameSite"])
    assert TOKEN not in cookie["value"]
    assert ([], []) == (seen.dialogs, seen.errors)


def test_a_console_without_its_extra_says_how_to_install_it(stack: Stack) -> None:
    """Without uvicorn importable, `cairn console` names the extra in one line, exit 2."""
    script = "import sys; sys.modules['uvicorn'] = None; from cairn.cli import main; " \
        "sys.exit(main(['console']))"  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", script], env=stack.env, capture_output=True, text=True,
        timeout=WAIT_S, check=False,
    )  # fmt: skip
    assert 2 == done.returncode
    lines = done.stderr.splitlines()
    assert 1 == len(lines)
    assert "pip install 'cairn-agents[console]'" in lines[0]
