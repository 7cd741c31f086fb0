"""Cairn's configuration: `CAIRN_*` environment variables, overridden by arguments or flags.

| setting | variable | default |
| --- | --- | --- |
| redis_url | `CAIRN_REDIS_URL` | the URL a running `cairn up` wrote in the state directory |
| state_dir | `CAIRN_STATE_DIR` | `.cairn` |
| archive_dir | `CAIRN_ARCHIVE_DIR` | `<state_dir>/archive` |
| cache_dir | `CAIRN_CACHE_DIR` | `<state_dir>/cache` |
| signing_key | `CAIRN_SIGNING_KEY` | none (records are hashed, not signed); 32 bytes or more |
| log_format | `CAIRN_LOG_FORMAT` | `console` in a terminal, else `json` |
| log_level | `CAIRN_LOG_LEVEL` | `warning` for one-shot commands, `info` for processes |
| metrics_port | `CAIRN_METRICS_PORT` | none (no endpoint; see `cairn.coordinator.metrics`) |
| audit | `CAIRN_AUDIT` | off (`1` turns the audit stream on) |
| tools | `CAIRN_TOOLS` | none: modules of Python tools a worker loads (comma-separated) |
| mcp_config | `CAIRN_MCP_CONFIG` | none: a worker's MCP servers (an `mcpServers` JSON file) |
| worker_concurrency | `CAIRN_WORKER_CONCURRENCY` | 1: steps one worker process runs at once |
| prices | `CAIRN_PRICES` | none: a price table (YAML or JSON) for tasks submitted here |
| console_host | `CAIRN_CONSOLE_HOST` | `127.0.0.1`: where `cairn console` listens |
| console_port | `CAIRN_CONSOLE_PORT` | 8737 |
| console_token | `CAIRN_CONSOLE_TOKEN` | none: required for a console on a non-loopback address |
| sandbox | `CAIRN_SANDBOX` | `bwrap`: agents' commands run in bubblewrap; `off` runs them bare |
| otel_content | `CAIRN_OTEL_CONTENT` | off: `1` puts messages, tool calls and results in spans |

Traces (`cairn.agents.tracing`, the `otel` extra) follow OpenTelemetry's own variables, read
here with the rest: exported over OTLP/HTTP when `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or
`OTEL_EXPORTER_OTLP_ENDPOINT` is set or `OTEL_TRACES_EXPORTER` is `otlp` (`console` prints
them), never when `OTEL_TRACES_EXPORTER=none` or `OTEL_SDK_DISABLED=true`; the service is
`OTEL_SERVICE_NAME`, else the process's role. Content goes into spans with
`CAIRN_OTEL_CONTENT=1` or the GenAI convention's
`OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`.

This is the one module that reads the process environment. Every process reads its
settings once, at its entry (the `cairn` CLI, `cairn.Client`, `python -m cairn.coordinator`,
`python -m cairn.coordinator.worker`, a `CairnWorker` under stock `rq worker`, whose job
functions take `process_settings()`), and hands explicit values down: a store from
`open_store`, a codec's key, a log format and level. A new setting is one annotated field
of `Settings`, read from `CAIRN_<FIELD>`.

`Settings.environ` is the process environment as it was when the settings were read, for
what names its variables elsewhere (a model's API key: `CAIRN_OPENAI_API_KEY`, else
`OPENAI_API_KEY`). The signing key has no flag on purpose: a flag would show it in every
process listing. Worker and coordinator processes the CLI starts get the resolved values
as `CAIRN_*` variables (the Redis URL among them, never on their command line), except the
console's: no worker needs its token, and agents' commands run there.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
from pydantic import (
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from cairn.agents.tracing import TraceConfig
from cairn.coordinator.metrics import MeteredHotStore, MeteredStore
from cairn.errors import InvalidSpec, Unavailable
from cairn.storage.backends.disk import DiskArchive
from cairn.storage.backends.redis import RedisHotStore
from cairn.storage.backends.sentinel import SCHEME as SENTINEL_SCHEME
from cairn.storage.backends.sentinel import parse as parse_sentinel_url
from cairn.storage.chain import DEFAULT_FULL_EVERY
from cairn.storage.codec import Codec
from cairn.storage.public import public
from cairn.storage.store import CheckpointStore

URL_FILE = "redis.url"  # in the state directory, while `cairn up` runs
SCHEMES = ("redis", "rediss", "unix", SENTINEL_SCHEME)
SECRET_OPTIONS = ("password", "sentinel_password")  # URL options that display_url masks
LOG_FORMATS = ("console", "json")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
SIGNING_KEY_VARIABLE = "CAIRN_SIGNING_KEY"
MIN_SIGNING_KEY_BYTES = 32  # SHA-256's output: RFC 2104 calls a shorter HMAC key weaker
MAKE_A_KEY = "make one with `openssl rand -hex 32`"
TRACES_EXPORTER = "OTEL_TRACES_EXPORTER"
GENAI_CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"  # the GenAI convention's


@public
class Settings(BaseSettings):
    """Cairn's settings as every process resolves them (see the module's table)."""

    model_config = SettingsConfigDict(env_prefix="CAIRN_", extra="ignore", env_ignore_empty=True)

    redis_url: str | None = None
    state_dir: Path = Path(".cairn")
    archive_dir: Path | None = None
    cache_dir: Path | None = None
    signing_key: SecretStr | None = None
    log_format: Literal["console", "json"] | None = None
    log_level: str | None = None
    metrics_port: int | None = Field(default=None, ge=1, le=65_535)
    audit: bool = False
    tools: Annotated[tuple[str, ...], NoDecode] = ()
    mcp_config: Path | None = None
    worker_concurrency: int = Field(default=1, ge=1, le=256)
    prices: Path | None = None
    console_host: str = "127.0.0.1"
    console_port: int = Field(default=8737, ge=1, le=65_535)
    console_token: SecretStr | None = None
    sandbox: Literal["bwrap", "off"] = "bwrap"  # how a worker runs agents' commands
    otel_content: bool = False  # message text, tool arguments and results in spans
    _environ: dict[str, str] = PrivateAttr(default_factory=lambda: dict(os.environ))
    # How each setting given explicitly (a flag, an argument) was given, for messages that
    # name where a value came from; any other came from its CAIRN_* variable, or a default.
    _origins: dict[str, str] = PrivateAttr(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _explicit_empty_key(cls, data: object) -> object:
        # env_ignore_empty drops an empty variable before validation; for the signing key an
        # empty one is kept, so that `_strong_key` refuses it rather than signing nothing.
        explicit_empty = os.environ.get(SIGNING_KEY_VARIABLE) == ""
        if explicit_empty and isinstance(data, dict) and "signing_key" not in data:
            return {**data, "signing_key": ""}
        return data

    @field_validator("signing_key")
    @classmethod
    def _strong_key(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        size = len(value.get_secret_value().encode())
        if size == 0:
            raise ValueError(
                "is set but empty (a secret that did not reach this process?): unset it to "
                f"run without signing, or {MAKE_A_KEY}"
            )
        if size < MIN_SIGNING_KEY_BYTES:
            raise ValueError(
                f"must be at least {MIN_SIGNING_KEY_BYTES} bytes, not {size}: {MAKE_A_KEY}"
            )
        return value

    @field_validator("redis_url")
    @classmethod
    def _known_scheme(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme not in SCHEMES:
            raise ValueError(f"must start with one of {', '.join(s + '://' for s in SCHEMES)}")
        if parts.scheme == SENTINEL_SCHEME:
            parse_sentinel_url(value)  # its ValueError says what is wrong
            return value
        if parts.scheme != "unix" and not parts.hostname:
            raise ValueError("names no host")
        if parts.scheme == "unix" and not parts.path:
            raise ValueError("names no socket path")
        return value

    @field_validator("tools", mode="before")
    @classmethod
    def _module_list(cls, value: object) -> object:
        if isinstance(value, str):  # CAIRN_TOOLS=a.tools,b.tools (or a JSON list)
            text = value.strip()
            parts = json.loads(text) if text.startswith("[") else text.split(",")
            return tuple(str(p).strip() for p in parts if str(p).strip())
        return value

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str | None) -> str | None:
        if value is not None and value.lower() not in LOG_LEVELS:
            raise ValueError(f"must be one of {', '.join(LOG_LEVELS)}")
        return None if value is None else value.lower()

    @property
    def archive(self) -> Path:
        """The archive directory."""
        return self.archive_dir or self.state_dir / "archive"

    @property
    def cache(self) -> Path:
        """Where workers (and the coordinator's verify) keep workspace copies."""
        return self.cache_dir or self.state_dir / "cache"

    @property
    def url_file(self) -> Path:
        """Where a running `cairn up` says which Redis it started."""
        return self.state_dir / URL_FILE

    @property
    def environ(self) -> Mapping[str, str]:
        """The process environment when these settings were read (read-only)."""
        return MappingProxyType(self._environ)

    def traces(self, role: str) -> TraceConfig:
        """How a process of `role` (`worker`, `coordinator`, `client`) exports its traces.

        Raises `InvalidSpec` for an `OTEL_TRACES_EXPORTER` or an OTLP protocol Cairn
        cannot export with.
        """
        env = self._environ
        service = env.get("OTEL_SERVICE_NAME") or f"cairn-{role}"
        said = env.get(TRACES_EXPORTER, "").split(",")[0].strip().lower()
        endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or None
        base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").rstrip("/")
        if endpoint is None and base:
            endpoint = f"{base}/v1/traces"  # as the OTLP exporter specification joins them
        if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true" or said == "none":
            return TraceConfig(service=service)
        if said not in ("", "otlp", "console"):
            raise InvalidSpec(f"invalid setting {TRACES_EXPORTER}: Cairn exports traces with "
                              f"otlp or console, not {said!r}")  # fmt: skip
        protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get(
            "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
        )
        if protocol != "http/protobuf":
            raise InvalidSpec(f"invalid setting OTEL_EXPORTER_OTLP_PROTOCOL: Cairn exports "
                              f"OTLP over http/protobuf, not {protocol!r}")  # fmt: skip
        exporter: Literal["otlp", "console"] | None = None
        if said == "console":
            exporter = "console"
        elif said == "otlp" or endpoint is not None:
            exporter = "otlp"
        convention = env.get(GENAI_CONTENT, "").strip().lower() == "true"
        return TraceConfig(exporter, endpoint, self.otel_content or convention, service)

    def origin(self, name: str) -> str:
        """Where setting `name` came from: the flag or argument that gave it, else its variable."""
        return self._origins.get(name, f"CAIRN_{name.upper()}")

    def given(self, values: Mapping[str, object], given_as: Callable[[str], str]) -> Settings:
        """These settings with `values` on top, each known as given by `given_as(name)`."""
        updated = self.model_copy(update=values)
        updated._origins = {**self._origins, **{name: given_as(name) for name in values}}
        return updated

    def key(self) -> bytes | None:
        """The signing key as the codec takes it."""
        secret = self.signing_key.get_secret_value() if self.signing_key else ""
        return secret.encode() or None

    def redis(self) -> tuple[str, str]:
        """Return the Redis URL to use and where it came from.

        Raises `Unavailable` when none is configured and no `cairn up` is running here:
        the same call succeeds once one is.
        """
        if self.redis_url:
            return self.redis_url, self.origin("redis_url")
        try:
            written = self.url_file.read_text().strip()
        except OSError:
            written = ""
        if written:
            return written, f"{self.url_file}, written by `cairn up`"
        raise Unavailable(
            "no Redis configured: set CAIRN_REDIS_URL (or --redis-url), or run `cairn up`"
            f" (none runs in {self.state_dir})"
        )

    def child_env(self, url: str) -> dict[str, str]:
        """The environment of a worker or coordinator process the CLI starts.

        Every setting, as resolved here (flags included), as its `CAIRN_*` variable: the
        Redis at `url`, directories as absolute paths; the console's settings left out.
        """
        env = dict(self._environ)
        resolved: dict[str, object] = {
            **{name: getattr(self, name) for name in type(self).model_fields},
            "redis_url": url,
            "state_dir": self.state_dir.resolve(),
            "archive_dir": self.archive.resolve(),
            "cache_dir": self.cache.resolve(),
        }
        for name, value in resolved.items():
            if name.startswith("console_"):
                env.pop(f"CAIRN_{name.upper()}", None)
            elif value is not None:
                env[f"CAIRN_{name.upper()}"] = _as_variable(value)
        return env


def _as_variable(value: object) -> str:
    """A setting's value as its environment variable spells it."""
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, tuple):
        return ",".join(value)
    if isinstance(value, list | dict):
        return json.dumps(value)  # pydantic-settings reads complex values as JSON
    return str(value)


