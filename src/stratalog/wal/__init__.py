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
