"""Every token counted, replays included, and budgets held across retries and restores.

Real workers run a scripted team whose every model call reports usage (tokens by the
prompt's and the reply's length); a price table turns them into dollars.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cairn.agents.accounting import Budget, Price, cost, load_prices
from cairn.coordinator.spec import TaskSpec
from cairn.coordinator.spend import in_flight
from cairn.coordinator.views import TaskStatus, Tokens
from cairn.errors import InvalidSpec
from cairn.storage.backends.redis import RedisHotStore
from cairn.storage.chain import rebuild
from cairn.storage.codec import Codec
from cairn.storage.records import LocalCheckpoint, Usage
from cairn.storage.store import CheckpointStore
from tests.cluster import Cluster
from tests.test_restore import run_until

SPEC = """
name: Spend
goal: Write three notes, one a superstep.
prices: {scripted: {input: 2.0, output: 10.0, cached: 1.0}}
agents:
  - name: writer
    model: scripted
    script:
      - say: First I write a, a note of some length to count.
        tools: [{name: write_file, args: {path: a.txt, content: "a"}}]
      - say: Then b, though the first worker to try it dies.
        crash: {after_tools: 0, attempts: [1]}
        tools: [{name: write_file, args: {path: b.txt, content: "b"}}]
      - say: Done writing.
        tools: [{name: finish, args: {summary: done}}]
  - name: counter
    model: scripted
    script:
      - say: I count along.
        tools: [{name: list_files, args: {}}]
      - say: Still counting.
        tools: [{name: list_files, args: {}}]
      - say: Counted.
        tools: [{name: finish, args: {summary: counted}}]
"""


def spec(*, crash: bool = True, **changes: object) -> TaskSpec:
    """The team's spec; without `crash`, no worker dies (a test with one worker)."""
    data = yaml.safe_load(SPEC)
    if not crash:
        del data["agents"][0]["script"][1]["crash"]
    return TaskSpec.model_validate({**data, **changes})


def tokens(usage: Tokens | Usage) -> tuple[int, int, int, float]:
    return (usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens,
            round(usage.cost_usd, 9))  # fmt: skip


def history_usage(cluster: Cluster, task: str) -> dict[str, Usage]:
    """Each agent's usage as its committed history holds it, added up call by call."""
    gc = cluster.store.latest_gc(task)
    assert gc is not None
    found = {}
    for agent, ref in gc.members.items():
        total = Usage()
        for record in cluster.store.read_state(task, agent, ref.id, ref.checksum).trace:
            if record.usage is not None:
                total = total.plus(record.usage)
        found[agent] = total
    return found


def model_calls(cluster: Cluster, task: str) -> dict[str, list[Usage]]:
    """The usage of every model call in the committed history, per agent, in order."""
    gc = cluster.store.latest_gc(task)
    assert gc is not None
    return {
        agent: [
            r.usage
            for r in cluster.store.read_state(task, agent, ref.id, ref.checksum).trace
            if r.tool is None and r.usage is not None
        ]
        for agent, ref in gc.members.items()
    }


def test_spend_rises_through_a_killed_worker_and_a_restore(cluster: Cluster) -> None:
    """Replayed spend is exactly the usage of the discarded work; nothing is given back."""
    cluster.start_worker()
    cluster.start_worker()
    task = cluster.tasks.submit(spec())
    assert "succeeded" == cluster.drive(task)["status"]
    status = cluster.tasks.status(task)
    history = history_usage(cluster, task)
    calls = model_calls(cluster, task)
    writer = {a.name: a for a in status.agents}["writer"]
    # The killed attempt asked the model the same question its retry asked: paid twice.
    retried = calls["writer"][1]
    assert retried.completion_tokens > 0
    assert tokens(history["writer"].plus(retried)) == tokens(writer.usage)
    assert tokens(retried) == tokens(writer.usage.replayed)
    counter = {a.name: a for a in status.agents}["counter"]
    assert tokens(history["counter"]) == tokens(counter.usage)
    assert (0, 0, 0, 0.0) == tokens(counter.usage.replayed)
    price = Price(input=2.0, output=10.0, cached=1.0)
    assert round(sum(cost(c, price) for c in calls["writer"]) + cost(retried, price), 9) == round(
        writer.usage.cost_usd, 9
    )
    assert status.usage.cost_usd > 0

    # Back to GC 1: what the agents did after it is discarded, its spend kept as replayed.
    before = status.usage
    cluster.coordinator.restorer.restore(task, to=1)
    at_gc1 = history_usage(cluster, task)
    after = cluster.tasks.status(task)
    assert tokens(before) == tokens(after.usage)  # a restore gives nothing back
    discarded = {a: history[a].minus(at_gc1[a]) for a in history}
    for agent in after.agents:
        was = {a.name: a for a in status.agents}[agent.name].usage.replayed
        assert tokens(Usage(**was.model_dump()).plus(discarded[agent.name])) == tokens(
            agent.usage.replayed
        )
    cluster.start_worker()  # the rerun's attempt 1 of superstep 2 kills its worker again
    assert "succeeded" == cluster.drive(task)["status"]
    final = cluster.tasks.status(task)
    assert final.usage.tokens > before.tokens
    # The rerun is committed work, but its superstep 2 died once more (attempt 1 again, in
    # the new epoch): the writer's replayed spend grows by that call, the counter's not.
    again = model_calls(cluster, task)["writer"][1]
    kept = {a.name: a.usage.replayed for a in after.agents}
    grown = {a.name: a.usage.replayed for a in final.agents}
    assert tokens(kept["counter"]) == tokens(grown["counter"])
    assert tokens(Usage(**kept["writer"].model_dump()).plus(again)) == tokens(grown["writer"])


