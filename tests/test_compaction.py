"""Compaction: an agent's model is sent a view of its history that fits, checkpointed.

The model is a local server speaking the Messages API (every request checked against the
`anthropic` SDK's request type, every reply built from its models, `tests.sdk_wire`). It
plays a coding agent whose every turn writes a file and says a long line, and answers a
compaction's summary request with a summary; each request is kept, so the tests read what
the model was really sent.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pydantic import JsonValue

from cairn.agents import faults
from cairn.agents.compaction import estimate, head_of, plan, sent
from cairn.agents.spec import AgentSpec
from cairn.agents.task import start_task
from cairn.coordinator.diff import diff
from cairn.coordinator.spec import TaskSpec
from cairn.coordinator.timeline import gather
from cairn.errors import ModelError
from cairn.storage.records import ContextView, Message, Role, ToolCall
from cairn.storage.store import CheckpointStore
from cairn.testing import RedisServer
from cairn.testing.faults import KILL_AFTER_COMPACTION
from tests.agent_harness import record, superstep
from tests.cli_harness import cli_runner
from tests.cluster import Cluster
from tests.sdk_wire import anthropic_error, anthropic_reply, anthropic_request_errors, text
from tests.sdk_wire import tool_use as use
from tests.test_openai_model import Received, Scripted, ScriptedServer, serve_scripted

SUMMARY = "The coder wrote files f0 to f{n}; the tests are not run yet."
SAY = "I write the next part now. " * 20  # ~540 characters a turn


@dataclass
class Coder:
    """What the model server plays: `turns` file-writing turns, then `finish`.

    `overflow_over` answers "prompt is too long" (Anthropic's 400) to a turn request of
    more than that many characters of messages; `summaries` counts summary requests.
    """

    turns: int
    overflow_over: int | None = None
    summary_overflows: bool = False
    summaries: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, body: dict[str, Any]) -> Scripted:
        """The reply to one request, by what it asks."""
        if "You compact the working memory" in str(body.get("system", "")):
            with self.lock:
                self.summaries += 1
            if self.summary_overflows:
                return anthropic_error(400, "invalid_request_error", "prompt is too long")
            return anthropic_reply(text(SUMMARY), usage=(900, 40, 0))
        sent_chars = len(str(body["messages"]))
        if self.overflow_over is not None and sent_chars > self.overflow_over:
            why = f"prompt is too long: {sent_chars} tokens > {self.overflow_over} maximum"
            return anthropic_error(400, "invalid_request_error", why)
        # The turn after the last one it sees (a compacted request shows only the last few).
        blocks = [
            b for m in body["messages"] if isinstance(m["content"], list) for b in m["content"]
        ]
        done = [int(b["id"].removeprefix("toolu_")) for b in blocks if b.get("type") == "tool_use"]
        turn = max(done, default=-1) + 1
        if turn >= self.turns:
            return anthropic_reply(use(f"toolu_f{turn}", "finish", {"summary": "done"}),
                                   stop_reason="tool_use")  # fmt: skip
        write = use(f"toolu_{turn}", "write_file", {"path": f"f{turn}.txt", "content": "x" * 900})
        return anthropic_reply(text(SAY), write, stop_reason="tool_use",
                               usage=(sent_chars // 4, 300, 0))  # fmt: skip


class CoderServer(ScriptedServer):
    """A `ScriptedServer` that answers each request as its `Coder` says."""

    coder: Coder

    def next_response(self, received: Received) -> Scripted:
        """Record `received` and answer it."""
        with self.lock:
            self.received.append(received)
        return self.coder.answer(received.body)


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[CoderServer]:
    """A `CoderServer` on a free port of 127.0.0.1, playing ten turns."""
    built = CoderServer()
    built.coder = Coder(turns=10)
    for _ in serve_scripted(monkeypatch, built):
        yield built


def coder(server: ScriptedServer, **context: JsonValue) -> AgentSpec:
    """An `anthropic:` agent of `server` with write_file and finish, and `context`."""
    return AgentSpec.model_validate({
        "name": "a", "model": "anthropic:m-test", "base_url": server.root_url,
        "tools": ["write_file", "finish"], "context": context,
    })  # fmt: skip


def turn_requests(server: ScriptedServer) -> list[dict[str, Any]]:
    """The bodies of the agent's own turns (not the summaries), in order."""
    return [r.body for r in server.received if "tools" in r.body]


def check_pairs(body: dict[str, Any]) -> None:
    """Every tool_result the request sends answers a tool_use of the turn before it."""
    previous: list[str] = []
    for message in body["messages"]:
        blocks = message["content"] if isinstance(message["content"], list) else []
        results = [b["tool_use_id"] for b in blocks if b.get("type") == "tool_result"]
        assert set(results) <= set(previous), (results, previous)
        previous = [b["id"] for b in blocks if b.get("type") == "tool_use"]


def run(store: CheckpointStore, task: str, cache: Path, limit: int = 30) -> None:
    """Supersteps until the agent is done."""
    for _ in range(limit):
        if superstep(store, task, cache) is None:
            return
    raise AssertionError("the agent did not finish")


# --- the plan ----------------------------------------------------------------------------


def history(turns: int) -> list[Message]:
    """System, goal, then `turns` turns of a call, its result and a peer's message."""
    messages = [Message(role=Role.SYSTEM, content="sys"), Message(role=Role.USER, content="goal")]
    for n in range(turns):
        call = ToolCall(id=f"c{n}", name="read_file", args={"path": f"{n}"})
        messages += [
            Message(role=Role.ASSISTANT, content=f"turn {n}", tool_calls=[call]),
            Message(role=Role.TOOL, tool_call_id=f"c{n}", name="read_file", content="r" * 300),
            Message(role=Role.USER, name="peer", content=f"note {n}"),
        ]
    return messages


def test_a_plan_keeps_the_head_and_the_last_turns_whole() -> None:
    """The fold ends at an assistant message: no result is ever sent without its call."""
    messages = history(6)
    assert 2 == head_of(messages)
    fold = plan(messages, None, keep_last=2)
    assert fold is not None
    assert (fold.head, fold.start) == (2, 2 + 4 * 3)
    assert messages[fold.start].role is Role.ASSISTANT
    assert list(fold.folded) == messages[2:14]
    view = ContextView(head=2, start=fold.start, summary="S", folded=12)
    shown = sent(messages, view)
    assert [m.content for m in shown[:3]] == ["sys", "goal", "S"]
    assert shown[3:] == messages[14:]
    assert estimate(shown) < estimate(messages)
    assert plan(messages, view, keep_last=2) is None  # nothing newer to fold yet
    assert plan(history(2), None, keep_last=2) is None


# --- compaction in steps -------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["summarize", "truncate"])
def test_a_long_run_stays_under_its_budget_and_ends_as_it_would(
    strategy: str, server: CoderServer, real_store: CheckpointStore, tmp_path: Path
) -> None:
    """Every request fits the budget; the history stays whole; the files are all written."""
    task = f"long-{strategy}"
    start_task(real_store, record(task, coder(server, max_tokens=2_000, keep_last=2,
                                              strategy=strategy)), {})  # fmt: skip
    run(real_store, task, tmp_path / "cache")
    for body in (r.body for r in server.received):
        assert [] == anthropic_request_errors(body)
        check_pairs(body)
    turns = turn_requests(server)
    assert 11 == len(turns)
    # As the server counts tokens (a character in four), no request passed the budget.
    assert max(len(str(body["messages"])) // 4 for body in turns) <= 2_000
    gc = real_store.latest_gc(task)
    assert gc is not None
    state = real_store.read_state(task, "a", gc.members["a"].id)
    assert "finished" == state.status.value
    assert 2 + 11 * 2 == len(state.messages)  # the history is whole: only what is sent shrank
    view = state.context
    assert view is not None
    assert view.folded > 0
    files = real_store.read_manifest(task, gc.workspace).files
    assert {f"f{n}.txt" for n in range(10)} <= set(files)
    compactions = [t for t in state.trace if t.compacted is not None]
    assert compactions
    last = turns[-1]
    said = last["messages"][0]["content"]  # the goal, then the summary, merged into one turn
    kept = [b for b in said if b.get("type") == "text"]
    assert kept[0]["text"] == "Make the project pass its tests."
    if strategy == "summarize":
        assert server.coder.summaries == len(compactions)
        assert SUMMARY in kept[1]["text"]
        assert all(t.usage is not None and t.usage.prompt_tokens == 900 for t in compactions)
    else:
        assert 0 == server.coder.summaries
        assert "were left out to fit the model's context window" in kept[1]["text"]


def test_a_summary_too_long_to_make_is_a_marker_still_traced_as_a_compaction(
    server: CoderServer, real_store: CheckpointStore, tmp_path: Path
) -> None:
    """The summary's own request is too long: the turns are dropped with a marker, traced."""
    server.coder.summary_overflows = True
    start_task(real_store, record("nosum", coder(server, max_tokens=2_000, keep_last=2)), {})
    run(real_store, "nosum", tmp_path / "cache")
    gc = real_store.latest_gc("nosum")
    assert gc is not None
    state = real_store.read_state("nosum", "a", gc.members["a"].id)
    assert "finished" == state.status.value
    compactions = [t for t in state.trace if t.compacted is not None]
    assert len(compactions) == server.coder.summaries > 0
    assert all("were left out to fit" in str(t.result) for t in compactions)
    assert state.context is not None
    assert "were left out to fit" in str(state.context.summary)


def test_a_prompt_too_long_is_compacted_and_asked_again(
    server: CoderServer, real_store: CheckpointStore, tmp_path: Path
) -> None:
    """No window known: the provider's 400 makes the step compact and ask once more."""
    server.coder.overflow_over = 6_000
    start_task(real_store, record("over", coder(server, keep_last=2)), {})
    run(real_store, "over", tmp_path / "cache")
    refused = [r for r in server.received if len(str(r.body["messages"])) > 6_000]
    assert refused, "the prompt never grew past the provider's limit"
    assert 11 == sum(1 for body in turn_requests(server) if len(str(body["messages"])) <= 6_000)
    assert server.coder.summaries >= 1


def test_a_prompt_too_long_with_nothing_left_to_fold_fails_the_step_saying_the_sizes(
    server: CoderServer, real_store: CheckpointStore, tmp_path: Path
) -> None:
    """Too long even at the last turns kept: a refused error, with the estimate in it."""
    server.coder.overflow_over = 2_500
    start_task(real_store, record("stuck", coder(server, keep_last=3)), {})
    with pytest.raises(ModelError) as caught:
        run(real_store, "stuck", tmp_path / "cache")
    assert caught.value.refused
    assert "prompt is too long" in str(caught.value)
    assert "tokens sent; nothing older than the last 3 turns is left to compact" in str(
        caught.value
    )


class Died(BaseException):
    """A worker's death at a fault point, in-process (the cluster test kills a real one)."""


def test_a_retry_after_a_compaction_does_not_pay_for_it_again(
    server: CoderServer, real_store: CheckpointStore, tmp_path: Path
) -> None:
    """Died right after the compaction's checkpoint: the retry resumes past it, no new summary."""
    start_task(real_store, record("once", coder(server, max_tokens=2_000, keep_last=2)), {})
    cache = tmp_path / "cache"

    def die(crash: faults.Crash) -> None:
        if crash.after_tools == faults.COMPACTED:
            raise Died

    faults.install(die)
    try:
        with pytest.raises(Died):
            run(real_store, "once", cache)
    finally:
        faults.install(None)
    assert 1 == server.coder.summaries
    gc = real_store.latest_gc("once")
    assert gc is not None
    superstep_ = gc.superstep + 1
    epoch = real_store.hot.get_epoch("once")
    from cairn.agents.step import run_step  # noqa: PLC0415 - the retry, as a worker runs it

    real_store.hot.begin_attempt("once", "a", superstep_, 2)
    run_step("once", "a", superstep_, epoch, 2, store=real_store, cache=cache)
    assert 1 == server.coder.summaries  # resumed from the compaction's checkpoint


def test_a_diff_and_the_trace_show_a_compaction(
    server: CoderServer,
    real_store: CheckpointStore,
    redis_server: RedisServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`cairn diff` across a compaction names it: how many messages, and the summary."""
    start_task(real_store, record("seen", coder(server, max_tokens=2_000, keep_last=2)), {})
    run(real_store, "seen", tmp_path / "cache")
    gc = real_store.latest_gc("seen")
    assert gc is not None
    found = diff(real_store, "seen", 0, "seen", gc.number).agents["a"].compactions_added
    assert found
    assert all(c["compacted"] > 0 and SUMMARY in str(c["result"]) for c in found)
    flags = ["--redis-url", redis_server.url, "--archive-dir", str(tmp_path / "archive")]
    with cli_runner({"COLUMNS": "200"}, monkeypatch, capsys) as cli:
        code, out, _ = cli(*flags, "trace", "seen")
    assert 0 == code
    assert out.count("compaction (") == len(found)


# --- end to end: a worker killed after a compaction, a restore across one, a fork ------------


def test_kill_after_compaction_then_restore_across_it_and_fork(
    server: CoderServer, cluster: Cluster, tmp_path: Path
) -> None:
    """A real worker dies right after a compaction; the retry pays no second summary.

    A restore to a checkpoint before the first compaction sends the long history again
    (and compacts anew); a fork of the end carries its view.
    """
    flag = tmp_path / "kill-after-compaction"
    flag.touch()
    cluster.env.update({"no_proxy": "*", "NO_PROXY": "*"})
    cluster.start_worker(options=[KILL_AFTER_COMPACTION, str(flag)])
    cluster.start_worker(options=[KILL_AFTER_COMPACTION, str(flag)])
    spec = TaskSpec.model_validate({
        "name": "compacting", "goal": "Make the project pass its tests.",
        "agents": [coder(server, max_tokens=2_000, keep_last=2).model_dump(mode="json")],
    })  # fmt: skip
    task = cluster.tasks.submit(spec)
    assert "succeeded" == cluster.drive(task)["status"]
    assert not flag.exists(), "no worker passed the compaction's point"
    compactions = [t for t in state_at(cluster, task, None).trace if t.compacted is not None]
    assert server.coder.summaries == len(compactions)  # the killed one was not paid twice

    first = min(t.superstep for t in compactions)
    before = next(n for n in range(first, -1, -1) if gc_superstep(cluster, task, n) < first)
    view_before = state_at(cluster, task, before).context
    assert view_before is None or not view_before.start
    cells = gather(cluster.client, cluster.store, task).steps
    assert {c.superstep for c in cells if c.compacted} == {t.superstep for t in compactions}
    summaries = server.coder.summaries
    cluster.coordinator.restorer.restore(task, to=before)
    assert "succeeded" == cluster.drive(task)["status"]
    assert server.coder.summaries > summaries  # the long history came back, and was compacted

    fork = cluster.tasks.fork(task)
    view = state_at(cluster, fork, 0).context
    assert view is not None
    assert view.start > 0


def state_at(cluster: Cluster, task: str, number: int | None) -> Any:
    """Agent a's state at GC `number` of `task` (None: the latest)."""
    gc = cluster.store.latest_gc(task) if number is None else cluster.store.read_gc(task, number)
    assert gc is not None
    return cluster.store.read_state(task, "a", gc.members["a"].id)


def gc_superstep(cluster: Cluster, task: str, number: int) -> int:
    """The superstep GC `number` of `task` closed."""
    return cluster.store.read_gc(task, number).superstep
