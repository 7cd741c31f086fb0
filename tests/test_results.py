"""Typed results: a task declares a JSON Schema, and the agent that finishes gives a value.

On a real redis-server: the `finish` tool takes the value and shows the model its schema;
a value that does not fit is a tool error saying where and why, and the agent goes on;
a value that fits is kept in the agent's LC, so a restore and a fork carry the result of
their own branch. `Task.result()` and `cairn result` read it back. A schema Cairn cannot
check, or one that points outside itself, is refused at submit, and nothing is fetched.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import jsonschema
import pytest
from pydantic import BaseModel, JsonValue

from cairn import Client, TaskSpec
from cairn.agents.models.base import ModelReply, ModelRequest, ToolSchema
from cairn.agents.models.scripted import ScriptedModel
from cairn.agents.results import MAX_DEPTH, MAX_RESULT_BYTES, check_value
from cairn.agents.spec import AgentSpec, parse_model
from cairn.agents.task import start_task
from cairn.coordinator.spec import load_spec
from cairn.coordinator.views import TaskResult, task_result
from cairn.errors import InvalidSpec, NoResult, ToolError
from cairn.storage.records import AgentResult, AgentState
from cairn.storage.store import CheckpointStore
from cairn.testing.redis_server import RedisServer
from tests.agent_harness import drive, superstep
from tests.cli_harness import cli_runner
from tests.cluster import Cluster

ANSWER: dict[str, JsonValue] = {
    "type": "object",
    "properties": {"answer": {"type": "integer"}, "why": {"type": "string"}},
    "required": ["answer"],
    "additionalProperties": False,
}


def finish(result: JsonValue, summary: str = "done") -> dict[str, object]:
    """A scripted turn that calls `finish` with `result`."""
    call = {"name": "finish", "args": {"summary": summary, "result": result}}
    return {"say": "Done.", "tools": [call]}


def agent(name: str, *turns: Mapping[str, object]) -> dict[str, object]:
    """A scripted agent playing `turns`."""
    return {"name": name, "model": "scripted", "script": list(turns)}


def spec_of(*agents: Mapping[str, object], result: object = ANSWER) -> TaskSpec:
    """A task of `agents` whose result has the schema `result`."""
    fields = {"name": "answer", "goal": "Find the answer.", "agents": list(agents)}
    return parse_model(TaskSpec, fields | {"result": result}, "task spec")


def started(store: CheckpointStore, spec: TaskSpec, task: str = "answer") -> str:
    """Start `spec` as task `task` (no coordinator: the tests drive its supersteps)."""
    start_task(store, spec.record(task), {})
    return task


def last_message(store: CheckpointStore, task: str, agent: str) -> tuple[bool, str | None]:
    """Whether the agent's last message is an error, and its text, at the latest GC."""
    gc = store.latest_gc(task)
    assert gc is not None
    ref = gc.members[agent]
    message = store.read_state(task, agent, ref.id, ref.checksum).messages[-1]
    return message.error, message.content


def given(store: CheckpointStore, task: str, agent: str) -> AgentResult | None:
    """The result the agent's LC at the latest GC holds."""
    gc = store.latest_gc(task)
    assert gc is not None
    ref = gc.members[agent]
    return store.read_state(task, agent, ref.id, ref.checksum).result


# the finish tool ---------------------------------------------------------------------------
def test_a_value_that_does_not_fit_is_a_tool_error_and_the_agent_goes_on(
    real_store: CheckpointStore, tmp_path: Path
) -> None:
    """Told where and why, not finished; the value that fits next finishes it and is kept."""
    spec = spec_of(agent("solver", finish({"answer": "forty-two"}), finish({"answer": 42})))
    task = started(real_store, spec)
    first = superstep(real_store, task, tmp_path / "cache")
    assert first is not None
    assert AgentState.ACTIVE == first.statuses["solver"]
    error, text = last_message(real_store, task, "solver")
    assert error
    assert (
        "error: result does not fit the task's schema: at $.answer: 'forty-two' is not of "
        "type 'integer'"
    ) == text
    assert given(real_store, task, "solver") is None

    final = drive(real_store, task, tmp_path / "cache")
    assert AgentState.FINISHED == final.statuses["solver"]
    assert AgentResult(value={"answer": 42}, superstep=2) == given(real_store, task, "solver")
    expected = TaskResult(value={"answer": 42}, agent="solver", superstep=2,
                          checkpoint=final.number)  # fmt: skip
    assert expected == task_result(real_store, task)


