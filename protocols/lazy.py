"""A package's public names loaded on first use (PEP 562): its `__init__` says where each name
lives, and importing the package costs nothing until a name is used (every `actor-run` process
imports `actor_run`; the Runner alone brings trio, pykka and every cloud).

    if not TYPE_CHECKING:  # mypy reads the TYPE_CHECKING imports instead
        __getattr__, __dir__ = lazy.exports(globals(), {"Runner": "actor_run.supervisors.api.runner"})
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def exports(namespace: dict[str, Any], where: Mapping[str, str | tuple[str, str]],
            computed: Mapping[str, Callable[[], Any]] | None = None,
            ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module's `__getattr__` and `__dir__`. `where`: name -> its module, or (module, its name
    there); `computed`: name -> what makes its value. A value, once loaded, is kept in `namespace`
    (the module's globals), so the next use does not come here."""
    made = dict(computed or {})

    def getattr_(name: str) -> Any:
        if name in made:
            value = made[name]()
        elif name in where:
            place = where[name]
            module, attr = (place, name) if isinstance(place, str) else place
            value = getattr(importlib.import_module(module), attr)
        else:
            raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted({*namespace, *namespace.get("__all__", ())})

    return getattr_, dir_


__all__ = ["exports"]
