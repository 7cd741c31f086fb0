"""Bad input, fuzzed: specs, CLI arguments, stored records, tool arguments, model output.

Each property says the same thing for its input: a user never meets a crash or a
traceback, always a clear Cairn error, and nothing beside the bad input is damaged. The
examples are derandomized and bounded, so the module is deterministic and quick.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from cairn.agents.models.openai import _parse_reply
from cairn.agents.spec import StepPolicy
from cairn.agents.tools import TOOLS, ToolContext
from cairn.agents.workspace import Workspace
from cairn.cli import main
from cairn.coordinator.spec import TaskSpec, load_spec
from cairn.errors import (
    CorruptCheckpoint,
    InvalidSpec,
    ModelError,
    RecordNotFound,
    ToolError,
)
from cairn.storage import keys
from cairn.storage.backends.disk import DiskArchive
from cairn.storage.backends.redis import RedisHotStore
from cairn.storage.records import WorkspaceManifest
from cairn.storage.store import CheckpointStore
from cairn.testing.redis_server import RedisServer
from tests.factories import make_gc, manifest, new_agent, next_superstep, take_step

BASE = settings(
    derandomize=True,
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.generate, Phase.shrink],  # no explain: it traces, slowly
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def fuzz(examples: int) -> settings:
    """Deterministic settings running `examples` examples."""
    return settings(BASE, max_examples=examples)


json_leaves = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30)
)
json_values = st.recursive(
    json_leaves,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=15,
)
nasty_text = st.sampled_from(
    ["", " ", "\n", "a\nb", "\x00", "\ud800", "é" * 300, "x" * 70_000, "../x", "/etc", "💥"]
) | st.text(max_size=40)
nasty_values: st.SearchStrategy[Any] = (
    nasty_text
    | st.integers(-(2**70), 2**70)
    | st.sampled_from([-1, 0, 10**30, -0.5, 1e308, True, None, [], {}])
    | json_values
)


@contextlib.contextmanager
def captured() -> Iterator[tuple[io.StringIO, io.StringIO]]:
    """Capture stdout and stderr (capsys cannot be reset per hypothesis example)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        yield out, err


def assert_clean_exit(code: int, err: str, allowed: frozenset[int]) -> None:
    """An exit code of the contract, and stderr without a traceback or a caught bug."""
    assert code in allowed, err
    assert "Traceback" not in err
    # The CLI's catch-all says a bug in one line, "unexpected KeyError: ..."; a reason of
    # its own may use the word ("not UTF-8 text (byte 0: unexpected end of data)").
    assert re.search(r"\bunexpected [A-Z]\w*: ", err) is None, err


