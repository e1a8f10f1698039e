"""StreamStore: many streams over one WAL, recent data in memory, everything else in object storage.

Write path: ``Stream.append`` encodes one batch, appends it to the WAL and to the LogCache (in memory,
not yet uploaded); its future completes with the base offset once the WAL says the batch is durable.
The uploader turns LogCache contents into objects, commits their ranges in metadata, drops them from
memory, then trims the WAL. Read path: objects through the BlockCache for committed offsets, then the
LogCache for the tail. Recovery replays the WAL from its trim point into the LogCache, skipping what
metadata says is already in objects, and deletes objects that no commit refers to.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from prometheus_client.registry import Collector

from stratalog.caching import BoundedCache
from stratalog.datadir import lock_data_dir, prepare_data_dir, unlock_data_dir
from stratalog.engine.batch import (
    BatchInfo,
    StoredBatch,
    check_batch,
    decode_records,
    encode_batch,
    read_batch_info,
    record_timestamps,
    stored_batch,
    wrap_kafka_batch,
)
from stratalog.engine.blockcache import BlockCache
from stratalog.engine.config import StoreConfig
from stratalog.engine.manifest import ManifestPublisher
from stratalog.engine.metadata import Fence, Metadata, NewObject, RangeRow, StreamMeta, UnknownStreamError
from stratalog.engine.objformat import DATA_BLOCK_BYTES_TARGET, ObjectBuilder, StreamBatch, placed_batches
from stratalog.engine.upkeep import delete_orphans, with_retries
from stratalog.errors import (
    OutOfSpaceError,
    OverCapacityError,
    RecordTooLargeError,
    StratalogError,
    WALFailedError,
    WriteBufferFullError,
    release_frames,
)
from stratalog.free_space import SpaceGuard
from stratalog.invariant import invariant
from stratalog.io.block_io import CompletionWatch
from stratalog.io.device import Device
from stratalog.objects.local import LocalDirStore
from stratalog.objects.metered import MeteredStore
from stratalog.objects.store import ObjectStore, put_parts
from stratalog.records import NewRecord, Record
from stratalog.wal import WriteAheadLog
from stratalog.wal.protocol import WAL

log = logging.getLogger("stratalog.engine")

DATA_PREFIX = "data/"
_T = TypeVar("_T")


class BackpressureError(StratalogError):
    """Appends outran uploads for ``append_wait_s_max``: the log cache or the WAL stayed full."""


class OffsetOutOfRangeError(StratalogError, ValueError):
    """The offset is below the stream's start (trimmed) or above its end."""


class StoreClosedError(StratalogError):
    """The store was closed."""


class StoreFailedError(StratalogError):
    """A durability step failed; the store stopped accepting appends. Reopen it to recover."""


class StoreFullError(OutOfSpaceError):
    """Appends are refused: the disk under the store is below its free-space headroom, or object storage
    is out of room. Reads go on; appends resume by themselves once space is back (retry)."""


class UnflushedStreamError(StratalogError):
    """A stream still holds appends here that are not committed: it cannot be reloaded from metadata."""


def object_key(object_id: int) -> str:
    return f"{DATA_PREFIX}{object_id:016x}.slo"


@dataclass(slots=True)
class _Entry:
    """One batch in the LogCache."""

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
class _StreamState:
    stream_id: int
    name: str | None
    start_offset: int
    committed_end: int           # offsets below are in objects
    next_offset: int             # offset the next append gets
    durable_end: int             # offsets below are acknowledged: what readers may see
    #: Batches in the LogCache, oldest first (offsets and WAL offsets both ascending). Appenders add at
    #: the end and only the uploader removes from the front, so the uploader may read a prefix without
    #: the store lock. An empty tuple while there are none, so idle streams hold no list.
    cache: list[_Entry] | tuple[()] = ()
    #: Readahead: where a sequential reader will fetch next, and how many blocks to read ahead.
    read_next: int = -1
    readahead_blocks: int = 1
    #: An external commit is placing objects at this stream's end: appends wait until it is done.
    fenced: bool = False

    def push(self, entry: _Entry) -> None:
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

    def cached_between(self, start: int, stop: int) -> list[_Entry]:
        """Log-cache batches holding offsets in ``[start, stop)`` (store lock held; no scan of the rest)."""
        cache = self.cache
        first = bisect.bisect_right(cache, start, key=lambda e: e.end_offset)
        last = bisect.bisect_left(cache, stop, lo=first, key=lambda e: e.base_offset)
        return list(cache[first:last])


class _Pacer:
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


class _RangeRowCache:
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


@dataclass(slots=True)
class RecoveryReport:
    wal_records: int = 0
    batches_replayed: int = 0
    batches_already_in_objects: int = 0
    batches_not_contiguous: int = 0
    #: Records in those batches: never acknowledged after a plain crash; lost if a WAL record was damaged.
    records_not_contiguous: int = 0
    #: WAL records whose body failed its CRC (bit rot, a torn write): what they held is gone.
    wal_records_damaged: int = 0
    batches_of_unknown_streams: int = 0
    orphan_objects_deleted: int = 0
    seconds: float = 0.0


