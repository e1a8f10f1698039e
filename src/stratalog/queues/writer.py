"""The writer: pending puts become bulk records in the WAL and in the log cache.

A drain takes every pending put, finds the queues' dense ids (the NameIndex for the batch at once, then a
dict for names it did not find, creating the queues that are new), groups the messages by queue and
assigns offsets in bulk with NumPy, and appends bulk records (docs/formats/queues.md) to the WAL: new
queues' names first, then the messages in records of about ``record_bytes_target``. Each record goes to
the log cache as the WAL takes it. Drains run one at a time (:attr:`Writer.lock`): the writer thread's,
and those of a flush or a get that must see the puts made before it.
"""

from __future__ import annotations

import itertools
import operator
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stratalog.engine.store import StoreFailedError
from stratalog.errors import OverCapacityError, WALFailedError
from stratalog.queues.errors import TooManyQueuesError, too_many_queues
from stratalog.queues.format import (
    I64,
    NAME_HEAD,
    STREAM_MESSAGES_MAX,
    BulkRecord,
    Chunk,
    Ids,
    chunks_of,
    encode_bulk_parts,
)
from stratalog.queues.lifecycle import Lifecycle
from stratalog.queues.logcache import CachedRecord, LogCache
from stratalog.queues.names import NameIndex
from stratalog.queues.pending import PendingPuts, SinglePuts
from stratalog.queues.record_sort import sort_record
from stratalog.wal import WriteAheadLog

_EMPTY_BATCH = pa.array([], type=pa.binary())
#: Per-queue arrays start with room for this many queues and double when full.
QUEUE_ARRAYS_INITIAL = 1024


class QueueArrays:
    """Per-queue state, indexed by queue id: the next offset (the writer's) and the next offset a
    sequential reader will ask for (the reader's). 16 bytes a queue; room beyond the queues is zeros."""

    def __init__(self) -> None:
        self.next_offsets = np.zeros(QUEUE_ARRAYS_INITIAL, I64)
        self.read_next = np.zeros(QUEUE_ARRAYS_INITIAL, I64)

    @property
    def nbytes(self) -> int:
        return self.next_offsets.nbytes + self.read_next.nbytes

    def grow(self, queues: int) -> None:
        """Room for ``queues`` queues (doubling). Before a new queue's id is published: a reader that finds
        an id indexes these arrays."""
        if queues > len(self.next_offsets):
            size = max(queues, 2 * len(self.next_offsets))
            self.next_offsets = _grown(self.next_offsets, size)
            self.read_next = _grown(self.read_next, size)


def _grown(array: Ids, size: int) -> Ids:
    grown = np.zeros(size, I64)
    grown[:len(array)] = array
    return grown