@pytest.fixture
def cli_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run the CLI in a scratch directory with no Redis configured from outside."""
    for name in ("CAIRN_REDIS_URL", "CAIRN_LOG_LEVEL", "CAIRN_LOG_FORMAT", "CAIRN_SIGNING_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CAIRN_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# 1. task specs ---------------------------------------------------------------------------
VALID: dict[str, Any] = {
    "name": "fuzz",
    "goal": "fix it",
    "files": {"a.py": "x = 1\n"},
    "verify": "true",
    "max_supersteps": 3,
    "checkpoints": {"hot_keep": 2, "durability": "sync"},
    "agents": [
        {
            "name": "coder",
            "model": "scripted",
            "tools": ["read_file", "write_file"],
            "script": [{"say": "hi", "tools": [{"name": "read_file", "args": {"path": "a.py"}}]}],
        }
    ],
}
FIELD_PATHS = [
    ("name",),
    ("goal",),
    ("files",),
    ("verify",),
    ("max_supersteps",),
    ("checkpoints",),
    ("checkpoints", "hot_keep"),
    ("checkpoints", "durability"),
    ("agents",),
    ("agents", 0),
    ("agents", 0, "name"),
    ("agents", 0, "tools"),
    ("agents", 0, "script"),
    ("agents", 0, "script", 0, "tools", 0, "args"),
    ("workspace",),
    ("step_timeout",),
]


@st.composite
def mutated_specs(draw: st.DrawFn) -> object:
    """The valid spec with one to three fields dropped, retyped or filled with junk."""
    spec: Any = json.loads(json.dumps(VALID))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(FIELD_PATHS))
        parent: Any = spec
        part: Any
        for part in path[:-1]:
            if not isinstance(parent, dict | list):
                break
            try:
                parent = parent[part]
            except (KeyError, IndexError):
                break
        else:
            last: Any = path[-1]
            if draw(st.booleans()) and isinstance(parent, dict):
                parent.pop(last, None)
            elif isinstance(parent, dict) or (isinstance(parent, list) and last < len(parent)):
                parent[last] = draw(nasty_values)
    return spec


spec_documents = mutated_specs() | json_values


def write_document(path: Path, document: object, fmt: str) -> None:
    """Write `document` as JSON or YAML, or as raw text/bytes when it is already so."""
    if isinstance(document, bytes):
        path.write_bytes(document)
    elif fmt == "json":
        path.write_text(json.dumps(document), errors="surrogatepass")
    else:
        path.write_text(yaml.safe_dump(document, allow_unicode=True), errors="surrogatepass")


TRICKY_DOCUMENTS = [
    b"[" * 3_000,
    b'{"a":' * 3_000,
    b"a: [" * 3_000,
    b"\xff\xfe not utf-8",
    b"name: x\ngoal: 2020-13-45\n",
    b"? [a]\n: b\n",
    b"name: x\ngoal: g\nagents: &x [*x]\n",
    b'name: x\ngoal: "\\ud800"\nagents: [{name: a, model: scripted, system: "\\udfff"}]\n',
    b"1" * 5_000,
    b'{"name": "x", "goal": "g", '
    b'"agents": [{"name": "a", "model": "scripted"}], "files": {"a\\nb": 1}}',
    b'{"name": "\\ud800", "goal": "g", "agents": [{"name": "a", "model": "scripted"}]}',
    b'{"name": "x", "goal": "g", '
    b'"agents": [{"name": "a", "model": "scripted"}], "files": {"a": "\\udc80"}}',
    b'{"name": "x", "goal": "g", '
    b'"agents": [{"name": "a", "model": "scripted", "system": "\\ud800"}]}',
    b'{"name": "x", "goal": "g", '
    b'"agents": [{"name": "a", "model": "scripted", "script": [{"say": "\\ud800"}]}]}',
    b'{"name": "x", "goal": "g", '
    b'"agents": [{"name": "a", "model": "scripted"}], "verify": "\\ud800"}',
    b'{"name": "x", "goal": "g", '
    b'"agents": [{"name": "a", "model": "scripted"}], "max_supersteps": 1e400}',
    b'{"name": "x", "goal": "g", '
    b'"agents": [{"name": "a", "model": "scripted", "script": [{"tools": '
    b'[{"name": "read_file", "args": {"n": 100000000000000000000000}}]}]}]}',
]
raw_documents = st.binary(max_size=200) | st.sampled_from(TRICKY_DOCUMENTS)


def check_spec(path: Path) -> None:
    """`load_spec` returns a spec or raises a one-line `InvalidSpec`."""
    try:
        spec = load_spec(path)
    except InvalidSpec as exc:
        message = str(exc)
        assert message
        assert 1 == len(message.splitlines()), message
    else:
        assert isinstance(spec, TaskSpec)


@fuzz(150)
@given(document=spec_documents | raw_documents, fmt=st.sampled_from(["json", "yaml"]))
def test_any_spec_document_loads_or_is_refused_in_one_line(
    tmp_path: Path, document: object, fmt: str
) -> None:
    """Random and mutated specs load, or raise `InvalidSpec` in one line."""
    path = tmp_path / f"spec.{fmt}"
    write_document(path, document, fmt)
    check_spec(path)


@fuzz(40)
@given(document=spec_documents | raw_documents, fmt=st.sampled_from(["json", "yaml"]))
def test_submitting_any_spec_exits_0_or_2_in_one_line(
    cli_env: Path, redis_client: redis.Redis, redis_server: RedisServer, document: object, fmt: str
) -> None:
    """`cairn submit` of a random spec exits 0 or 2, a bad one with one line on stderr."""
    path = cli_env / f"spec.{fmt}"
    write_document(path, document, fmt)
    with captured() as (_, err):
        code = main(["submit", str(path), "--json", "--redis-url", redis_server.url])
    assert_clean_exit(code, err.getvalue(), frozenset({0, 2}))
    if code == 2:
        lines = [line for line in err.getvalue().splitlines() if line]
        assert 1 == len(lines), err.getvalue()


@pytest.mark.parametrize("fmt", ["json", "yaml"])
@pytest.mark.parametrize("document", TRICKY_DOCUMENTS, ids=range(len(TRICKY_DOCUMENTS)))
def test_submitting_a_tricky_spec_exits_0_or_2(
    cli_env: Path, redis_client: redis.Redis, redis_server: RedisServer, document: bytes, fmt: str
) -> None:
    """Deep nesting, bad UTF-8, lone surrogates, huge numbers: submitted or refused cleanly."""
    path = cli_env / f"spec.{fmt}"
    path.write_bytes(document)
    with captured() as (_, err):
        code = main(["submit", str(path), "--json", "--redis-url", redis_server.url])
    assert_clean_exit(code, err.getvalue(), frozenset({0, 2}))


# 2. CLI arguments ------------------------------------------------------------------------
# Process commands (up, demo, worker, coordinator) start servers and children: not fuzzed.
COMMANDS = [
    "submit",
    "status",
    "checkpoints",
    "checkpoint",
    "restore",
    "trace",
    "watch",
    "workspace",
    "approve",
    "reject",
    "pause",
    "resume",
    "cancel",
    "archive",
]
FLAGS = [
    "--json",
    "--wait",
    "--timeout",
    "--to",
    "--on-workers",
    "--agent",
    "--checkpoint",
    "--out",
    "--reason",
    "--state-dir",
    "--archive-dir",
    "--log-format",
    "--log-level",
    "--metrics-port",
    "--redis-url",
    "-h",
    "--",
    "-",
]
tokens = (
    st.sampled_from(FLAGS)
    | st.sampled_from(["-1", "0", "3", "1e309", "nan", "debug", "json", "x" * 300, "a\nb", "t-1"])
    | st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"), max_size=12)
)


@fuzz(200)
@given(command=st.sampled_from(COMMANDS), rest=st.lists(tokens, max_size=6))
def test_any_arguments_exit_with_a_contract_code_without_a_traceback(
    cli_env: Path, command: str, rest: list[str]
) -> None:
    """Random arguments end with a contract exit code (0 to 4) and never a traceback."""
    argv = [command, *rest]
    # Nothing may connect for real: the last --redis-url wins, so put a closed one last.
    url = f"redis://127.0.0.1:{closed_port()}/0"
    with captured() as (_, err):
        code = main([*argv, "--redis-url", url] if "--" not in argv else argv)
    assert_clean_exit(code, err.getvalue(), frozenset({0, 1, 2, 3, 4}))


# 3. stored records -----------------------------------------------------------------------
TASK = "fuzz-task"


@pytest.fixture
def records(real_store: CheckpointStore) -> dict[str, Any]:
    """A task with a chain of LCs, a manifest and two GCs, hot and archived."""
    store = real_store
    states = {}
    members = {}
    for agent in ("a", "b"):
        state = new_agent(store, TASK, agent)
        refs = []
        for i in range(3):
            take_step(state, i, size=50)
            refs.append(store.write_lc(state, vote=True))
        members[agent] = refs
        states[agent] = state
    workspace = manifest(store, TASK, {"a.py": b"x = 1\n", "b.py": b"y = 2\n"})
    gc1 = store.commit_gc(
        make_gc(TASK, 1, 1, 1, {a: refs[-1] for a, refs in members.items()}, workspace)
    )
    for agent, state in states.items():
        next_superstep(store, state)
        take_step(state, 9, size=5_000)  # compressed
        members[agent].append(store.write_lc(state, vote=True))
    gc2 = store.commit_gc(
        make_gc(TASK, 2, 2, 1, {a: refs[-1] for a, refs in members.items()}, workspace)
    )
    hot = store.hot
    assert isinstance(hot, RedisHotStore)
    for agent, refs in members.items():
        for ref in refs:
            store.cold.put_lc(TASK, agent, ref.id, hot.read_chain(TASK, ref.id, 1)[0])
    for number in (1, 2):
        data = hot.read_gc(TASK, number)
        assert data is not None
        store.cold.put_gc(TASK, number, data)
    blob = hot.get_blob(TASK, workspace)
    assert blob is not None
    store.cold.put_blob(workspace, blob)
    return {"members": members, "workspace": workspace, "gcs": (gc1, gc2)}


Copy = tuple[Callable[[], bytes | None], Callable[[bytes | None], None]]


def record_copies(store: CheckpointStore, target: str, item: Any) -> tuple[Copy, Copy]:
    """(get, set) of the hot and the cold copy of one stored record (set None: delete)."""
    hot = store.hot
    assert isinstance(hot, RedisHotStore)
    cold = store.cold
    assert isinstance(cold, DiskArchive)
    client = hot.redis
    if target == "lc":
        agent, lc_id = item
        hot_key, field = keys.lc(TASK, lc_id), "data"
        path = cold._lc_path(TASK, agent, lc_id)
    elif target == "gc":
        hot_key, field = keys.gc(TASK, item), "data"
        path = cold._gc_path(TASK, item)
    else:
        hot_key, field = keys.blob(TASK, item), None
        path = cold._blob_path(item)

    def get_hot() -> bytes | None:
        if field is None:
            return client.get(hot_key)  # type: ignore[return-value]
        return client.hget(hot_key, field)  # type: ignore[return-value]

    def set_hot(data: bytes | None) -> None:
        if field is None:
            client.delete(hot_key) if data is None else client.set(hot_key, data)
        elif data is None:
            client.hdel(hot_key, field)
        else:
            client.hset(hot_key, field, data)

    def get_cold() -> bytes | None:
        return path.read_bytes() if path.exists() else None

    def set_cold(data: bytes | None) -> None:
        if data is None:
            path.unlink(missing_ok=True)
        else:
            path.write_bytes(data)

    return (get_hot, set_hot), (get_cold, set_cold)


@st.composite
def damage(draw: st.DrawFn, original: bytes) -> bytes:
    """Random bytes, a truncation or a single bit flipped, in place of `original`."""
    kind = draw(st.sampled_from(["random", "truncate", "flip", "header"]))
    if kind == "random":
        return draw(st.binary(max_size=300).filter(lambda b: b != original))
    if kind == "truncate":
        return original[: draw(st.integers(0, len(original) - 1))]
    if kind == "header":  # a sound-looking envelope head over junk
        return original[:41] + draw(st.binary(max_size=100))
    bit = draw(st.integers(0, len(original) * 8 - 1))
    flipped = bytearray(original)
    flipped[bit // 8] ^= 1 << (bit % 8)
    return bytes(flipped)


def read_record(store: CheckpointStore, target: str, item: Any, info: dict[str, Any]) -> object:
    """Read one record as users do: an LC's whole state, a GC, a manifest."""
    if target == "lc":
        agent, lc_id = item
        ref = next(r for r in info["members"][agent] if r.id == lc_id)
        return store.read_state(TASK, agent, lc_id, ref.checksum).messages
    if target == "gc":
        return store.read_gc(TASK, item)
    return store.read_manifest(TASK, item)