class Stream:
    """A handle on one stream. Cheap; get one from ``StreamStore.create_stream`` or ``open_stream``."""

    def __init__(self, store: StreamStore, state: _StreamState) -> None:
        self._store = store
        self._state = state

    @property
    def stream_id(self) -> int:
        return self._state.stream_id

    @property
    def name(self) -> str | None:
        return self._state.name

    @property
    def start_offset(self) -> int:
        """The first offset still kept (records below were trimmed or expired)."""
        return self._state.start_offset

    @property
    def end_offset(self) -> int:
        """One past the last acknowledged record: the offset the next durable append will get at least."""
        return self._state.durable_end

    @property
    def uploaded_end_offset(self) -> int:
        """One past the last record in objects: reads from here on are served from memory."""
        return self._state.committed_end

    def append(self, records: Sequence[bytes | NewRecord]) -> Future[int]:
        """Append records as one batch; the future completes with the first record's offset once durable."""
        return self._store._append(self._state, records)

    def append_kafka(self, kafka_batch: bytes | memoryview, count: int, max_timestamp_ms: int, *,
                     wait_s_max: float | None = None) -> Future[int]:
        """Append one Kafka RecordBatch (magic 2, already checked: ``stratalog.kafka.records``) of ``count``
        records as it is, its baseOffset set to the offset it gets; the future completes with that offset
        once durable. Readers of either kind (``fetch``, ``fetch_batches``) see its records.

        When the log cache or the WAL is full, waits up to ``wait_s_max`` (default ``append_wait_s_max``;
        0: not at all) for uploads to make room, then raises BackpressureError."""
        return self._store._append_kafka(self._state, kafka_batch, count, max_timestamp_ms, wait_s_max)

    def fetch_batches(self, start_offset: int, max_bytes: int = 1 << 20, *,
                      at_least_one: bool = True) -> list[StoredBatch]:
        """The stored batches holding ``start_offset`` and the offsets after it, whole (the first may begin
        before ``start_offset``), their bodies ``max_bytes`` at most in all (a Kafka batch's body is the
        batch as Kafka sends it); with ``at_least_one``, the first batch whatever its size, so that a
        reader always progresses (Kafka's rule for a fetch's first batch)."""
        return self._store._fetch_batches(self._state, start_offset, max_bytes, at_least_one)

    def fetch(self, start_offset: int, end_offset: int | None = None, max_bytes: int = 1 << 20) -> list[Record]:
        """Records from ``start_offset`` (up to ``end_offset``), in order, about ``max_bytes`` of values at
        most but always at least one record when one exists."""
        return self._store._fetch(self._state, start_offset, end_offset, max_bytes)

    def offset_for_timestamp(self, timestamp_ms: int) -> int | None:
        """The first offset whose record timestamp is >= ``timestamp_ms`` (None: no such record yet)."""
        return self._store._offset_for_timestamp(self._state, timestamp_ms)

    def latest_timestamp(self) -> tuple[int, int] | None:
        """``(offset, timestamp_ms)`` of the first record with the largest timestamp (None: no records)."""
        return self._store._latest_timestamp(self._state)

    def trim(self, new_start_offset: int) -> None:
        """Drop records below ``new_start_offset``; durable when it returns."""
        self._store._trim(self._state, new_start_offset)

    def __repr__(self) -> str:
        s = self._state
        return f"Stream(id={s.stream_id}, name={s.name!r}, start={s.start_offset}, end={s.durable_end})"


