"""Operating errors: typed, with a message that says what to do."""

from __future__ import annotations


class StratalogError(Exception):
    """Base of every error stratalog raises on purpose."""


class OutOfSpaceError(StratalogError):
    """Storage is full, or below the free space a store keeps in reserve: writes are refused until room is
    made (delete data, grow the filesystem, raise the bucket's quota); reads go on, and writes resume by
    themselves."""


class WALError(StratalogError):
    """Base of write-ahead log errors."""


class OverCapacityError(WALError):
    """The ring has no room for this append: trim what has been uploaded, then retry."""


class WriteBufferFullError(OverCapacityError):
    """The write buffer is full (the device or the object store is behind) and the append was asked not to
    wait: wait for room (``wait_for_room``), or append from a thread that may wait."""


class WALFailedError(WALError):
    """A write or sync failed; the log stopped and acknowledges nothing more. Reopen to recover."""


class WALClosedError(WALError):
    """The log was closed."""


class WALStateError(WALError):
    """The log was used out of order (for example, append before recover() finished)."""


class RecordTooLargeError(WALError, ValueError):
    """A record is larger than the configured ``record_bytes_max``."""


class CorruptHeaderError(WALError):
    """Neither header slot holds a valid WAL header."""


class CapacityMismatchError(WALError):
    """The requested capacity disagrees with the header or with the file / device size."""


class RecoveryReadError(WALError):
    """Reading the log during recovery failed; recovery stopped rather than guess where the log ends."""


def release_frames(error: BaseException | None) -> None:
    """Drop the tracebacks of ``error`` and of every error it was raised from or during. A closed log or
    store keeps the error that stopped it (to raise it again, as the cause of each refusal), and its
    traceback holds the frames of the calls that raised it, which hold the log or store: a cycle that kept
    a stopped store's memory (its WAL device and buffers, its log cache) until a full garbage collection.
    The message and the chain of causes stay. For the same reason errors are logged by their message
    (``str(error)``), not as the record's argument: a handler that keeps records (pytest's, a
    MemoryHandler) kept the error, its frames and the store (1,200 failed stores in one test: 24 GB)."""
    stack = [error]
    seen: set[int] = set()
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        e.__traceback__ = None
        stack += (e.__cause__, e.__context__)