def read_everything(store: CheckpointStore, info: dict[str, Any]) -> list[object]:
    """Every record the fixture stored, read and verified."""
    out: list[object] = [store.read_gc(TASK, 1), store.read_gc(TASK, 2)]
    out.append(store.read_manifest(TASK, info["workspace"]))
    for agent, refs in info["members"].items():
        out += [store.read_state(TASK, agent, r.id, r.checksum).messages for r in refs]
    return out


@fuzz(150)
@given(data=st.data())
def test_damaged_records_are_refused_and_others_still_read(
    real_store: CheckpointStore, records: dict[str, Any], data: st.DataObject
) -> None:
    """A damaged LC, GC or manifest, hot or cold, is refused; every other record still reads."""
    store, info = real_store, records
    target = data.draw(st.sampled_from(["lc", "gc", "manifest"]))
    if target == "lc":
        agent = data.draw(st.sampled_from(["a", "b"]))
        item: Any = (agent, data.draw(st.sampled_from(info["members"][agent])).id)
    elif target == "gc":
        item = data.draw(st.sampled_from([1, 2]))
    else:
        item = info["workspace"]
    (get_hot, set_hot), (get_cold, set_cold) = record_copies(store, target, item)
    hot_original, cold_original = get_hot(), get_cold()
    assert hot_original is not None
    assert cold_original is not None
    before = read_everything(store, info)
    expected = read_record(store, target, item, info)
    where = data.draw(st.sampled_from(["hot", "cold", "both"]))
    other = data.draw(st.sampled_from(["kept", "missing"]))
    hot_damaged = where in {"hot", "both"} or other == "missing"
    cold_damaged = where in {"cold", "both"} or other == "missing"
    try:
        if where in {"hot", "both"}:
            set_hot(data.draw(damage(hot_original)))
        elif other == "missing":
            set_hot(None)
        if where in {"cold", "both"}:
            set_cold(data.draw(damage(cold_original)))
        elif other == "missing":
            set_cold(None)
        try:
            got = read_record(store, target, item, info)
        except (CorruptCheckpoint, RecordNotFound):
            assert hot_damaged, "a sound copy was there to read"
            assert cold_damaged, "a sound copy was there to read"
        else:
            assert not (hot_damaged and cold_damaged), "a damaged record was read"
            assert expected == got
    finally:
        set_hot(hot_original)
        set_cold(cold_original)
    assert before == read_everything(store, info)


