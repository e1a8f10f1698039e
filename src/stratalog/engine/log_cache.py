"""The log cache: batches appended and durable in the WAL but not yet in objects, per stream, in memory.

Appenders add at the end of a stream's list (under the store lock); only the uploader removes, from the
front, after the batches are committed in objects. Readers of the tail take the batches between two offsets.
``StreamState`` is a stream's whole state in the store: its offsets and its part of the cache.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass


@dataclass(slots=True)
class LogEntry:
    """One batch in the log cache."""

    base_offset: int
    count: int
    data: bytes
    max_timestamp_ms: int
    wal_offset: int
    appended_at: float

    @property
    def end_offset(self) -> int:
        return self.base_offset + self.count


@dataclass(slots=True)
class StreamState:
    stream_id: int
    name: str | None
    start_offset: int
    committed_end: int           # offsets below are in objects
    next_offset: int             # offset the next append gets
    durable_end: int             # offsets below are acknowledged: what readers may see
    #: Batches in the LogCache, oldest first (offsets and WAL offsets both ascending). Appenders add at
    #: the end and only the uploader removes from the front, so the uploader may read a prefix without
    #: the store lock. An empty tuple while there are none, so idle streams hold no list.
    cache: list[LogEntry] | tuple[()] = ()
    #: Readahead: where a sequential reader will fetch next, and how many blocks to read ahead.
    read_next: int = -1
    readahead_blocks: int = 1
    #: An external commit is placing objects at this stream's end: appends wait until it is done.
    fenced: bool = False

    def push(self, entry: LogEntry) -> None:
        cache = self.cache
        if not isinstance(cache, list):
            cache = self.cache = []
        cache.append(entry)

    def drop_oldest(self, count: int) -> None:
        cache = self.cache
        assert isinstance(cache, list)
        del cache[:count]
        if not cache:
            self.cache = ()

    def cached_between(self, start: int, stop: int) -> list[LogEntry]:
        """Log-cache batches holding offsets in ``[start, stop)`` (store lock held; no scan of the rest)."""
        cache = self.cache
        first = bisect.bisect_right(cache, start, key=lambda e: e.end_offset)
        last = bisect.bisect_left(cache, stop, lo=first, key=lambda e: e.base_offset)
        return list(cache[first:last])


#: A stream's batches taken for one upload: a prefix of its log cache.
Taken = list[tuple[StreamState, list[LogEntry]]]


class LogCache:
    """Which streams hold batches in the log cache, how many bytes, and since when (all under the store
    lock, except :meth:`durable_prefixes`, which reads the prefixes only the uploader removes)."""

    def __init__(self) -> None:
        self.streams: dict[int, StreamState] = {}   # streams with entries
        self.size_bytes = 0
        #: When the oldest entry came in, about (for upload_interval_s; None when empty).
        self.oldest: float | None = None

    def add(self, st: StreamState, entry: LogEntry) -> bool:
        """Add ``entry`` at the end of ``st``'s batches; True when the cache was empty before."""
        was_empty = not self.streams
        if was_empty:
            self.oldest = entry.appended_at
        st.push(entry)
        self.streams[st.stream_id] = st
        self.size_bytes += len(entry.data)
        return was_empty

    def durable_prefixes(self, cached: list[StreamState], durable_wal_offset: int) -> Taken:
        """Each stream's batches whose WAL offset is below ``durable_wal_offset``, in stream id order.
        Without the lock: appends only add batches at the ends, past the durable offset, and only the
        uploader removes any."""
        taken: Taken = []
        for st in sorted(cached, key=lambda s: s.stream_id):
            cache = st.cache
            count = bisect.bisect_left(cache, durable_wal_offset, key=lambda e: e.wal_offset)
            if count:
                taken.append((st, list(cache[:count])))
        return taken

    def drop_uploaded(self, taken: Taken, taken_at: float) -> int:
        """Drop what an upload committed (lock held); return its bytes."""
        uploaded = sum(len(e.data) for _, entries in taken for e in entries)
        for st, entries in taken:
            st.drop_oldest(len(entries))
            st.committed_end = entries[-1].end_offset
            if not st.cache:
                self.streams.pop(st.stream_id, None)
        self.size_bytes -= uploaded
        # What is left came in about when this upload began (or was not yet durable then).
        self.oldest = taken_at if self.streams else None
        return uploaded

    def drop_stream(self, st: StreamState) -> None:
        """Forget a deleted stream's batches (lock held)."""
        if self.streams.pop(st.stream_id, None) is not None:
            self.size_bytes -= sum(len(e.data) for e in st.cache)
        st.cache = ()
