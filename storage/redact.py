"""Redaction of secrets (API keys, bearer tokens, passwords in URLs) from text Cairn keeps.

Applied to what a model said and what a tool returned before it is checkpointed, to the
trace, and to every log event. It is a safety net for common shapes of secrets, not a
guarantee: a secret in no known shape is kept as it is.
"""

from __future__ import annotations

import re

from pydantic import JsonValue

REDACTED = "[REDACTED]"

# Each pattern's groups 1 and 2 (where present) are kept around the secret they enclose.
# Beside each, strings one of which the lower-cased text of any match contains (every
# character IGNORECASE takes for one of their letters lowers to it, across Unicode), so a
# pattern runs only on text holding one: most text is spared the scans. "[REDACTED]" holds
# none of them, so no replacement can make a later pattern match where they were missing.
_PATTERNS = (
    # OpenAI-style keys: sk-..., sk-proj-..., sk-ant-...
    (re.compile(r"()\bsk-(?:[A-Za-z]+-)?[A-Za-z0-9_\-]{20,}()"), ("sk-",)),
    # Authorization: Bearer <token>
    (re.compile(r"(\bBearer\s+)[A-Za-z0-9\-._~+/]{8,}=*()", re.IGNORECASE), ("bearer",)),
    # AWS access key ids
    (re.compile(r"()\b(?:AKIA|ASIA)[0-9A-Z]{16}\b()"), ("akia", "asia")),
    # api_key=..., "api-key": "...", apikey: ... (a value, not code: `os.environ[...]`)
    (
        re.compile(
            r"(\bapi[_-]?key[\"']?\s*[:=]\s*[\"']?)[A-Za-z0-9_\-+]{8,}[A-Za-z0-9_\-+./=]*()",
            re.IGNORECASE,
        ),
        ("key",),
    ),
    # the password of a URL: redis://user:secret@host, https://u:p@host
    (re.compile(r"(\b[a-z][a-z0-9+.\-]*://[^:/@\s]*:)[^@\s/]+(@)", re.IGNORECASE), ("://",)),
)


def redact(text: str) -> str:
    """Return `text` with every secret of a known shape replaced by `[REDACTED]`."""
    folded = text.lower()
    for pattern, needles in _PATTERNS:
        for needle in needles:
            if needle in folded:
                text = pattern.sub(_keep_around, text)
                break
    return text


def _keep_around(match: re.Match[str]) -> str:
    """The replacement of one secret: what its pattern keeps around it, `[REDACTED]` inside."""
    return f"{match.group(1)}{REDACTED}{match.group(2)}"


def redact_optional(text: str | None) -> str | None:
    """`redact`, passing None through."""
    return None if text is None else redact(text)


def redact_json(value: JsonValue) -> JsonValue:
    """Redact every string inside a JSON value (keys are kept)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, list):
        return [redact_json(v) for v in value]
    if isinstance(value, dict):
        return {k: redact_json(v) for k, v in value.items()}
    return value