def as_flag(name: str) -> str:
    """The command-line flag that gives setting `name`: `--redis-url`."""
    return f"--{name.replace('_', '-')}"


def as_argument(name: str) -> str:
    """How a message names setting `name` given to a Python call: `argument redis_url`."""
    return f"argument {name}"


def load_settings(**overrides: object) -> Settings:
    """Read the settings from the environment, with `overrides` (flags) taking precedence.

    Raises `InvalidSpec` naming the variable or the flag, and the reason, for a value that
    is not valid.
    """
    return read_settings(overrides, as_flag)


def read_settings(overrides: Mapping[str, object], given_as: Callable[[str], str]) -> Settings:
    """`load_settings`, naming an override in messages as `given_as` does (`argument x`)."""
    given = {name: value for name, value in overrides.items() if value is not None}
    try:
        settings = Settings(**given)  # type: ignore[arg-type]  # checked here, by pydantic
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else "settings"
        source = given_as(field) if field in given else f"CAIRN_{field.upper()}"
        raise InvalidSpec(f"invalid setting {source}: {first['msg']}") from None
    settings._origins = {name: given_as(name) for name in given}
    return settings


def open_store(
    settings: Settings,
    client: redis.Redis,
    *,
    metered: bool = False,
    full_every: int = DEFAULT_FULL_EVERY,
) -> CheckpointStore:
    """The checkpoint store over `client` with the configured archive, signing key and audit.

    Every process builds its store here. `metered` observes each LC write's time and size
    in the process's metrics (workers serve them).
    """
    hot, store = (MeteredHotStore, MeteredStore) if metered else (RedisHotStore, CheckpointStore)
    return store(
        hot(client, audit=settings.audit),
        DiskArchive(settings.archive),
        Codec(signing_key=settings.key()),
        full_every,
    )


_process: list[Settings] = []  # this process's settings, once read or given


def use_settings(settings: Settings) -> None:
    """Make `settings` this process's, for the job functions that run in it."""
    _process[:] = [settings]


def process_settings() -> Settings:
    """Return the process's settings: those its entry point gave, else read now, once.

    RQ job functions take their settings here: a job carries names and numbers only.
    """
    if not _process:
        _process.append(load_settings())
    return _process[0]


def display_url(url: str) -> str:
    """`url` with its passwords masked, for messages and logs.

    The password before the host, and a `password` or `sentinel_password` option.
    """
    parts = urlsplit(url)
    if parts.password is not None:
        user = parts.username or ""
        host = parts.netloc.rsplit("@", 1)[1]
        parts = parts._replace(netloc=f"{user}:***@{host}")
    options = parse_qsl(parts.query, keep_blank_values=True)
    if any(name in SECRET_OPTIONS for name, _ in options):
        masked = [(name, "***" if name in SECRET_OPTIONS else value) for name, value in options]
        parts = parts._replace(query=urlencode(masked, safe="*"))
    return urlunsplit(parts)
