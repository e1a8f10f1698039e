"""The log cache: bulk records in the WAL whose messages are not yet in objects, held in memory, and the
view readers take of it and of the objects. Gets of recent offsets read them here (through a TailIndex,
or record by record for records it does not hold); an upload merges a prefix of them into one run
object, then trims the WAL.

Readers take :attr:`LogCache.view` with no lock: each change (the writer adds a record, an upload swaps a
prefix of records for an object, a merge swaps objects for their pieces) publishes a new frozen
:class:`View` under :attr:`LogCache.lock`, and a reader keeps the one it took for its whole get.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from stratalog.invariant import invariant
from stratalog.queues.config import QueueConfig
from stratalog.queues.errors import PutBackpressureError
from stratalog.queues.format import Ids, U32s
from stratalog.queues.index import RunIndex, TailIndex, read_runs
from stratalog.queues.objects import ReadArgs, RunObject


@dataclass(slots=True, eq=False)
class CachedRecord:
    """One bulk record in the log cache: messages in the WAL, not yet in an object."""

    seq: int
    wal_offset: int
    future: Future[int]
    stream_ids: Ids          # ascending, distinct
    base_offsets: Ids
    counts: Ids
    first_msg: Ids           # run i's messages are first_msg[i] .. first_msg[i + 1]
    data: bytes | memoryview  # the messages in the order of their runs: m is data[message_at[m]:message_at[m + 1]]
    message_at: memoryview   # int32, one more than the messages
    names: list[tuple[int, str]]
    stream_count: int        # streams known once this record was made
    cache_bytes: int
    written_at: float

    _array: Any = None

    def messages(self) -> Any:
        """The messages as an Arrow binary array (a view of the body, no copy), runs in order; made once."""
        array = self._array
        if array is None:
            offsets, data = pa.py_buffer(self.message_at), pa.py_buffer(self.data)
            array = self._array = pa.BinaryArray.from_buffers(pa.binary(), len(self.message_at) - 1,
                                                              [None, offsets, data])
        return array


def runs_in(records: Sequence[CachedRecord], stream_id: int) -> list[tuple[CachedRecord, int, int, int]]:
    """The run of ``stream_id`` in each of ``records`` that has one, as :meth:`TailIndex.runs` gives it."""
    runs = []
    for rec in records:
        i = int(np.searchsorted(rec.stream_ids, stream_id))
        if i < len(rec.stream_ids) and rec.stream_ids.item(i) == stream_id:
            base = rec.base_offsets.item(i)
            runs.append((rec, rec.first_msg.item(i), base, base + rec.counts.item(i)))
    return runs


@dataclass(frozen=True, slots=True)
class View:
    """What a get reads: the uploaded objects in the order of their places, the RunIndex over them (column
    k is ``objects[k]``), and the log cache's records, oldest first."""

    objects: tuple[RunObject, ...]
    records: tuple[CachedRecord, ...]
    index: RunIndex
    #: What a random get reads each object with (``RunObject.read_args``, in the objects' order): made
    #: with the objects (:meth:`of`), kept as records come (:meth:`with_records`).
    read_args: tuple[ReadArgs, ...] = ()

    @classmethod
    def of(cls, objects: tuple[RunObject, ...], records: tuple[CachedRecord, ...], index: RunIndex) -> View:
        return cls(objects, records, index, tuple(o.read_args for o in objects))

    @classmethod
    def empty(cls) -> View:
        return cls((), (), RunIndex.empty())

    def with_records(self, records: tuple[CachedRecord, ...]) -> View:
        return View(self.objects, records, self.index, self.read_args)


