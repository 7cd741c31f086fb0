"""`CairnSaver` under LangGraph: its conformance suite, real graphs, races, the archive.

Every test runs real LangGraph graphs or LangGraph's own conformance suite against a real
redis-server and a real archive directory.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any, TypedDict, TypeVar, cast

import pytest
import redis
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, Checkpoint, CheckpointTuple
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command, interrupt

from storage.backends.redis import connect
from storage.errors import CorruptCheckpoint, FencedWrite
from storage.langgraph_saver import CairnSaver
from storage.redis_server import RedisServer

S = TypeVar("S", bound=BaseCheckpointSaver[Any])


class Chat(TypedDict):
    """A chat's state: its messages, merged by `add_messages`."""

    messages: Annotated[list[AnyMessage], add_messages]


def chat(saver: BaseCheckpointSaver[Any]) -> CompiledStateGraph[Chat, None, Chat, Chat]:
    """A one-node graph that answers every message, checkpointed by `saver`."""

    def reply(state: Chat) -> dict[str, list[AnyMessage]]:
        n = len(state["messages"])
        return {"messages": [AIMessage(content=f"reply to message {n}", id=f"ai-{n}")]}

    builder = StateGraph(Chat)
    builder.add_node("reply", reply)
    builder.add_edge(START, "reply")
    builder.add_edge("reply", END)
    return builder.compile(checkpointer=saver)


def say(graph: CompiledStateGraph[Chat, None, Chat, Chat], thread: str, n: int) -> None:
    """One turn of the chat on `thread`."""
    config: RunnableConfig = {"configurable": {"thread_id": thread}}
    graph.invoke({"messages": [HumanMessage(content=f"message {n}", id=f"human-{n}")]}, config)


@pytest.fixture
def saver(redis_client: redis.Redis, tmp_path: Path) -> CairnSaver:
    """A saver on the session's Redis (flushed) and an archive of the test's own."""
    return CairnSaver(redis_client, tmp_path / "archive")


def conformance(server: RedisServer, tmp_path: Path, archive_everything: bool) -> dict[str, Any]:
    """Run LangGraph's conformance suite on CairnSaver; return capability → result."""
    fresh = itertools.count()

    class Archiving(CairnSaver):
        """Moves all but the newest checkpoint of a thread to disk after every write."""

        def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: Any,
                new_versions: Any) -> RunnableConfig:  # fmt: skip
            stored = super().put(config, checkpoint, metadata, new_versions)
            self.archive(str(stored["configurable"]["thread_id"]), keep=1)
            return stored

        def put_writes(self, config: RunnableConfig, writes: Any, task_id: str,
                       task_path: str = "") -> None:  # fmt: skip
            super().put_writes(config, writes, task_id, task_path)
            self.archive(str(config["configurable"]["thread_id"]), keep=1)

    @checkpointer_test(name="CairnSaver")
    async def factory() -> AsyncIterator[CairnSaver]:
        client = connect(server.url)
        client.flushall()
        kind = Archiving if archive_everything else CairnSaver
        yield kind(client, tmp_path / f"archive-{next(fresh)}")
        client.close()

    report = asyncio.run(validate(factory))
    report.print_report()
    return dict(report.results)


@pytest.mark.parametrize("archive_everything", [False, True], ids=["hot", "archived"])
def test_langgraphs_conformance_suite_passes_every_capability(
    own_redis: RedisServer, tmp_path: Path, archive_everything: bool
) -> None:
    """All eight capabilities, base and extended; also with every older checkpoint on disk."""
    results = conformance(own_redis, tmp_path, archive_everything)
    assert {"put", "put_writes", "get_tuple", "list", "delete_thread", "delete_for_runs",
            "copy_thread", "prune"} == set(results)  # fmt: skip
    failed = {cap: r.failures for cap, r in results.items() if r.passed is not True}
    assert {} == failed


def racing(kind: type[S]) -> type[S]:
    """`kind`, whose first read in each thread but the main one waits for another's."""
    barrier = threading.Barrier(2, timeout=10)
    seen = threading.local()

    class Racing(kind):  # type: ignore[valid-type,misc]
        def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
            found: CheckpointTuple | None = super().get_tuple(config)
            racer = threading.current_thread() is not threading.main_thread()
            if racer and not getattr(seen, "read", False):
                seen.read = True
                barrier.wait()  # both writers have read the same head
            return found

    return cast(type[S], Racing)


