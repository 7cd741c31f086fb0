"""A worker's MCP servers, read from a JSON file in the `mcpServers` shape MCP clients use.

```json
{"mcpServers": {
  "files":  {"command": "uvx", "args": ["mcp-server-files"], "env": {"ROOT": "/srv"}},
  "search": {"url": "https://search.example/mcp",
             "headers": {"Authorization": "Bearer ${SEARCH_TOKEN}"}}
}}
```

A server has a `command` (stdio: `args`, `env`, `cwd`) or a `url` (streamable HTTP:
`headers`); `type` (`stdio`, `http` or `streamable-http`) may say which, and must agree.
`timeout` bounds each listing and call, in seconds (default 60). `disabled: true` leaves
a server out. `${VAR}` in `command`, `args`, `env`, `cwd`, `url` and `headers` is the
worker's environment variable `VAR`, so secrets stay out of the file. Anything wrong is
one `InvalidSpec` line naming the file and the field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from cairn.agents.mcp.names import MAX_SERVER_NAME, is_server_name
from cairn.agents.userfiles import read_at_most
from cairn.errors import InvalidSpec

DEFAULT_TIMEOUT = 60.0  # seconds, for one listing or one call
MAX_CONFIG_BYTES = 1024 * 1024
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class McpServer(BaseModel):
    """One MCP server a worker may start (stdio) or reach (streamable HTTP)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["stdio", "http", "streamable-http"] | None = None
    command: str | None = Field(default=None, min_length=1)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    timeout: float = Field(default=DEFAULT_TIMEOUT, gt=0, le=3600)
    disabled: bool = False

    @model_validator(mode="after")
    def _one_transport(self) -> McpServer:
        if (self.command is None) == (self.url is None):
            raise ValueError("give either command (stdio) or url (streamable HTTP)")
        if self.command is not None:
            if self.type not in (None, "stdio"):
                raise ValueError(f"type {self.type} needs a url, not a command")
            if self.headers:
                raise ValueError("headers are for url servers; a command takes env")
        else:
            if self.type == "stdio":
                raise ValueError("type stdio needs a command, not a url")
            if self.args or self.env or self.cwd:
                raise ValueError("args, env and cwd are for command servers")
            split = urlsplit(self.url)
            if split.scheme not in ("http", "https") or not split.hostname:
                raise ValueError("url must be an http:// or https:// URL with a host")
        return self

    @property
    def transport(self) -> Literal["stdio", "http"]:
        """`stdio` for a command the worker starts, `http` for a streamable HTTP url."""
        return "stdio" if self.command is not None else "http"


def load_mcp_config(
    path: str | Path, environ: Mapping[str, str] | None = None
) -> dict[str, McpServer]:
    """Read the MCP servers of the file at `path`, by name, the disabled ones left out.

    `${VAR}` is replaced from `environ` (none: a reference is an error). Raises
    `InvalidSpec` with one line, naming the file and what is wrong, for a file that
    cannot be read, is not JSON, or does not describe servers.
    """
    where = str(path)
    try:
        data = read_at_most(path, MAX_CONFIG_BYTES)
    except OSError as exc:
        raise InvalidSpec(f"MCP config {where}: cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise InvalidSpec(f"MCP config {where}: over {MAX_CONFIG_BYTES} bytes")
    try:
        document = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidSpec(f"MCP config {where}: not JSON: {_one_line(str(exc))}") from None
    if not isinstance(document, dict) or not isinstance(document.get("mcpServers"), dict):
        raise InvalidSpec(f'MCP config {where}: expected an object {{"mcpServers": {{...}}}}')
    servers: dict[str, McpServer] = {}
    for name, entry in document["mcpServers"].items():
        field = f"mcpServers.{name}"
        if not is_server_name(name):
            raise InvalidSpec(
                f"MCP config {where}: {field}: a server name is letters, digits, - and single "
                f"_ (not leading, trailing or doubled), at most {MAX_SERVER_NAME}"
            )
        try:
            server = McpServer.model_validate(_expand(entry, environ or {}, field))
        except ValidationError as exc:
            raise InvalidSpec(f"MCP config {where}: {_first_error(exc, field)}") from None
        except KeyError as exc:
            raise InvalidSpec(f"MCP config {where}: {exc.args[0]}") from None
        if not server.disabled:
            servers[name] = server
    return servers


def _expand(value: object, environ: Mapping[str, str], field: str) -> object:
    """`value` with `${VAR}` in its strings replaced from `environ`; `KeyError` if unset."""
    if isinstance(value, str):

        def lookup(match: re.Match[str]) -> str:
            if match[1] not in environ:
                raise KeyError(f"{field}: ${{{match[1]}}} is not set in the worker's environment")
            return environ[match[1]]

        return _VARIABLE.sub(lookup, value)
    if isinstance(value, list):
        return [_expand(item, environ, f"{field}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, dict):
        return {key: _expand(item, environ, f"{field}.{key}") for key, item in value.items()}
    return value


def _first_error(exc: ValidationError, field: str) -> str:
    """A validation error as one line: its first problem, where it is, and how many more."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    at = ".".join([field, *(str(part) for part in first["loc"])])
    message = str(first["msg"]).removeprefix("Value error, ")
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{at}: {_one_line(message)}{more}"


def _one_line(text: str) -> str:
    return " ".join(text.split())