def test_a_finish_without_the_result_is_a_tool_error_too(
    real_store: CheckpointStore, tmp_path: Path
) -> None:
    """A task that declares a result is not finished by a bare `finish`."""
    bare = {"tools": [{"name": "finish", "args": {"summary": "done"}}]}
    task = started(real_store, spec_of(agent("solver", bare)))
    gc = superstep(real_store, task, tmp_path / "cache")
    assert gc is not None
    assert AgentState.ACTIVE == gc.statuses["solver"]
    assert (True, "error: finish: missing required argument 'result'") == (
        last_message(real_store, task, "solver")
    )


class Recording:
    """The scripted model, keeping the tools each request offered."""

    def __init__(self, spec: AgentSpec, seen: list[list[ToolSchema]]) -> None:
        self.model, self.seen = ScriptedModel(spec.script), seen

    def complete(self, request: ModelRequest) -> ModelReply:
        """Answer as the script says; keep the tools on offer."""
        self.seen.append(list(request.tools))
        return self.model.complete(request)


class Verdict(BaseModel):
    """A nested part of the result: its schema goes under `$defs`."""

    passed: bool
    notes: list[str] = []


class Review(BaseModel):
    """A pydantic model as a task's result."""

    score: int
    verdict: Verdict


def test_a_pydantic_model_is_the_schema_the_model_sees_and_the_value_read_back_as_it(
    real_store: CheckpointStore, redis_server: RedisServer, tmp_path: Path
) -> None:
    """`result=Review` declares its JSON Schema; `finish` shows it (its `$defs` resolving)."""
    value: dict[str, JsonValue] = {"score": 9, "verdict": {"passed": True, "notes": ["tidy"]}}
    spec = TaskSpec(
        name="review",
        goal="Review it.",
        agents=[AgentSpec.model_validate(agent("critic", finish(value)))],
        result=Review,
    )
    assert Review.model_json_schema() == spec.result
    task = started(real_store, spec, "review")
    seen: list[list[ToolSchema]] = []
    drive(real_store, task, tmp_path / "cache", models=lambda s: Recording(s, seen))

    offered = {tool.name: tool for tool in seen[0]}
    parameters = offered["finish"].parameters
    assert ["result"] == parameters["required"]
    jsonschema.Draft202012Validator.check_schema(parameters)
    checker = jsonschema.Draft202012Validator(parameters)
    assert checker.is_valid({"summary": "ok", "result": value})
    assert not checker.is_valid({"summary": "ok", "result": {"score": 9, "verdict": {}}})
    assert "finish" not in {t.name for t in seen[0] if t is not offered["finish"]}

    with Client(redis_url=redis_server.url, archive_dir=tmp_path / "archive") as client:
        handle = client.task(task)
        assert value == handle.result()
        assert Review.model_validate(value) == handle.result(Review)


def test_the_latest_result_is_the_tasks_and_in_one_superstep_the_later_agent_in_order(
    real_store: CheckpointStore, tmp_path: Path
) -> None:
    """Agents that finish later give the task's result; at a tie, as the barrier's merge."""
    spec = spec_of(
        agent("first", finish({"answer": 1}), {"say": "rest"}),
        agent("second", finish({"answer": 2})),
        agent("third", {"tools": [{"name": "list_files"}]}, finish({"answer": 3})),
    )
    task = started(real_store, spec)
    gc = superstep(real_store, task, tmp_path / "cache")
    assert gc is not None
    assert ("second", {"answer": 2}) == (
        task_result(real_store, task).agent,
        task_result(real_store, task).value,
    )
    drive(real_store, task, tmp_path / "cache")
    found = task_result(real_store, task)
    assert ("third", {"answer": 3}, 2) == (found.agent, found.value, found.superstep)