def race(saver: BaseCheckpointSaver[Any]) -> list[BaseException]:
    """Two turns of one thread at once (both read the same head); what each raised."""
    graph = chat(saver)
    say(graph, "race", 0)
    errors: list[BaseException] = []

    def turn(n: int) -> None:
        try:
            say(graph, "race", n)
        except Exception as exc:  # noqa: BLE001 - collected for the test to inspect
            errors.append(exc)

    threads = [threading.Thread(target=turn, args=(n,)) for n in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def parents(saver: BaseCheckpointSaver[Any], thread: str) -> list[str | None]:
    """The parent of every checkpoint of the thread's root namespace."""
    config: RunnableConfig = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    return [
        None if t.parent_config is None else t.parent_config["configurable"]["checkpoint_id"]
        for t in saver.list(config)
    ]


def test_two_writers_racing_on_one_thread_get_an_error_not_a_silent_fork(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    """InMemorySaver forks the thread in two without a word; CairnSaver refuses the second."""
    memory = racing(InMemorySaver)()
    assert [] == race(memory)
    forked = parents(memory, "race")
    assert len(forked) != len(set(forked)), "two checkpoints share a parent: a fork"

    cairn = racing(CairnSaver)(redis_client, tmp_path / "archive")
    errors = race(cairn)
    assert 1 == len(errors)
    assert isinstance(errors[0], FencedWrite)
    assert "another writer extended this thread" in str(errors[0])
    linear = parents(cairn, "race")
    assert len(linear) == len(set(linear)), "one history: no checkpoint has two children"


def test_time_travel_forks_on_purpose_and_fences_the_old_branch(
    saver: CairnSaver, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """Resuming from an older checkpoint by id forks; a writer of the old head is refused."""
    graph = chat(saver)
    for n in range(3):
        say(graph, "travel", n)
    config: RunnableConfig = {"configurable": {"thread_id": "travel"}}
    history = list(graph.get_state_history(config))
    head, old = history[0].config, history[3].config
    stale = CairnSaver(redis_client, tmp_path / "archive").get_tuple(head)  # reads the head
    assert stale is not None
    graph.invoke({"messages": [HumanMessage(content="again", id="again")]}, old)
    assert ["again", "reply to message"] == [
        str(m.content)[:16] for m in graph.get_state(config).values["messages"][-2:]
    ]
    with pytest.raises(FencedWrite):
        saver.put(head, stale.checkpoint | {"id": "ffffffff-0000-6000-8000-000000000000"},
                  stale.metadata, {})  # fmt: skip


def test_a_long_chat_is_stored_in_pieces_and_reads_back_as_with_langgraphs_saver(
    saver: CairnSaver, redis_client: redis.Redis
) -> None:
    """60 turns: the same state as InMemorySaver's, stored in pieces.

    Of the 120 messages, a version of `messages` stores what its step added and folds in
    the newest pieces no bigger than that: over the thread's life each message is written
    O(log n) times, not once per step, and a read joins O(log n) pieces.
    """
    graphs = chat(saver), chat(InMemorySaver())
    for n in range(60):
        for graph in graphs:
            say(graph, "long", n)
    config: RunnableConfig = {"configurable": {"thread_id": "long"}}
    ours, theirs = (g.get_state(config).values["messages"] for g in graphs)
    assert 120 == len(ours)
    assert theirs == ours
    keys = list(redis_client.scan_iter(match="cairn:lg:{long}:b:_:messages:*"))
    records = [saver._open(cast(bytes, redis_client.get(k)), "blob") for k in keys]
    held = [len(saver.serde.loads_typed((r["t"], r["d"]))) for r in records]
    assert len(records) >= 120  # a version per step that changed the list
    assert sum(held) <= 8 * 120  # each message written at most ~log2(120) + 1 times
    assert 7 >= sum(1 for r in records if "base" not in r)  # whole at 1, 2, 4, … 64 only
    assert max(len(r.get("base", ())) for r in records) <= 7  # pieces a read joins


def test_a_damaged_record_is_refused_with_its_name(
    saver: CairnSaver, redis_client: redis.Redis
) -> None:
    """One flipped byte of a stored checkpoint: the read fails, naming it; nothing is guessed."""
    say(chat(saver), "damaged", 0)
    config: RunnableConfig = {"configurable": {"thread_id": "damaged"}}
    head = saver.get_tuple(config)
    assert head is not None
    key = f"cairn:lg:{{damaged}}:cp:_:{head.config['configurable']['checkpoint_id']}"
    data = bytearray(cast(bytes, redis_client.get(key)))
    data[len(data) // 2] ^= 0x01
    redis_client.set(key, bytes(data))
    with pytest.raises(CorruptCheckpoint, match="langgraph checkpoint damaged"):
        saver.get_tuple(config)


def test_archived_checkpoints_read_back_from_disk_and_the_chat_goes_on(
    saver: CairnSaver, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """Archive all but two checkpoints: history reads the same from disk.

    Redis keeps two, the next turn extends the head, and deleting the thread deletes the
    disk copy too.
    """
    graph = chat(saver)
    for n in range(8):
        say(graph, "archived", n)
    config: RunnableConfig = {"configurable": {"thread_id": "archived"}}
    before = [(s.config, s.values, s.metadata) for s in graph.get_state_history(config)]
    moved = saver.archive("archived", keep=2)
    assert len(before) - 2 == moved
    assert 2 == redis_client.zcard("cairn:lg:{archived}:ids:_")
    after = [(s.config, s.values, s.metadata) for s in graph.get_state_history(config)]
    assert before == after
    say(graph, "archived", 8)
    assert 18 == len(graph.get_state(config).values["messages"])
    saver.delete_thread("archived")
    assert [] == list(saver.list(config))
    assert not any((tmp_path / "archive").rglob("*.rec"))


def workflow(saver: BaseCheckpointSaver[Any]) -> tuple[list[str], int]:
    """A subgraph, two parallel branches, an interrupt resumed twice and a state edit.

    Returns the final messages and how many checkpoints the history holds.
    """

    def ask(state: Chat) -> dict[str, list[AnyMessage]]:
        answer = interrupt("approve?")
        return {"messages": [AIMessage(content=f"human said {answer}", id=f"said-{answer}")]}

    def node(text: str) -> Any:
        return lambda state: {
            "messages": [AIMessage(content=text, id=f"{text}-{len(state['messages'])}")]
        }

    inner = StateGraph(Chat)
    inner.add_node("inner", node("from the subgraph"))
    inner.add_edge(START, "inner")
    inner.add_edge("inner", END)
    outer = StateGraph(Chat)
    outer.add_node("sub", inner.compile())
    outer.add_node("left", node("left"))
    outer.add_node("right", node("right"))
    outer.add_node("ask", ask)
    outer.add_edge(START, "sub")
    for branch in ("left", "right"):
        outer.add_edge("sub", branch)
        outer.add_edge(branch, "ask")
    outer.add_edge("ask", END)
    graph = outer.compile(checkpointer=saver)
    config: RunnableConfig = {"configurable": {"thread_id": "workflow"}}
    graph.invoke({"messages": [HumanMessage(content="hi", id="hi")]}, config)
    assert ("ask",) == graph.get_state(config).next
    graph.invoke(Command(resume="yes"), config)
    graph.update_state(config, {"messages": [AIMessage(content="edited", id="edited")]},
                       as_node="ask")  # fmt: skip
    graph.invoke({"messages": [HumanMessage(content="again", id="again")]}, config)
    graph.invoke(Command(resume="no"), config)
    messages = [str(m.content) for m in graph.get_state(config).values["messages"]]
    return messages, len(list(graph.get_state_history(config)))


def test_hot_keep_archives_as_the_chat_goes_and_history_stays_whole(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    """With hot_keep=3 Redis never holds more than six checkpoints of the thread.

    Every one of them reads back, from Redis or the disk, as InMemorySaver has it.
    """
    saver = CairnSaver(redis_client, tmp_path / "archive", hot_keep=3)
    graphs = chat(saver), chat(InMemorySaver())
    config: RunnableConfig = {"configurable": {"thread_id": "kept"}}
    for n in range(15):
        for graph in graphs:
            say(graph, "kept", n)
        assert redis_client.zcard("cairn:lg:{kept}:ids:_") <= 6
    ours, theirs = ([s.values for s in g.get_state_history(config)] for g in graphs)
    assert 45 == len(ours)
    assert theirs == ours


def test_subgraphs_branches_interrupts_and_edits_run_as_on_langgraphs_saver(
    saver: CairnSaver,
) -> None:
    """Fencing does not get in the way of LangGraph's own ways of writing a thread."""
    ours, theirs = workflow(saver), workflow(InMemorySaver())
    assert theirs == ours
    assert "human said no" == ours[0][-1]


def test_an_async_graph_runs_on_the_saver(saver: CairnSaver) -> None:
    """Ainvoke and aget_state go through the saver's async methods."""

    async def chat_twice() -> list[str]:
        graph = chat(saver)
        config: RunnableConfig = {"configurable": {"thread_id": "async"}}
        for n in range(2):
            await graph.ainvoke({"messages": [HumanMessage(content=f"m{n}", id=f"m{n}")]}, config)
        return [str(m.content) for m in (await graph.aget_state(config)).values["messages"]]

    assert ["m0", "reply to message 1", "m1", "reply to message 3"] == asyncio.run(chat_twice())
