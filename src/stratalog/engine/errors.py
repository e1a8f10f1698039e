"""The stream store's errors: what an append, a read or a reload may raise, and why."""

from __future__ import annotations

from stratalog.errors import OutOfSpaceError, StratalogError


class BackpressureError(StratalogError):
    """Appends outran uploads for ``append_wait_s_max``: the log cache or the WAL stayed full."""


class OffsetOutOfRangeError(StratalogError, ValueError):
    """The offset is below the stream's start (trimmed) or above its end."""


class StoreClosedError(StratalogError):
    """The store was closed."""


class StoreFailedError(StratalogError):
    """A durability step failed; the store stopped accepting appends. Reopen it to recover."""


class StoreFullError(OutOfSpaceError):
    """Appends are refused: the disk under the store is below its free-space headroom, or object storage
    is out of room. Reads go on; appends resume by themselves once space is back (retry)."""


class UnflushedStreamError(StratalogError):
    """A stream still holds appends here that are not committed: it cannot be reloaded from metadata."""
