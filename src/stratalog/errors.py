"""Operating errors: typed, with a message that says what to do."""


class StratalogError(Exception):
    """Base of every error stratalog raises on purpose."""


class WALError(StratalogError):
    """Base of write-ahead log errors."""


class OverCapacityError(WALError):
    """The ring has no room for this append: trim what has been uploaded, then retry."""


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
