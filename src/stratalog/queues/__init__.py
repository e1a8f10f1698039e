"""Named queues: a million small queues on the engine's bulk path (WAL bulk records, run objects).

```python
qs = QueueStore.open("data")                  # object_store=None: a local directory under data/
qs.put("orders-17", b"message")               # returns at once; thread-safe
qs.put_many(["a", "b"], [b"x", b"y"])         # sequences, or Arrow / NumPy buffers
qs.flush()                                    # every earlier put is durable when it returns
qs.get("orders-17", 0, 10)                    # -> [b"message"]
qs.commit("billing", "orders-17", 1); qs.committed("billing", "orders-17")   # -> 1
qs.close()
```
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stratalog.lazy import lazy_names

if TYPE_CHECKING:
    from stratalog.queues.config import GROUP_NAME_CHARS_MAX, QUEUE_NAME_CHARS_MAX, QueueConfig
    from stratalog.queues.errors import (
        InvalidQueueNameError,
        MessageTooLargeError,
        PutBackpressureError,
        QueueError,
        TooManyQueuesError,
    )
    from stratalog.queues.recovery import QueueRecoveryReport
    from stratalog.queues.store import QueueStore

__all__ = [
    "QueueStore", "QueueConfig", "QueueRecoveryReport", "QUEUE_NAME_CHARS_MAX", "GROUP_NAME_CHARS_MAX",
    "QueueError", "InvalidQueueNameError", "MessageTooLargeError", "PutBackpressureError", "TooManyQueuesError",
]

#: Where each name above lives. Imported when first asked for: a module of the package (queues.format,
#: say) imported alone does not bring the store, its recovery and the engine with it (the fuzzing
#: children, the CLI's help).
_HOMES = {
    "QueueStore": "stratalog.queues.store", "QueueRecoveryReport": "stratalog.queues.recovery",
    "QueueConfig": "stratalog.queues.config", "QUEUE_NAME_CHARS_MAX": "stratalog.queues.config",
    "GROUP_NAME_CHARS_MAX": "stratalog.queues.config",
    **{name: "stratalog.queues.errors" for name in ("QueueError", "InvalidQueueNameError", "MessageTooLargeError",
                                                     "PutBackpressureError", "TooManyQueuesError")},
}


__getattr__ = lazy_names(__name__, _HOMES)