# hostile values ---------------------------------------------------------------------------
def nested(depth: int) -> JsonValue:
    """A value of lists `depth` deep."""
    value: JsonValue = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_a_huge_or_deeply_nested_value_is_refused_in_one_line(
    real_store: CheckpointStore, tmp_path: Path
) -> None:
    """Refused before any schema looks at it; the agent is told, and is not finished."""
    huge: dict[str, JsonValue] = {"answer": 1, "why": "x" * (MAX_RESULT_BYTES + 1)}
    anything: dict[str, JsonValue] = {}  # any value fits: only the bounds refuse
    spec = spec_of(agent("solver", finish(huge), finish(nested(MAX_DEPTH + 1))), result=anything)
    task = started(real_store, spec)
    superstep(real_store, task, tmp_path / "cache")
    error, text = last_message(real_store, task, "solver")
    assert error
    assert text is not None
    assert text.startswith("error: result is ")
    assert text.endswith(f" bytes as JSON; at most {MAX_RESULT_BYTES}")
    gc = superstep(real_store, task, tmp_path / "cache")
    assert gc is not None
    assert AgentState.ACTIVE == gc.statuses["solver"]
    assert (True, f"error: result nests deeper than {MAX_DEPTH} levels") == last_message(
        real_store, task, "solver"
    )
    check_value(anything, nested(MAX_DEPTH))  # as deep as may be: no error


def test_a_reason_is_bounded_and_one_line_whatever_the_value() -> None:
    """A long, many-lined value in the reason is cut: the model reads a line, not the value."""
    with pytest.raises(ToolError) as caught:
        check_value(ANSWER, {"answer": "line\n" * 10_000})
    reason = str(caught.value)
    assert "\n" not in reason
    assert len(reason) <= 400
    assert reason.startswith("result does not fit the task's schema: at $.answer: ")


# schemas at submit ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("schema", "said"),
    [
        ({"type": "integre"}, "result: not a valid JSON Schema: at $.type: "),
        ({"type": "object", "properties": {"a": {"$ref": "#/$defs/gone"}}},
         "result: $ref '#/$defs/gone' cannot be resolved in the schema"),
        ({"$schema": "https://example.com/my-dialect"},
         "result: $schema 'https://example.com/my-dialect' is not a JSON Schema "
         "dialect Cairn knows"),
        ({"items": nested(MAX_DEPTH + 1)}, f"result: nests deeper than {MAX_DEPTH}"),
    ],
)  # fmt: skip
def test_a_schema_cairn_cannot_check_is_refused_at_submit_in_one_line(
    schema: dict[str, JsonValue], said: str
) -> None:
    """The error names the field (`result`) and what is wrong."""
    with pytest.raises(InvalidSpec) as caught:
        spec_of(agent("solver"), result=schema)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"invalid task spec: {said}")


def test_a_yaml_spec_declares_its_result_and_a_bad_one_names_the_field(tmp_path: Path) -> None:
    """`result:` in YAML is the schema; a schema that is not a mapping is refused."""
    path = tmp_path / "task.yaml"
    path.write_text(
        "name: answer\ngoal: Find it.\nagents: [{name: solver, model: scripted}]\n"
        "result:\n  type: object\n  properties: {answer: {type: integer}}\n"
    )
    assert {"type": "object", "properties": {"answer": {"type": "integer"}}} == (
        load_spec(path).result
    )
    path.write_text("name: answer\ngoal: Find it.\nagents: [{name: solver, model: scripted}]\n"
                    "result: [1, 2]\n")  # fmt: skip
    with pytest.raises(InvalidSpec, match=r"task.yaml:4:1: invalid task spec: result: "):
        load_spec(path)