class LogCache:
    """The log cache's records and the view over them and the objects; thread-safe.

    Its lock (:attr:`lock`, a condition) guards every change of the view and of the counts here; the
    writer waits on it for room, the uploader for work, the compactor for an upload to pass."""

    def __init__(self, config: QueueConfig) -> None:
        self._bytes_max = config.log_cache_bytes_max
        self._wait_s_max = config.put_wait_s_max
        self._rebuild_s = config.tail_rebuild_s
        self._lookups_max = config.tail_lookups_max
        self.lock = threading.Condition(threading.Lock())
        self.view = View.empty()
        #: Bytes of the records held (under the lock).
        self.cache_bytes = 0
        #: A writer waits for room (or the WAL is full): the uploader should upload now (under the lock).
        self.upload_wanted = False
        #: Uploads done (under the lock): a compactor lets one go first when one is due.
        self.uploads = 0
        self._tail = TailIndex.empty()
        self._tail_lock = threading.Lock()   # one reader rebuilds the tail index at a time
        self._record_seq = 0

    @property
    def tail(self) -> TailIndex:
        """The index of the records' runs as the last read built it (records an upload took since: None)."""
        return self._tail

    def next_seq(self) -> int:
        """The sequence number of the next record (the writer's, or recovery's: one at a time)."""
        self._record_seq += 1
        return self._record_seq

    # The writer ------------------------------------------------------------------------------------

    def wait_for_room(self, size: int, check_open: Callable[[], None]) -> None:
        """Wait until a record of ``size`` bytes fits; PutBackpressureError after ``wait_s_max``."""
        deadline = time.monotonic() + self._wait_s_max
        with self.lock:
            while self.cache_bytes and self.cache_bytes + size > self._bytes_max:
                check_open()
                if time.monotonic() > deadline:
                    raise PutBackpressureError(f"the log cache stayed full for {self._wait_s_max} s: "
                                               "uploads are too slow or failing")
                self.upload_wanted = True
                self.lock.notify_all()
                self.lock.wait(0.1)

    def want_upload(self) -> None:
        """Ask for an upload now and wait a moment for it (the WAL is full: only an upload trims it)."""
        with self.lock:
            self.upload_wanted = True
            self.lock.notify_all()
            self.lock.wait(0.1)

    def add(self, record: CachedRecord) -> None:
        """Publish a record the WAL took: readers see it from now on."""
        with self.lock:
            view = self.view
            self.view = view.with_records((*view.records, record))
            self.cache_bytes += record.cache_bytes

    # Uploads and merges ----------------------------------------------------------------------------

    def uploaded(self, taken: Sequence[CachedRecord], obj: RunObject, ends: U32s, positions: U32s) -> None:
        """``taken`` (a prefix of the records) is in ``obj`` now, its column of the index ``ends`` and
        ``positions``: swap them in the view and let the records go."""
        with self.lock:
            view = self.view
            invariant(view.records[:len(taken)] == tuple(taken), "uploads take a prefix of the log cache")
            self.view = View.of((*view.objects, obj), view.records[len(taken):],
                                view.index.with_object(ends, positions))
            self.cache_bytes -= sum(r.cache_bytes for r in taken)
            # The tail index holds the uploaded records (their messages): let them go, and keep the rest
            # indexed (readers of the log cache's rest need no rebuild).
            self._tail = self._tail.without_through(taken[-1].seq)
            self.uploads += 1
            self.lock.notify_all()

    def merged(self, first: int, stop: int, replaced: tuple[RunObject, ...], merged: tuple[RunObject, ...],
               columns: Sequence[tuple[U32s, U32s]]) -> None:
        """Objects ``first .. stop - 1`` (``replaced``) are merged into ``merged``, whose index columns are
        ``columns``: swap them in the view."""
        with self.lock:
            view = self.view
            invariant(view.objects[first:stop] == replaced, "only a merge removes objects from the view")
            self.view = View.of((*view.objects[:first], *merged, *view.objects[stop:]), view.records,
                                view.index.with_merged(first, stop, columns))

    def set_objects(self, objects: tuple[RunObject, ...], index: RunIndex) -> None:
        """The objects an open found, before any record (recovery)."""
        with self.lock:
            invariant(not self.view.records, "objects are set before the log cache holds records")
            self.view = View.of(objects, (), index)

    def wake_all(self) -> None:
        with self.lock:
            self.lock.notify_all()

    # Reads -----------------------------------------------------------------------------------------

    def read(self, records: tuple[CachedRecord, ...], stream_id: int, pos: int, stop: int,
             out: list[bytes]) -> None:
        """Append messages ``pos .. stop - 1`` of a stream that ``records`` (a view's) hold to ``out``."""
        tail = self._tail
        # Stale once records came after it (uploads only drop the records they take from it: readers of
        # the rest go on with it, as after a send, while the log cache is uploaded under them). One reader
        # rebuilds it at a time (a build of a full log cache at a million queues takes a few hundred MB for
        # a moment); the others meanwhile look up the newer records one by one, or, if there are more than
        # tail_lookups_max of them, wait for the build (each lookup searches a record's runs: after a send
        # to 100 k queues, about 80 records a get).
        if tail.last_seq < records[-1].seq and time.monotonic() - tail.built_at >= self._rebuild_s \
                and self._tail_lock.acquire(blocking=records[-1].seq - tail.last_seq > self._lookups_max):
            try:
                tail = self._tail
                if tail.last_seq < records[-1].seq:     # (a reader that waited may find it built)
                    tail = TailIndex.build(records)
                with self.lock:
                    # Records an upload took meanwhile go from it now (it would hold their messages).
                    live = self.view.records
                    tail = self._tail = tail.without_through(live[0].seq - 1 if live else tail.last_seq)
            finally:
                self._tail_lock.release()
        first_seq = records[0].seq
        # This get's records the index does not hold, looked up one by one: older ones (an upload took
        # them after this get took its view) and newer ones (written since the build).
        older = max(0, min(len(records), tail.first_seq - first_seq))
        newer = len(records)
        while newer > older and records[newer - 1].seq > tail.last_seq:
            newer -= 1
        # (Records an upload took in this get's view are in its objects: the index's runs start at its first.)
        if older:
            pos = read_runs(runs_in(records[:older], stream_id), pos, stop, out)
        if pos < stop:
            pos = tail.read(stream_id, pos, stop, first_seq, out)
        if pos < stop and newer < len(records):
            read_runs(runs_in(records[newer:], stream_id), pos, stop, out)
