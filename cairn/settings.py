"""Cairn's configuration: `CAIRN_*` environment variables, overridden by arguments or flags.

| setting | variable | default |
| --- | --- | --- |
| redis_url | `CAIRN_REDIS_URL` | the URL a running `cairn up` wrote in the state directory |
| state_dir | `CAIRN_STATE_DIR` | `.cairn` |
| archive_dir | `CAIRN_ARCHIVE_DIR` | `<state_dir>/archive` |
| cache_dir | `CAIRN_CACHE_DIR` | `<state_dir>/cache` |
| signing_key | `CAIRN_SIGNING_KEY` | none (records are hashed, not signed) |
| log_format | `CAIRN_LOG_FORMAT` | `console` in a terminal, else `json` |
| log_level | `CAIRN_LOG_LEVEL` | `warning` for one-shot commands, `info` for processes |
| metrics_port | `CAIRN_METRICS_PORT` | none (no metrics endpoint; see `coordinator.metrics`) |

`cairn.Client` and every `cairn` command read them once, here. The signing key has no
flag on purpose: a flag would show it in every process listing. Worker and coordinator
processes the CLI starts get the resolved values as `CAIRN_*` variables (the Redis URL
among them, never on their command line), which is how they read their configuration.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from storage.errors import InvalidSpec

URL_FILE = "redis.url"  # in the state directory, while `cairn up` runs
SCHEMES = ("redis", "rediss", "unix")
LOG_FORMATS = ("console", "json")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


class Settings(BaseSettings):
    """Cairn's settings as the API and the CLI resolve them (see the module's table)."""

    model_config = SettingsConfigDict(env_prefix="CAIRN_", extra="ignore", env_ignore_empty=True)

    redis_url: str | None = None
    state_dir: Path = Path(".cairn")
    archive_dir: Path | None = None
    cache_dir: Path | None = None
    signing_key: SecretStr | None = None
    log_format: Literal["console", "json"] | None = None
    log_level: str | None = None
    metrics_port: int | None = Field(default=None, ge=1, le=65_535)

    @field_validator("redis_url")
    @classmethod
    def _known_scheme(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme not in SCHEMES:
            raise ValueError(f"must start with one of {', '.join(s + '://' for s in SCHEMES)}")
        if parts.scheme != "unix" and not parts.hostname:
            raise ValueError("names no host")
        if parts.scheme == "unix" and not parts.path:
            raise ValueError("names no socket path")
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

    def key(self) -> bytes | None:
        """The signing key as the codec takes it."""
        secret = self.signing_key.get_secret_value() if self.signing_key else ""
        return secret.encode() or None

    def redis(self) -> tuple[str, str]:
        """Return the Redis URL to use and where it came from.

        Raises `InvalidSpec` when none is configured and no `cairn up` is running here.
        """
        if self.redis_url:
            return self.redis_url, "CAIRN_REDIS_URL"
        try:
            written = self.url_file.read_text().strip()
        except OSError:
            written = ""
        if written:
            return written, f"{self.url_file}, written by `cairn up`"
        raise InvalidSpec(
            "no Redis configured: set CAIRN_REDIS_URL (or --redis-url), or run `cairn up`"
        )

    def child_env(self, url: str) -> dict[str, str]:
        """The environment of a worker or coordinator process the CLI starts."""
        env = dict(os.environ)
        env.update(
            CAIRN_REDIS_URL=url,
            CAIRN_ARCHIVE_DIR=str(self.archive.resolve()),
            CAIRN_CACHE_DIR=str(self.cache.resolve()),
        )
        optional = {
            "CAIRN_SIGNING_KEY": self.signing_key.get_secret_value() if self.signing_key else None,
            "CAIRN_LOG_FORMAT": self.log_format,
            "CAIRN_LOG_LEVEL": self.log_level,
            "CAIRN_METRICS_PORT": None if self.metrics_port is None else str(self.metrics_port),
        }
        env.update({name: value for name, value in optional.items() if value})
        return env


def load_settings(**overrides: object) -> Settings:
    """Read the settings from the environment, with `overrides` (flags) taking precedence.

    Raises `InvalidSpec` naming the variable and the reason for a value that is not valid.
    """
    given = {name: value for name, value in overrides.items() if value is not None}
    try:
        return Settings(**given)  # type: ignore[arg-type]  # flags are checked here, by pydantic
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else "settings"
        source = f"--{field.replace('_', '-')}" if field in given else f"CAIRN_{field.upper()}"
        raise InvalidSpec(f"invalid setting {source}: {first['msg']}") from None


def display_url(url: str) -> str:
    """`url` with its password masked, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