class Counting(BaseHTTPRequestHandler):
    """Serves a schema to anyone who asks, and counts who did."""

    asked: list[str] = []  # noqa: RUF012 - shared by the server's handlers on purpose

    def do_GET(self) -> None:
        """Answer with a schema any value fits."""
        Counting.asked.append(self.path)
        body = b"{}"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet."""


@pytest.fixture
def schema_server() -> Iterator[str]:
    """A local HTTP server that would serve a schema; its base URL."""
    Counting.asked = []
    server = HTTPServer(("127.0.0.1", 0), Counting)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


def test_a_schema_that_points_outside_itself_is_refused_and_nothing_is_fetched(
    schema_server: str,
) -> None:
    """A remote `$ref` is refused at submit; a validator given one anyway fetches nothing."""
    remote = f"{schema_server}/answer.json"
    with pytest.raises(InvalidSpec) as caught:
        spec_of(agent("solver"), result={"$ref": remote})
    assert str(caught.value).startswith(
        f"invalid task spec: result: $ref {remote!r} points outside the schema"
    )
    with pytest.raises(ToolError, match=r"cannot be resolved without fetching it"):
        check_value({"properties": {"a": {"$ref": remote}}}, {"a": 1})
    with pytest.raises(ToolError, match=r"cannot be resolved without fetching it"):
        check_value({"$ref": remote}, 1)
    assert [] == Counting.asked


# restore, fork, the facade and the command line, through a coordinator and a worker -------
def test_a_result_end_to_end_then_restored_away_and_forked_per_branch(
    cluster: Cluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The task succeeds with its result; restored to before it, none; each fork its own."""
    cluster.start_worker()
    write = {"tools": [{"name": "write_file", "args": {"path": "notes.md", "content": "hm\n"}},
                       {"name": "finish", "args": {"result": {"answer": "?"}}}]}  # fmt: skip
    source = cluster.tasks.submit(spec_of(agent("solver", write, finish({"answer": 42}))))
    final = cluster.drive(source)
    assert "succeeded" == final["status"]
    assert {"value": {"answer": 42}, "agent": "solver", "superstep": 2,
            "checkpoint": final["latest_checkpoint"]} == final["result"]  # fmt: skip
    env = {"CAIRN_REDIS_URL": cluster.server.url, "CAIRN_ARCHIVE_DIR": str(tmp_path / "archive"),
           "CAIRN_STATE_DIR": str(tmp_path / "state")}  # fmt: skip
    with Client(redis_url=cluster.server.url, archive_dir=tmp_path / "archive") as client:
        assert {"answer": 42} == client.task(source).result()
        with cli_runner(env, monkeypatch, capsys) as cairn:
            assert (0, {"answer": 42}) == _json(cairn("result", source, "--json"))

            cluster.coordinator.restorer.restore(source, to=1)  # before the value that fit
            with pytest.raises(NoResult, match=rf"^task {source} has no result yet"):
                client.task(source).result()
            code, out, err = cairn("result", source, "--json")
            assert (1, "") == (code, out)
            assert [f"cairn: task {source} has no result yet: no agent has finished with one"] == (
                err.splitlines()
            )
            assert "result" not in cluster.status(source)

            other = spec_of(agent("solver", write, finish({"answer": 7})))
            fork_before = cluster.tasks.fork(source, at=1, spec=other)
            fork_after = cluster.tasks.fork(source, at=2)
            assert {"answer": 42} == client.task(fork_after).result()
            assert (0, {"answer": 42}) == _json(cairn("result", fork_after, "--json"))
            with pytest.raises(NoResult):
                client.task(fork_before).result()
            assert "succeeded" == cluster.drive(fork_before)["status"]
            assert {"answer": 7} == client.task(fork_before).result()
            assert "succeeded" == cluster.drive(source)["status"]
            assert {"answer": 42} == client.task(source).result()
            assert {"answer": 42} == client.task(source).result(checkpoint=2)
            with pytest.raises(NoResult, match=r"at checkpoint 1$"):
                client.task(source).result(checkpoint=1)


def _json(ran: tuple[int, str, str]) -> tuple[int, object]:
    code, out, _ = ran
    return code, json.loads(out) if out else None


def test_a_task_that_declares_no_result_says_so(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """`result()` of a task without a schema is one line and a non-zero exit."""
    plain = TaskSpec.model_validate(
        {"name": "plain", "goal": "Say hi.", "agents": [agent("solver", {"say": "hi"})]}
    )
    task = cluster.tasks.submit(plain)
    env = {"CAIRN_REDIS_URL": cluster.server.url, "CAIRN_ARCHIVE_DIR": str(tmp_path / "archive"),
           "CAIRN_STATE_DIR": str(tmp_path / "state")}  # fmt: skip
    with cli_runner(env, monkeypatch, capsys) as cairn:
        code, out, err = cairn("result", task)
    assert (1, "", [f"cairn: task {task} declares no result"]) == (code, out, err.splitlines())
    with (
        Client(redis_url=cluster.server.url, archive_dir=tmp_path / "archive") as client,
        pytest.raises(NoResult, match=rf"^task {task} declares no result$"),
    ):
        client.task(task).result()
