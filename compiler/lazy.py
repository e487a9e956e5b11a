"""Package names that load on first use (PEP 562), so importing a package imports none of its modules.

A device process on a warm start needs a few modules of each package; importing them used to pull
in everything the packages re-export (the op table, the interpreter, the code generator).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping


def lazy_names(package: str, table: Mapping[str, str]) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``, whose name ``n`` is ``table[n]``'s attribute
    ``n`` (a module relative to the package), imported when first used and then kept."""
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> object:
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(table[name], package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted([*namespace, *table])

    return __getattr__, __dir__