# 4. tool arguments -----------------------------------------------------------------------
@pytest.fixture
def jail(tmp_path: Path) -> tuple[ToolContext, Path]:
    """A workspace with symlinks leading out, and a sentinel directory beside it."""
    sentinel = tmp_path / "sentinel"
    sentinel.mkdir()
    (sentinel / "secret.txt").write_text("s3cret")
    workspace = Workspace(tmp_path / "cache", "t", "coder")
    tree = workspace.tree
    (tree / "a.py").write_text("x = 1\n")
    (tree / "out").symlink_to(sentinel)
    (tree / "secret").symlink_to(sentinel / "secret.txt")
    (tree / "dangling").symlink_to(sentinel / "new.txt")
    policy = StepPolicy(command_timeout=0.2, output_limit=300)
    return ToolContext(workspace, "coder", ["coder", "reviewer"], 1, policy), sentinel


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file under `directory` with its content."""
    return {
        p.relative_to(directory).as_posix(): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


paths = st.sampled_from(
    [
        "/etc/passwd",
        "../sentinel/secret.txt",
        "../sentinel/new.txt",
        "a/../../sentinel/x",
        "out/secret.txt",
        "out/new.txt",
        "secret",
        "dangling",
        "dangling/x",
        "a.py/x",
        ".",
        "./",
        "a\x00b",
        "",
        "x" * 5_000,
        "/".join(["d"] * 300),
        "é/💥.txt",
        "\ud800",
        "a\nb",
        "~/x",
    ]
) | st.text(max_size=30)
patch_lines = st.sampled_from(
    [
        "--- a/a.py",
        "+++ b/a.py",
        "--- /dev/null",
        "+++ /dev/null",
        "--- a/../sentinel/secret.txt",
        "+++ b/../sentinel/secret.txt",
        "--- out/new.txt",
        "+++ out/new.txt",
        "+++ b/dangling",
        "--- /etc/passwd",
        "+++ /tmp/x",
        "@@ -1 +1 @@",
        "@@ -1,1 +1,2 @@",
        "@@ -0,0 +1 @@",
        "@@ -99999999999999999999 +1 @@",
        "-x = 1",
        "+x = 2",
        "+",
        " x = 1",
        "\\ No newline at end of file",
        "",
    ]
) | st.text(max_size=20)
patches = st.lists(patch_lines, max_size=12).map("\n".join)
# No letters: a random word could name a real program; the shell's own syntax is enough.
commands = st.sampled_from(
    [
        "sleep 5",
        "yes | head -c 100000",
        "printf '\\377\\000\\n'",
        "exit 3",
        "kill -9 $$",
        "echo $HOME",
        "a\x00b",
        "",
        "(",
    ]
) | st.text("0123456789 '\"`$;|&(){}<#\\\n\t", max_size=20)


@fuzz(300)
@given(data=st.data())
def test_tool_arguments_never_escape_the_workspace(
    jail: tuple[ToolContext, Path], data: st.DataObject
) -> None:
    """Random paths and patches give a result or a `ToolError`; the sentinel stays as it was."""
    ctx, sentinel = jail
    before = snapshot(sentinel)
    tool = data.draw(
        st.sampled_from(["read_file", "write_file", "list_files", "apply_patch", "send_message"])
    )
    args: dict[str, Any]
    if tool == "apply_patch":
        args = {"patch": data.draw(patches)}
    elif tool == "send_message":
        args = {"to": data.draw(nasty_text), "content": data.draw(nasty_text)}
    else:
        args = {"path": data.draw(paths), "content": data.draw(nasty_text)}
    if data.draw(st.booleans()):
        args[data.draw(st.sampled_from(sorted(args)))] = data.draw(nasty_values)
    try:
        result = TOOLS[tool].run(ctx, args)
    except ToolError as exc:
        result = str(exc)
    except (OSError, ValueError) as exc:  # the step's net: e.g. write_file of "a.py/x"
        result = f"{type(exc).__name__}: {exc}"
    assert isinstance(result, str)
    assert result
    assert before == snapshot(sentinel)
    assert sorted(p.name for p in sentinel.iterdir()) == ["secret.txt"]


@fuzz(30)
@given(command=commands | st.sampled_from([None, 3, ["ls"]]))
def test_any_command_returns_or_fails_as_a_tool_error(
    jail: tuple[ToolContext, Path], command: object
) -> None:
    """Random shell syntax ends within the timeout with output or a `ToolError`."""
    ctx, sentinel = jail
    before = snapshot(sentinel)
    try:
        result = TOOLS["run_command"].run(ctx, {"command": command})  # type: ignore[dict-item]
    except ToolError as exc:
        result = f"refused: {exc}"
    assert result.startswith(("exit code ", "refused: "))
    assert len(result) < ctx.policy.output_limit + 200
    assert before == snapshot(sentinel)


# 5. model output -------------------------------------------------------------------------
tool_calls = st.fixed_dictionaries(
    {},
    optional={
        "id": nasty_values,
        "type": st.just("function"),
        "function": st.fixed_dictionaries(
            {},
            optional={
                "name": st.sampled_from([*TOOLS, "rm_rf", ""]) | nasty_values,
                "arguments": st.sampled_from(
                    ['{"path": "a.py"}', "{", "[1, 2]", "null", '"x"', "{" * 5_000, "x" * 100_000]
                )
                | nasty_values,
            },
        )
        | nasty_values,
    },
)
messages = st.fixed_dictionaries(
    {},
    optional={
        "role": st.just("assistant"),
        "content": nasty_values,
        "tool_calls": st.lists(tool_calls | nasty_values, max_size=3) | nasty_values,
    },
)
bodies = st.fixed_dictionaries(
    {},
    optional={
        "choices": st.lists(st.fixed_dictionaries({"message": messages}) | nasty_values, max_size=2)
        | nasty_values,
        "usage": st.fixed_dictionaries(
            {}, optional={"prompt_tokens": nasty_values, "completion_tokens": nasty_values}
        )
        | nasty_values,
    },
)


def encode_body(body: object) -> bytes:
    """A response body as a server might send it (surrogates and big ints survive)."""
    return json.dumps(body).encode()


raw_bodies = st.binary(max_size=100) | st.sampled_from(
    [b"", b"null", b"[]", b"[" * 10_000, b'{"choices": [{"message": null}]}', b"\xff"]
)


@fuzz(300)
@given(body=bodies.map(encode_body) | json_values.map(encode_body) | raw_bodies)
def test_any_response_body_is_a_reply_or_a_model_error(body: bytes) -> None:
    """Malformed bodies, tool calls and arguments give a valid reply or a `ModelError`."""
    try:
        reply = _parse_reply(body)
    except ModelError:
        return  # retryable or not, the step knows what to do with it
    assert reply.content is None or isinstance(reply.content, str)
    for call in reply.tool_calls:
        assert isinstance(call.name, str)
        assert isinstance(call.args, dict)
        orjson.dumps(call.args)  # what is stored with the LC must serialize


def test_an_unknown_tool_in_a_reply_parses_for_the_step_to_refuse() -> None:
    """A call to a tool that does not exist parses; the step answers it with an error."""
    body = {"choices": [{"message": {"tool_calls": [{"function": {"name": "rm_rf"}}]}}]}
    reply = _parse_reply(encode_body(body))
    assert ["rm_rf"] == [call.name for call in reply.tool_calls]
    assert "rm_rf" not in TOOLS


def test_a_manifest_of_junk_is_refused(real_store: CheckpointStore) -> None:
    """A blob that is sound bytes but no manifest is refused as corrupt, not parsed."""
    sha = real_store.put_blob(TASK, b'{"files": 3}')
    with pytest.raises(CorruptCheckpoint):
        real_store.read_manifest(TASK, sha)
    assert WorkspaceManifest(files={}) == real_store.read_manifest(
        TASK, real_store.put_manifest(TASK, WorkspaceManifest(files={}))
    )
