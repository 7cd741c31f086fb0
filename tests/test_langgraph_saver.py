"""`CairnSaver` under LangGraph: its conformance suite, real graphs, races, the archive.

Every test runs real LangGraph graphs or LangGraph's own conformance suite against a real
redis-server and a real archive directory.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import operator
import shutil
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Annotated, Any, TypedDict, TypeVar, cast

import pytest
import redis
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    Checkpoint,
    CheckpointTuple,
    empty_checkpoint,
)
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command, interrupt

from cairn.errors import CorruptCheckpoint, FencedWrite
from cairn.storage.backends.redis import connect
from cairn.storage.keys import ThreadKeys
from cairn.storage.langgraph import CairnSaver
from cairn.testing.redis_server import RedisServer

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
    keys = [k.decode() for k in redis_client.scan_iter(match="cairn:lg:{long}:b:_:messages:*")]
    records = list(saver._blobs(ThreadKeys("long", ""), keys).values())
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


# Branches: time travel and forks read back what each branch wrote ---------------------------


class Log(TypedDict):
    """A state with a list channel (`operator.add`), a chat and a scalar."""

    log: Annotated[list[str], operator.add]
    messages: Annotated[list[AnyMessage], add_messages]
    count: int


def logger(saver: BaseCheckpointSaver[Any]) -> CompiledStateGraph[Log, None, Log, Log]:
    """A model node whose every answer is new, inside a subgraph, then a counter node.

    The answers are numbered per graph, so a replay produces a different answer than the
    run it replays, as a real model would.
    """
    calls = itertools.count(1)

    def llm(state: Log) -> dict[str, Any]:
        n = next(calls)
        return {"log": [f"answer #{n}"], "messages": [AIMessage(content=f"#{n}", id=f"ai-{n}")]}

    inner = StateGraph(Log)
    inner.add_node("llm", llm)
    inner.add_edge(START, "llm")
    inner.add_edge("llm", END)
    outer = StateGraph(Log)
    outer.add_node("think", inner.compile())
    outer.add_node("tally", lambda state: {"count": state.get("count", 0) + 1})
    outer.add_edge(START, "think")
    outer.add_edge("think", "tally")
    outer.add_edge("tally", END)
    return outer.compile(checkpointer=saver)


def render(value: Any) -> Any:
    """A value as comparable plain data (messages by type, content and id)."""
    if isinstance(value, BaseMessage):
        return {"type": value.type, "content": value.content, "id": value.id}
    if isinstance(value, list):
        return [render(v) for v in value]
    if isinstance(value, dict):
        return {k: render(v) for k, v in value.items()}
    return value


def every_checkpoint(saver: BaseCheckpointSaver[Any], thread: str) -> list[Any]:
    """Every checkpoint of the thread, all branches and namespaces, in the order written.

    Each is its namespace's kind ("" or the subgraph's node), its values, its parent's
    position and its pending writes: the same on two savers that ran the same operations,
    whatever ids they drew.
    """
    found = sorted(
        saver.list({"configurable": {"thread_id": thread}}),
        key=lambda t: t.config["configurable"]["checkpoint_id"],
    )
    position = {t.config["configurable"]["checkpoint_id"]: n for n, t in enumerate(found)}
    return [
        (
            t.config["configurable"]["checkpoint_ns"].split(":")[0],
            render(t.checkpoint["channel_values"]),
            None if t.parent_config is None
            else position[t.parent_config["configurable"]["checkpoint_id"]],
            sorted((ch, repr(render(v))) for _, ch, v in t.pending_writes or []),
        )
        for t in found
    ]  # fmt: skip


def branch_out(saver: Callable[[], BaseCheckpointSaver[Any]], turns: int = 12) -> None:
    """Grow a thread, replay from old checkpoints, fork with `update_state`, fork the fork.

    `saver()` is asked anew for each operation: one saver, or a new one each time (a
    process that remembers nothing of earlier puts).
    """
    config: RunnableConfig = {"configurable": {"thread_id": "branches"}}

    def graph() -> CompiledStateGraph[Log, None, Log, Log]:
        return logger(saver())

    for n in range(turns):
        turn = {"log": [f"q{n}"], "messages": [HumanMessage(f"q{n}", id=f"q{n}")]}
        graph().invoke(cast(Log, turn), config)
    history = list(graph().get_state_history(config))
    graph().invoke(None, history[1].config)  # replay the last step: a new answer
    graph().invoke(None, history[len(history) // 2].config)  # replay from the middle
    forked = graph().update_state(history[4].config, {"log": ["edited"], "count": 100})
    graph().invoke(None, forked)
    for n in range(3):  # the fork goes on: its lists grow from the shared prefix
        graph().invoke(cast(Log, {"log": [f"fork q{n}"]}), config)
    fork_history = list(graph().get_state_history(config))
    again = graph().update_state(fork_history[2].config, {"log": ["edited again"]},
                                 as_node="tally")  # fmt: skip
    graph().invoke(cast(Log, {"log": ["last"]}), again)


def test_a_replay_does_not_change_what_the_replayed_branch_reads(saver: CairnSaver) -> None:
    """LangGraph's replay from an older checkpoint leaves the original run's final state be."""

    class State(TypedDict):
        log: Annotated[list[str], operator.add]

    def run(saver: BaseCheckpointSaver[Any]) -> list[str]:
        calls = itertools.count(1)
        builder = StateGraph(State)
        builder.add_node("llm", lambda s: {"log": [f"answer #{next(calls)}"]})
        builder.add_edge(START, "llm")
        builder.add_edge("llm", END)
        graph = builder.compile(checkpointer=saver)
        config: RunnableConfig = {"configurable": {"thread_id": "t"}}
        graph.invoke({"log": ["q"]}, config)
        final, before_llm = list(graph.get_state_history(config))[:2]
        graph.invoke(None, before_llm.config)
        return cast(list[str], graph.get_state(final.config).values["log"])

    assert ["q", "answer #1"] == run(InMemorySaver()) == run(saver)


@pytest.mark.parametrize("fresh", [False, True], ids=["one-saver", "a-saver-per-call"])
def test_every_branch_reads_back_what_it_wrote_as_on_langgraphs_saver(
    redis_client: redis.Redis, tmp_path: Path, fresh: bool
) -> None:
    """Replays, forks and a fork of a fork, with a subgraph and lists kept in pieces.

    Every checkpoint of every branch reads back as InMemorySaver has it, hot and after
    all but two checkpoints of each namespace moved to the archive.
    """
    memory = InMemorySaver()
    branch_out(lambda: memory)
    one = CairnSaver(redis_client, tmp_path / "archive")
    branch_out((lambda: CairnSaver(redis_client, tmp_path / "archive")) if fresh else lambda: one)
    expected = every_checkpoint(memory, "branches")
    assert len(expected) > 60
    assert {"", "think"} == {ns for ns, *_ in expected}
    assert expected == every_checkpoint(one, "branches")
    keys = [k.decode() for k in redis_client.scan_iter(match="cairn:lg:{branches}:b:_:log:*")]
    stored = list(one._blobs(ThreadKeys("branches", ""), keys).values())
    assert any("base" in blob for blob in stored), "the log is kept in pieces"
    assert one.archive("branches", keep=2) > 50
    assert expected == every_checkpoint(CairnSaver(redis_client, tmp_path / "archive"),
                                         "branches")  # fmt: skip


def test_a_put_never_overwrites_a_stored_record_with_other_bytes(
    saver: CairnSaver, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint id put twice, or a blob key holding other bytes: refused, nothing moved.

    The same put again (redis-py retrying a command whose reply it lost) is a no-op.
    """
    graph = logger(saver)
    config: RunnableConfig = {"configurable": {"thread_id": "once"}}
    graph.invoke(cast(Log, {"log": ["q"]}), config)
    head = saver.get_tuple(config)
    assert head is not None
    child = head.checkpoint | {"id": "ffffffff-0000-6000-8000-000000000001"}
    child["channel_versions"] = {**child["channel_versions"], "log": 7}
    child["channel_values"] = {**child["channel_values"], "log": ["q", "child"]}
    put_script = saver._put

    def sent_twice(**call: Any) -> Any:
        put_script(**call)  # as redis-py resends a command whose reply it lost
        return put_script(**call)

    monkeypatch.setattr(saver, "_put", sent_twice)
    stored = saver.put(head.config, child, head.metadata, {"log": 7})
    monkeypatch.undo()
    before = every_checkpoint(saver, "once")
    changed = child | {"channel_values": {**child["channel_values"], "log": ["other"]}}
    with pytest.raises(FencedWrite, match="holds another value"):
        saver.put(head.config, changed, head.metadata, {"log": 7})
    with pytest.raises(FencedWrite, match="stored already with other contents"):
        saver.put(head.config, child, head.metadata | {"step": 99}, {"log": 7})
    grandchild = child | {"id": "ffffffff-0000-6000-8000-000000000002"}
    grandchild["channel_versions"] = {**child["channel_versions"], "log": 8}
    key = f"cairn:lg:{{once}}:b:_:log:8@{grandchild['id']}"
    redis_client.set(key, b"another writer's bytes")
    with pytest.raises(FencedWrite, match="holds another value"):
        saver.put(stored, grandchild, head.metadata, {"log": 8})
    assert b"another writer's bytes" == redis_client.get(key)
    assert before == every_checkpoint(saver, "once")


