"""The block cache: whole data blocks fetched from objects with ranged gets, bounded in bytes.

Cold reads go through here. A block is fetched once even when several readers want it at the same time,
checked against its CRC before anyone sees it, and kept in LRU order within ``bytes_max``. Sequential
readers get readahead: the store asks for the next blocks before the reader does, and releases
each block it has read to the end, which then goes first when room is needed (freed after read).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from stratalog.caching import BoundedCache
from stratalog.engine.metadata import RangeRow
from stratalog.engine.objformat import check_block
from stratalog.objects.store import ObjectStore

_Key = tuple[str, int]


@dataclass(slots=True)
class BlockCacheStats:
    hits: int = 0
    misses: int = 0
    readahead_blocks: int = 0
    evicted_blocks: int = 0
    fetched_bytes: int = 0


class BlockCache:
    def __init__(self, store: ObjectStore, bytes_max: int, io_threads: int = 4) -> None:
        self._store = store
        self._blocks: BoundedCache[_Key, bytes] = BoundedCache(bytes_max, len, lru=True)
        self._inflight: dict[_Key, Future[bytes]] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(io_threads, thread_name_prefix="stratalog-blockcache")
        self.stats = BlockCacheStats()

    def get(self, row: RangeRow) -> bytes:
        """The data block ``row`` describes, CRC-checked. Raises CorruptObjectError or ObjectStoreError."""
        key = (row.key, row.position)
        with self._lock:
            data = self._blocks.get(key)
            if data is not None:
                self.stats.hits += 1
                return data
            future = self._inflight.get(key)
            if future is None:
                future = Future()
                self._inflight[key] = future
                owner = True
                self.stats.misses += 1
            else:
                owner = False
        if owner:
            self._load(key, row, future)
        return future.result()

    def prefetch(self, rows: list[RangeRow]) -> None:
        """Start fetching blocks a sequential reader will want next; returns at once."""
        for row in rows:
            key = (row.key, row.position)
            with self._lock:
                if key in self._blocks or key in self._inflight:
                    continue
                future: Future[bytes] = Future()
                self._inflight[key] = future
                self.stats.readahead_blocks += 1
            self._pool.submit(self._load, key, row, future)

    def release(self, row: RangeRow) -> None:
        """A sequential reader has read this block to its end: evict it before blocks not yet read."""
        with self._lock:
            self._blocks.make_oldest((row.key, row.position))

    def _load(self, key: _Key, row: RangeRow, future: Future[bytes]) -> None:
        try:
            data = check_block(self._store.get(row.key, row.position, row.position + row.size_bytes), row.entry())
        except BaseException as e:
            with self._lock:
                del self._inflight[key]
            future.set_exception(e)
            return
        with self._lock:
            del self._inflight[key]
            self.stats.fetched_bytes += len(data)
            self.stats.evicted_blocks += self._blocks.put(key, data)
        future.set_result(data)

    def drop_object(self, object_key: str) -> None:
        """Forget every cached block of an object that was deleted."""
        with self._lock:
            for key in [k for k in self._blocks.keys() if k[0] == object_key]:  # noqa: SIM118 (keys() copies: safe beside other threads)
                self._blocks.pop(key)

    @property
    def cached_bytes(self) -> int:
        return self._blocks.size

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._blocks.clear()
