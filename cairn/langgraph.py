"""`CairnSaver`: a LangGraph checkpointer on Cairn's storage (the `langgraph` extra).

    pip install 'cairn-agents[langgraph]'
    from cairn.langgraph import CairnSaver

Importing this module without the extra raises an `ImportError` that says what to install;
`import cairn` never needs it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import redis

from cairn.coordinator.settings import load_settings
from cairn.storage.backends.redis import connect
from cairn.storage.codec import Codec

try:
    from cairn.storage.langgraph import CairnSaver as _StorageSaver
except ImportError as exc:  # the optional extra is not installed
    raise ImportError(
        f"cairn.langgraph needs the langgraph extra: pip install 'cairn-agents[langgraph]' ({exc})"
    ) from exc

__all__ = ["CairnSaver"]


class CairnSaver(_StorageSaver):
    """The LangGraph saver, signing with `CAIRN_SIGNING_KEY` unless given a `codec`."""

    def __init__(
        self,
        client: redis.Redis | str,
        archive: str | Path | None = None,
        *,
        codec: Codec | None = None,
        **options: Any,  # noqa: ANN401 - the storage saver's keyword options, as they are
    ) -> None:
        """`client` is a Redis client, or a URL (redis://, rediss://, unix://, redis+sentinel://)."""
        if isinstance(client, str):
            client = connect(client)
        super().__init__(
            client, archive, codec=codec or Codec(signing_key=load_settings().key()), **options
        )
