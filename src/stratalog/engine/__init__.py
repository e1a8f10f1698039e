"""The stream engine: many streams over one WAL, object storage as main storage.

```python
store = StreamStore.open("data", object_store=None)   # or "s3://bucket/prefix?endpoint=http://127.0.0.1:8333"
s = store.create_stream("orders")
base = s.append([b"a", NewRecord(b"b", key=b"k")]).result()   # offsets are dense, one per record
records = s.fetch(base)                                       # Record(offset, timestamp_ms, key, value, headers)
store.close()
```

``fetch`` is read_committed by default: on a store a broker wrote Kafka transactions into, opened without
the broker, pass ``isolation="read_uncommitted"`` (every record) or read through the broker; a store written
by ``append`` alone reads the same either way (engine/txn_view.py).
"""

from stratalog.datadir import StoreLockedError
from stratalog.engine.config import StoreConfig
from stratalog.engine.store import (
    BackpressureError,
    OffsetOutOfRangeError,
    StoreClosedError,
    StoreFailedError,
    StoreFullError,
    Stream,
    StreamStore,
)
from stratalog.engine.txn_view import TransactionsUnknownError
from stratalog.records import NewRecord, Record

__all__ = [
    "StreamStore", "Stream", "StoreConfig", "NewRecord", "Record",
    "BackpressureError", "OffsetOutOfRangeError", "StoreClosedError", "StoreFailedError", "StoreFullError",
    "StoreLockedError", "TransactionsUnknownError",
]
