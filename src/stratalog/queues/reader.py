"""The reader: gets, and the caches that serve them.

A get first writes the puts made before it (it sees them, durable or not), then reads offsets below the
queue's uploaded end from objects: the queue's row of the RunIndex, a binary search over it for the
objects that hold the offsets, and each run read as the whole pages it lies in (objects.py); the rest
from the log cache. Two kinds of readers: a sequential one (a get at the offset where the queue's last
get ended, a consumer) may read a run from a chunk read ahead for consumers walking the queues in order,
and keeps a run it leaves part of for its next get (:attr:`Reader.run_cache`); a random one (an index
check) takes its messages straight from the pages read and keeps nothing.
"""

from __future__ import annotations

import bisect
import itertools
import threading

from stratalog.caching import BoundedCache
from stratalog.objects.store import ObjectStore
from stratalog.queues.config import QueueConfig
from stratalog.queues.errors import check_name
from stratalog.queues.format import run_messages
from stratalog.queues.lifecycle import Lifecycle
from stratalog.queues.logcache import LogCache
from stratalog.queues.objects import RunObject, read_random_get
from stratalog.queues.pending import PendingPuts
from stratalog.queues.writer import Writer


class Reader:
    """Gets of a store's queues; thread-safe (any number of threads read at once)."""

    def __init__(self, *, objects: ObjectStore, pending: PendingPuts, writer: Writer, log_cache: LogCache,
                 lifecycle: Lifecycle, config: QueueConfig) -> None:
        self._objects = objects
        self._pending = pending
        self._writer = writer
        self._ids = writer.ids     # (never replaced: updated in place)
        self._queues = writer.queues
        self._cache = log_cache
        self._lifecycle = lifecycle
        self._ahead = config.read_ahead_bytes
        self._ahead_cache_bytes = config.read_ahead_cache_bytes
        self._chunks_min = config.read_ahead_chunks_per_object_min
        self._walk_span = config.read_ahead_walk_span
        self._walk_runs_min = config.read_ahead_walk_runs_min
        #: Checked runs kept for sequential readers, by (object id, stream id), first in first out: a
        #: consumer reads each run a few times soon after it came (QueueConfig.read_cache_bytes_max).
        self.run_cache: BoundedCache[tuple[int, int], bytes] = BoundedCache(
            config.read_cache_bytes_max, _run_entry_bytes, lru=False)
        self._counts_lock = threading.Lock()
        #: Reads of objects by gets, the bytes (whole pages) they read, and of them the reads the page cache
        #: could not serve (the disk's).
        self.object_reads = 0
        self.object_read_bytes = 0
        self.object_reads_waited = 0
        #: Gets made (not atomic: a lost count still counts; the compactor only looks for a change).
        self.gets = 0
        self._starts = itertools.count()   # gets begun and ended (see no_get_in_flight)
        self._ends = itertools.count()

    def no_get_in_flight(self) -> bool:
        """No get was running a moment ago (the ends are read first: a get that ends or starts meanwhile
        counts as running), so none holds a view older than that moment. (Each call adds one to both.)"""
        ends = next(self._ends)
        return next(self._starts) == ends

    def get(self, queue_name: str, offset: int, num: int) -> list[bytes]:
        """Messages ``offset .. offset + num - 1`` of ``queue_name`` that exist, in order."""
        next(self._starts)   # counted (atomically: one C call) so merged-away files go once no get is in one
        try:
            return self._get(queue_name, offset, num)
        finally:
            next(self._ends)

    def _get(self, queue_name: str, offset: int, num: int) -> list[bytes]:
        if offset < 0 or num < 0:
            raise ValueError(f"offset and num must be >= 0, got {offset}, {num}")
        if self._lifecycle.closed:
            self._lifecycle.check_not_closed()
        if self._pending.waiting():
            self._writer.drain(self._pending)
        self.gets += 1
        stream_id = self._ids.get(queue_name)
        if stream_id is None or num == 0:
            if stream_id is None and type(queue_name) is not str:
                check_name(queue_name)
            return []
        queues = self._queues
        sequential = queues.read_next.item(stream_id) == offset
        # A consumer's get past the queue's end (its last): nothing to look up. The puts made before this
        # get were written by the drain above, so the queue's next offset counts them. (Only sequential
        # gets look: for a random one the check costs a cache miss more than it saves.)
        if sequential and offset >= queues.next_offsets.item(stream_id):
            return []
        view = self._cache.view
        objects, records, index = view.objects, view.records, view.index
        out: list[bytes] = []
        stop = offset + num
        pos = offset
        if index.objects and not sequential:
            # A random reader (an index check): as far as the page cache serves it, one call, its messages
            # straight from the pages read; the rest as a sequential reader's, below.
            out, pos, reads, read_bytes = read_random_get(index.ends_flat, index.positions_flat, index.capacity,
                                                          view.read_args, stream_id, pos, stop)
            if reads:
                with self._counts_lock:
                    self.object_reads += reads
                    self.object_read_bytes += read_bytes
        if index.objects and pos < stop and (sequential or pos < index.end_of(stream_id)):
            ends, positions = index.row(stream_id)
            if pos < ends[-1]:
                k = bisect.bisect_right(ends, pos)
                # The last run this get reads. A get that spans runs in several objects: if a read must wait
                # for the disk, the later runs are hinted first, so the disk serves them together rather
                # than one after another (runs in the page cache need no hint: it would cost a system call).
                last = k if stop <= ends[k] else min(bisect.bisect_right(ends, stop - 1, k), len(ends) - 1)
                hinted = last == k
                capacity = index.capacity
                runs = self.run_cache
                ahead = self._ahead
                chunks_max = max(self._chunks_min, self._ahead_cache_bytes // (ahead * len(objects))) \
                    if sequential and ahead else 0
                reads = read_bytes = waited = 0
                start = ends[k - 1] if k else 0
                while pos < stop and k <= last:
                    end = ends[k]
                    if end > start:
                        obj = objects[k]
                        upto = min(stop, end)
                        cached = runs.get((obj.object_id, stream_id)) if sequential and runs.size else None
                        if cached is not None:
                            raw = cached
                        else:
                            run_start = positions[k]
                            run_stop = positions[capacity + k]
                            got = obj.read_run_ahead(self._objects, run_start, run_stop, end - start, stream_id,
                                                     ahead, chunks_max, self._walk_span, self._walk_runs_min) \
                                if sequential and ahead else None
                            if got is None and sequential:   # (a random reader tried the page cache above)
                                got = obj.read_run_cached(run_start, run_stop, end - start, stream_id)
                            if got is None:
                                if not hinted:
                                    self._hint_runs(objects, stream_id, positions, capacity, k + 1, last)
                                    hinted = True
                                got = obj.read_run(self._objects, run_start, run_stop, end - start, stream_id,
                                                   not sequential)
                                waited += 1
                            raw, size = got
                            if size:
                                reads += 1
                                read_bytes += size
                            # Keep it only for a sequential reader this get leaves part of it to: a random
                            # reader (an index check) rarely comes back to the same run.
                            if sequential and stop < end:
                                runs.put((obj.object_id, stream_id), raw)
                        out += run_messages(raw, end - start, pos - start, upto - start)
                        pos = upto
                        # This get ends where the run does: the reader's next get wants the next run
                        # (the next one with messages: a merge's pieces leave a queue's runs empty in all
                        # pieces but one).
                        if sequential and pos == end == stop:
                            j = bisect.bisect_right(ends, end, k + 1)
                            if j < len(ends) and objects[j].reader is not None:
                                objects[j].reader.will_need(positions[j], positions[capacity + j])
                    start = end
                    k += 1
                if reads:
                    with self._counts_lock:
                        self.object_reads += reads
                        self.object_read_bytes += read_bytes
                        self.object_reads_waited += waited
        if pos < stop and records:
            self._cache.read(records, stream_id, pos, stop, out)
        queues.read_next[stream_id] = offset + len(out)
        return out

    def _hint_runs(self, objects: tuple[RunObject, ...], stream_id: int, positions: memoryview, capacity: int,
                   first: int, last: int) -> None:
        """Ask the kernel to read runs ``first .. last`` of a stream ahead (those not cached here); its
        runs' positions as :meth:`RunIndex.row` gives them."""
        for j in range(first, last + 1):
            reader = objects[j].reader
            start, stop = positions[j], positions[capacity + j]
            if stop > start and reader is not None and (objects[j].object_id, stream_id) not in self.run_cache:
                reader.will_need(start, stop)


#: What a kept run costs besides its bytes: its cache entry, its key and the objects' heads, about.
RUN_ENTRY_OVERHEAD_BYTES = 100


def _run_entry_bytes(raw: bytes) -> int:
    """A kept run's share of read_cache_bytes_max: its bytes and its entry's overhead."""
    return len(raw) + RUN_ENTRY_OVERHEAD_BYTES
