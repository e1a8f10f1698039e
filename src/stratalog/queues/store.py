"""QueueStore: a million small queues as streams of the engine's bulk path.

Write path: ``put`` appends the name and the message to one list (no lock: an ``extend`` is atomic under
the GIL) and returns; ``put_many`` appends its batch as Arrow arrays (puts.py). A writer thread takes the
list every few milliseconds, resolves names to dense stream ids (NameIndex, then a dict for new names),
groups the messages by stream and assigns offsets in bulk with NumPy, and appends one bulk record to the
WAL (docs/formats/queues.md). The record stays in memory (the log cache, logcache.py) until an upload
merges many records into one run object: each queue's messages contiguous, a dense index of 8 bytes per
queue per object (RunIndex). ``flush`` hands what is pending to the WAL and waits until it is durable.

Read path: offsets below a queue's uploaded end come from objects (a binary search over the queue's row
of the RunIndex, then one ranged read of the pages its run lies in, objects.py); the rest from the log
cache. Compaction merges consecutive objects (compaction.py, in a worker process with a local store).
Recovery reads each object's index (never its data), then replays the WAL from its trim point.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import itertools
import logging
import math
import operator
import os
import sys
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stratalog.datadir import lock_data_dir, prepare_data_dir, unlock_data_dir
from stratalog.engine.metadata import Metadata, NewObject
from stratalog.engine.store import StoreClosedError, StoreFailedError
from stratalog.engine.upkeep import delete_orphans, with_retries
from stratalog.errors import OverCapacityError, StratalogError, WALFailedError, release_frames
from stratalog.invariant import invariant
from stratalog.io import libc
from stratalog.io.device import Device
from stratalog.objects.local import LocalDirStore
from stratalog.objects.store import ObjectStore, made_ahead, put_parts
from stratalog.queues.compaction import (
    MergePlan,
    MergeResult,
    MergeSource,
    idle_merge_start,
    merge_piece,
    plan_merge,
    tier_merge_start,
)
from stratalog.queues.config import GROUP_NAME_CHARS_MAX, QUEUE_NAME_CHARS_MAX, QueueConfig
from stratalog.queues.errors import (
    MessageTooLargeError,
    PutBackpressureError,
    QueueError,
    check_name,
)
from stratalog.queues.format import (
    I64,
    NAME_HEAD,
    OBJECT_FOOTER_BYTES,
    STREAM_MESSAGES_MAX,
    U32,
    BulkRecord,
    CorruptBulkError,
    Ids,
    ObjectParts,
    U32s,
    decode_bulk,
    decode_footer,
    decode_index,
    encode_bulk,
    lay_out_object,
    run_messages,
)
from stratalog.queues.index import RunIndex, TailIndex
from stratalog.queues.logcache import CachedRecord, runs_in
from stratalog.queues.manifest import QueueObjectRef, last_manifest_seq, publish_manifest
from stratalog.queues.merge_worker import MergeCancelledError, MergeJob, run_merge_job
from stratalog.queues.names import NameIndex
from stratalog.queues.objects import (
    CHUNKS_PER_OBJECT_MIN,
    QUEUE_PREFIX,
    RunObject,
    object_order,
    queue_object_key,
)
from stratalog.queues.puts import as_bytes, messages_as_arrow, names_as_arrow, plain_name
from stratalog.queues.recovery import ACTIONS, Action, QueueRecoveryReport, classify
from stratalog.wal import WriteAheadLog

log = logging.getLogger("stratalog.queues")

#: Messages up to this size take put's fast path (no lock) and count as one pending message each;
#: larger ones are also counted by their bytes, so pending_bytes_max bounds what big messages can hold.
SMALL_MESSAGE_BYTES_MAX = 1024
_BULK = object()
#: Slots of the pending-put list a put takes: name, message, id.
PUT_SLOTS = 3
#: A read of the log cache rebuilds the tail index at most this often; records written since the last
#: build are searched one by one.
TAIL_REBUILD_S = 0.05
#: ... and a reader that would look up more than this many records one by one waits for the rebuild.
TAIL_LOOKUPS_MAX = 16
#: A log-cache run's messages are cut in a loop up to this many, beyond by Arrow.
TAIL_LOOP_MESSAGES_MAX = 8
_EMPTY_BATCH = pa.array([], type=pa.binary())
_COMMIT_KEY = "queue-commit:{}:{}:{}"
_T = TypeVar("_T")


_View = tuple[tuple[RunObject, ...], tuple[CachedRecord, ...], RunIndex]


class QueueStore:
    """Durable named queues, created on first put, offsets dense from 0. Thread-safe."""

    def __init__(self, data_dir: Path, objects: ObjectStore, config: QueueConfig,
                 wal_device: Device | None = None) -> None:
        config.validate()
        self._dir = data_dir
        self._config = config
        self._merges_in_worker = config.compact_in_worker and type(objects) is LocalDirStore
        self._objects = objects
        self._lock_fd = lock_data_dir(data_dir)
        self._meta = Metadata(data_dir / "meta.sqlite")
        # Puts: name, message, -1 appended to one flat list (PUT_SLOTS slots a put: the writer finds the ids
        # of all it takes at once); a put_many is (names, ids, array), None, _BULK. One list.extend of a
        # tuple is atomic under the GIL, so a put's slots are never split; the tuple comes from CPython's
        # free list and dies at once: no object per pending put, nothing for the cyclic GC to track.
        # Small messages count against pending_messages_max; large ones and bulk puts also by their bytes.
        self._buf: list[Any] = []
        self._in_flight = False         # a drain has taken puts from _buf and not yet written them
        self._wake_slots = PUT_SLOTS * config.pending_messages_wake
        self._max_slots = PUT_SLOTS * config.pending_messages_max
        self._small_max = min(SMALL_MESSAGE_BYTES_MAX, config.message_bytes_max)
        self._put_cond = threading.Condition(threading.Lock())
        self._large_bytes = 0
        self._bulk_pending = 0
        self._wake = threading.Event()
        # Whether a put has set _wake since the writer last cleared it: a plain attribute, so the puts that
        # come while the writer is behind (each of them past pending_messages_wake) do not each call
        # Event.is_set.
        self._woken = False
        # The writer's state; _writer_lock serializes drains (the writer thread, flush, get).
        self._writer_lock = threading.Lock()
        self._ids: dict[str, int] = {}
        self._names = NameIndex()   # the same names, for batches of puts (written by the writer only)
        self._stream_count = 0
        self._next = np.zeros(1024, I64)
        self._new_names: list[tuple[int, str]] = []
        self._last_future: Future[int] | None = None
        self._last_write = time.monotonic()
        # What readers see: uploaded objects and the log cache, swapped as one tuple.
        self._view_lock = threading.Condition(threading.Lock())
        self._view: _View = ((), (), RunIndex.empty())
        self._tail = TailIndex.empty()
        self._tail_lock = threading.Lock()
        self._record_seq = 0
        self._cache_bytes = 0
        self._upload_lock = threading.Lock()
        self._upload_wanted = False
        self._read_lock = threading.Lock()
        # Checked runs kept for readers: (object id, stream id) -> (run bytes, message count, bytes held).
        self._runs: OrderedDict[tuple[int, int], tuple[bytes, int, int]] = OrderedDict()
        self._runs_bytes = 0
        self._object_reads = 0          # reads of objects by gets, and the bytes (whole pages) they read
        self._object_read_bytes = 0
        self._object_reads_waited = 0   # of them, reads the page cache could not serve (the disk's)
        self._read_next = np.zeros(1024, I64)
        self._gets = 0                  # gets made, and when the compactor last saw the count change
        self._rest_gets = 0
        self._rest_since = time.monotonic()
        self._closing = False
        self._closed = False
        self._failure: BaseException | None = None
        # Compaction: merged-away objects wait here (monotonic time retired, object) until no get can hold them.
        self._compact_wake = threading.Event()
        self._uploads = 0               # uploads done (under _view_lock): merges let one go when due
        self._retired: list[tuple[float, RunObject]] = []
        self._merge_cancelled = False   # a close stopped a merge: its worker's temp file is left behind
        self._get_starts = itertools.count()   # gets begun and ended (see _no_get_in_flight)
        self._get_ends = itertools.count()
        self.compactions = 0
        self.compactions_at_rest = 0    # of them, merges a store at rest made (QueueConfig.compact_idle_s)
        self.compacted_bytes = 0
        self.merge_worker_peak_rss_bytes = 0
        self.compaction_error: BaseException | None = None
        # The queue manifest readers without this process use (Spark); published under _upload_lock.
        self._manifest_seq = last_manifest_seq(objects)
        self._wal = WriteAheadLog.open(data_dir / "wal" if wal_device is None else wal_device,
                                       capacity_bytes=config.wal_capacity_bytes, create=True, config=config.wal)
        self.recovery = self._recover()
        self._writer = threading.Thread(target=self._writer_loop, name="stratalog-queue-writer", daemon=True)
        self._uploader = threading.Thread(target=self._uploader_loop, name="stratalog-queue-uploader",
                                          daemon=True)
        self._compactor = threading.Thread(target=self._compactor_loop, name="stratalog-queue-compactor",
                                           daemon=True)
        self._writer.start()
        self._uploader.start()
        self._compactor.start()

    @classmethod
    def open(cls, data_dir: str | os.PathLike[str], object_store: str | ObjectStore | None = None,
             config: QueueConfig | None = None, *, wal_device: Device | None = None) -> QueueStore:
        """Open (or create) the queue store in ``data_dir``; ``object_store`` and ``wal_device`` as for
        StreamStore.open (the WAL on a raw block device, or any Device, instead of ``data_dir/wal``; the
        caller closes it after the store)."""
        path, objects = prepare_data_dir(data_dir, object_store)
        return cls(path, objects, config or QueueConfig(), wal_device)

    # Put -------------------------------------------------------------------------------------------

    def put(self, queue_name: str, message: bytes) -> None:
        """Add ``message`` to the end of ``queue_name`` (created on first put). Returns at once; the
        message is durable after the next :meth:`flush` returns."""
        if type(message) is not bytes or len(message) > self._small_max:
            self._put_large(queue_name, message)
            return
        # The name is checked here (three cheap tests; check_name only for what they do not pass); its id
        # is the writer's to find, for all the puts it takes at once (NameIndex): a dict lookup per put
        # here cost ~300 ns at a million queues, its cache misses.
        if type(queue_name) is not str or not 0 < len(queue_name) <= QUEUE_NAME_CHARS_MAX \
                or not queue_name.isascii():
            check_name(queue_name)
        # No lock: list.extend of a tuple is atomic under the GIL, and the writer only ever removes a prefix.
        buf = self._buf
        buf.extend((queue_name, message, -1))
        if len(buf) >= self._wake_slots:
            self._backpressure()

    def _put_large(self, queue_name: str, message: object) -> None:
        """A message that is not small bytes: checked, and its bytes counted against pending_bytes_max."""
        if type(message) is not bytes:
            message = as_bytes(message)
        assert isinstance(message, bytes)
        if len(message) > self._config.message_bytes_max:
            raise MessageTooLargeError(f"message of {len(message)} bytes exceeds message_bytes_max="
                                       f"{self._config.message_bytes_max}")
        check_name(queue_name)
        with self._put_cond:
            self._large_bytes += len(message)
            self._buf.extend((queue_name, message, -1))
        self._backpressure()

    def put_many(self, queue_names: Sequence[str] | Any, messages: Sequence[bytes] | Any) -> None:
        """Put ``messages[i]`` on ``queue_names[i]`` for every i, in order. Names: a sequence of str, a
        NumPy array of str or an Arrow string array (anything else, bytes too, is InvalidQueueNameError);
        messages: a sequence of bytes, an Arrow binary array, or a 2-D uint8 NumPy
        array (one message per row). All are checked before any is put."""
        names = names_as_arrow(queue_names)
        batch = messages_as_arrow(messages)
        if len(names) != len(batch):
            raise ValueError(f"{len(names)} queue names for {len(batch)} messages")
        if not len(names):
            return
        if batch.null_count:
            raise TypeError("messages must not be null")
        lengths = pc.binary_length(batch)
        longest = pc.max(lengths).as_py() or 0
        if longest > self._config.message_bytes_max:
            raise MessageTooLargeError(f"a message of {longest} bytes exceeds message_bytes_max="
                                       f"{self._config.message_bytes_max}")
        # The ids of known queues, for the whole batch in NumPy passes (see names.py), in the caller's
        # thread; -1: not known yet, the writer resolves (or creates) those. A known queue's id never
        # changes.
        known = self._names.lookup(names)
        # Only names not known yet are checked: a known one was checked when its queue was made (a name
        # equal to it is the same name).
        unknown_at = np.flatnonzero(known < 0)
        unknown = names.take(unknown_at).to_pylist() if len(unknown_at) else []
        if not all(map(plain_name, unknown)):
            for name in unknown:
                check_name(name)
        total = int(pc.sum(lengths).as_py() or 0)
        with self._put_cond:
            self._large_bytes += total
            self._bulk_pending += 1
            self._buf.extend(((names, known, batch), None, _BULK))
        self._backpressure()

    def _backpressure(self) -> None:
        """Wake the writer; wait while the puts not yet written are at their bound. Called by every put
        while the writer is behind, so the way through is short: a store that stopped or closed refuses
        the put before this (see _RefusedPuts), and is checked for here only before waiting."""
        if not self._woken:
            self._woken = True
            self._wake.set()
        config = self._config
        if len(self._buf) < self._max_slots and self._large_bytes < config.pending_bytes_max:
            return
        self._check_open()
        deadline = time.monotonic() + config.put_wait_s_max
        with self._put_cond:
            while len(self._buf) >= self._max_slots or self._large_bytes >= config.pending_bytes_max:
                self._check_open()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise PutBackpressureError(f"puts waited {config.put_wait_s_max} s for the writer: "
                                               "the disk or the uploads are too slow")
                self._put_cond.wait(min(remaining, 0.1))

    def flush(self) -> None:
        """Return once every put made before this call is durable (survives kill -9 and power loss)."""
        self._check_open()
        self._drain()
        last = self._last_future
        if last is not None:
            error = last.exception()
            if error is not None:
                raise StoreFailedError(f"the queue store's WAL failed: {error}") from error

    # Write -----------------------------------------------------------------------------------------

    def _writer_loop(self) -> None:
        while True:
            self._wake.wait(self._config.linger_s)
            self._wake.clear()
            self._woken = False     # after the clear: a put in between is taken by the drain below
            if self._closing:
                return
            try:
                self._drain()
            except BaseException as e:
                self._fail(e)
                return

    def _drain(self) -> None:
        """Hand every pending put to the WAL (as bulk records) and to the log cache."""
        with self._writer_lock:
            with self._put_cond:
                # Lock-free puts may append meanwhile; they land after the prefix taken here. Large and
                # bulk puts append under this lock, so the counts reset here are exactly what is taken.
                buf = self._buf
                taken = len(buf)
                # Set before the puts leave _buf: a get that finds _buf empty then sees them in flight
                # and waits for this drain (a get sees every put made before it).
                self._in_flight = taken > 0
                bulk_items = self._bulk_pending
                # Each slot straight from _buf (a copy of the prefix first, then of its slots, cost ~35 ns
                # a put more under the GIL); the id slots are needed only beside bulk puts.
                names, messages = buf[0:taken:PUT_SLOTS], buf[1:taken:PUT_SLOTS]
                known = buf[2:taken:PUT_SLOTS] if bulk_items else []
                del buf[:taken]
                self._bulk_pending = 0
                self._large_bytes = 0
                self._put_cond.notify_all()
            if not taken:
                return
            try:
                invariant(taken % PUT_SLOTS == 0, "a put's slots are appended together")
                self._check_open()
                ids, batch = self._unzip_mixed(names, messages, known) if bulk_items else self._singles(names, messages)
                self._write(ids, batch)
            finally:
                self._in_flight = False

    def _resolve(self, names: list[str]) -> Ids:
        """The ids of ``names`` (checked names, so str: no check of their type here), creating the queues
        that are new."""
        array = pa.array(names, pa.string())
        return self._complete(self._names.lookup(array), array)

    def _resolve_new(self, names: list[str]) -> Ids:
        """The ids of names the NameIndex did not find: mostly new ones, which this creates."""
        ids = self._ids
        try:
            return np.fromiter(map(ids.__getitem__, names), I64, len(names))
        except KeyError:
            pass
        # New names in the order of their first put, each once; every step a C loop.
        new = list(dict.fromkeys(itertools.filterfalse(ids.__contains__, names)))
        first = self._stream_count
        self._grow(first + len(new))   # before the ids: a get that finds an id indexes the per-queue arrays
        ids.update(zip(new, range(first, first + len(new)), strict=True))
        self._names.add(new, np.arange(first, first + len(new)))
        self._new_names.extend(zip(range(first, first + len(new)), new, strict=True))
        self._stream_count = first + len(new)
        return np.fromiter(map(ids.__getitem__, names), I64, len(names))

    def _unzip_mixed(self, names: list[Any], messages: list[Any], known: list[Any]) -> tuple[Ids, Any]:
        """Ids and one Arrow array of messages from pending puts (their slots), some of them bulk. Ids are
        completed in the order of the puts, so new queues get theirs in the order of their first put."""
        id_parts: list[Ids] = []
        arrays = []
        start = 0
        while start < len(known):
            # The id slots hold ints and _BULK only (the store puts them there), so index() finds _BULK
            # by identity and never calls a caller's __eq__.
            try:
                bulk = known.index(_BULK, start)
            except ValueError:
                bulk = len(known)
            if bulk > start:
                single_ids, single_messages = self._singles(names[start:bulk], messages[start:bulk])
                id_parts.append(single_ids)
                arrays.append(single_messages)
            if bulk < len(known):
                bulk_names, bulk_known, batch = names[bulk]
                id_parts.append(self._complete(bulk_known, bulk_names))
                arrays.append(batch)
            start = bulk + 1
        ids = id_parts[0] if len(id_parts) == 1 else np.concatenate(id_parts)
        return ids, arrays[0] if len(arrays) == 1 else pa.concat_arrays(arrays)

    def _singles(self, names: list[str], messages: list[bytes]) -> tuple[Ids, Any]:
        """Ids and one Arrow array of messages from single puts (no bulk among them)."""
        return self._resolve(names), pa.array(messages, type=pa.binary())

    def _complete(self, ids: Ids, names: Any) -> Ids:
        """``ids`` (a NameIndex lookup of ``names``, an Arrow string array) with each -1 (a name it did not
        find) resolved through the dict, creating the queues that are new."""
        missing = np.flatnonzero(ids < 0)
        if len(missing):
            ids[missing] = self._resolve_new(names.take(missing).to_pylist())
        return ids

    def _grow(self, stream_count: int) -> None:
        if stream_count > len(self._next):
            size = max(stream_count, 2 * len(self._next))
            grown = np.zeros(size, I64)
            grown[:len(self._next)] = self._next
            self._next = grown
            read_next = np.zeros(size, I64)
            read_next[:len(self._read_next)] = self._read_next
            self._read_next = read_next

    def _write(self, ids: Ids, batch: Any) -> None:
        """Split into records of about record_bytes_target; write each. New queues' names go first, in
        records of their own when there are many (a million new queues bring ~20 MB of names)."""
        target = self._config.record_bytes_target
        names, self._new_names = self._new_names, []
        if names:
            utf8 = pa.array(list(map(_second, names)), pa.string())
            sizes = np.cumsum(NAME_HEAD.size + np.asarray(pc.binary_length(utf8), I64))
            start = 0
            while start < len(names):
                done = int(sizes[start - 1]) if start else 0
                stop = max(start + 1, int(np.searchsorted(sizes, done + target, side="right")))
                chunk = names[start:stop]
                self._write_record(np.zeros(0, I64), _EMPTY_BATCH, chunk, chunk[-1][0] + 1)
                start = stop
        lengths = np.asarray(pc.binary_length(batch), I64)
        cumulative = np.cumsum(lengths)
        total = int(cumulative[-1]) if len(cumulative) else 0
        start = 0
        while start < len(ids):
            stop = len(ids)
            if total > target:
                already = int(cumulative[start - 1]) if start else 0
                stop = max(start + 1, int(np.searchsorted(cumulative, already + target, side="right")))
            self._write_record(ids[start:stop], batch.slice(start, stop - start), [], self._stream_count)
            start = stop

    def _write_record(self, ids: Ids, batch: Any, names: list[tuple[int, str]], stream_count: int) -> None:
        order = np.argsort(ids, kind="stable")
        sorted_ids = ids[order]
        first = np.flatnonzero(np.concatenate(([True], sorted_ids[1:] != sorted_ids[:-1]))) if len(ids) \
            else np.zeros(0, I64)
        stream_ids = sorted_ids[first]
        counts = np.diff(np.append(first, len(sorted_ids)))
        base = self._next[stream_ids]
        if len(base) and int((base + counts).max()) > STREAM_MESSAGES_MAX:
            raise QueueError(f"a queue would exceed {STREAM_MESSAGES_MAX} messages")
        taken = batch.take(pa.array(order))
        offsets = np.frombuffer(taken.buffers()[1], np.int32, len(taken) + 1, taken.offset * 4)
        data = memoryview(taken.buffers()[2] or b"")[int(offsets[0]):int(offsets[-1])]
        message_at = offsets - offsets[0]
        parts = encode_bulk(stream_ids, base, counts, names, stream_count, message_at[1:], data)
        cache_bytes = sum(map(len, parts))
        self._wait_for_cache_room(cache_bytes)
        # The WAL gathers the parts; the log cache keeps the taken messages themselves (no joined copy of
        # the record: at a million queues that was 6 GB of fresh memory per 100 M messages, each page
        # faulted in under the GIL).
        result = self._append_wal(parts)
        del taken, parts
        self._next[stream_ids] = base + counts
        first_msg = np.zeros(len(counts) + 1, I64)
        np.cumsum(counts, out=first_msg[1:])
        self._record_seq += 1
        record = CachedRecord(self._record_seq, result.offset, result.future, stream_ids, base, counts, first_msg,
                              data, message_at.data, names, stream_count, cache_bytes, time.monotonic())
        with self._view_lock:
            objects, records, index = self._view
            self._view = (objects, (*records, record), index)
            self._cache_bytes += cache_bytes
        self._last_future = result.future
        self._last_write = record.written_at

    def _wait_for_cache_room(self, size: int) -> None:
        deadline = time.monotonic() + self._config.put_wait_s_max
        with self._view_lock:
            while self._cache_bytes and self._cache_bytes + size > self._config.log_cache_bytes_max:
                self._check_open()
                if time.monotonic() > deadline:
                    raise PutBackpressureError(f"the log cache stayed full for {self._config.put_wait_s_max} s: "
                                               "uploads are too slow or failing")
                self._upload_wanted = True
                self._view_lock.notify_all()
                self._view_lock.wait(0.1)

    def _append_wal(self, body: bytes | list[bytes | memoryview]) -> Any:
        deadline = time.monotonic() + self._config.put_wait_s_max
        while True:
            try:
                return self._wal.append(body)
            except OverCapacityError:
                if time.monotonic() > deadline:
                    raise
            except WALFailedError as e:
                # Whichever thread met it (the writer, or a caller's flush or get writing pending puts), the
                # store stops and says so with its own error, as when the failure reached a record's future.
                self._fail(e)
                raise StoreFailedError(f"the queue store's WAL failed: {e}") from e
            with self._view_lock:
                self._upload_wanted = True
                self._view_lock.notify_all()
                self._view_lock.wait(0.1)

    # Read ------------------------------------------------------------------------------------------

    def get(self, queue_name: str, offset: int, num: int) -> list[bytes]:
        """Messages ``offset .. offset + num - 1`` of ``queue_name`` that exist, in order. Sees every put
        made before it (durable or not: a message not yet flushed may be gone after a crash)."""
        next(self._get_starts)   # counted (atomically: one C call) so merged-away files go once no get is in one
        try:
            return self._get(queue_name, offset, num)
        finally:
            next(self._get_ends)

    def _no_get_in_flight(self) -> bool:
        """No get was running a moment ago (the ends are read first: a get that ends or starts meanwhile
        counts as running), so none holds a view older than that moment. (Each call adds one to both.)"""
        ends = next(self._get_ends)
        return next(self._get_starts) == ends

    def _get(self, queue_name: str, offset: int, num: int) -> list[bytes]:
        if offset < 0 or num < 0:
            raise ValueError(f"offset and num must be >= 0, got {offset}, {num}")
        if self._closed:
            self._check_not_closed()
        if self._buf or self._in_flight:
            self._drain()
        self._gets += 1     # not atomic: a lost count still counts (the compactor only looks for a change)
        stream_id = self._ids.get(queue_name)
        if stream_id is None or num == 0:
            if stream_id is None and type(queue_name) is not str:
                check_name(queue_name)
            return []
        sequential = self._read_next.item(stream_id) == offset
        # A consumer's get past the queue's end (its last): nothing to look up. The puts made before this
        # get were written by the drain above, so the queue's next offset counts them. (Only sequential
        # gets look: for a random one the check costs a cache miss more than it saves.)
        if sequential and offset >= self._next.item(stream_id):
            return []
        objects, records, index = self._view
        out: list[bytes] = []
        stop = offset + num
        pos = offset
        if index.objects:
            ends, positions = index.row(stream_id)
            if pos < ends[-1]:
                k = bisect.bisect_right(ends, pos)
                # The last run this get reads. A get that spans runs in several objects: if a read must wait
                # for the disk, the later runs are hinted first, so the disk serves them together rather
                # than one after another (runs in the page cache need no hint: it would cost a system call).
                last = k if stop <= ends[k] else min(bisect.bisect_right(ends, stop - 1, k), len(ends) - 1)
                hinted = last == k
                capacity = index.capacity
                runs = self._runs
                ahead = self._config.read_ahead_bytes
                chunks_max = max(CHUNKS_PER_OBJECT_MIN, self._config.read_ahead_cache_bytes // (ahead * len(objects))) \
                    if sequential and ahead else 0
                reads = read_bytes = waited = 0
                start = ends[k - 1] if k else 0
                while pos < stop and k <= last:
                    end = ends[k]
                    if end > start:
                        obj = objects[k]
                        upto = min(stop, end)
                        if not sequential:
                            # A random reader (an index check): its messages straight from the pages read.
                            cut = obj.read_messages_cached(positions[k], positions[capacity + k], end - start,
                                                           stream_id, pos - start, upto - start)
                            if cut is not None:
                                out += cut[0]
                                reads += 1
                                read_bytes += cut[1]
                                pos = upto
                                start = end
                                k += 1
                                continue
                        cached = runs.get((obj.object_id, stream_id)) if runs and sequential else None
                        if cached is not None:
                            raw = cached[0]
                        else:
                            run_start = positions[k]
                            run_stop = positions[capacity + k]
                            got = obj.read_run_ahead(self._objects, run_start, run_stop, end - start, stream_id,
                                                     ahead, chunks_max) if sequential and ahead else None
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
                                self._cache_run((obj.object_id, stream_id), raw, end - start)
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
                    with self._read_lock:
                        self._object_reads += reads
                        self._object_read_bytes += read_bytes
                        self._object_reads_waited += waited
        if pos < stop and records:
            self._get_tail(records, stream_id, pos, stop, out)
        self._read_next[stream_id] = offset + len(out)
        return out

    def _hint_runs(self, objects: tuple[RunObject, ...], stream_id: int, positions: memoryview, capacity: int,
                   first: int, last: int) -> None:
        """Ask the kernel to read runs ``first .. last`` of a stream ahead (those not cached here); its
        runs' positions as :meth:`RunIndex.row` gives them."""
        for j in range(first, last + 1):
            reader = objects[j].reader
            start, stop = positions[j], positions[capacity + j]
            if stop > start and reader is not None and (objects[j].object_id, stream_id) not in self._runs:
                reader.will_need(start, stop)

    def _get_tail(self, records: tuple[CachedRecord, ...], stream_id: int, pos: int, stop: int,
                  out: list[bytes]) -> None:
        """Messages ``pos .. stop`` of a stream from the log cache, through the tail index."""
        tail = self._tail
        # Stale once records came after it (uploads only drop the records they take from it: readers of
        # the rest go on with it, as after a send, while the log cache is uploaded under them). One reader
        # rebuilds it at a time (a build of a full log cache at a million queues takes a few hundred MB for
        # a moment); the others meanwhile look up the newer records one by one, or, if there are more than
        # TAIL_LOOKUPS_MAX of them, wait for the build (each lookup searches a record's runs: after a send
        # to 100 k queues, ~80 records, ~100 us a get).
        if tail.last_seq < records[-1].seq and time.monotonic() - tail.built_at >= TAIL_REBUILD_S \
                and self._tail_lock.acquire(blocking=records[-1].seq - tail.last_seq > TAIL_LOOKUPS_MAX):
            try:
                tail = self._tail
                if tail.last_seq < records[-1].seq:     # (a reader that waited may find it built)
                    tail = TailIndex.build(records)
                with self._view_lock:
                    # Records an upload took meanwhile go from it now (it would hold their messages).
                    live = self._view[1]
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
        runs = runs_in(records[:older], stream_id) + tail.runs(stream_id, pos, first_seq, stop) \
            + runs_in(records[newer:], stream_id)
        for rec, run_first, base, end in runs:
            if end <= pos:
                continue
            invariant(base <= pos, "the log cache's runs of a stream follow on from where its reader is")
            first = run_first + pos - base
            n = min(stop, end) - pos
            if n < TAIL_LOOP_MESSAGES_MAX:
                # A few messages (most runs here: at many queues a record holds a message or two of each):
                # sliced one by one, ~0.25 us each, against ~1.5 us for an Arrow slice.
                data, message_at = rec.data, rec.message_at
                lo = message_at[first]
                for m in range(first + 1, first + n + 1):
                    hi = message_at[m]
                    out.append(bytes(data[lo:hi]))
                    lo = hi
            else:
                out += rec.messages().slice(first, n).to_pylist()    # in C
            pos += n
            if pos >= stop:
                return

    def _cache_run(self, key: tuple[int, int], raw: bytes, count: int) -> None:
        size = len(raw) + 100
        with self._read_lock:
            self._runs[key] = (raw, count, size)
            self._runs_bytes += size
            while self._runs_bytes > self._config.read_cache_bytes_max and self._runs:
                # Oldest first, as the million-queue race's cycle cache: no bookkeeping on a hit.
                _, (_, _, old_size) = self._runs.popitem(last=False)
                self._runs_bytes -= old_size

    # Consumer positions ----------------------------------------------------------------------------

    def commit(self, group: str, queue_name: str, offset: int) -> None:
        """Record that ``group`` consumed ``queue_name`` up to ``offset``; durable when it returns."""
        check_name(group, "group")
        check_name(queue_name)
        if type(offset) is not int or offset < 0:
            raise ValueError(f"offset must be an int >= 0, got {offset!r}")
        self._check_open()
        invariant(len(group) <= GROUP_NAME_CHARS_MAX)
        self._meta.set_meta(_COMMIT_KEY.format(len(group), group, queue_name), offset)

    def committed(self, group: str, queue_name: str) -> int | None:
        """The offset ``group`` last committed on ``queue_name``, or None."""
        check_name(group, "group")
        check_name(queue_name)
        self._check_not_closed()
        value = self._meta.get_meta(_COMMIT_KEY.format(len(group), group, queue_name), -1)
        return None if value < 0 else value

    # Upload ----------------------------------------------------------------------------------------

    def _upload_due(self) -> bool:
        """Whether the log cache should go to an object now: enough of it, a pause in the puts, its oldest
        record old enough, or a writer waiting for room."""
        config = self._config
        records = self._view[1]
        now = time.monotonic()
        return bool(records) and (self._upload_wanted or self._cache_bytes >= config.upload_bytes_threshold
                                  or now - self._last_write >= config.upload_idle_s
                                  or now - records[0].written_at >= config.upload_interval_s)

    def _uploader_loop(self) -> None:
        config = self._config
        while True:
            with self._view_lock:
                while not self._closing:
                    if self._upload_due():
                        break
                    self._view_lock.wait(min(config.upload_idle_s, 0.1))
                if self._closing:
                    return
                self._upload_wanted = False
            try:
                self._upload()
            except BaseException as e:
                self._fail(e)
                return

    def _upload(self, *, everything: bool = False) -> int:
        """Merge the durable records of the log cache into one object; return the messages uploaded."""
        with self._upload_lock:
            objects, records, index = self._view
            taken: list[CachedRecord] = []
            for rec in records:
                if not everything and not rec.future.done():
                    break
                if rec.future.done() and rec.future.exception() is not None:
                    raise StoreFailedError(f"a WAL write failed: {rec.future.exception()}")
                taken.append(rec)
            if not taken:
                return 0
            obj, ends, positions = self._write_object(objects, index, taken)
            with self._view_lock:
                objects, records, index = self._view
                invariant(records[:len(taken)] == tuple(taken), "uploads take a prefix of the log cache")
                self._view = ((*objects, obj), records[len(taken):], index.with_object(ends, positions))
                self._cache_bytes -= sum(r.cache_bytes for r in taken)
                # The tail index holds the uploaded records (their messages): let them go, and keep the rest
                # indexed (readers of the log cache's rest need no rebuild).
                self._tail = self._tail.without_through(taken[-1].seq)
                self._uploads += 1
                self._view_lock.notify_all()
            self._publish_manifest()
            self._compact_wake.set()
            last = taken[-1].wal_offset
            if last > self._wal.trim_offset and not everything:
                self._wal.trim(last)
            return int(sum(int(r.counts.sum()) for r in taken))

    def _write_object(self, objects: tuple[RunObject, ...], index: RunIndex,
                      taken: list[CachedRecord]) -> tuple[RunObject, U32s, U32s]:
        prev_ends = index.last_ends()
        # The records' runs in stream order. At a million queues a run is about one message, so each of
        # these arrays is as long as the upload's messages and fresh memory: each goes once done with
        # (together they set an upload's peak beside the log cache).
        stream_ids = np.concatenate([r.stream_ids for r in taken])
        order = np.argsort(stream_ids, kind="stable")
        s_ids = stream_ids[order]
        del stream_ids
        s_counts = np.concatenate([r.counts for r in taken])[order]
        shift = np.cumsum([0] + [len(r.message_at) - 1 for r in taken[:-1]])
        run_starts = np.concatenate([r.first_msg[:-1] + s for r, s in zip(taken, shift, strict=True)])[order]
        total = int(s_counts.sum())
        ahead = np.zeros(len(s_counts), I64)
        np.cumsum(s_counts[:-1], out=ahead[1:])
        run_starts -= ahead
        del ahead
        perm = np.repeat(run_starts, s_counts)
        del run_starts
        perm += np.arange(total, dtype=I64)     # (in place: each message-long temporary is fresh memory)
        groups = np.flatnonzero(np.concatenate(([True], s_ids[1:] != s_ids[:-1]))) if total else np.zeros(0, I64)
        unique = s_ids[groups]
        del s_ids
        per_stream = np.add.reduceat(s_counts, groups) if len(groups) else s_counts
        del s_counts
        first_runs = order[groups]
        del order, groups
        stream_count = taken[-1].stream_count
        prev = np.zeros(stream_count, I64)
        prev[:len(prev_ends)] = prev_ends
        before = prev[unique]
        bases = np.concatenate([r.base_offsets for r in taken])[first_runs]
        invariant(bool(np.all(bases == before)), "a queue's runs must follow its uploaded end")
        del bases, before, first_runs, prev
        names = list(itertools.chain.from_iterable(r.names for r in taken))
        first_stream = len(prev_ends)
        invariant(list(map(_first, names)) == list(range(first_stream, stream_count)), "names cover new streams")
        # A take per slice of streams gathers straight from the records into the object's runs: no merged
        # copy first, and at most a slice of the object in memory at once.
        messages = pa.chunked_array([r.messages() for r in taken], type=pa.binary())
        object_id = self._with_retries("allocating an object id", self._meta.allocate_object_id)
        key = queue_object_key(object_id)

        def write() -> ObjectParts:
            # Laid out again on a retry: a failed write may have taken some of the parts.
            laid = lay_out_object(prev_ends, stream_count, first_stream, names, unique, per_stream, messages, perm,
                                  self._config.upload_slice_bytes)
            # Each slice laid out while the one before is written; on a failed write the slice being made
            # is waited for and the rest given up here, before a retry lays the object out again.
            with contextlib.closing(made_ahead(laid.parts, "stratalog-queue-lay-out")) as parts:
                put_parts(self._objects, key, parts, sync_every_bytes=self._config.upload_sync_bytes,
                          size_hint=laid.size_bytes)
            return laid

        laid = self._with_retries(f"writing object {key}", write)
        size = laid.size_bytes
        ends, positions, pages = laid.ends, laid.positions, laid.pages
        if pages is None:
            raise AssertionError("an object's page CRCs are known once its parts are written")
        del laid
        self._with_retries("committing the upload",
                           lambda: self._meta.commit_objects([NewObject(object_id, key, size, [])]))
        libc.return_freed_memory()
        return RunObject(object_id, key, self._open_reader(key), size, pages, int(positions[-1])), ends, positions

    def _publish_manifest(self) -> None:
        """Publish the live objects as the queue manifest. Called under ``_upload_lock`` (uploads and
        merges, the only changes to the objects, hold it) after the view changed, so manifests go out in
        the order of the changes. A few dozen keys per publish: cheap next to the upload it follows."""
        objects, _, index = self._view
        self._manifest_seq += 1
        seq = self._manifest_seq
        stream_count = index.stream_counts[-1] if index.stream_counts else 0
        refs = [QueueObjectRef(o.key, o.size_bytes) for o in objects]
        self._with_retries("publishing the queue manifest",
                           lambda: publish_manifest(self._objects, seq, stream_count, refs))

    def _open_reader(self, key: str) -> Any:
        opener = getattr(self._objects, "open_reader", None)
        return opener(key) if callable(opener) else None

    def _with_retries(self, what: str, step: Callable[[], _T]) -> _T:
        return with_retries(what, step, attempts=self._config.upload_attempts_max,
                            backoff_s=self._config.upload_backoff_s, log=log)

    # Compaction ------------------------------------------------------------------------------------

    def _compactor_loop(self) -> None:
        while True:
            self._compact_wake.wait(1.0)
            self._compact_wake.clear()
            if self._closing:
                return
            try:
                self._retire_due()
                while self.compaction_error is None and not self._closing:
                    # A merge in a thread goes one at a time with uploads: their working sets (each a few
                    # hundred MiB at a million queues) never add up, and producers wait for a merge that
                    # has fallen behind. Merges in a thread beside uploads were measured: beside busy
                    # producers a merge gets the GIL a few milliseconds at a time and falls behind (24
                    # objects after 100 M puts instead of 7). A merge in the worker process has its own.
                    self._let_uploads_go_first()
                    if not self._compact_once():
                        break
                    self._retire_due()
                if not self._writing():
                    self._drop_spares()
            except _CompactionCancelledError:
                self._merge_cancelled = True
                return
            except BaseException as e:
                # The objects stay as they are and reads go on; only merging stops (until the next open).
                log.error("queue compaction stopped: %s", str(e))
                self.compaction_error = e

    def _let_uploads_go_first(self) -> None:
        """Wait while an upload is due, until one is done: uploads and merges take turns. The upload lock is
        not fair: a compactor taking it again right after a merge kept a waiting uploader out for a whole
        read phase (368 MiB left in the log cache, every get of it through the log cache's index); and
        waiting for no upload to be due at all starved merges beside a busy writer."""
        with self._view_lock:
            uploads = self._uploads
            while self._upload_due() and self._uploads == uploads and not self._closing and self._failure is None:
                self._view_lock.wait(0.1)

    def _plan_compaction(self, objects: tuple[RunObject, ...]) -> tuple[int, int, bool] | None:
        """Objects ``first .. stop - 1`` and whether the store is at rest: ``compact_fanout`` consecutive
        merge units of one size tier within ``compact_merge_bytes_max`` (see tier_merge_start); but when the store is
        at rest, the newest units if there are two that may merge (see QueueConfig.compact_idle_s). A unit
        is an upload, or the pieces one merge made (they share its place), sized by their sum."""
        config = self._config
        fanout = config.compact_fanout
        if not fanout:
            return None
        units: list[tuple[int, int]] = []     # (first object, bytes)
        place = -1
        for k, obj in enumerate(objects):
            obj_place = object_order(obj.key, obj.object_id)[0]
            if obj_place != place:
                units.append((k, 0))
                place = obj_place
            units[-1] = (units[-1][0], units[-1][1] + obj.size_bytes)
        if self._at_rest():
            # First: a merge of the tiers' newest units would often be part of it, written twice.
            first = idle_merge_start([size for _, size in units], fanout, config.compact_idle_bytes_max)
            if first is not None:
                return units[first][0], len(objects), True
        u = tier_merge_start([size for _, size in units], config.upload_bytes_threshold, fanout,
                              config.compact_merge_bytes_max)
        if u is None:
            return None
        stop = units[u + fanout][0] if u + fanout < len(units) else len(objects)
        return units[u][0], stop, False

    def _at_rest(self) -> bool:
        """No put and no get for compact_idle_s, and everything put is in objects. (A merge beside busy
        readers takes the CPU they are using, and at a million queues it does not end before they do:
        right after a 100 M-message send, index checks 53.8-56.0 k -> 42.6-50.2 k get/s, paired.)"""
        now = time.monotonic()
        if self._gets != self._rest_gets:
            self._rest_gets, self._rest_since = self._gets, now
            return False
        idle = self._config.compact_idle_s
        return not self._view[1] and not self._buf and now - self._last_write >= idle and \
            now - self._rest_since >= idle

    def _compact_once(self) -> bool:
        """Merge the objects the plan picks; False when there is nothing to merge. A merge in a thread
        holds the upload lock throughout; one in the worker process only to publish its result.

        The merged runs are cut by stream range into pieces of at most ``compact_object_bytes_max`` bytes
        (run positions are u32), each an object of its own, committed in one metadata transaction."""
        if not self._merges_in_worker:
            with self._upload_lock:
                return self._merge(in_worker=False)
        return self._merge(in_worker=True)

    def _merge(self, *, in_worker: bool) -> bool:
        # Only this thread removes objects from the view; uploads add them after the ones planned here.
        objects, _, index = self._view
        plan = self._plan_compaction(objects)
        if plan is None:
            return False
        first, stop, at_rest = plan
        replaced = objects[first:stop]
        prev_ends = index.ends[:index.stream_counts[first - 1], first - 1].copy() if first else np.zeros(0, U32)
        sources = [MergeSource.open(o.key, functools.partial(o.read, self._objects), o.size_bytes) for o in replaced]
        merge = plan_merge(sources, prev_ends, self._config.compact_object_bytes_max)
        place = object_order(replaced[0].key, replaced[0].object_id)[0]
        started = time.monotonic()
        keys: list[tuple[int, str]] = []
        for _ in merge.pieces:
            object_id = self._with_retries("allocating an object id", self._meta.allocate_object_id)
            keys.append((object_id, queue_object_key(object_id, place)))
        try:
            results = self._merge_in_worker(replaced, prev_ends, keys) if in_worker else self._merge_here(merge, keys)
        except _CompactionCancelledError:
            # The store is closing. Pieces already written are committed nowhere: they go now rather than at
            # the next open (each may be gigabytes, and a store's size read after close would count them).
            for _, key in keys:
                with contextlib.suppress(StratalogError):    # what stays goes at the next open
                    self._objects.delete(key)
            raise
        pieces = [(object_id, key, r) for (object_id, key), r in zip(keys, results, strict=True)]
        with self._upload_lock if in_worker else contextlib.nullcontext():
            self._with_retries("committing the merge", lambda: self._meta.replace_objects(
                [o.object_id for o in replaced], [NewObject(i, key, r.size_bytes, []) for i, key, r in pieces]))
            merged = tuple(RunObject(object_id, key, self._open_reader(key), r.size_bytes, r.pages,
                                   int(r.positions[-1])) for object_id, key, r in pieces)
            with self._view_lock:
                objects, records, index = self._view
                invariant(objects[first:stop] == replaced, "only a merge removes objects from the view")
                self._view = ((*objects[:first], *merged, *objects[stop:]), records,
                              index.with_merged(first, stop, [(r.ends, r.positions) for _, _, r in pieces]))
                now = time.monotonic()
                self._retired.extend((now, o) for o in replaced)
            # Readers planned on the previous manifest may still get the replaced objects for compact_retire_s.
            self._publish_manifest()
        self.compactions += 1
        self.compactions_at_rest += at_rest
        self.compacted_bytes += sum(r.size_bytes for _, _, r in pieces)
        log.info("merged %d queue objects (%d MiB) into %d in %.1f s%s%s", len(replaced),
                 sum(r.size_bytes for _, _, r in pieces) >> 20, len(pieces), time.monotonic() - started,
                 " (worker process)" if in_worker else "", " at rest" if at_rest else "")
        libc.return_freed_memory()
        return True

    def _merge_here(self, merge: MergePlan, keys: list[tuple[int, str]]) -> list[MergeResult]:
        results = []
        for p, (_, key) in enumerate(keys):
            result = MergeResult()

            def write(piece: int = p, key: str = key) -> None:
                nonlocal result
                result = MergeResult()
                put_parts(self._objects, key, self._unless_closing(
                    merge_piece(merge, piece, self._config.compact_slice_bytes, result)),
                    sync_every_bytes=self._config.upload_sync_bytes, size_hint=merge.piece_runs_bytes(piece))

            self._with_retries(f"writing merged object {key}", write)
            results.append(result)
        return results

    def _merge_in_worker(self, replaced: tuple[RunObject, ...], prev_ends: U32s,
                         keys: list[tuple[int, str]]) -> list[MergeResult]:
        assert isinstance(self._objects, LocalDirStore)
        config = self._config
        job = MergeJob(str(self._objects.root), tuple((o.key, o.size_bytes) for o in replaced), prev_ends,
                       tuple(key for _, key in keys), config.compact_object_bytes_max, config.compact_slice_bytes,
                       config.upload_sync_bytes)
        try:
            answer = self._with_retries(f"merging into {keys[0][1]} in the worker process",
                                        lambda: run_merge_job(job, lambda: self._closing))
        except MergeCancelledError:
            raise _CompactionCancelledError from None
        self.merge_worker_peak_rss_bytes = max(self.merge_worker_peak_rss_bytes, answer.peak_rss_bytes)
        return answer.results

    def _unless_closing(self, parts: Iterator[bytes | memoryview]) -> Iterator[bytes | memoryview]:
        for part in parts:
            if self._closing:
                raise _CompactionCancelledError
            yield part

    def _retire_due(self, *, everything: bool = False) -> None:
        """Close and delete merged-away objects once no get can still be reading them: after
        compact_retire_s, or as soon as no get is in flight (every get then holds a newer view). A writer
        with no readers gets its spares at once (put_many of 100 M messages: 6-9 of 29 uploads over a
        spare with a 10 s wait, 15 of 29 at once)."""
        quiet = everything or self._no_get_in_flight()
        cutoff = math.inf if quiet else time.monotonic() - self._config.compact_retire_s
        with self._view_lock:
            due = [o for t, o in self._retired if t <= cutoff]
            self._retired = [(t, o) for t, o in self._retired if t > cutoff]
        for obj in due:
            if obj.reader is not None:
                obj.reader.close()
            if isinstance(self._objects, LocalDirStore) and self._config.spare_bytes_max and self._writing():
                delete = functools.partial(self._objects.recycle, obj.key, self._config.spare_bytes_max)
            else:
                delete = functools.partial(self._objects.delete, obj.key)
            self._with_retries(f"deleting merged-away object {obj.key}", delete)
            self._meta.forget_object(obj.object_id)

    def _writing(self) -> bool:
        """A put came within compact_idle_s: uploads and merges will follow, and spare files serve them."""
        return time.monotonic() - self._last_write < self._config.compact_idle_s and not self._closing

    def _drop_spares(self) -> None:
        """Delete the spare files (see QueueConfig.spare_bytes_max): a store that is not being written needs
        none, and they take disk space."""
        if isinstance(self._objects, LocalDirStore):
            self._objects.drop_spares()

    # Recovery --------------------------------------------------------------------------------------

    def _recover(self) -> QueueRecoveryReport:
        report = QueueRecoveryReport()
        started = time.monotonic()
        objects, index = self._load_objects(report)
        ends = index.last_ends()
        self._grow(len(ends))
        self._next[:len(ends)] = ends
        self._view = (tuple(objects), (), index)
        last_wal_offset = -1
        stopped = False
        for rec in self._wal.recover():
            report.wal_records += 1
            last_wal_offset = rec.offset
            if stopped:
                report.records_dropped += 1
                continue
            body = bytes(rec.data)
            bulk = decode_bulk(body)
            action = ACTIONS[classify(bulk, self._next, self._stream_count, self._ids)]
            if action is Action.SKIP:
                report.records_in_objects += 1
                continue
            if action is Action.DROP_REST:
                stopped = True
                report.records_dropped += 1
                continue
            self._grow(bulk.stream_count)
            self._replay(bulk, body, rec.offset)
            report.records_replayed += 1
            report.messages_replayed += len(bulk.ends)
            if self._cache_bytes >= self._config.upload_bytes_threshold:
                self._upload(everything=True)
        self._upload(everything=True)
        self._names.add(list(self._ids), np.fromiter(self._ids.values(), I64, len(self._ids)))
        if last_wal_offset > self._wal.trim_offset:
            self._wal.trim(last_wal_offset)
        # Before deleting merged-away objects: a manifest published before a crash may still name them.
        self._publish_manifest()
        self._delete_orphans(report)
        report.merged_objects = sum("-" in o.key for o in self._view[0])
        report.seconds = time.monotonic() - started
        return report

    def _load_objects(self, report: QueueRecoveryReport) -> tuple[list[RunObject], RunIndex]:
        loaded: list[RunObject] = []
        index = RunIndex.empty()
        live = [m for m in self._meta.objects() if m.key.startswith(QUEUE_PREFIX) and m.unreferenced_ms is None]
        for meta in sorted(live, key=lambda m: object_order(m.key, m.object_id)):
            size = meta.size_bytes
            footer = decode_footer(self._objects.get(meta.key, size - OBJECT_FOOTER_BYTES, size), size)
            raw = self._objects.get(meta.key, footer.names_position, size - OBJECT_FOOTER_BYTES)
            names, ends, positions, pages = decode_index(raw, footer)
            if footer.first_stream != self._stream_count:
                raise CorruptBulkError(f"queue object {meta.key} names streams from {footer.first_stream}; "
                                       f"{self._stream_count} are known")
            for stream_id, name in names:
                self._ids[name] = stream_id
            self._stream_count = footer.stream_count
            loaded.append(RunObject(meta.object_id, meta.key, self._open_reader(meta.key), size, pages,
                                  footer.names_position))
            index = index.with_object(ends, positions)
            report.objects += 1
            report.index_bytes += ends.nbytes + positions.nbytes + pages.nbytes
        return loaded, index

    def _replay(self, bulk: BulkRecord, body: bytes, wal_offset: int) -> None:
        for stream_id, name in bulk.names:
            self._ids[name] = stream_id
        self._stream_count = bulk.stream_count
        ids = bulk.stream_ids
        self._next[ids] = bulk.base_offsets + bulk.counts
        message_at = np.zeros(len(bulk.ends) + 1, np.int32)
        message_at[1:] = bulk.ends
        first_msg = np.zeros(len(ids) + 1, I64)
        np.cumsum(bulk.counts, out=first_msg[1:])
        done: Future[int] = Future()
        done.set_result(wal_offset)
        self._record_seq += 1
        record = CachedRecord(self._record_seq, wal_offset, done, ids, bulk.base_offsets, bulk.counts, first_msg,
                              bulk.data, message_at.data, bulk.names, bulk.stream_count, len(body), time.monotonic())
        objects, records, index = self._view
        self._view = (objects, (*records, record), index)
        self._cache_bytes += record.cache_bytes

    def _delete_orphans(self, report: QueueRecoveryReport) -> None:
        """Delete objects an interrupted upload or merge wrote but never committed, the pieces of cut-off
        puts, and objects a merge replaced (nothing reads them before the open returns)."""
        for meta in self._meta.collect_unreferenced(int(time.time() * 1000) + 1):
            if meta.key.startswith(QUEUE_PREFIX):
                self._objects.delete(meta.key)
                self._meta.forget_object(meta.object_id)
                report.merged_away_deleted += 1
        report.orphan_objects_deleted = delete_orphans(self._objects, self._meta, QUEUE_PREFIX)

    # Lifecycle -------------------------------------------------------------------------------------

    def _fail(self, error: BaseException) -> None:
        log.error("the queue store stopped: %s", str(error))
        self._failure = self._failure or error
        self._buf = _RefusedPuts(self)
        with self._put_cond:
            self._put_cond.notify_all()
        with self._view_lock:
            self._view_lock.notify_all()

    def _check_not_closed(self) -> None:
        if self._closed:
            raise StoreClosedError("the queue store is closed")

    def _check_open(self) -> None:
        if self._failure is not None:
            raise StoreFailedError(f"the queue store stopped after an error: {self._failure}") from self._failure
        if self._closing or self._closed:
            raise StoreClosedError("the queue store is closed")

    def close(self) -> None:
        """Make every put durable, upload, trim the WAL, and release everything."""
        if self._closed or self._closing:
            return
        try:
            if self._failure is None:
                self.flush()
        finally:
            self._closing = True
            self._buf = _RefusedPuts(self)
            self._wake.set()
            with self._view_lock:
                self._view_lock.notify_all()
            self._compact_wake.set()
            self._writer.join()
            self._uploader.join()
            self._compactor.join()
            try:
                if self._failure is None and not self._wal.failure:
                    self._upload()
                self._retire_due(everything=True)
                self._drop_spares()
                if self._merge_cancelled and isinstance(self._objects, LocalDirStore):
                    # The killed worker's piece (a spare it was writing over may be gigabytes): nothing
                    # writes here any more, so every temp file is a leftover.
                    self._objects.remove_temp_files()
            finally:
                self._closed = True
                self._wal.close()
                for obj in self._view[0]:
                    if obj.reader is not None:
                        obj.reader.close()
                self._meta.close()
                self._objects.close()
                unlock_data_dir(self._lock_fd)
                release_frames(self._failure)

    def __enter__(self) -> QueueStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stats(self) -> dict[str, int]:
        """Queues, messages, and the bytes of each in-memory structure."""
        objects, records, index = self._view
        ids = self._ids.copy()  # one C call: the writer may add names meanwhile
        return {
            "queues": self._stream_count,
            "messages": int(self._next[:self._stream_count].sum()),
            "objects": len(objects),
            "index_bytes": index.nbytes,
            "index_bytes_used": index.used_bytes,
            "page_crc_bytes": sum(o.pages.nbytes for o in objects),
            "queue_state_bytes": self._next.nbytes + self._read_next.nbytes,
            "name_dict_bytes": sys.getsizeof(ids) + sum(sys.getsizeof(k) + sys.getsizeof(v) for k, v in ids.items()),
            "name_index_bytes": self._names.nbytes,
            "log_cache_bytes": self._cache_bytes,
            "log_cache_records": len(records),
            "read_cache_bytes": self._runs_bytes,
            # list(): one C call, so a reader adding or dropping a chunk meanwhile changes no dict mid-loop
            "read_ahead_bytes": sum(len(chunk[0]) for obj in objects for chunk in list(obj.chunks.values())),
            "object_reads": self._object_reads,
            "object_read_bytes": self._object_read_bytes,
            "object_reads_waited": self._object_reads_waited,
            "compactions": self.compactions,
            "compactions_at_rest": self.compactions_at_rest,
            "merge_worker_peak_rss_bytes": self.merge_worker_peak_rss_bytes,
            "compacted_bytes": self.compacted_bytes,
            "spare_bytes": self._objects.spare_bytes() if isinstance(self._objects, LocalDirStore) else 0,
        }


class _RefusedPuts(list[Any]):
    """The put buffer of a store that stopped or closed: a put raises the store's error at once, at no
    cost to the puts of a store that runs (put reads ``_buf`` and extends it, nothing more). A put that
    read the buffer before it was swapped lands in the old one: never written, never acknowledged.

    It holds its store weakly: the store holds it, and a cycle would keep a closed store's memory (its
    log cache, indexes and names: gigabytes at a million queues) until a full garbage collection."""

    def __init__(self, store: QueueStore) -> None:
        super().__init__()
        self._store = weakref.ref(store)

    def extend(self, items: Any) -> None:
        store = self._store()
        if store is not None:
            store._check_open()
        raise StoreClosedError("the queue store is closed")    # reached only once the store is gone


class _CompactionCancelledError(Exception):
    """The store is closing: a merge in progress stops (its object is never committed)."""


_first = operator.itemgetter(0)
_second = operator.itemgetter(1)