class Writer:
    """The queues' names, ids and next offsets, and the drains that write puts. The names and offsets
    change under :attr:`lock` only; readers read them without it (a queue's id, once in :attr:`ids`,
    never changes, and its entries in the per-queue arrays exist before it is there)."""

    def __init__(self, *, record_bytes_target: int, wal_wait_s_max: float, queues_max: int, wal: WriteAheadLog,
                 log_cache: LogCache, lifecycle: Lifecycle, queues: QueueArrays) -> None:
        self._record_bytes_target = record_bytes_target
        self._queues_max = queues_max
        self._wal_wait_s_max = wal_wait_s_max
        self._wal = wal
        self._cache = log_cache
        self._lifecycle = lifecycle
        #: Each queue's next offset (and next read): grown here, before new ids are published.
        self.queues = queues
        #: Serializes drains (the writer thread, flush, get).
        self.lock = threading.Lock()
        #: Queue name -> id, for gets and for creating queues.
        self.ids: dict[str, int] = {}
        #: The bytes of the names and ids in :attr:`ids` (the dict's own aside), kept as names are added:
        #: stats() reports it, and summing a million names at each look took about a second.
        self.name_bytes = 0
        #: The same names, for batches of puts: written under the lock only.
        self.names = NameIndex()
        self.stream_count = 0
        self._new_names: list[tuple[int, str]] = []
        #: The future of the last record handed to the WAL, and when that was.
        self.last_future: Future[int] | None = None
        self.last_write = time.monotonic()

    # Drains ----------------------------------------------------------------------------------------

    def drain(self, pending: PendingPuts) -> None:
        """Hand every pending put to the WAL (as bulk records) and to the log cache."""
        with self.lock:
            taken = pending.take()
            if taken is None:
                return
            try:
                self._lifecycle.check_open()
                id_parts: list[Ids] = []
                arrays = []
                # Ids are completed in the order of the puts, so new queues get theirs in the order of
                # their first put.
                for part in taken.parts():
                    if isinstance(part, SinglePuts):
                        id_parts.append(self._resolve(part.names))
                        arrays.append(pa.array(part.messages, type=pa.binary()))
                    else:
                        id_parts.append(self._complete(part.known, part.names) if part.unknown else part.known)
                        arrays.append(part.messages)
                ids = id_parts[0] if len(id_parts) == 1 else np.concatenate(id_parts)
                self._write(ids, arrays)
            except TooManyQueuesError as e:
                # The puts taken are lost: were the store to go on, a flush after them would say they were
                # durable. It stops, and every later call says why.
                self._lifecycle.fail(e)
                raise
            finally:
                pending.written()

    def known_ids(self, names: Any) -> Ids:
        """The ids of ``names`` (an Arrow string array) where known, else -1: for a put_many in its caller's
        thread (a known queue's id never changes)."""
        return self.names.lookup(names)

    def _resolve(self, names: list[str]) -> Ids:
        """The ids of ``names`` (checked names, so str: no check of their type here), creating the queues
        that are new."""
        array = pa.array(names, pa.string())
        return self._complete(self.names.lookup(array), array)

    def _complete(self, ids: Ids, names: Any) -> Ids:
        """``ids`` (a NameIndex lookup of ``names``, an Arrow string array) with each -1 (a name it did not
        find) resolved through the dict, creating the queues that are new."""
        missing = np.flatnonzero(ids < 0)
        if len(missing):
            ids[missing] = self._resolve_new(names.take(missing).to_pylist())
        return ids

    def _resolve_new(self, names: list[str]) -> Ids:
        """The ids of names the NameIndex did not find: mostly new ones, which this creates."""
        ids = self.ids
        try:
            return np.fromiter(map(ids.__getitem__, names), I64, len(names))
        except KeyError:
            pass
        # New names in the order of their first put, each once; every step a C loop.
        new = list(dict.fromkeys(itertools.filterfalse(ids.__contains__, names)))
        first = self.stream_count
        if first + len(new) > self._queues_max:
            raise too_many_queues(first, len(new), self._queues_max)
        self.queues.grow(first + len(new))   # before the ids: a get that finds an id indexes the per-queue arrays
        ids.update(zip(new, range(first, first + len(new)), strict=True))
        self.name_bytes += _object_bytes(new) + _object_bytes(range(first, first + len(new)))
        self.names.add(new, np.arange(first, first + len(new)))
        self._new_names.extend(zip(range(first, first + len(new)), new, strict=True))
        self.stream_count = first + len(new)
        return np.fromiter(map(ids.__getitem__, names), I64, len(names))

    @property
    def next_offsets(self) -> Ids:
        """Each queue's next offset (room beyond ``stream_count``: zeros)."""
        return self.queues.next_offsets

    def _write(self, ids: Ids, arrays: list[Any]) -> None:
        """Split the messages (``arrays``, Arrow binary arrays one after the other; message i on queue
        ``ids[i]``) into records of about record_bytes_target; write each. New queues' names go first, in
        records of their own when there are many (a million new queues bring ~20 MB of names)."""
        target = self._record_bytes_target
        names, self._new_names = self._new_names, []
        if names:
            utf8 = pa.array(list(map(_second, names)), pa.string())
            sizes = np.cumsum(NAME_HEAD.size + np.asarray(pc.binary_length(utf8), I64))
            start = 0
            while start < len(names):
                done = int(sizes[start - 1]) if start else 0
                stop = max(start + 1, int(np.searchsorted(sizes, done + target, side="right")))
                chunk = names[start:stop]
                self._write_record(np.zeros(0, I64), 0, (), chunk, chunk[-1][0] + 1)
                start = stop
        chunks = chunks_of(arrays)
        cumulative = np.cumsum(np.concatenate([np.diff(offsets) for offsets, _ in chunks]) if chunks else [], dtype=I64)
        total = int(cumulative[-1]) if len(cumulative) else 0
        start = 0
        while start < len(ids):
            stop = len(ids)
            if total > target:
                already = int(cumulative[start - 1]) if start else 0
                stop = max(start + 1, int(np.searchsorted(cumulative, already + target, side="right")))
            self._write_record(ids[start:stop], start, chunks, [], self.stream_count)
            start = stop

    def _write_record(self, ids: Ids, lo: int, chunks: tuple[Chunk, ...], names: list[tuple[int, str]],
                      stream_count: int) -> None:
        """One bulk record of messages ``lo .. lo + len(ids) - 1`` of ``chunks`` (and of ``names``)."""
        laid = sort_record(ids, lo, chunks, self.queues.next_offsets, STREAM_MESSAGES_MAX)
        parts = encode_bulk_parts(len(laid.stream_ids), laid.runs_u32, names, stream_count,
                                  laid.message_at.data.cast("B")[4:], laid.data)
        cache_bytes = sum(map(len, parts))
        self._cache.wait_for_room(cache_bytes, self._lifecycle.check_open)
        # The WAL gathers the parts; the log cache keeps the sorted messages themselves (no joined copy of
        # the record: at a million queues that was 6 GB of fresh memory per 100 M messages, each page
        # faulted in under the GIL).
        result = self._append_wal(parts)
        del parts
        stream_ids, base, counts = laid.stream_ids, laid.base_offsets, laid.counts
        self.queues.next_offsets[stream_ids] = base + counts
        first_msg = np.zeros(len(counts) + 1, I64)
        np.cumsum(counts, out=first_msg[1:])
        record = CachedRecord(self._cache.next_seq(), result.offset, result.future, stream_ids, base, counts,
                              first_msg, laid.data, laid.message_at.data, names, stream_count, cache_bytes,
                              time.monotonic())
        self._cache.add(record)
        self.last_future = result.future
        self.last_write = record.written_at

    def _append_wal(self, body: list[bytes | memoryview]) -> Any:
        deadline = time.monotonic() + self._wal_wait_s_max
        while True:
            try:
                return self._wal.append(body)
            except OverCapacityError:
                if time.monotonic() > deadline:
                    raise
            except WALFailedError as e:
                # Whichever thread met it (the writer, or a caller's flush or get writing pending puts), the
                # store stops and says so with its own error, as when the failure reached a record's future.
                self._lifecycle.fail(e)
                raise StoreFailedError(f"the queue store's WAL failed: {e}") from e
            self._cache.want_upload()

    # Recovery --------------------------------------------------------------------------------------

    def adopt_object_names(self, names: Sequence[tuple[int, str]], stream_count: int) -> None:
        """An object recovery loaded names these queues, and brings the streams to ``stream_count``."""
        ids = self.ids
        for stream_id, name in names:
            ids[name] = stream_id
        self.stream_count = stream_count

    def adopt_ends(self, ends: Any) -> None:
        """The queues' ends in the objects recovery loaded."""
        self.queues.grow(len(ends))
        self.queues.next_offsets[:len(ends)] = ends

    def replay(self, bulk: BulkRecord) -> None:
        """A bulk record recovery replays: its names, streams and offsets."""
        self.queues.grow(bulk.stream_count)
        for stream_id, name in bulk.names:
            self.ids[name] = stream_id
        self.stream_count = bulk.stream_count
        self.queues.next_offsets[bulk.stream_ids] = bulk.base_offsets + bulk.counts

    def index_names(self) -> None:
        """Every name known once recovery is done goes into the NameIndex (batches of puts look there)."""
        self.names.add(list(self.ids), np.fromiter(self.ids.values(), I64, len(self.ids)))
        self.name_bytes = _object_bytes(self.ids) + _object_bytes(self.ids.values())


_second = operator.itemgetter(1)


def _object_bytes(objects: Iterable[object]) -> int:
    """What ``objects`` take in memory, each on its own (sys.getsizeof)."""
    return sum(map(sys.getsizeof, objects))
