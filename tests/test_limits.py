"""Size limits: each refuses what is too big with one clear line, through the real code path."""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from pydantic import JsonValue

import cairn.coordinator.spec
from cairn.agents.models.base import MAX_ARGS_BYTES, MAX_REPLY_CHARS, MAX_TOOL_CALLS
from cairn.agents.models.http import MAX_RESPONSE_BYTES
from cairn.agents.spec import MAX_PROMPT_CHARS, StepPolicy, parse_model
from cairn.agents.tools import MAX_MESSAGE, MAX_WRITE, ToolContext
from cairn.agents.workspace import Workspace
from cairn.coordinator.spec import TaskSpec
from cairn.errors import InvalidSpec, ModelError, RecordTooLarge, ToolError
from cairn.storage.codec import MAX_SEALED_BYTES, Codec, canonical_bytes
from cairn.storage.ids import new_id
from cairn.storage.records import LocalCheckpoint, Message, Role
from tests.test_openai_model import (
    Scripted,
    ScriptedServer,
    ask,
    model_for,
    reply,
    serve_scripted,
)
from tests.test_tools import call


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    """A tool context over an empty workspace, with a 300-character output limit."""
    workspace = Workspace(tmp_path / "cache", "t", "coder")
    policy = StepPolicy(command_timeout=30.0, output_limit=300)
    return ToolContext(workspace, "coder", ["planner", "coder"], 1, policy)


# tools -------------------------------------------------------------------------------------
def test_write_file_refuses_content_over_the_limit(ctx: ToolContext) -> None:
    """Content over MAX_WRITE bytes is refused for the model, and nothing is written."""
    with pytest.raises(ToolError) as caught:
        call(ctx, "write_file", path="big.txt", content="x" * (MAX_WRITE + 1))
    assert f"content is {MAX_WRITE + 1} bytes; write_file takes at most {MAX_WRITE}" == str(
        caught.value
    )
    assert not (ctx.workspace.tree / "big.txt").exists()
    assert f"wrote {MAX_WRITE} bytes to ok.txt" == call(
        ctx, "write_file", path="ok.txt", content="x" * MAX_WRITE
    )


