"""`CairnSaver`: a LangGraph checkpointer on Cairn's storage (the `langgraph` extra).

    pip install 'cairn-agents[langgraph]'
    from cairn.langgraph import CairnSaver

Importing this module without the extra raises an `ImportError` that says what to install;
`import cairn` never needs it.
"""

from __future__ import annotations

try:
    from storage.langgraph import CairnSaver
except ImportError as exc:  # the optional extra is not installed
    raise ImportError(
        f"cairn.langgraph needs the langgraph extra: pip install 'cairn-agents[langgraph]' ({exc})"
    ) from exc

__all__ = ["CairnSaver"]
