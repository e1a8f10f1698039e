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

from __future__ import annotations

from typing import TYPE_CHECKING

from stratalog.lazy import lazy_names

if TYPE_CHECKING:
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

#: Where each name above lives. Imported when first asked for: a module of the engine (engine.batch, say)
#: imported alone does not bring the whole store with it (the fuzzing children, the CLI's help).
_HOMES = {
    "StreamStore": "stratalog.engine.store", "Stream": "stratalog.engine.store",
    "BackpressureError": "stratalog.engine.store", "OffsetOutOfRangeError": "stratalog.engine.store",
    "StoreClosedError": "stratalog.engine.store", "StoreFailedError": "stratalog.engine.store",
    "StoreFullError": "stratalog.engine.store", "StoreConfig": "stratalog.engine.config",
    "StoreLockedError": "stratalog.datadir", "TransactionsUnknownError": "stratalog.engine.txn_view",
    "NewRecord": "stratalog.records", "Record": "stratalog.records",
}


__getattr__ = lazy_names(__name__, _HOMES)
