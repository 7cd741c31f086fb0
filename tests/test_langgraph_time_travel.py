"""`CairnSaver` goes back in time as LangGraph's own saver does, and takes in others' threads.

Each scenario runs real LangGraph graphs twice, once on `InMemorySaver` and once on
`CairnSaver` over a real redis-server, and the two must end alike: copies (`__copy__`)
of a checkpoint behind the head and of a root, replays of a graph whose subgraph keeps
its own state, and a thread written by `SqliteSaver` (string channel versions) carried
on by `CairnSaver`. The fence still refuses a writer that read only the head.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
import redis
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, empty_checkpoint
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph

from cairn.errors import FencedWrite, RecordNotFound
from cairn.storage.keys import ThreadKeys
from cairn.storage.langgraph import CairnSaver

Saver = BaseCheckpointSaver[Any]
MakeSaver = Callable[[], Saver]


class Steps(TypedDict):
    """A state that records which nodes ran, in order."""

    steps: Annotated[list[str], operator.add]


def line(saver: Saver | bool) -> CompiledStateGraph[Steps, None, Steps, Steps]:
    """START → a → b → c → END, each node adding its name; checkpointed by `saver`."""
    builder = StateGraph(Steps)
    for name in "abc":
        builder.add_node(name, lambda _state, name=name: {"steps": [name]})
    builder.add_edge(START, "a")
    builder.add_edge("a", "b")
    builder.add_edge("b", "c")
    builder.add_edge("c", END)
    return builder.compile(checkpointer=saver)


THREAD: RunnableConfig = {"configurable": {"thread_id": "t"}}


@pytest.fixture
def both(redis_client: redis.Redis, tmp_path: Path) -> dict[str, MakeSaver]:
    """LangGraph's saver and Cairn's (on the session's flushed Redis), by name."""
    return {
        "memory": InMemorySaver,
        "cairn": lambda: CairnSaver(redis_client, tmp_path / "archive"),
    }


def on_both(both: dict[str, MakeSaver], scenario: Callable[[Saver], object]) -> object:
    """Run `scenario` on each saver; what it returned, the same on both."""
    found = {name: scenario(make()) for name, make in both.items()}
    assert found["memory"] == found["cairn"]
    return found["cairn"]


def copy_of(saver: Saver, pick: Callable[[list[Any]], Any]) -> tuple[object, ...]:
    """Run the line, copy (`__copy__`) the checkpoint `pick` chooses, run on from the copy."""
    graph = line(saver)
    graph.invoke({"steps": []}, THREAD)
    history = list(graph.get_state_history(THREAD))
    chosen = pick(history)
    copied = graph.update_state(chosen.config, None, as_node="__copy__")
    copy = graph.get_state(copied)
    parent = None if copy.parent_config is None else copy.parent_config["configurable"]
    chosen_parent = None if chosen.parent_config is None else chosen.parent_config["configurable"]
    after = graph.invoke(None, copied)
    assert copy.metadata is not None
    return copy.values, copy.next, copy.metadata["source"], parent == chosen_parent, after


def test_a_copy_of_a_checkpoint_behind_the_head_is_a_sibling_that_runs_on(
    both: dict[str, MakeSaver],
) -> None:
    """`update_state(..., as_node="__copy__")` puts a sibling under the copied one's parent.

    That parent is not the head, and this saver never read it by id: the copy was once
    refused as a race (`FencedWrite`).
    """
    found = on_both(both, lambda saver: copy_of(saver, lambda h: next(
        s for s in h if s.next == ("b",))))  # fmt: skip
    assert ({"steps": ["a"]}, ("b",), "fork", True, {"steps": ["a", "b", "c"]}) == found


def test_a_copy_of_a_root_checkpoint_reads_back(both: dict[str, MakeSaver]) -> None:
    """A copy of the thread's first checkpoint (no parent) reads back and runs on.

    Its channels' versions are the copied root's; they were once looked up under a
    parent it does not have, and the read failed (`RecordNotFound`).
    """
    found = on_both(both, lambda saver: copy_of(saver, lambda h: h[-1]))
    assert isinstance(found, tuple)
    assert (("__start__",), "fork") == found[1:3]


class Outer(TypedDict):
    """The parent graph's state."""

    steps: Annotated[list[str], operator.add]


def with_stateful_subgraph(saver: Saver) -> CompiledStateGraph[Outer, None, Outer, Outer]:
    """A parent graph whose node `inner` is a subgraph keeping its own state across runs."""
    sub = StateGraph(Steps)
    sub.add_node("count", lambda state: {"steps": [f"inner-{len(state['steps'])}"]})
    sub.add_edge(START, "count")
    sub.add_edge("count", END)
    inner = sub.compile(checkpointer=True)  # its state lives on, per thread

    builder = StateGraph(Outer)
    builder.add_node("first", lambda _state: {"steps": ["first"]})
    builder.add_node("inner", lambda _state: {"steps": inner.invoke({"steps": []})["steps"]})
    builder.add_edge(START, "first")
    builder.add_edge("first", "inner")
    builder.add_edge("inner", END)
    return builder.compile(checkpointer=saver)


def replayed(saver: Saver) -> tuple[object, ...]:
    """Run twice, then replay the second run from before its subgraph, and fork it."""
    graph = with_stateful_subgraph(saver)
    graph.invoke({"steps": []}, THREAD)
    graph.invoke({"steps": []}, THREAD)
    before_inner = next(s for s in graph.get_state_history(THREAD) if s.next == ("inner",))
    replay = graph.invoke(None, before_inner.config)
    forked = graph.update_state(before_inner.config, {"steps": ["edited"]})
    fork = graph.invoke(None, forked)
    return replay, fork, graph.get_state(THREAD).values


def test_a_replay_and_a_fork_find_the_subgraphs_state_as_langgraphs_saver_does(
    both: dict[str, MakeSaver],
) -> None:
    """Replaying from before a stateful subgraph loads its state as it was then.

    LangGraph finds the subgraph's checkpoint with `list(before=...)` and writes on from
    it, behind its namespace's head: once refused as a race (`FencedWrite`).
    """
    found = on_both(both, replayed)
    assert isinstance(found, tuple)
    replay, fork, latest = found
    assert {"steps": ["first", "inner-0", "first", "inner-0", "inner-1"]} == replay
    assert fork == latest


def carried_over(make: MakeSaver, sqlite: SqliteSaver) -> tuple[object, ...]:
    """Copy a thread SqliteSaver wrote into a saver, checkpoint by checkpoint; run on."""
    saver = make()
    parent: str | None = None
    for saved in reversed(list(sqlite.list(THREAD))):
        conf: RunnableConfig = {
            "configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": parent}
        }
        saver.put(conf, saved.checkpoint, saved.metadata, saved.checkpoint["channel_versions"])
        parent = saved.checkpoint["id"]
    graph = line(saver)
    graph.update_state(THREAD, {"steps": ["x"]}, as_node="c")
    after = graph.get_state(THREAD)
    versions = after.config["configurable"]["checkpoint_id"], saver.get_tuple(THREAD)
    assert versions[1] is not None
    return after.values, {type(v) for v in versions[1].checkpoint["channel_versions"].values()}


