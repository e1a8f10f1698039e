"""Which core runs: the compiled module ``stratalog._native`` or the Python twins.

The compiled module holds the loops a profile named (docs/ARCHITECTURE.md, "Native code"); each of its
functions has a Python twin that stays the readable reference, and the tests hold the two to the same
results and the same errors. The package builds the module where it can (setup.py); where it was not
built or does not load, or where ``STRATALOG_PURE_PYTHON=1`` asks for it, every caller takes the twin,
and ``stratalog serve`` says which core runs.
"""

from __future__ import annotations

import ctypes
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


def _hand_over_crc32c(module: ModuleType) -> ctypes.CDLL | None:
    """Give the compiled module a CRC32C function: google-crc32c's ``crc32c_extend``, from the C library its
    extension links (a copy in the wheel, or the system's libcrc32c). Found through the extension, as
    dlsym searches a library's dependencies: no path or file name guessed. The library stays loaded for
    the life of the process (the handle returned is kept). None where there is none to load."""
    try:
        from google_crc32c import _crc32c  # (its C extension; no type information)
        library = ctypes.CDLL(_crc32c.__file__)
        address = ctypes.cast(library.crc32c_extend, ctypes.c_void_p).value
        module._use_crc32c(address)
    except (ImportError, OSError, AttributeError, ValueError, TypeError):
        return None
    return library


_crc32c_library = _hand_over_crc32c(native) if native is not None else None
#: The compiled module where it also computes CRC32C (what its readers of checked pages need), else None.
native_crc: ModuleType | None = native if _crc32c_library is not None else None


def core() -> str:
    """Which core runs, for a banner: ``native (C)``, or ``pure Python`` and why."""
    if native is None:
        return f"pure Python ({why_pure})"
    if native_crc is None:
        return "native (C), but without a CRC32C library (google-crc32c's did not load): queue reads on Python"
    return "native (C)"