def test_write_file_counts_bytes_not_characters(ctx: ToolContext) -> None:
    """Two-byte characters count twice: fewer characters than the limit can be over it."""
    content = "é" * (MAX_WRITE // 2 + 1)
    with pytest.raises(ToolError, match=f"content is {MAX_WRITE + 2} bytes"):
        call(ctx, "write_file", path="big.txt", content=content)


def test_apply_patch_refuses_a_patch_over_the_limit(ctx: ToolContext) -> None:
    """A patch over MAX_WRITE bytes is refused before it is parsed."""
    patch = "--- /dev/null\n+++ b/big.txt\n@@ -0,0 +1 @@\n+" + "x" * MAX_WRITE + "\n"
    size = len(patch.encode())
    with pytest.raises(ToolError) as caught:
        call(ctx, "apply_patch", patch=patch)
    assert f"patch is {size} bytes; apply_patch takes at most {MAX_WRITE}" == str(caught.value)
    assert not (ctx.workspace.tree / "big.txt").exists()


def test_send_message_refuses_content_over_the_limit(ctx: ToolContext) -> None:
    """A message over MAX_MESSAGE bytes is refused and never reaches the outbox."""
    with pytest.raises(ToolError) as caught:
        call(ctx, "send_message", to="planner", content="m" * (MAX_MESSAGE + 1))
    assert f"content is {MAX_MESSAGE + 1} bytes; send_message takes at most {MAX_MESSAGE}" == str(
        caught.value
    )
    assert [] == ctx.outbox
    call(ctx, "send_message", to="planner", content="m" * MAX_MESSAGE)
    assert 1 == len(ctx.outbox)


def test_run_command_keeps_only_head_and_tail_of_huge_output(ctx: ToolContext) -> None:
    """50 MB of output comes back truncated with the count cut, without being held whole."""
    tracemalloc.start()
    try:
        out = call(ctx, "run_command", command="head -c 50000000 /dev/zero | tr '\\0' y")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    expected = "exit code 0\n" + "y" * 150 + "\n… [49999700 characters cut] …\n" + "y" * 150
    assert expected == out
    assert peak < 5_000_000  # communicate() held 50 MB of bytes and 50 MB of text


def test_run_command_decodes_characters_split_between_reads(ctx: ToolContext) -> None:
    """A UTF-8 character torn across two pipe reads is decoded whole and counted once."""
    out = call(ctx, "run_command", command="yes é | head -n 100000")
    expected = "exit code 0\n" + "é\n" * 75 + "\n… [199700 characters cut] …\n" + "é\n" * 75
    assert expected == out


@pytest.mark.parametrize(
    "command",
    ["yes", "echo hi; exec >&-; sleep 30"],
    ids=["printing-forever", "running-after-closing-its-output"],
)
def test_run_command_times_out_whatever_its_output_does(ctx: ToolContext, command: str) -> None:
    """A command printing forever, or running on after closing its output, is killed.

    At command_timeout (not after its 30 s sleep), its output not hoarded.
    """
    ctx.policy.command_timeout = 1.0
    started = time.monotonic()
    with pytest.raises(ToolError, match="command timed out after 1 s and was killed"):
        call(ctx, "run_command", command=command)
    assert time.monotonic() - started < 10


# model replies -----------------------------------------------------------------------------
@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[ScriptedServer]:
    """The OpenAI tests' scripted chat-completions server."""
    yield from serve_scripted(monkeypatch)


def function_call(index: int, arguments: str) -> dict[str, JsonValue]:
    """A chat-completions tool call of `write_file` with `arguments` (JSON text)."""
    return {
        "id": f"call_{index}",
        "type": "function",
        "function": {"name": "write_file", "arguments": arguments},
    }


def refusal(server: ScriptedServer) -> ModelError:
    """The ModelError the model raises for the scripted response, after one request."""
    with pytest.raises(ModelError) as caught:
        model_for(server, []).complete(ask())
    assert 1 == len(server.received)
    return caught.value


def test_a_reply_text_over_the_limit_is_refused(server: ScriptedServer) -> None:
    """Reply text over MAX_REPLY_CHARS is a retryable model error."""
    server.script = [reply("a" * (MAX_REPLY_CHARS + 1))]
    error = refusal(server)
    assert f"reply text is {MAX_REPLY_CHARS + 1} characters; at most {MAX_REPLY_CHARS}" == str(
        error
    )
    assert error.retryable


def test_too_many_tool_calls_are_refused(server: ScriptedServer) -> None:
    """A reply making more than MAX_TOOL_CALLS calls is a retryable model error."""
    calls = [function_call(i, "{}") for i in range(MAX_TOOL_CALLS + 1)]
    server.script = [reply(None, calls)]
    error = refusal(server)
    assert f"reply makes {MAX_TOOL_CALLS + 1} tool calls; at most {MAX_TOOL_CALLS}" == str(error)
    assert error.retryable


def test_tool_call_arguments_over_the_limit_are_refused(server: ScriptedServer) -> None:
    """One call's arguments over MAX_ARGS_BYTES (as JSON) are a retryable model error."""
    arguments = orjson.dumps({"path": "a", "content": "c" * MAX_ARGS_BYTES}).decode()
    server.script = [reply(None, [function_call(0, "{}"), function_call(1, arguments)])]
    error = refusal(server)
    expected = (
        f"arguments of tool call call_1 (write_file) are {len(arguments)} bytes; "
        f"at most {MAX_ARGS_BYTES}"
    )
    assert expected == str(error)
    assert error.retryable


def test_a_response_body_over_the_limit_is_refused(server: ScriptedServer) -> None:
    """A 2xx body over MAX_RESPONSE_BYTES fails with a clear error, whatever it holds."""
    server.script = [Scripted(200, b" " * (MAX_RESPONSE_BYTES + 1))]
    error = refusal(server)
    assert f"response body is over {MAX_RESPONSE_BYTES} bytes" == str(error)
    assert error.retryable


# task specs --------------------------------------------------------------------------------
def spec_data(**fields: Any) -> dict[str, Any]:
    """A valid task spec's fields, with `fields` replacing or adding some."""
    return {"name": "limits", "goal": "g", "agents": [{"name": "a", "model": "scripted"}]} | fields


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            spec_data(goal="g" * (MAX_PROMPT_CHARS + 1)),
            f"invalid task spec: goal: String should have at most {MAX_PROMPT_CHARS} characters",
        ),
        (
            spec_data(
                agents=[{"name": "a", "model": "scripted", "system": "s" * (MAX_PROMPT_CHARS + 1)}]
            ),
            "invalid task spec: agents[a].system: "
            f"String should have at most {MAX_PROMPT_CHARS} characters",
        ),
        (
            spec_data(
                agents=[
                    {
                        "name": "a",
                        "model": "scripted",
                        "script": [{"say": "s" * (MAX_REPLY_CHARS + 1)}],
                    }
                ]
            ),
            "invalid task spec: agents[a].script[0].say: "
            f"String should have at most {MAX_REPLY_CHARS} characters",
        ),
        (
            spec_data(
                agents=[
                    {
                        "name": "a",
                        "model": "scripted",
                        "script": [{"tools": [{"name": "finish"}] * (MAX_TOOL_CALLS + 1)}],
                    }
                ]
            ),
            "invalid task spec: agents[a].script[0].tools: "
            f"List should have at most {MAX_TOOL_CALLS} items after validation, "
            f"not {MAX_TOOL_CALLS + 1}",
        ),
        (
            spec_data(
                agents=[
                    {
                        "name": "a",
                        "model": "scripted",
                        "script": [
                            {"tools": [{"name": "finish", "args": {"s": "x" * MAX_ARGS_BYTES}}]}
                        ],
                    }
                ]
            ),
            "invalid task spec: agents[a].script[0].tools[0].args: "
            f"{MAX_ARGS_BYTES + 8} bytes as JSON; at most {MAX_ARGS_BYTES}",
        ),
    ],
    ids=["goal", "system", "say", "tool-calls", "tool-args"],
)
def test_oversized_spec_fields_are_refused(data: dict[str, Any], message: str) -> None:
    """Each bounded field over its bound is one InvalidSpec line naming it."""
    with pytest.raises(InvalidSpec) as caught:
        parse_model(TaskSpec, data, "task spec")
    assert message == str(caught.value)