# Threads stored by an earlier release, with plain integer versions --------------------------

LEGACY = Path(__file__).parent / "fixtures" / "langgraph-int-versions"


def load_legacy(client: redis.Redis, archive: Path) -> dict[str, Any]:
    """Put the fixture's Redis keys and archive in place; return what each checkpoint holds."""
    for key, stored in json.loads((LEGACY / "redis.json").read_text()).items():
        value = stored["value"]
        if stored["type"] == "string":
            client.set(key, base64.b64decode(value))
        elif stored["type"] == "zset":
            client.zadd(key, dict.fromkeys(value, 0))
        elif stored["type"] == "set":
            client.sadd(key, *value)
        else:
            client.hset(key, mapping={base64.b64decode(f): base64.b64decode(v)
                                      for f, v in value.items()})  # fmt: skip
    shutil.copytree(LEGACY / "archive", archive)
    return cast(dict[str, Any], json.loads((LEGACY / "expected.json").read_text()))


def stored_as(saver: CairnSaver) -> dict[str, Any]:
    """Every checkpoint the saver holds, in the fixture's shape."""
    found: dict[str, Any] = {}
    for t in saver.list(None):
        c = t.config["configurable"]
        found.setdefault(c["thread_id"], {}).setdefault(c["checkpoint_ns"], {})[
            c["checkpoint_id"]
        ] = {
            "values": json.loads(json.dumps(render(t.checkpoint["channel_values"]))),
            "versions": dict(t.checkpoint["channel_versions"]),
            "parent": t.parent_config["configurable"]["checkpoint_id"] if t.parent_config
            else None,
            "step": t.metadata.get("step"),
            "writes": len(t.pending_writes or []),
        }  # fmt: skip
    return found


