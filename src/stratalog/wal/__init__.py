"""The Delta WAL: a durable write-ahead log on a preallocated file or raw block device; and the object WAL
(:class:`ObjectWAL`, docs/formats/object-wal.md), the same interface over object storage.

```python
wal = WriteAheadLog.open(path, capacity_bytes=1 << 30, create=True)
for rec in wal.recover():           # records after the trim point, in offset order
    rec.offset, rec.data
res = wal.append(b"payload")        # -> AppendResult(offset, future)
res.future.result()                 # returns once durable; futures complete in offset order
wal.trim(res.offset)                # records at offsets <= res.offset may be overwritten
wal.close()
```
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stratalog.lazy import lazy_names

if TYPE_CHECKING:
    from stratalog.errors import (
        CapacityMismatchError,
        CorruptHeaderError,
        OverCapacityError,
        RecordTooLargeError,
        RecoveryReadError,
        WALClosedError,
        WALError,
        WALFailedError,
        WALStateError,
    )
    from stratalog.wal.config import FsyncPolicy, ObjectWALConfig, WALConfig
    from stratalog.wal.log import AppendResult, WriteAheadLog
    from stratalog.wal.object_wal import ObjectWAL
    from stratalog.wal.protocol import WAL
    from stratalog.wal.recovery import RecoveredRecord, RecoveryStats

__all__ = [
    "WriteAheadLog", "ObjectWAL", "WAL", "AppendResult", "RecoveredRecord", "RecoveryStats", "WALConfig",
    "ObjectWALConfig", "FsyncPolicy",
    "WALError", "OverCapacityError", "WALFailedError", "WALClosedError", "WALStateError",
    "RecordTooLargeError", "CorruptHeaderError", "CapacityMismatchError", "RecoveryReadError",
]

#: Where each name above lives. Imported when first asked for: a module of the WAL (wal.format, say)
#: imported alone does not bring both logs with it (the engine's batch format, the fuzzing children).
_HOMES = {
    **dict.fromkeys(("WALError", "OverCapacityError", "WALFailedError", "WALClosedError", "WALStateError",
                     "RecordTooLargeError", "CorruptHeaderError", "CapacityMismatchError", "RecoveryReadError"),
                    "stratalog.errors"),
    **dict.fromkeys(("WALConfig", "ObjectWALConfig", "FsyncPolicy"), "stratalog.wal.config"),
    **dict.fromkeys(("WriteAheadLog", "AppendResult"), "stratalog.wal.log"),
    "ObjectWAL": "stratalog.wal.object_wal", "WAL": "stratalog.wal.protocol",
    **dict.fromkeys(("RecoveredRecord", "RecoveryStats"), "stratalog.wal.recovery"),
}


__getattr__ = lazy_names(__name__, _HOMES)
