"""A package's names imported when first asked for (PEP 562's module ``__getattr__``), so that importing
one module of the package does not import every module its ``__init__`` re-exports: the engine's and the
WAL's packages use it (a fuzzing child that needs one format module, the CLI's help)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_names(package: str, homes: dict[str, str]) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``package``: each name of ``homes`` from its module (``homes[name]``),
    imported on first use; AttributeError for any other name."""

    def get(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(home), name)

    return get
