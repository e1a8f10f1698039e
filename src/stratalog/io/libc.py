"""The C library calls Python's ``os`` module lacks or makes slower, in one place.

Each is loaded once through ctypes, from the symbols the process has already loaded (``None`` to ctypes:
Python links the C library, so no search for it, which ``ctypes.util.find_library`` makes by running
``ldconfig``, a process per call); where the C library lacks it (not glibc, an old kernel), the name is
None or the function does nothing, and callers fall back to ``os``. Calls made through ``ctypes.PyDLL``
keep the GIL: they are for calls that do not wait on the disk, where giving the GIL up and getting it back
costs more than the call.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

#: Reads up to this size first try the page cache without giving up the GIL (see cached_view): the
#: size of one thread's read buffer.
CACHED_READ_BYTES_MAX = 64 << 10
#: prctl's option that sends the calling process a signal when its parent dies (linux/prctl.h).
_PR_SET_PDEATHSIG = 1


def _libc_keeping_gil(name: str, argtypes: tuple[Any, ...] | None, restype: Any) -> Any:
    """libc's function ``name`` through ctypes.PyDLL, which calls it without releasing the GIL; None where
    it cannot be loaded. It returns what libc returns (an error number or -1) and never raises.
    ``argtypes`` None: the caller passes arguments as C types itself."""
    try:
        function = getattr(ctypes.PyDLL(None), name)
    except (OSError, AttributeError, TypeError):
        return None
    function.argtypes = argtypes
    function.restype = restype
    return function


class _IoVec(ctypes.Structure):
    _fields_ = (("base", ctypes.c_void_p), ("length", ctypes.c_size_t))


#: posix_fadvise (returns an error number); None: os.posix_fadvise.
_fadvise_keeping_gil: Callable[[int, int, int, int], int] | None = _libc_keeping_gil(
    "posix_fadvise", (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int),
    ctypes.c_int) if hasattr(os, "POSIX_FADV_WILLNEED") else None
#: preadv2 (returns bytes read, or -1); None: every read through os.pread. No argtypes: converting five
#: arguments through them cost a sixth of a cached read, so a caller passes the offset as a ctypes.c_int64
#: and the rest as C ints.
_preadv2_keeping_gil = _libc_keeping_gil("preadv2", None, ctypes.c_ssize_t) if hasattr(os, "RWF_NOWAIT") else None


class _CachedReadBuffer(threading.local):
    """Each thread's buffer for cached_view, with its I/O vector made once and the box its offsets are
    passed in: making either per read cost a large part of a cached read."""

    def __init__(self) -> None:
        self.buffer = ctypes.create_string_buffer(CACHED_READ_BYTES_MAX)
        vector = _IoVec(ctypes.addressof(self.buffer), 0)
        # One attribute of a threading.local to look up per read, not four.
        self.parts = (vector, ctypes.byref(vector), memoryview(self.buffer).cast("B"), ctypes.c_int64())


_cached_read_buffer = _CachedReadBuffer()


def cached_view(fd: int, size: int, offset: int) -> memoryview | None:
    """The ``size`` bytes (at most CACHED_READ_BYTES_MAX) at ``offset`` if the page cache holds them all,
    read without giving up the GIL (``preadv2`` with ``RWF_NOWAIT``: the kernel answers EAGAIN rather than
    go to the disk), as a view of this thread's read buffer: valid until the thread's next read. None
    otherwise. ``os.pread`` releases the GIL even for cached bytes, and with reader threads queueing for
    it, getting it back cost more than the copy (cached gets from 8 threads nearly doubled keeping it)."""
    if _preadv2_keeping_gil is None:
        return None
    vector, vector_ref, view, offset_box = _cached_read_buffer.parts
    vector.length = size
    offset_box.value = offset
    got: int = _preadv2_keeping_gil(fd, vector_ref, 1, offset_box, os.RWF_NOWAIT)
    return view[:size] if got == size else None


def will_need(fd: int, start: int, length: int) -> None:
    """Ask the kernel to read ``length`` bytes at ``start`` ahead, keeping the GIL (the call only queues
    the reads; see LocalObjectReader.will_need for what that saved). ``length`` must be positive: to
    ``posix_fadvise`` a length of 0 means the rest of the file."""
    if length <= 0:
        return
    if _fadvise_keeping_gil is not None:
        _fadvise_keeping_gil(fd, start, length, os.POSIX_FADV_WILLNEED)
        return
    with contextlib.suppress(OSError):
        os.posix_fadvise(fd, start, length, os.POSIX_FADV_WILLNEED)


def die_with_parent() -> None:
    """Have the kernel kill this process when its parent dies (Linux's PR_SET_PDEATHSIG); nothing elsewhere.
    The caller checks the parent is still there afterwards: it may have died before the call."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _load_malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(None)
        trim: Callable[[int], int] = libc.malloc_trim
        return trim
    except (OSError, AttributeError):
        return None  # not glibc


_MALLOC_TRIM = _load_malloc_trim()


def return_freed_memory() -> None:
    """Hand freed heap memory back to the OS (glibc's malloc_trim; nothing elsewhere). glibc keeps freed
    memory for reuse, and a queue store's upload frees a great deal of it in pieces that would otherwise stay
    resident."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
