"""Which core runs: the compiled module ``stratalog._native`` or the Python twins.

The compiled module holds the loops a profile named (docs/ARCHITECTURE.md, "Native code"); each of its
functions has a Python twin that stays the readable reference, and the tests hold the two to the same
results and the same errors. The package builds the module where it can (setup.py); where it was not
built or does not load, or where ``STRATALOG_PURE_PYTHON=1`` asks for it, every caller takes the twin,
and ``stratalog serve`` says which core runs.
"""

from __future__ import annotations

import os
from types import ModuleType

#: Set to 1 to run on the Python twins even where the compiled module is built (as msgpack's
#: MSGPACK_PUREPYTHON and aiohttp's AIOHTTP_NO_EXTENSIONS do).
PURE_PYTHON_ENV = "STRATALOG_PURE_PYTHON"


def _load() -> tuple[ModuleType | None, str]:
    if os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0"):
        return None, f"{PURE_PYTHON_ENV} is set"
    try:
        from stratalog import _native
    except ImportError as e:
        return None, f"the compiled module did not load ({e}); reinstall with a C compiler to build it"
    return _native, ""


#: The compiled module, or None: callers take the Python twin.
native, why_pure = _load()


def core() -> str:
    """Which core runs, for a banner: ``native (C)``, or ``pure Python`` and why."""
    return "native (C)" if native is not None else f"pure Python ({why_pure})"
