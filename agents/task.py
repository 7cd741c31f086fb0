"""Starting a task: its spec, its initial workspace and global checkpoint 0."""

from __future__ import annotations

from cairn.agents.kinds import kind_of
from cairn.agents.spec import LLM_KIND, TaskRecord
from cairn.agents.workspace import check_path, tree_clashes
from cairn.errors import InvalidSpec, ToolError
from cairn.storage.chain import WorkingState
from cairn.storage.keys import SPEC_DOC
from cairn.storage.records import (
    AgentState,
    GCOrigin,
    GlobalCheckpoint,
    Message,
    Role,
    WorkspaceManifest,
)
from cairn.storage.store import CheckpointStore


def start_task(
    store: CheckpointStore, record: TaskRecord, files: dict[str, bytes]
) -> GlobalCheckpoint:
    """Store the task and commit GC 0: every agent's history is its system prompt and the goal.

    Raises `InvalidSpec` for a workspace path that leaves the workspace, files that are not
    a tree (`a` and `a/b`, or one file named twice), or a task id in use.
    """
    files = _tree(files)
    task = record.task
    if store.hot.get_epoch(task) or store.cold.list_gcs(task):
        raise InvalidSpec(f"task {task} exists already")
    epoch = store.hot.init_task(task)
    store.put_doc(task, SPEC_DOC, record)
    manifest = WorkspaceManifest(files={p: store.put_blob(task, c) for p, c in files.items()})
    workspace = store.put_manifest(task, manifest)
    members = {}
    for spec in record.agents:
        store.hot.begin_attempt(task, spec.name, 0, 1)
        state = WorkingState(
            task=task,
            agent=spec.name,
            epoch=epoch,
            messages=[
                Message(role=Role.SYSTEM, content=spec.system or f"You are {spec.name}."),
                Message(role=Role.USER, content=record.goal),
            ],
            workspace_before=workspace,
            workspace_after=workspace,
            # A kind in code starts empty: the coordinator never loads users' code.
            kind_state=kind_of(spec).initial_state(spec) if spec.kind == LLM_KIND else {},
        )
        members[spec.name] = store.write_lc(state, vote=True)
    gc = GlobalCheckpoint(
        task=task,
        number=0,
        superstep=0,
        epoch=epoch,
        members=members,
        statuses=dict.fromkeys(members, AgentState.ACTIVE),
        workspace=workspace,
        origin=GCOrigin.SUPERSTEP,  # submitted: GC 0 opens superstep 0
    )
    store.prepare_gc(gc)
    return store.commit_gc(gc)


def _tree(files: dict[str, bytes]) -> dict[str, bytes]:
    """`files` under their canonical paths; `InvalidSpec` unless they are a tree."""
    tree: dict[str, bytes] = {}
    for path, content in files.items():
        try:
            normal = check_path(path)
        except ToolError as exc:
            raise InvalidSpec(f"invalid workspace file: {exc}") from None
        if normal == "." or normal in tree:
            raise InvalidSpec(f"invalid workspace file {path!r}: not a file of its own")
        tree[normal] = content
    for above, below in tree_clashes(tree)[:1]:
        raise InvalidSpec(f"invalid workspace: {above} is a file and a directory ({below})")
    return tree
