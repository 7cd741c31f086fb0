"""Builders of agent states, steps and global checkpoints for the tests."""

from __future__ import annotations

from datetime import UTC, datetime

from cairn.storage.chain import WorkingState
from cairn.storage.records import (
    GlobalCheckpoint,
    LCRef,
    Message,
    Role,
    ToolCall,
    TraceRecord,
    Usage,
    WorkspaceManifest,
)
from cairn.storage.store import CheckpointStore

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def new_agent(store: CheckpointStore, task: str, agent: str, superstep: int = 1) -> WorkingState:
    """Register `task` (epoch 1) and return an agent state with its system prompt."""
    epoch = store.hot.init_task(task)
    store.hot.begin_attempt(task, agent, superstep, 1)
    return WorkingState(
        task=task,
        agent=agent,
        epoch=epoch,
        attempt=1,
        superstep=superstep,
        messages=[Message(role=Role.SYSTEM, content=f"You are {agent}.")],
    )


def take_step(state: WorkingState, i: int, size: int = 400) -> None:
    """Append one assistant message with a tool call and its trace record to `state`."""
    state.step += 1
    state.messages.append(
        Message(
            role=Role.ASSISTANT,
            content=f"step {i}: " + "x" * size,
            tool_calls=[ToolCall(id=f"call-{i}", name="write_file", args={"path": f"f{i}.py"})],
        )
    )
    state.add_trace(
        TraceRecord(
            step=state.step,
            superstep=state.superstep,
            tool="write_file",
            arguments={"path": f"f{i}.py", "n": i},
            result={"ok": True},
            side_effect=True,
            started_at=T0,
            finished_at=T0,
            duration_ms=1.5,
            usage=Usage(prompt_tokens=10 * i, completion_tokens=i),
        )
    )


def next_superstep(store: CheckpointStore, state: WorkingState) -> None:
    """Move `state` to the next superstep and make its attempt 1 the current one."""
    state.superstep += 1
    state.attempt = 1
    store.hot.begin_attempt(state.task, state.agent, state.superstep, 1)


def manifest(store: CheckpointStore, task: str, files: dict[str, bytes]) -> str:
    """Store the files and their manifest; return the manifest id."""
    shas = {path: store.put_blob(task, content) for path, content in files.items()}
    return store.put_manifest(task, WorkspaceManifest(files=shas))


def make_gc(
    task: str, number: int, superstep: int, epoch: int, members: dict[str, LCRef], workspace: str
) -> GlobalCheckpoint:
    """Return a global checkpoint record (status set by the store on prepare/commit)."""
    return GlobalCheckpoint(
        task=task,
        number=number,
        superstep=superstep,
        epoch=epoch,
        members=members,
        workspace=workspace,
    )


def run_task(
    store: CheckpointStore,
    task: str,
    supersteps: int,
    agents: tuple[str, ...] = ("planner", "coder", "reviewer"),
    message_size: int = 400,
) -> list[GlobalCheckpoint]:
    """Run `supersteps` barriers of a scripted team and commit a GC at each; return them.

    Every agent but the last takes a step each superstep; the last one (the reviewer)
    halts on even supersteps, so GCs carry its older LC over. Each step writes a file, and
    `shared.txt` goes back and forth between two contents, so blobs are shared across GCs.
    """
    states = {a: new_agent(store, task, a) for a in agents}
    files: dict[str, bytes] = {"README.md": b"# project\n"}
    refs: dict[str, LCRef] = {}
    gcs = []
    for s in range(1, supersteps + 1):
        for name, state in states.items():
            if name == agents[-1] and s % 2 == 0:
                continue  # halted: its last LC stays the member
            take_step(state, s, size=message_size)
            refs[name] = store.write_lc(state, vote=True)
            files[f"src/{name}_{s}.py"] = f"# {name} wrote this in superstep {s}\n".encode() * 20
        files["shared.txt"] = b"even" if s % 2 == 0 else b"odd"
        ws = manifest(store, task, files)
        gc = make_gc(task, s, s, states[agents[0]].epoch, dict(refs), ws)
        store.prepare_gc(gc)
        gcs.append(store.commit_gc(gc))
        for state in states.values():
            next_superstep(store, state)
    return gcs


def read_gc_whole(store: CheckpointStore, task: str, number: int) -> dict[str, object]:
    """Read a GC and everything it names, verified; return a comparable snapshot of it."""
    gc = store.read_gc(task, number)
    agents = {
        agent: store.read_state(task, agent, ref.id, ref.checksum).messages
        for agent, ref in gc.members.items()
    }
    files = store.read_manifest(task, gc.workspace).files
    contents = {path: store.get_blob(task, sha) for path, sha in files.items()}
    return {"gc": gc.model_dump(), "agents": agents, "files": contents}
