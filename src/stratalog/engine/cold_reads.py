"""What cold reads (of records already in objects) share: the range rows of the blocks ahead of each
reader, and the byte-rate bound on what they read."""

from __future__ import annotations

import bisect
import threading
import time

from stratalog.caching import BoundedCache
from stratalog.engine.metadata import Metadata, RangeRow


class Pacer:
    """Holds callers to a byte rate. ``take`` is called after reading ``nbytes``: it books them on a shared
    clock that advances ``nbytes / rate`` per call (from no earlier than the time they took to read) and
    sleeps until it, so a reader slower than the rate never waits and a faster one is held to it."""

    def __init__(self, bytes_per_s: int) -> None:
        self._seconds_per_byte = 1.0 / bytes_per_s
        self._lock = threading.Lock()
        self._booked_until = 0.0

    def take(self, nbytes: int) -> None:
        with self._lock:
            now = time.monotonic()
            cost_s = nbytes * self._seconds_per_byte
            self._booked_until = max(self._booked_until, now - cost_s) + cost_s
            wait_s = self._booked_until - now
        if wait_s > 0:
            time.sleep(wait_s)


def _one(rows: list[RangeRow]) -> int:
    """The range-row cache counts streams, not bytes: each stream's rows are a few dozen at most."""
    return 1


class RangeRowCache:
    """The next blocks of streams being read cold, so a sequential reader asks the metadata once per
    ``rows_per_query`` blocks rather than once per block. Bounded in streams; emptied when objects are
    replaced (compaction), since rows may then name objects on their way out."""

    def __init__(self, meta: Metadata, streams_max: int, rows_per_query: int) -> None:
        self._meta = meta
        self._rows_per_query = rows_per_query
        self._lock = threading.Lock()    # the epoch, and the rows stored with the epoch they were read in
        self._rows: BoundedCache[int, list[RangeRow]] = BoundedCache(streams_max, _one, lru=False)
        self._epoch = 0

    def invalidate(self) -> None:
        with self._lock:
            self._epoch += 1
            self._rows.clear()

    def rows(self, stream_id: int, pos: int, want: int) -> list[RangeRow]:
        """Up to ``want`` blocks of ``stream_id`` in offset order, the first holding offset ``pos``."""
        with self._lock:
            rows = self._rows.get(stream_id)
            epoch = self._epoch
        if rows:
            i = bisect.bisect_right(rows, pos, key=lambda r: r.end_offset)  # first block ending past pos
            if len(rows) - i >= want and rows[i].start_offset <= pos:
                return rows[i:i + want]
        fresh = self._meta.ranges(stream_id, pos, limit=max(want, self._rows_per_query))
        with self._lock:
            if epoch == self._epoch:
                self._rows.put(stream_id, fresh)
        return fresh[:want]