def test_a_budget_pauses_the_task_at_a_barrier_and_a_raise_lets_it_finish(
    cluster: Cluster,
) -> None:
    """Reaching the budget pauses with reason `budget`; `budget` + `resume` finish the task."""
    cluster.start_worker()
    task = cluster.tasks.submit(spec(crash=False, budget={"tokens": 1}))
    status = paused(cluster, task)
    assert ("paused", "budget") == (status.state.value, status.reason)
    assert 1 == status.latest_checkpoint  # superstep 1 committed whole, then the pause
    assert Budget(tokens=1) == status.budget
    spent = status.usage.tokens
    assert spent >= 1

    cluster.tasks.resume(task)  # not raised: paused again at the next barrier
    again = paused(cluster, task)
    assert (1, "budget") == (again.latest_checkpoint, again.reason)
    raised = cluster.tasks.budget(task, tokens=10**9)
    assert Budget(tokens=10**9) == raised == cluster.tasks.status(task).budget
    cluster.tasks.resume(task)
    assert "succeeded" == cluster.drive(task)["status"]
    assert cluster.tasks.status(task).usage.tokens > spent


def paused(cluster: Cluster, task: str) -> TaskStatus:
    """Tick until the task is paused; return its status."""
    for _ in range(3000):
        cluster.coordinator.tick()
        status = cluster.tasks.status(task)
        if status.state.value == "paused":
            return status
        assert not status.ended, status
    raise AssertionError("the task never paused")


def test_a_restore_does_not_reset_what_a_budget_counts(cluster: Cluster) -> None:
    """Spent before a restore still counts against the budget after it."""
    cluster.start_worker()
    task = cluster.tasks.submit(spec(crash=False))
    run_until(cluster, task, 2)
    spent = cluster.tasks.status(task).usage.tokens
    cluster.coordinator.restorer.restore(task, to=0)
    cluster.tasks.budget(task, tokens=spent)
    status = paused(cluster, task)
    assert ("paused", "budget") == (status.state.value, status.reason)
    assert 0 == cluster.store.read_gc(task, status.latest_checkpoint or 0).superstep


def test_a_model_call_is_counted_once_however_often_it_is_sent(own_store: CheckpointStore) -> None:
    """The spend script is idempotent per attempt (redis-py may send it again)."""
    hot = own_store.hot
    assert isinstance(hot, RedisHotStore)
    used = Usage(prompt_tokens=100, completion_tokens=10, cached_tokens=40, cost_usd=0.5)
    assert hot.record_spend("t", "a", 1, 1, 1, used)
    assert not hot.record_spend("t", "a", 1, 1, 1, used)  # the same call again
    assert hot.record_spend("t", "a", 1, 1, 2, used)  # its retry: paid again
    assert hot.record_spend("t", "a", 2, 1, 1, used)  # after a restore: paid again
    raw = hot.redis.hgetall("cairn:{t}:spend")
    assert b"300" == raw[b"a:prompt_tokens"]
    assert b"3" == raw[b"a:calls"]
    assert 1.5 == float(raw[b"a:cost_usd"])


def test_an_attempts_calls_are_each_counted_once_and_summed(own_store: CheckpointStore) -> None:
    """Two model calls of one attempt (a cut reply asked again): both counted, each once.

    The attempt's entry holds them summed: what the coordinator reads of a step in flight.
    """
    hot = own_store.hot
    assert isinstance(hot, RedisHotStore)
    first = Usage(prompt_tokens=100, completion_tokens=10, cached_tokens=40, cost_usd=0.25)
    second = Usage(prompt_tokens=7, completion_tokens=3, cached_tokens=0, cost_usd=0.5)
    assert hot.record_spend("t", "a", 1, 1, 1, first, 0)
    assert hot.record_spend("t", "a", 1, 1, 1, second, 1)
    assert not hot.record_spend("t", "a", 1, 1, 1, second, 1)  # sent again
    raw = hot.redis.hgetall("cairn:{t}:spend")
    assert (b"107", b"13", b"2") == (raw[b"a:prompt_tokens"], raw[b"a:completion_tokens"],
                                     raw[b"a:calls"])  # fmt: skip
    flying = in_flight(hot.redis, "t", {"superstep": "1", "epoch": "1"},
                       {"a": '{"attempt": 1}'})  # fmt: skip
    assert Usage(prompt_tokens=107, completion_tokens=13, cached_tokens=40,
                 cost_usd=0.75) == flying["a"]  # fmt: skip


