"""One bounded cache, for every in-memory cache of blocks, runs, chunks and rows.

Bounded by the sum of ``sizeof`` over its values: their bytes (``len``) for caches of data, 1 each for a
cache bounded in entries. An ``OrderedDict`` underneath, oldest entry first: a hit is one C call
(``dict.get``), so the cache costs a reader what a bare dict would. Two orders: ``lru=True`` moves a hit
to the newest end (a block cache, whose hot blocks must outlive a scan); ``lru=False`` leaves it (first
in, first out, as the million-queue race's cycle cache: no bookkeeping on a hit, for caches each entry of
which is read a few times soon after it came). Either may put an entry at the cold end (read-ahead nobody
has asked for yet, a block read to its end) so that it goes first. Adds, evictions and LRU moves take a
lock; gets do not (a ``dict.get`` is atomic under the GIL), so any number of threads may share one cache.

Why not a library: ``cachetools`` bounds by a ``getsizeof`` too, but its gets are Python calls and it is
not thread-safe, and nothing in it puts an entry at the cold end.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class BoundedCache(Generic[K, V]):
    """Values up to ``size_max`` in all (each sized by ``sizeof``), the oldest evicted first."""

    __slots__ = ("_entries", "_lock", "_lru", "_sizeof", "size", "size_max")

    def __init__(self, size_max: int, sizeof: Callable[[V], int], *, lru: bool) -> None:
        if size_max < 0:
            raise ValueError("a cache's size_max must be >= 0")
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._lock = threading.Lock()
        self._lru = lru
        self._sizeof = sizeof
        #: The bound; a plain attribute, so a cache whose bound follows something else (a share of a budget)
        #: may be given a new one (it applies from the next put).
        self.size_max = size_max
        #: The values held, as ``sizeof`` counts them.
        self.size = 0

    def get(self, key: K) -> V | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if self._lru:
            with self._lock, contextlib.suppress(KeyError):    # (evicted meanwhile: it was still a hit)
                self._entries.move_to_end(key)
        return entry[0]

    def put(self, key: K, value: V, *, newest: bool = True) -> int:
        """Add (or replace) ``key``; return how many entries went to make room. ``newest=False`` puts it
        at the end evicted first. A value larger than the bound is not kept."""
        size = self._sizeof(value)
        evicted = 0
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.size -= old[1]
            if size > self.size_max:
                return 0
            self._entries[key] = (value, size)
            if not newest:
                self._entries.move_to_end(key, last=False)
            self.size += size
            while self.size > self.size_max:
                _, (_, gone) = self._entries.popitem(last=False)
                self.size -= gone
                evicted += 1
        return evicted

    def make_oldest(self, key: K) -> None:
        """Move ``key`` (if held) to the end evicted first: a block read to its end by a sequential reader
        should go before blocks not yet read."""
        with self._lock, contextlib.suppress(KeyError):
            self._entries.move_to_end(key, last=False)

    def pop(self, key: K) -> V | None:
        with self._lock:
            entry = self._entries.pop(key, None)
            if entry is None:
                return None
            self.size -= entry[1]
            return entry[0]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.size = 0

    def keys(self) -> list[K]:
        """The keys, oldest first (a copy: one C call, safe beside other threads)."""
        return list(self._entries)

    def values(self) -> Iterator[V]:
        """The values, oldest first, from a copy taken at once."""
        return (value for value, _ in list(self._entries.values()))

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)
