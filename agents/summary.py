"""The context summary a restored agent reads, so it neither redoes nor skips work."""

from __future__ import annotations

from cairn.storage.chain import WorkingState
from cairn.storage.records import Message, Role, TraceRecord

FILE_TOOLS = ("write_file", "edit_file", "apply_patch")
MAX_STEPS_SHOWN = 12
RESULT_CHARS = 160


def context_summary(state: WorkingState, reason: str, restored_to: int) -> Message:
    """Write the message an agent restored to GC `restored_to` reads when it next runs.

    In plain language: why it was restored, the steps it completed with their key results,
    the files it changed, and where to continue.
    """
    steps = _steps(state.trace)
    lines = [
        f"Cairn restored you to checkpoint {restored_to} (superstep {state.superstep}).",
        f"Why: {reason}",
        "Anything you did after that checkpoint was undone; everything below still holds.",
        "",
        f"Completed steps ({len(steps)}):" if steps else "You had completed no steps yet.",
    ]
    shown = sorted(steps)[-MAX_STEPS_SHOWN:]
    if len(steps) > len(shown):
        lines.append(f"  (the first {len(steps) - len(shown)} steps are not listed)")
    lines += [f"  step {n}: {'; '.join(_describe(r) for r in steps[n])}" for n in shown]
    files = _files(state.trace)
    lines.append("")
    lines.append("Files you changed: " + (", ".join(files) if files else "none."))
    last = next((m for m in reversed(state.messages) if m.role is Role.ASSISTANT), None)
    lines.append("")
    if last is not None and last.content:
        lines.append(f"Your last words were: {_short(last.content)}")
    lines.append(
        "Continue from here: check the workspace as it is now, then take the next step "
        "of your task; do not repeat the steps above."
    )
    return Message(role=Role.USER, name="cairn", content="\n".join(lines))


def _steps(trace: list[TraceRecord]) -> dict[int, list[TraceRecord]]:
    steps: dict[int, list[TraceRecord]] = {}
    for record in trace:
        steps.setdefault(record.step, [])
        if record.tool is not None:
            steps[record.step].append(record)
    return steps


def _describe(record: TraceRecord) -> str:
    target = (
        record.arguments.get("path")
        or record.arguments.get("command")
        or record.arguments.get("to")
    )
    head = f"{record.tool}({target})" if isinstance(target, str) else f"{record.tool}"
    if record.error:
        return f"{head} failed: {_short(record.error)}"
    return f"{head} → {_short(str(record.result))}" if record.result is not None else head


def _files(trace: list[TraceRecord]) -> list[str]:
    files: set[str] = set()
    for record in trace:
        if record.tool not in FILE_TOOLS or record.error:
            continue
        path = record.arguments.get("path")
        if isinstance(path, str):
            files.add(path)
        elif isinstance(record.result, str) and record.result.startswith("applied to "):
            files.update(record.result.removeprefix("applied to ").split(", "))
    return sorted(files)


def _short(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= RESULT_CHARS else flat[: RESULT_CHARS - 1] + "…"
