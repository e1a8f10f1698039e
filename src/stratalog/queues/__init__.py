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
