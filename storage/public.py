"""`public`: marks, where it is defined, a class or function the facade `cairn` exports.

The facade (`cairn/__init__.py`) imports its names only when first asked for, so a name's
`__module__` is set where it is defined: reprs, tracebacks and docs then say
`cairn.TaskStatus`, not the module it lives in, whichever module was imported first. The
errors keep `cairn.errors`, the module that exports them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

FACADE = "cairn"
Exported = TypeVar("Exported", bound=type[Any] | Callable[..., Any])


def public(exported: Exported) -> Exported:
    """`exported` under the facade's name: its `__module__` becomes `cairn`.

    A class's own annotations are resolved first, in the module that defines it: tools
    that read them later (`typing.get_type_hints`, pydantic) look names up in the module
    `__module__` names, and the facade holds none of them.
    """
    if isinstance(exported, type):
        exported.__annotations__ = inspect.get_annotations(exported, eval_str=True)
        if getattr(exported, "__pydantic_complete__", True) is False:
            # Pydantic would build its schema later, looking names up in the facade (which
            # holds none): a model must be whole when it is marked.
            raise TypeError(f"{exported.__qualname__} refers to a name defined after it")
    exported.__module__ = FACADE
    return exported