def test_prices_cost_and_tables() -> None:
    """Cached tokens at their own price (else input's); a bad table is one clear error."""
    price = Price(input=3.0, output=15.0, cached=0.3)
    used = Usage(prompt_tokens=1_000_000, completion_tokens=100_000, cached_tokens=400_000)
    assert 0.6 * 3.0 + 0.4 * 0.3 + 0.1 * 15.0 == pytest.approx(cost(used, price))
    assert 2.0 * 1 + 0 == pytest.approx(
        cost(Usage(prompt_tokens=1_000_000), Price(input=2, output=9))
    )
    assert 0.0 == cost(used, None)
    # Cache writes at the table's `cache_write`, else at 1.25x `input` (Anthropic's price).
    written = Usage(prompt_tokens=1_000_000, cached_tokens=400_000, cache_write_tokens=100_000)
    assert 0.5 * 3.0 + 0.4 * 0.3 + 0.1 * 3.75 == pytest.approx(cost(written, price))
    own = Price(input=3.0, output=15.0, cached=0.3, cache_write=6.0)
    assert 0.5 * 3.0 + 0.4 * 0.3 + 0.1 * 6.0 == pytest.approx(cost(written, own))
    with pytest.raises(ValueError, match="tokens, cost_usd or both"):
        Budget()


def test_a_price_table_file_is_read_or_refused_in_one_line(tmp_path: Path) -> None:
    good = tmp_path / "prices.yaml"
    good.write_text("openai:gpt-4o: {input: 2.5, output: 10}\n")
    assert {"openai:gpt-4o": Price(input=2.5, output=10.0)} == load_prices(good)
    bad = tmp_path / "bad.yaml"
    bad.write_text("openai:gpt-4o: {input: -1, output: 10}\n")
    with pytest.raises(InvalidSpec, match=r"bad.yaml: openai:gpt-4o.input: Input should be"):
        load_prices(bad)
    with pytest.raises(InvalidSpec, match="cannot read price table"):
        load_prices(tmp_path / "missing.yaml")


def test_a_history_of_schema_1_adds_up_its_trace() -> None:
    """Schema 1 LCs kept no running total: a reader adds up the calls in their trace."""
    golden = Path(__file__).parent / "golden" / "v1"
    codec = Codec()
    full, delta = (
        codec.decode((golden / f"lc-{kind}.rec").read_bytes(), LocalCheckpoint, kind)
        for kind in ("full", "delta")
    )
    assert (None, None) == (full.usage, delta.usage)
    state = rebuild([delta, full])
    assert Usage(prompt_tokens=812 + 1024, completion_tokens=164 + 32, cached_tokens=512 + 960) == (
        state.usage
    )


def test_a_spend_sent_ahead_is_answered_in_order_and_counted_once(
    own_store: CheckpointStore,
) -> None:
    """`send_spend` leaves its answer on the connection; the next script reads it first.

    A script sent after it gets its own reply (not the spend's); a Redis that lost the
    script, or a connection dropped before the answer, still counts the call exactly once.
    """
    hot = own_store.hot
    assert isinstance(hot, RedisHotStore)
    used = Usage(prompt_tokens=7, completion_tokens=3)
    answer = hot.send_spend("t", "a", 1, 1, 1, used)
    assert 1 == hot.init_task("t")  # a plain command on the pool
    hot.begin_attempt("t", "a", 1, 1)  # a script on the held connection: reads the answer
    assert hot.send_spend("t", "a", 1, 1, 1, used)() is False  # counted by the first
    assert answer() is True
    assert answer() is True  # answered once, asked twice
    hot.redis.script_flush()
    assert hot.send_spend("t", "a", 1, 1, 2, used)() is True  # the script sent again
    lost = hot.send_spend("t", "a", 1, 1, 3, used)
    hot.redis.client_kill_filter(_type="normal", skipme=True)  # the held connection too
    # The answer is read, or, lost with the connection, the script is sent again; which
    # one depends on timing, and the second answers "counted already". Once, either way:
    lost()
    assert hot.send_spend("t", "a", 1, 1, 3, used)() is False
    raw = hot.redis.hgetall("cairn:{t}:spend")
    assert (b"21", b"3") == (raw[b"a:prompt_tokens"], raw[b"a:calls"])
