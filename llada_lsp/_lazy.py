"""Lazy package faces: a module's names imported on first use (PEP 562), so importing the package
pays for no torch. Knows nothing of what the names are."""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import Any


def lazy_names(package: str, table: dict[str, str], namespace: dict[str, Any]) -> tuple[Callable, Callable]:
    """`__getattr__` and `__dir__` for `package` (its `__name__`), whose names in `table` (name ->
    relative module) are imported on first use and then kept in `namespace` (its `globals()`)."""

    def __getattr__(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(table[name], package), name)
        namespace[name] = value  # later look-ups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *table})

    return __getattr__, __dir__
