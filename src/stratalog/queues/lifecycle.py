"""Whether a queue store runs: open, closing, closed, or stopped by an error; shared by its parts.

It holds no reference to the store or to a part that holds it back (the pending puts it refuses hold it
weakly): a closed store must be freed as soon as its last reference goes, not at the next full garbage
collection (its log cache, indexes and names are gigabytes at a million queues).
"""

from __future__ import annotations

import logging

from stratalog.engine.store import StoreClosedError, StoreFailedError
from stratalog.queues.logcache import LogCache
from stratalog.queues.pending import PendingPuts

log = logging.getLogger("stratalog.queues")


class Lifecycle:
    """The store's state; :meth:`fail` stops it (puts refused, waiters woken)."""

    def __init__(self, pending: PendingPuts, log_cache: LogCache) -> None:
        self._pending = pending
        self._log_cache = log_cache
        #: close has begun: the threads stop, a merge in progress is cancelled.
        self.closing = False
        self.closed = False
        #: The error that stopped the store (the first one), or None.
        self.failure: BaseException | None = None

    def fail(self, error: BaseException) -> None:
        log.error("the queue store stopped: %s", str(error))
        self.failure = self.failure or error
        self._pending.refuse(self.check_open)
        self._log_cache.wake_all()

    def check_not_closed(self) -> None:
        if self.closed:
            raise StoreClosedError("the queue store is closed")

    def check_open(self) -> None:
        if self.failure is not None:
            raise StoreFailedError(f"the queue store stopped after an error: {self.failure}") from self.failure
        if self.closing or self.closed:
            raise StoreClosedError("the queue store is closed")