def test_threads_stored_with_integer_versions_read_back_and_go_on(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    """The fixture (a long chat, a list channel, a subgraph workflow; part archived).

    Every checkpoint reads back as it was written; the chat goes on, a replay forks the
    list thread from an archived checkpoint, and every stored checkpoint still reads the same.
    """
    expected = load_legacy(redis_client, tmp_path / "archive")
    saver = CairnSaver(redis_client, tmp_path / "archive")
    assert expected == stored_as(saver)
    say(chat(saver), "chat", 20)
    config: RunnableConfig = {"configurable": {"thread_id": "log"}}
    oldest = list(saver.list(config))[-4]  # in the archive, not in Redis
    replayed = StateGraph(LegacyLog)
    replayed.add_node("step", lambda s: {"log": ["replayed"], "count": -1})
    replayed.add_edge(START, "step")
    replayed.add_edge("step", END)
    replayed.compile(checkpointer=saver).invoke(None, oldest.config)
    now = stored_as(saver)
    for thread, namespaces in expected.items():
        for ns, checkpoints in namespaces.items():
            assert checkpoints == {i: now[thread][ns][i] for i in checkpoints}
    replay = saver.get_tuple(config)
    assert replay is not None
    old_log, new_log = oldest.checkpoint["channel_values"]["log"], replay.checkpoint[
        "channel_values"]["log"]  # fmt: skip
    assert (old_log, "replayed") == (new_log[: len(old_log)], new_log[-1])
    messages = chat(saver).get_state({"configurable": {"thread_id": "chat"}}).values["messages"]
    assert ["message 20", "reply to message 41"] == [m.content for m in messages[-2:]]


class LegacyLog(TypedDict):
    """The fixture's list thread: a log and a count."""

    log: Annotated[list[str], operator.add]
    count: int


def test_no_two_names_share_a_slot(saver: CairnSaver) -> None:
    """The namespace "_" is not the root namespace; a thread named like a digest is its own.

    Each reads back its own checkpoint.
    """
    digest_of_a_b = ThreadKeys("a/b", "").base.removeprefix("cairn:lg:{").removesuffix("}:")
    places = [("t", ""), ("t", "_"), ("a/b", ""), (digest_of_a_b, "")]
    assert len(places) == len({ThreadKeys(*p).head() for p in places})
    for thread, ns in places:
        config: RunnableConfig = {"configurable": {"thread_id": thread, "checkpoint_ns": ns}}
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"where": f"{thread}|{ns}"}
        checkpoint["channel_versions"] = {"where": 1}
        saver.put(config, checkpoint, {}, {"where": 1})
    for thread, ns in places:
        config = {"configurable": {"thread_id": thread, "checkpoint_ns": ns}}
        found = saver.get_tuple(config)
        assert found is not None
        assert {"where": f"{thread}|{ns}"} == found.checkpoint["channel_values"]