def test_a_thread_written_by_sqlite_saver_goes_on_on_cairn_saver(
    both: dict[str, MakeSaver],
) -> None:
    """Threads moved from SqliteSaver carry string versions: the next ones are strings too.

    Once `get_next_version` raised `NotImplementedError` on them.
    """
    with SqliteSaver.from_conn_string(":memory:") as sqlite:
        line(sqlite).invoke({"steps": []}, THREAD)
        found = {name: carried_over(make, sqlite) for name, make in both.items()}
    assert found["memory"] == found["cairn"]
    assert ({"steps": ["a", "b", "c", "x"]}, {str}) == found["cairn"]


def test_a_version_no_put_stored_reads_as_no_value_and_a_lost_blob_still_fails(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    """A channel version nobody stored is a channel without a value, as LangGraph reads it.

    A migrated thread's renamed channels carry such versions. A blob a put did store and
    that is gone is damage, and the read says so.
    """
    saver = CairnSaver(redis_client, tmp_path / "archive")
    first = empty_checkpoint() | {"id": "1f000000-0000-6000-8000-000000000001"}
    first["channel_versions"] = {"kept": 1}
    first["channel_values"] = {"kept": "v"}
    conf: RunnableConfig = {"configurable": {"thread_id": "m", "checkpoint_ns": ""}}
    stored = saver.put(conf, first, {}, {"kept": 1})
    second = empty_checkpoint() | {"id": "1f000000-0000-6000-8000-000000000002"}
    second["channel_versions"] = {"kept": 1, "renamed": 7}  # 7: written by no put
    second["channel_values"] = {}
    stored = saver.put(stored, second, {}, {})
    found = saver.get_tuple(stored)
    assert found is not None
    assert {"kept": "v"} == found.checkpoint["channel_values"]

    where = ThreadKeys("m", "")
    lost = list(redis_client.scan_iter(match=where.base + "b:*"))
    assert 1 == len(lost)
    redis_client.delete(*lost)
    with pytest.raises(RecordNotFound):
        saver.get_tuple(stored)


def test_listing_a_threads_history_grants_no_fork(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    """A writer that read the head and listed the history is still fenced past a new head.

    Only a read by id, or a list before a named checkpoint, is going back in time.
    """
    saver = CairnSaver(redis_client, tmp_path / "archive")
    graph = line(saver)
    graph.invoke({"steps": []}, THREAD)
    head = saver.get_tuple(THREAD)
    assert head is not None
    history = list(saver.list(THREAD))
    assert head.config == history[0].config
    graph.invoke({"steps": []}, THREAD)  # another run moves the head on
    stale = head.checkpoint | {"id": "1fffffff-0000-6000-8000-000000000000"}
    with pytest.raises(FencedWrite):
        saver.put(head.config, stale, head.metadata, {})