class StreamStore:
    """Durable streams on one machine's WAL, with object storage as main storage."""

    def __init__(self, data_dir: Path, objects: ObjectStore, config: StoreConfig,
                 wal_device: Device | None = None, metadata: str | None = None,
                 fence: Fence | None = None,
                 wal: WAL | None = None) -> None:
        self._dir = data_dir
        self._config = config
        self._objects = objects
        self._lock_fd = lock_data_dir(data_dir)
        try:
            self._open(data_dir, objects, config, wal_device, metadata, fence, wal)
        except BaseException:
            # Whatever opened before the failure is let go, so a failed open leaks no connection, thread
            # or lock (the caller may retry at once, as a broker replaying another's log does).
            for part in ("_wal", "_blocks", "_meta"):
                opened = getattr(self, part, None)
                if opened is not None:
                    with contextlib.suppress(Exception):
                        opened.close()
            if wal is not None and getattr(self, "_wal", None) is None:
                with contextlib.suppress(Exception):
                    wal.close()
            unlock_data_dir(self._lock_fd)
            raise
        self._uploader = threading.Thread(target=self._uploader_loop, name="stratalog-uploader", daemon=True)
        self._uploader.start()

    def _open(self, data_dir: Path, objects: ObjectStore, config: StoreConfig, wal_device: Device | None,
              metadata: str | None, fence: Fence | None, wal: WAL | None) -> None:
        self._meta = Metadata(data_dir / "meta.sqlite" if metadata is None else metadata, fence=fence)
        self._shared_objects = fence is not None
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._upload_lock = threading.Lock()
        self._streams: dict[int, _StreamState] = {}
        self._by_name: dict[str, int] = {}
        self._cached: dict[int, _StreamState] = {}  # streams with LogCache entries
        #: When the oldest LogCache entry came in, about (for upload_interval_s; None when empty).
        self._cache_oldest: float | None = None
        self._cache_bytes = 0
        self._upload_wanted = False
        self._closing = False
        self._closed = False
        self._failure: BaseException | None = None
        self._last_wal_future: Future[int] | None = None
        local_roots = [objects.root] if isinstance(objects, LocalDirStore) else []
        # Every call below counted for /metrics (objects/metered.py); a local store's own root kept above.
        objects = self._objects = MeteredStore(objects)
        self._space = SpaceGuard([data_dir, *local_roots], config.headroom, log)
        self._space.check()   # a store opened on a full disk refuses appends from the start
        #: For /metrics: compactions committed here, and the objects they replaced.
        self._compactions = 0
        self._objects_compacted = 0
        #: After an upload ran out of room: no upload is tried before this (monotonic seconds).
        self._upload_retry_at = 0.0
        self._manifest = ManifestPublisher(objects)
        # A snapshot at open only when the published chain does not reach the last commit: a store with
        # a million streams would otherwise write its whole manifest at every open.
        self._manifest_stale = not self._manifest.resume(self._meta.commit_seq)
        # Held from a metadata commit through its manifest's publication, so each commit publishes under
        # its own sequence number and manifests go out in commit order.
        self._commit_lock = threading.RLock()
        self._blocks = BlockCache(objects, config.block_cache_bytes_max, config.block_cache_io_threads)
        self._cold_rows = _RangeRowCache(self._meta, config.range_rows_streams_max, config.range_rows_per_query)
        limit = config.cold_read_bytes_per_s_max
        self._cold_pacer = _Pacer(limit) if limit is not None else None
        # Readahead never asks for more than half the block cache, or blocks fetched ahead would evict
        # each other before the reader gets to them.
        self._readahead_blocks_max = max(1, min(config.readahead_blocks_max,
                                                config.block_cache_bytes_max // (2 * DATA_BLOCK_BYTES_TARGET)))
        self._last_retention = time.monotonic()
        for sm in self._meta.streams():
            self._add_state(sm)
        self._wal: WAL
        if wal is not None:
            self._wal = wal
        else:
            wal_path = data_dir / "wal" if wal_device is None else wal_device
            self._wal = WriteAheadLog.open(wal_path, capacity_bytes=config.wal_capacity_bytes, create=True,
                                           config=config.wal)
        self.recovery = self._recover()

    @classmethod
    def open(cls, data_dir: str | os.PathLike[str], object_store: str | ObjectStore | None = None,
             config: StoreConfig | None = None, *, wal_device: Device | None = None,
             metadata: str | None = None, fence: Fence | None = None, wal: WAL | None = None) -> StreamStore:
        """Open (or create) the store in ``data_dir``.

        ``object_store``: None for a local directory under ``data_dir``, a URI such as
        ``s3://bucket/prefix?endpoint=http://127.0.0.1:8333``, or an ObjectStore. ``wal_device``: the
        WAL on a raw block device (or any Device) instead of the file ``data_dir/wal``; the caller keeps
        ownership and closes it after the store. ``metadata``: None for ``data_dir/meta.sqlite``, or a
        PostgreSQL URI (``postgresql://user:password@host:port/database``; needs psycopg). ``fence``: a
        check every metadata change of a stream's data must pass (a broker of a cluster commits only for
        the partitions it leads: stratalog.cluster.leases); it also means other writers share the object
        store, so objects metadata does not know are left alone at open (they may be another broker's
        upload in flight).
        ``wal``: a log made by the caller instead of the device WAL, such as an
        :class:`~stratalog.wal.object_wal.ObjectWAL` (records that outlive the machine); not yet recovered,
        as the store recovers it, and closes it when it closes. A data directory is recovered by the kind of
        WAL it was written with: close a store cleanly (which uploads everything) before switching.
        """
        if wal is not None and wal_device is not None:
            raise ValueError("pass wal or wal_device, not both")
        config = config or StoreConfig()
        config.validate()
        path, objects = prepare_data_dir(data_dir, object_store)
        return cls(path, objects, config, wal_device, metadata, fence, wal=wal)

    def _add_state(self, sm: StreamMeta) -> _StreamState:
        st = _StreamState(sm.stream_id, sm.name, sm.start_offset, sm.committed_end_offset,
                          sm.committed_end_offset, sm.committed_end_offset)
        self._streams[sm.stream_id] = st
        if sm.name is not None:
            self._by_name[sm.name] = sm.stream_id
        return st

    # Streams ---------------------------------------------------------------------------------------

    def create_stream(self, name: str | None = None, *, retention_ms: int | None = None,
                      retention_bytes: int | None = None) -> Stream:
        """A new, empty stream; durable when it returns. Names are unique; None means unnamed."""
        self._check_open()
        with self._commit_lock:
            sm = self._meta.create_stream(name, retention_ms, retention_bytes)
            self._publish([sm])
        with self._lock:
            return Stream(self, self._add_state(sm))

    def create_streams(self, names: Sequence[str]) -> list[Stream]:
        """Many new, empty named streams in one commit and one manifest: what a bulk writer (Spark)
        needs when a write brings thousands of new streams. All or none are created."""
        self._check_open()
        if not names:
            return []
        with self._commit_lock:
            metas = self._meta.create_streams(names)
            self._publish(metas)
        with self._lock:
            return [Stream(self, self._add_state(sm)) for sm in metas]

    def open_stream(self, id_or_name: int | str) -> Stream:
        with self._lock:
            stream_id = self._by_name.get(id_or_name) if isinstance(id_or_name, str) else id_or_name
            st = self._streams.get(stream_id) if stream_id is not None else None
        if st is None:
            raise UnknownStreamError(f"no stream {id_or_name!r}")
        return Stream(self, st)

    def reload_stream(self, name: str) -> Stream:
        """Serve the stream ``name`` from its committed end as the metadata says it now.

        For a store sharing its metadata with other writers (a broker of a cluster): a stream another
        writer led until now was appended to and committed there, so what this store holds of it (from
        its open, or from an earlier time it led it) is stale, or missing if the stream was made since.
        The stream must hold nothing here that is not committed (its last writer here flushed it before
        handing it over): UnflushedStreamError otherwise. Handles already open see the new state."""
        self._check_open()
        sm = self._meta.stream(name)
        with self._cond:
            old_id = self._by_name.get(name)
            if old_id is not None and old_id != sm.stream_id:
                self._streams.pop(old_id, None)   # a stream of that name deleted elsewhere, then made again
            st = self._streams.get(sm.stream_id)
            if st is None:
                st = self._add_state(sm)
            elif st.cache or st.next_offset != st.durable_end:
                raise UnflushedStreamError(f"stream {name!r} holds appends that are not committed here; "
                                           "flush the store before another writer takes the stream")
            else:
                st.start_offset = sm.start_offset
                st.committed_end = st.next_offset = st.durable_end = sm.committed_end_offset
                st.read_next, st.readahead_blocks = -1, 1
                self._by_name[name] = sm.stream_id
        self._cold_rows.invalidate()   # rows read while another writer was adding blocks after them
        return Stream(self, st)

    def streams(self) -> list[Stream]:
        with self._lock:
            return [Stream(self, st) for st in self._streams.values()]

    def delete_stream(self, stream: Stream) -> None:
        """Delete a stream and its records; durable when it returns. Its objects go after the grace
        period (readers holding them finish first); its batches still in the WAL are skipped at recovery."""
        self._check_open()
        with self._upload_lock, self._commit_lock:
            self._meta.delete_stream(stream.stream_id)
            with self._cond:
                st = self._streams.pop(stream.stream_id, None)
                if st is not None:
                    if st.name is not None:
                        self._by_name.pop(st.name, None)
                    if self._cached.pop(st.stream_id, None) is not None:
                        self._cache_bytes -= sum(len(e.data) for e in st.cache)
                    st.cache = ()
                    st.start_offset = st.durable_end  # handles still held read nothing
                self._cond.notify_all()
            self._cold_rows.invalidate()
            self._publish([], snapshot=True)

    def set_retention(self, stream: Stream, *, retention_ms: int | None, retention_bytes: int | None) -> None:
        self._meta.set_retention(stream.stream_id, retention_ms, retention_bytes)

    # Append ----------------------------------------------------------------------------------------

    def _append(self, st: _StreamState, records: Sequence[bytes | NewRecord]) -> Future[int]:
        if not records:
            raise ValueError("append needs at least one record")
        return self._append_encoded(st, len(records), lambda base: encode_batch(st.stream_id, base, records))

    def _append_kafka(self, st: _StreamState, kafka_batch: bytes | memoryview, count: int,
                      max_timestamp_ms: int, wait_s_max: float | None = None) -> Future[int]:
        if count < 1:
            raise ValueError("a Kafka batch holds at least one record")
        return self._append_encoded(st, count, lambda base: (
            wrap_kafka_batch(st.stream_id, base, count, max_timestamp_ms, kafka_batch), max_timestamp_ms),
            wait_s_max)

    def _append_encoded(self, st: _StreamState, count: int, encode: Callable[[int], tuple[bytes, int]],
                        wait_s_max: float | None = None) -> Future[int]:
        """Append the batch ``encode(base_offset)`` returns (its bytes and max timestamp) of ``count``
        records; the base offset is the stream's next, given under the store lock."""
        config = self._config
        if self._space.refusal is not None and self._space.recheck() is not None:
            raise StoreFullError(f"appends refused: {self._space.refusal}")
        wait_s = config.append_wait_s_max if wait_s_max is None else wait_s_max
        deadline: float | None = None
        with self._cond:
            while True:
                self._check_open()
                behind_bytes = 0   # > 0: the WAL's write buffer is full (its device or store is behind)
                if self._cache_bytes < config.log_cache_bytes_max and not st.fenced:
                    data, max_ts = encode(st.next_offset)
                    if len(data) > config.wal.record_bytes_max:
                        raise RecordTooLargeError(
                            f"a batch of {len(data)} bytes exceeds wal.record_bytes_max={config.wal.record_bytes_max}:"
                            " append fewer or smaller records at a time"
                        )
                    try:
                        # Never waits under the store's lock (nor on a broker's event loop): below if at all.
                        res = self._wal.append(data, wait_s_max=0)
                        break
                    except WriteBufferFullError:
                        behind_bytes = len(data)
                    except OverCapacityError:
                        pass  # the ring is full until the uploader trims it: wait below
                    except WALFailedError as e:
                        self._stop_locked(e)  # the WAL logged it
                        raise StoreFailedError(f"the store stopped after an error: {e}") from e
                deadline = deadline or time.monotonic() + wait_s
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise self._backpressure(st, wait_s, behind_bytes)
                if behind_bytes:
                    self._wait_for_wal_room(behind_bytes, remaining)
                    continue
                self._upload_wanted = True
                self._cond.notify_all()
                self._cond.wait(remaining)
            entry = _Entry(st.next_offset, count, data, max_ts, res.offset, time.monotonic())
            st.next_offset += count
            st.push(entry)
            if not self._cached:
                self._cache_oldest = entry.appended_at
                self._cond.notify_all()  # the uploader sleeps without an upload deadline while nothing is cached
            self._cached[st.stream_id] = st
            self._cache_bytes += len(data)
            self._last_wal_future = res.future
            if self._cache_bytes >= config.upload_bytes_threshold:
                self._cond.notify_all()
        done: Future[int] = Future()
        res.future.add_done_callback(lambda wal_future: self._on_durable(st, entry, done, wal_future))
        return done

    def _backpressure(self, st: _StreamState, wait_s: float, wal_behind_bytes: int) -> BackpressureError:
        """Why an append found no room for ``wait_s`` (lock held)."""
        if wal_behind_bytes:
            return BackpressureError(f"appends waited {wait_s} s for room in the WAL's write buffer: its device "
                                     "(or object store) is slower than the appends")
        if st.fenced:
            return BackpressureError(f"appends to stream {st.stream_id} waited {wait_s} s for a commit of "
                                     "external objects (a Spark write) to place its records")
        return BackpressureError(
            f"appends waited {wait_s} s for uploads to free room "
            f"({self._cache_bytes} bytes not yet in objects): object storage is too slow or failing")

    def _wait_for_wal_room(self, size_bytes: int, timeout_s: float) -> None:
        """Wait for the WAL's write buffer with the store's lock let go (held on entry and on return): reads,
        uploads and the WAL's completions go on meanwhile."""
        self._cond.release()
        try:
            self._wal.wait_for_room(size_bytes, timeout_s)
        finally:
            self._cond.acquire()

    def _on_durable(self, st: _StreamState, entry: _Entry, done: Future[int], wal_future: Future[int]) -> None:
        # Runs in the WAL's completion order, which is append order: durable_end only grows.
        error = wal_future.exception()
        if error is not None:
            done.set_exception(StoreFailedError(f"the append was not made durable: {error}"))
            return
        st.durable_end = entry.end_offset
        done.set_result(entry.base_offset)

    # Read ------------------------------------------------------------------------------------------

    def _fetch(self, st: _StreamState, start: int, end: int | None, max_bytes: int) -> list[Record]:
        self._check_not_closed()
        with self._lock:
            low, visible_end, committed = st.start_offset, st.durable_end, st.committed_end
            if start < low or start > visible_end:
                raise OffsetOutOfRangeError(
                    f"stream {st.stream_id}: offset {start} is outside [{low}, {visible_end}]")
            stop = visible_end if end is None else min(end, visible_end)
            tail = st.cached_between(max(start, committed), stop)
        out: list[Record] = []
        budget = [max_bytes]
        if start < committed and start < stop:
            self._fetch_cold(st, start, min(stop, committed), out, budget)
            if self._cold_pacer is not None:
                self._cold_pacer.take(max_bytes - budget[0])
            if budget[0] <= 0:
                return out
        pos = max(start, committed)
        for entry in tail:
            # Log-cache batches were encoded here or CRC-checked when the WAL was replayed.
            if not self._take(entry.data, 0, read_batch_info(entry.data), pos, stop, out, budget):
                break
            pos = entry.end_offset
        return out

    def _fetch_batches(self, st: _StreamState, start: int, max_bytes: int, at_least_one: bool) -> list[StoredBatch]:
        self._check_not_closed()
        with self._lock:
            low, stop, committed = st.start_offset, st.durable_end, st.committed_end
            if start < low or start > stop:
                raise OffsetOutOfRangeError(
                    f"stream {st.stream_id}: offset {start} is outside [{low}, {stop}]")
            tail = st.cached_between(max(start, committed), stop)
        out: list[StoredBatch] = []
        budget = max_bytes

        def fits(size_bytes: int) -> bool:
            """Whether a batch of this size goes in: within what is left, or as the one batch promised."""
            return size_bytes <= budget or (at_least_one and not out)

        pos = start
        full = False
        if start < committed:
            ahead = self._readahead(st, start)
            while pos < min(stop, committed) and not full:
                row = self._cold_row(st, pos, ahead)
                if row is None:
                    break
                block = self._blocks.get(row)  # its CRC, which covers every batch in it, is checked
                for at, info in placed_batches(block, row.entry()):
                    if info.end_offset <= pos:
                        continue
                    batch = stored_batch(block, at, info)
                    if not fits(len(batch.body)):
                        full = True
                        break
                    out.append(batch)
                    budget -= len(batch.body)
                    pos = info.end_offset
                if not full:
                    pos = max(pos, row.end_offset)
                    if ahead:
                        self._blocks.release(row)  # read to its end: first to go when room is needed
            st.read_next = pos
            if self._cold_pacer is not None:
                self._cold_pacer.take(max_bytes - budget)
            if full:
                return out
            pos = max(pos, committed)
        for entry in tail:
            if entry.end_offset <= pos:
                continue
            batch = stored_batch(entry.data, 0, read_batch_info(entry.data))
            if not fits(len(batch.body)):
                break
            out.append(batch)
            budget -= len(batch.body)
        return out

    def _take(self, buf: bytes, at: int, info: BatchInfo, start: int, stop: int, out: list[Record],
              budget: list[int]) -> bool:
        """Decode the batch ``info`` at ``buf[at:]`` into ``out``; False once ``stop`` or the budget is reached."""
        left = budget[0]
        try:
            for rec in decode_records(buf, at, info, start):
                if rec.offset >= stop or (left <= 0 and out):
                    return False
                out.append(rec)
                left -= len(rec.value) + (len(rec.key) if rec.key else 0)
            return left > 0
        finally:
            budget[0] = left

    def _readahead(self, st: _StreamState, start: int) -> int:
        """How many blocks to fetch ahead of a cold read from ``start``: none for a reader that jumped,
        twice as many as last time (up to the bound) for one that goes on where it stopped."""
        sequential = st.read_next == start
        st.readahead_blocks = min(st.readahead_blocks * 2, self._readahead_blocks_max) if sequential else 1
        return st.readahead_blocks if sequential else 0

    def _cold_row(self, st: _StreamState, pos: int, ahead: int) -> RangeRow | None:
        """The uploaded block holding ``pos``, after asking the block cache for the ``ahead`` after it."""
        rows = self._cold_rows.rows(st.stream_id, pos, 1 + ahead)
        if not rows:
            return None
        if ahead:
            self._blocks.prefetch(rows[1:])
        return rows[0]

    def _fetch_cold(self, st: _StreamState, start: int, stop: int, out: list[Record], budget: list[int]) -> None:
        pos = start
        ahead = self._readahead(st, start)
        while pos < stop:
            row = self._cold_row(st, pos, ahead)
            if row is None:
                break
            block = self._blocks.get(row)  # its CRC, which covers every batch in it, is checked
            # Offsets come from the block's row, not the batch headers (provisional in a Spark write's object).
            for at, info in placed_batches(block, row.entry()):
                if info.end_offset > pos and not self._take(block, at, info, pos, stop, out, budget):
                    st.read_next = out[-1].offset + 1 if out else pos
                    return
            pos = row.end_offset
            if ahead:
                self._blocks.release(row)  # read to its end: first to go when room is needed
        st.read_next = pos

    def _offset_for_timestamp(self, st: _StreamState, timestamp_ms: int) -> int | None:
        self._check_not_closed()
        with self._lock:
            low, committed = st.start_offset, st.committed_end
            tail = st.cached_between(committed, st.durable_end)
        row = self._meta.first_range_at_or_after_time(st.stream_id, timestamp_ms) if low < committed else None
        if row is not None:
            block = self._blocks.get(row)
            for at, info in placed_batches(block, row.entry()):
                for offset, ts in record_timestamps(block, at, info):
                    if ts >= timestamp_ms and offset >= low:
                        return offset
        for entry in tail:
            if entry.max_timestamp_ms >= timestamp_ms:
                info = check_batch(entry.data)
                for offset, ts in record_timestamps(entry.data, 0, info):
                    if ts >= timestamp_ms and offset >= low:
                        return offset
        return None

    def _latest_timestamp(self, st: _StreamState) -> tuple[int, int] | None:
        self._check_not_closed()
        with self._lock:
            low, committed = st.start_offset, st.committed_end
            tail = st.cached_between(max(low, committed), st.durable_end)
        row = self._meta.latest_range(st.stream_id, low) if low < committed else None
        best_ts = row.max_timestamp_ms if row is not None else None
        entry = max(tail, key=lambda e: e.max_timestamp_ms, default=None)  # max() keeps the first of ties
        if entry is not None and (best_ts is None or entry.max_timestamp_ms > best_ts):
            info = read_batch_info(entry.data)
            candidates = record_timestamps(entry.data, 0, info)
            best_ts = entry.max_timestamp_ms
        elif row is not None:
            block = self._blocks.get(row)
            candidates = (pair for at, info in placed_batches(block, row.entry())
                          for pair in record_timestamps(block, at, info))
        else:
            return None
        for offset, ts in candidates:
            if ts == best_ts and offset >= low:
                return offset, ts
        return None

    # Trim, retention, compaction -------------------------------------------------------------------

    def _trim(self, st: _StreamState, new_start: int) -> None:
        self._check_open()
        if new_start > st.durable_end:
            raise OffsetOutOfRangeError(f"cannot trim stream {st.stream_id} to {new_start}: its end is "
                                        f"{st.durable_end}")
        if new_start <= st.start_offset:
            return
        with self._commit_lock:
            self._meta.trim_stream(st.stream_id, new_start)
            with self._lock:
                st.start_offset = max(st.start_offset, new_start)
            self._publish([self._meta.stream(st.stream_id)])

    def apply_retention(self, now_ms: int | None = None) -> int:
        """Apply each stream's time and byte retention to uploaded data, then delete objects past their grace.

        Returns the number of objects deleted.
        """
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        for sm in self._meta.streams():
            if sm.retention_ms is None and sm.retention_bytes is None:
                continue
            new_start = sm.start_offset
            blocks = [b for b in self._meta.ranges_by_time(sm.stream_id) if b[0] > sm.start_offset]
            kept_bytes = sum(b[2] for b in blocks)
            for end, max_ts, size in blocks:
                too_old = sm.retention_ms is not None and max_ts < now_ms - sm.retention_ms
                too_big = sm.retention_bytes is not None and kept_bytes > sm.retention_bytes
                if not (too_old or too_big):
                    break
                new_start = end
                kept_bytes -= size
            st = self._streams.get(sm.stream_id)
            if st is not None and new_start > sm.start_offset:
                self._trim_retained(st, new_start)
        return self.delete_unreferenced(now_ms)

    def _trim_retained(self, st: _StreamState, new_start: int) -> None:
        if not self._shared_objects:
            self._trim(st, new_start)
            return
        try:
            self._trim(st, new_start)
        except StratalogError as e:
            # Shared metadata: the fence lets each writer trim only the streams it leads (a broker of a
            # cluster, its partitions); the others' retention is theirs to apply.
            log.debug("retention of stream %d left to its writer: %s", st.stream_id, e)

    def delete_unreferenced(self, now_ms: int | None = None) -> int:
        """Delete objects that nothing has referred to for ``object_grace_s``."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        gone = self._meta.collect_unreferenced(now_ms - int(self._config.object_grace_s * 1000))
        for obj in gone:
            self._objects.delete(obj.key)  # metadata first (already done), object after
            self._blocks.drop_object(obj.key)
            self._meta.forget_object(obj.object_id)
        return len(gone)

    def replace_objects(self, old_object_ids: Sequence[int], new_objects: Sequence[NewObject]) -> int:
        """Compaction's primitive: swap objects in metadata atomically; old ones go after the grace period."""
        with self._commit_lock:
            seq = self._meta.replace_objects(old_object_ids, new_objects)
            self._cold_rows.invalidate()
            self._publish([], snapshot=True)
            self._compactions += 1
            self._objects_compacted += len(old_object_ids)
        return seq

    def commit_external_objects(self, stream_ids: Sequence[int],
                                place: Callable[[dict[int, int]], Sequence[NewObject]], *,
                                marker: tuple[str, int] | None = None) -> int | None:
        """Register objects written outside this store (Spark writes) at the ends of ``stream_ids``, while
        appends may go on, and publish them.

        Appends to those streams wait (others do not) while their records already appended are made
        durable and uploaded; ``place(ends)`` is then given each stream's end offset and returns the objects
        with their blocks placed there (each object already in the object store under its key, with an id
        from ``metadata.allocate_object_id()``). One metadata transaction registers them and moves the ends;
        appends resume after them. ``marker`` ``(key, value)`` makes the commit happen once per value (see
        :meth:`Metadata.commit_external_objects`): returns None, placing nothing, when it happened already.
        Otherwise returns the commit sequence. ``place`` should be quick and do no I/O: appends wait on it.
        """
        self._check_open()
        with self._upload_lock, self._commit_lock:
            with self._cond:
                fenced = [self._streams[i] for i in sorted(set(stream_ids)) if i in self._streams]
                if len(fenced) != len(set(stream_ids)):
                    raise ValueError(f"unknown streams {sorted(set(stream_ids) - self._streams.keys())}")
                for st in fenced:
                    st.fenced = True
                last = self._last_wal_future
            try:
                if last is not None:
                    last.result()  # everything appended before the fence is durable...
                self._upload_held(trim_wal=True)  # ...and now in objects
                marker_key, marker_value = marker if marker is not None else (None, 0)
                if marker_key is not None and self._meta.get_meta(marker_key, -1) >= marker_value:
                    return None
                with self._lock:
                    for st in fenced:
                        invariant(not st.cache and st.next_offset == st.committed_end,
                                  "a fenced stream holds appends that were not uploaded")
                    ends = {st.stream_id: st.next_offset for st in fenced}
                objects = place(ends)
                touched = {b.stream_id for o in objects for b in o.blocks}
                if not touched <= ends.keys():
                    raise ValueError(f"objects place blocks in streams {sorted(touched - ends.keys())}, which "
                                     "were not fenced")
                seq = self._meta.commit_external_objects(objects, marker_key, marker_value)
                if seq is None:
                    return None
                metas = self._meta.streams_by_id(sorted(touched))
                with self._lock:
                    for sm in metas:
                        st = self._streams[sm.stream_id]
                        st.committed_end = st.next_offset = st.durable_end = sm.committed_end_offset
                self._cold_rows.invalidate()
                self._publish(metas, objects)
                return seq
            except WALFailedError as e:
                self._fail(e)
                raise StoreFailedError(f"the store stopped after an error: {e}") from e
            finally:
                with self._cond:
                    for st in fenced:
                        st.fenced = False
                    self._cond.notify_all()

    @property
    def failure(self) -> BaseException | None:
        """The error that stopped the store (a write, fsync or put that failed for good), or None."""
        return self._failure

    @property
    def space_refusal(self) -> str | None:
        """Why appends are refused for want of space now (the disk low, object storage full), or None."""
        return self._space.refusal

    @property
    def metadata(self) -> Metadata:
        return self._meta

    @property
    def object_store(self) -> ObjectStore:
        return self._objects

    def watch_completions(self, backstop_s: float) -> CompletionWatch | None:
        """Let the calling thread (an event loop) complete the appends, as the WAL's
        ``watch_completions`` says; release the watch before :meth:`close`."""
        self._check_open()
        return self._wal.watch_completions(backstop_s)

    # Upload ----------------------------------------------------------------------------------------

    def flush(self) -> None:
        """Upload everything appended so far, commit it, and trim the WAL behind it."""
        self._check_open()
        last = self._last_wal_future
        try:
            if last is not None:
                last.result()
            self._upload(trim_wal=True)
        except WALFailedError as e:
            self._fail(e)
            raise StoreFailedError(f"the store stopped after an error: {e}") from e

    def _upload(self, *, trim_wal: bool, everything: bool = False) -> int:
        """Upload what the WAL holds durably; return the bytes uploaded. Serialized by ``_upload_lock``."""
        with self._upload_lock:
            return self._upload_held(trim_wal=trim_wal, everything=everything)

    def _upload_held(self, *, trim_wal: bool, everything: bool = False) -> int:
        """:meth:`_upload`, with ``_upload_lock`` held by the caller."""
        with self._lock:
            durable = (1 << 63) if everything else self._wal.durable_offset
            cached = list(self._cached.values())
            taken_at = time.monotonic()
        # Without the lock: appends only add batches at the ends of the lists, with WAL offsets past
        # ``durable``, and only this thread removes any.
        taken: list[tuple[_StreamState, list[_Entry]]] = []
        for st in sorted(cached, key=lambda s: s.stream_id):
            cache = st.cache
            count = bisect.bisect_left(cache, durable, key=lambda e: e.wal_offset)
            if count:
                taken.append((st, list(cache[:count])))
        if not taken:
            return 0
        objects = self._write_objects(taken)
        with self._commit_lock:
            self._with_retries("committing the upload", lambda: self._meta.commit_objects(objects))
            self._after_commit(taken, objects)
        uploaded = sum(len(e.data) for _, entries in taken for e in entries)
        with self._cond:
            for st, entries in taken:
                st.drop_oldest(len(entries))
                st.committed_end = entries[-1].end_offset
                if not st.cache:
                    self._cached.pop(st.stream_id, None)
            self._cache_bytes -= uploaded
            # What is left came in about when this upload began (or was not yet durable then).
            self._cache_oldest = taken_at if self._cached else None
            self._cond.notify_all()
        if trim_wal:
            last_wal = max(entries[-1].wal_offset for _, entries in taken)
            if last_wal > self._wal.trim_offset:
                self._wal.trim(last_wal)
                with self._cond:
                    self._cond.notify_all()  # appenders waiting for WAL room
        return uploaded

    def _write_objects(self, taken: list[tuple[_StreamState, list[_Entry]]]) -> list[NewObject]:
        groups: list[list[tuple[_StreamState, list[_Entry]]]] = []
        shared: list[tuple[_StreamState, list[_Entry]]] = []
        for st, entries in taken:
            if sum(len(e.data) for e in entries) >= self._config.stream_object_bytes_min:
                groups.append([(st, entries)])
            else:
                shared.append((st, entries))
        if shared:
            groups.append(shared)
        written: list[NewObject] = []
        for group in groups:
            builder = ObjectBuilder()
            for st, entries in group:
                builder.add_stream(st.stream_id, [StreamBatch(e.base_offset, e.count, e.max_timestamp_ms, e.data)
                                                  for e in entries])
            parts = builder.finish_parts()
            size_bytes = sum(len(part) for part in parts)
            object_id = self._with_retries("allocating an object id", self._meta.allocate_object_id)
            key = object_key(object_id)
            self._with_retries(f"writing object {key}", functools.partial(put_parts, self._objects, key, parts))
            written.append(NewObject(object_id, key, size_bytes, builder.entries))
        return written

    def _after_commit(self, taken: list[tuple[_StreamState, list[_Entry]]],
                      objects: list[NewObject]) -> None:
        # Data trimmed while it waited for upload is now in objects below the start: drop it at once.
        for st, _ in taken:
            if st.start_offset > st.committed_end:
                self._meta.trim_stream(st.stream_id, st.start_offset)
        self._publish(self._meta.streams_by_id([st.stream_id for st, _ in taken]), objects)

    def _publish(self, streams: Sequence[StreamMeta], objects: Sequence[NewObject] = (),
                 snapshot: bool = False) -> None:
        """Publish the manifest for the latest commit: a delta, or a snapshot when one is due.

        Best effort: the commit already stands in metadata. After a failed publication the chain of
        deltas has a hole, so the next publication is a snapshot, which readers start from.
        """
        seq = self._meta.commit_seq
        snapshot = snapshot or self._manifest_stale or seq % self._config.manifest_snapshot_every == 0
        try:
            if snapshot:
                self._with_retries("publishing a manifest snapshot", lambda: self._manifest.snapshot(seq, self._meta))
            else:
                self._with_retries("publishing a manifest delta",
                                   lambda: self._manifest.delta(seq, streams, objects))
            self._manifest_stale = False
        except StratalogError as e:
            self._manifest_stale = True
            log.warning("publishing manifest %d failed; the next one will be a snapshot: %s", seq, str(e))

    def _with_retries(self, what: str, step: Callable[[], _T]) -> _T:
        """``step()`` retried with backoff; a step out of room fails at once (see _uploader_loop)."""
        config = self._config
        return with_retries(what, step, attempts=config.upload_attempts_max, backoff_s=config.upload_backoff_s,
                            log=log, retry_s_min=config.upload_retry_s_min, backoff_s_max=config.upload_backoff_s_max,
                            never_on=(OutOfSpaceError,))

    def _uploader_loop(self) -> None:
        """Uploads, retention and the free-space checks, in the background. An upload that runs out of room
        does not stop the store: appends are refused (SpaceGuard) and the upload is tried again every
        free_space_check_interval_s until it goes through."""
        config = self._config
        space_check_s = config.free_space_check_interval_s
        next_space_check = time.monotonic() + space_check_s
        while True:
            with self._cond:
                while not self._closing:
                    now = time.monotonic()
                    upload_at = max(self._upload_due_at(now), self._upload_retry_at)
                    if now >= min(upload_at, next_space_check):
                        break
                    self._cond.wait(min(upload_at, next_space_check) - now)
                if self._closing:
                    return
                upload = time.monotonic() >= upload_at
                if upload:
                    self._upload_wanted = False
            if time.monotonic() >= next_space_check:
                self._space.check()
                next_space_check = time.monotonic() + space_check_s
            if not upload:
                continue
            try:
                self._upload(trim_wal=True)
                self._space.objects_ok()
                if time.monotonic() - self._last_retention >= config.retention_interval_s:
                    self._last_retention = time.monotonic()
                    self.apply_retention()
            except OutOfSpaceError as e:
                self._space.objects_full(e)
                self._upload_retry_at = time.monotonic() + space_check_s
            except BaseException as e:
                self._fail(e)
                return

    def _upload_due_at(self, now: float) -> float:
        """When the uploader should upload next (store lock held): now when asked or when the log cache
        holds upload_bytes_threshold; else when its oldest entry is upload_interval_s old, or retention is
        due, whichever comes first."""
        config = self._config
        if self._upload_wanted or self._cache_bytes >= config.upload_bytes_threshold:
            return now
        due = self._last_retention + config.retention_interval_s
        if self._cached and self._cache_oldest is not None:
            due = min(due, self._cache_oldest + config.upload_interval_s)
        return due

    def _fail(self, error: BaseException) -> None:
        log.error("the store stopped: %s", str(error))
        with self._cond:
            self._stop_locked(error)

    def _stop_locked(self, error: BaseException) -> None:
        """Record the first failure and wake every waiter (store lock held)."""
        if self._failure is None:
            self._failure = error
        self._cond.notify_all()

    # Recovery --------------------------------------------------------------------------------------

    def _recover(self) -> RecoveryReport:
        report = RecoveryReport()
        started = time.monotonic()
        last_wal_offset = -1
        dropped: dict[int, tuple[int, int]] = {}  # stream -> offsets of batches that did not continue it
        for rec in self._wal.recover():
            report.wal_records += 1
            last_wal_offset = rec.offset
            info = check_batch(rec.data)
            st = self._streams.get(info.stream_id)
            if st is None:
                report.batches_of_unknown_streams += 1
                continue
            if info.base_offset != st.next_offset:
                # Below: already in objects (a crash between commit and WAL trim). Above: a hole left by
                # a batch that never became durable; later batches of that stream were never acknowledged.
                if info.base_offset < st.next_offset:
                    report.batches_already_in_objects += 1
                else:
                    report.batches_not_contiguous += 1
                    report.records_not_contiguous += info.count
                    low, high = dropped.get(st.stream_id, (info.base_offset, 0))
                    dropped[st.stream_id] = (min(low, info.base_offset), max(high, info.base_offset + info.count))
                continue
            data = bytes(rec.data)
            entry = _Entry(info.base_offset, info.count, data, info.max_timestamp_ms, rec.offset, time.monotonic())
            if not self._cached:
                self._cache_oldest = entry.appended_at
            st.push(entry)
            st.next_offset = st.durable_end = entry.end_offset
            self._cached[st.stream_id] = st
            self._cache_bytes += len(data)
            report.batches_replayed += 1
            if self._cache_bytes >= self._config.log_cache_bytes_max:
                self._upload(trim_wal=False, everything=True)
        report.wal_records_damaged = self._wal.recovery_stats.bad_body_records
        self._report_dropped(dropped, report.wal_records_damaged)
        self._upload(trim_wal=False, everything=True)
        if last_wal_offset > self._wal.trim_offset:
            self._wal.trim(last_wal_offset)
        report.orphan_objects_deleted = self._delete_orphans()
        if self._manifest_stale:
            self._publish([], snapshot=True)
        report.seconds = time.monotonic() - started
        return report

    def _report_dropped(self, dropped: dict[int, tuple[int, int]], damaged: int) -> None:
        """Say which offsets recovery left out. Batches past a hole were never acknowledged after a plain
        crash (the WAL acknowledges in order); after a damaged record they may have been, so say it loudly."""
        if not dropped and not damaged:
            return
        level = logging.ERROR if damaged else logging.INFO
        if damaged:
            log.error("recovery: %d WAL record(s) failed their CRC and were dropped; acknowledged records may "
                      "be lost. Each stream below ends before its first missing batch", damaged)
        for stream_id, (low, high) in sorted(dropped.items()):
            st = self._streams[stream_id]
            log.log(level, "recovery: stream %d ends at offset %d; batches at offsets %d..%d after a hole "
                    "were dropped", stream_id, st.next_offset, low, high - 1)

    def _delete_orphans(self) -> int:
        """Delete objects an interrupted upload wrote but never committed, and the pieces of cut-off puts.
        Not when other writers share the object store: an object unknown to metadata may be one of theirs,
        put and not yet committed."""
        if self._shared_objects:
            return 0
        return delete_orphans(self._objects, self._meta, DATA_PREFIX)

    # Lifecycle -------------------------------------------------------------------------------------

    def _check_not_closed(self) -> None:
        if self._closed:
            raise StoreClosedError("the store is closed")

    def _check_open(self) -> None:
        if self._failure is not None:
            raise StoreFailedError(f"the store stopped after an error: {self._failure}") from self._failure
        if self._closing or self._closed:
            raise StoreClosedError("the store is closed")

    def close(self) -> None:
        """Upload what is left, trim the WAL, and release everything."""
        with self._cond:
            if self._closed:
                return
            self._closing = True
            self._cond.notify_all()
        self._uploader.join()
        try:
            if self._failure is None and not self._wal.failure:
                last = self._last_wal_future
                if last is not None:
                    last.exception()
                self._upload(trim_wal=True)
        except OutOfSpaceError as e:   # durable in the WAL: the next open uploads it
            log.warning("closing with appends not yet in objects (the WAL keeps them for the next open): %s",
                        str(e))
        finally:
            self._closed = True
            # The last WAL future's callback holds this store: kept, the pair would wait for a full garbage
            # collection, and with them the log cache.
            self._last_wal_future = None
            self._wal.close()
            self._blocks.close()
            self._meta.close()
            self._objects.close()
            unlock_data_dir(self._lock_fd)
            release_frames(self._failure)

    def __enter__(self) -> StreamStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stats(self) -> dict[str, int]:
        with self._lock:
            oldest = self._cache_oldest
            return {
                "streams": len(self._streams),
                "log_cache_bytes": self._cache_bytes,
                "block_cache_bytes": self._blocks.cached_bytes,
                "block_cache_hits": self._blocks.stats.hits,
                "block_cache_misses": self._blocks.stats.misses,
                # How long the oldest appended bytes not yet in objects have waited (0: none wait).
                "upload_lag_ms": 0 if oldest is None else max(0, int((time.monotonic() - oldest) * 1000)),
                "wal_trim_offset": self._wal.trim_offset,
                # The WAL's bytes not yet trimmed: what a restart would replay.
                "wal_used_bytes": max(0, self._wal.durable_offset - self._wal.trim_offset),
                "commit_seq": self._meta.commit_seq,
                "compactions": self._compactions,
                "objects_compacted": self._objects_compacted,
                **self._space.stats(),
            }

    def collectors(self) -> list[Collector]:
        """The store's own Prometheus collectors, in no registry until a broker serving metrics registers
        them: object store calls by operation, and the WAL's write and append times (a device WAL's)."""
        found = list(self._objects.collectors()) if isinstance(self._objects, MeteredStore) else []
        collectors = getattr(self._wal, "collectors", None)
        return found + (collectors() if collectors is not None else [])

    def iter_streams(self) -> Iterator[StreamMeta]:
        yield from self._meta.streams()