def test_inline_files_over_the_workspace_limit_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Inline `files` are bounded in all by MAX_WORKSPACE_BYTES, as a directory is."""
    monkeypatch.setattr(cairn.coordinator.spec, "MAX_WORKSPACE_BYTES", 10)
    parse_model(TaskSpec, spec_data(files={"a": "12345", "b": "é234"}), "task spec")
    with pytest.raises(InvalidSpec) as caught:
        parse_model(TaskSpec, spec_data(files={"a": "12345", "b": "é2345"}), "task spec")
    expected = "invalid task spec: files: 11 bytes in all; at most 10"
    assert expected == str(caught.value)


# records -----------------------------------------------------------------------------------
def test_a_record_over_the_limit_is_not_sealed() -> None:
    """A record whose canonical bytes pass MAX_SEALED_BYTES raises RecordTooLarge naming it."""
    lc = LocalCheckpoint(
        id=new_id(),
        task="t",
        agent="coder",
        step=1,
        superstep=1,
        epoch=1,
        attempt=1,
        messages=[Message(role=Role.TOOL, content="x" * MAX_SEALED_BYTES)],
    )
    size = len(canonical_bytes(lc))
    with pytest.raises(RecordTooLarge) as caught:
        Codec().encode(lc)
    expected = (
        f"record LocalCheckpoint t coder {lc.id} is {size} bytes; "
        f"a record may have at most {MAX_SEALED_BYTES}"
    )
    assert expected == str(caught.value)
    lc.messages[0].content = "small"
    Codec().encode(lc)  # the same record, small, seals
