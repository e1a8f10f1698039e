"""StreamStore: many streams over one WAL, recent data in memory, everything else in object storage.

The facade: it opens the parts, owns the store's lifecycle and its streams, and answers the public calls.
Each part is a module of its own, sharing one ``StoreCore`` (core.py: the locks, the streams, the log
cache, the WAL, the metadata):

- appends.py (Appends): ``Stream.append`` encodes one batch, appends it to the WAL and to the log cache
  (log_cache.py: in memory, not yet uploaded); its future completes with the base offset once the WAL
  says the batch is durable.
- uploads.py (Uploads): the uploader thread turns log-cache contents into objects, commits their ranges
  in metadata, publishes the manifest, drops them from memory, then trims the WAL.
- reads.py (Reads): objects through the block cache for committed offsets (cold_reads.py: readahead
  rows, the byte-rate bound), then the log cache for the tail.
- retention.py (Retention): trims, retention, object replacement and deletion.
- external_commit.py: objects written outside the store (a Spark write) placed at its streams' ends.
- recovery.py: at open, the WAL replayed from its trim point into the log cache, skipping what metadata
  says is already in objects, and objects no commit refers to deleted.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Protocol

from prometheus_client.registry import Collector

from stratalog.datadir import lock_data_dir, prepare_data_dir, unlock_data_dir
from stratalog.engine.appends import Appends
from stratalog.engine.blockcache import BlockCache
from stratalog.engine.cleaner import Cleaner, CleanPolicy, CleanReport
from stratalog.engine.config import StoreConfig
from stratalog.engine.core import StoreCore
from stratalog.engine.errors import (
    BackpressureError,
    OffsetOutOfRangeError,
    StoreClosedError,
    StoreFailedError,
    StoreFullError,
    UnflushedStreamError,
)
from stratalog.engine.external_commit import commit_external_objects
from stratalog.engine.manifest import ManifestPublisher
from stratalog.engine.metadata import Fence, Metadata, NewObject, StreamMeta, UnknownStreamError
from stratalog.engine.reads import Reads
from stratalog.engine.recovery import RecoveryReport, recover
from stratalog.engine.retention import Retention
from stratalog.engine.stream import Stream, StreamParts
from stratalog.engine.txn_view import TxnView
from stratalog.engine.uploads import DATA_PREFIX, Uploads, object_key
from stratalog.errors import OutOfSpaceError, release_frames
from stratalog.free_space import SpaceGuard
from stratalog.io.block_io import CompletionWatch
from stratalog.io.device import Device
from stratalog.objects.local import LocalDirStore
from stratalog.objects.metered import MeteredStore
from stratalog.objects.store import ObjectStore
from stratalog.wal import WriteAheadLog
from stratalog.wal.protocol import WAL

__all__ = [
    "DATA_PREFIX", "BackpressureError", "OffsetOutOfRangeError", "RecoveryReport", "StoreClosedError",
    "StoreFailedError", "StoreFullError", "Stream", "StreamStore", "UnflushedStreamError", "object_key",
]

log = logging.getLogger("stratalog.engine")


class _Closeable(Protocol):
    def close(self) -> None: ...


class StreamStore:
    """Durable streams on one machine's WAL, with object storage as main storage."""

    def __init__(self, data_dir: Path, objects: ObjectStore, config: StoreConfig,
                 wal_device: Device | None = None, metadata: str | None = None,
                 fence: Fence | None = None,
                 wal: WAL | None = None) -> None:
        self._dir = data_dir
        self._lock_fd = lock_data_dir(data_dir)
        opened: list[_Closeable] = []
        try:
            core = self._core = self._open_core(data_dir, objects, config, wal_device, metadata, fence, wal,
                                                opened)
            self._retention = Retention(core)
            self._uploads = Uploads(core, self._retention.apply_retention)
            self._parts = StreamParts(Appends(core), Reads(core), self._retention)
            self._cleaner = Cleaner(core, config.cleaner)
            self.recovery = recover(core, self._uploads)
        except BaseException:
            # Whatever opened before the failure is let go, so a failed open leaks no connection, thread
            # or lock (the caller may retry at once, as a broker replaying another's log does).
            if wal is not None and wal not in opened:
                opened.append(wal)
            for part in reversed(opened):
                with contextlib.suppress(Exception):
                    part.close()
            unlock_data_dir(self._lock_fd)
            raise
        self._uploads.start()

    @staticmethod
    def _open_core(data_dir: Path, objects: ObjectStore, config: StoreConfig, wal_device: Device | None,
                   metadata: str | None, fence: Fence | None, wal: WAL | None,
                   opened: list[_Closeable]) -> StoreCore:
        """Open the metadata, the block cache and the WAL (each added to ``opened`` as it opens)."""
        meta = Metadata(data_dir / "meta.sqlite" if metadata is None else metadata, fence=fence)
        opened.append(meta)
        local_roots = [objects.root] if isinstance(objects, LocalDirStore) else []
        # Every call below counted for /metrics (objects/metered.py); a local store's own root kept above.
        objects = MeteredStore(objects)
        space = SpaceGuard([data_dir, *local_roots], config.headroom, log)
        space.check()   # a store opened on a full disk refuses appends from the start
        manifest = ManifestPublisher(objects)
        # A snapshot at open only when the published chain does not reach the last commit: a store with
        # a million streams would otherwise write its whole manifest at every open.
        manifest_stale = not manifest.resume(meta.commit_seq)
        blocks = BlockCache(objects, config.block_cache_bytes_max, config.block_cache_io_threads)
        opened.append(blocks)
        if wal is None:
            wal_path = data_dir / "wal" if wal_device is None else wal_device
            wal = WriteAheadLog.open(wal_path, capacity_bytes=config.wal_capacity_bytes, create=True,
                                     config=config.wal)
        opened.append(wal)
        core = StoreCore(config, meta, objects, wal, blocks, space, manifest, manifest_stale=manifest_stale,
                         shared_objects=fence is not None)
        for sm in meta.streams():
            core.add_state(sm)
        return core

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

    # Streams ---------------------------------------------------------------------------------------

    def create_stream(self, name: str | None = None, *, retention_ms: int | None = None,
                      retention_bytes: int | None = None) -> Stream:
        """A new, empty stream; durable when it returns. Names are unique; None means unnamed."""
        core = self._core
        core.check_open()
        with core.commit_lock:
            sm = core.meta.create_stream(name, retention_ms, retention_bytes)
            core.publish([sm])
        with core.lock:
            return Stream(self._parts, core.add_state(sm))

    def create_streams(self, names: Sequence[str]) -> list[Stream]:
        """Many new, empty named streams in one commit and one manifest: what a bulk writer (Spark)
        needs when a write brings thousands of new streams. All or none are created."""
        core = self._core
        core.check_open()
        if not names:
            return []
        with core.commit_lock:
            metas = core.meta.create_streams(names)
            core.publish(metas)
        with core.lock:
            return [Stream(self._parts, core.add_state(sm)) for sm in metas]

    def open_stream(self, id_or_name: int | str) -> Stream:
        core = self._core
        with core.lock:
            stream_id = core.by_name.get(id_or_name) if isinstance(id_or_name, str) else id_or_name
            st = core.streams.get(stream_id) if stream_id is not None else None
        if st is None:
            raise UnknownStreamError(f"no stream {id_or_name!r}")
        return Stream(self._parts, st)

    def reload_stream(self, name: str) -> Stream:
        """Serve the stream ``name`` from its committed end as the metadata says it now.

        For a store sharing its metadata with other writers (a broker of a cluster): a stream another
        writer led until now was appended to and committed there, so what this store holds of it (from
        its open, or from an earlier time it led it) is stale, or missing if the stream was made since.
        The stream must hold nothing here that is not committed (its last writer here flushed it before
        handing it over): UnflushedStreamError otherwise. Handles already open see the new state."""
        core = self._core
        core.check_open()
        sm = core.meta.stream(name)
        with core.cond:
            old_id = core.by_name.get(name)
            if old_id is not None and old_id != sm.stream_id:
                core.streams.pop(old_id, None)   # a stream of that name deleted elsewhere, then made again
            st = core.streams.get(sm.stream_id)
            if st is None:
                st = core.add_state(sm)
            elif st.cache or st.next_offset != st.durable_end:
                raise UnflushedStreamError(f"stream {name!r} holds appends that are not committed here; "
                                           "flush the store before another writer takes the stream")
            else:
                st.start_offset = sm.start_offset
                st.committed_end = st.next_offset = st.durable_end = sm.committed_end_offset
                st.read_next, st.readahead_blocks = -1, 1
                core.by_name[name] = sm.stream_id
        core.cold_rows.invalidate()   # rows read while another writer was adding blocks after them
        return Stream(self._parts, st)

    def streams(self) -> list[Stream]:
        core = self._core
        with core.lock:
            return [Stream(self._parts, st) for st in core.streams.values()]

    def iter_streams(self) -> Iterator[StreamMeta]:
        yield from self._core.meta.streams()

    def delete_stream(self, stream: Stream) -> None:
        """Delete a stream and its records; durable when it returns. Its objects go after the grace
        period (readers holding them finish first); its batches still in the WAL are skipped at recovery."""
        core = self._core
        core.check_open()
        with core.upload_lock, core.commit_lock:
            core.meta.delete_stream(stream.stream_id)
            with core.cond:
                st = core.streams.pop(stream.stream_id, None)
                if st is not None:
                    if st.name is not None:
                        core.by_name.pop(st.name, None)
                    core.cache.drop_stream(st)
                    st.start_offset = st.durable_end  # handles still held read nothing
                core.cond.notify_all()
            core.cold_rows.invalidate()
            core.publish([], snapshot=True)

    def set_retention(self, stream: Stream, *, retention_ms: int | None, retention_bytes: int | None) -> None:
        self._core.meta.set_retention(stream.stream_id, retention_ms, retention_bytes)

    # Retention, compaction, external commits: retention.py, external_commit.py ------------------------

    def apply_retention(self, now_ms: int | None = None) -> int:
        """Apply each stream's time and byte retention to uploaded data, then delete objects past their grace.

        Returns the number of objects deleted.
        """
        return self._retention.apply_retention(now_ms)

    def delete_unreferenced(self, now_ms: int | None = None) -> int:
        """Delete objects that nothing has referred to for ``object_grace_s``."""
        return self._retention.delete_unreferenced(now_ms)

    def replace_objects(self, old_object_ids: Sequence[int], new_objects: Sequence[NewObject]) -> int:
        """Compaction's primitive: swap objects in metadata atomically; old ones go after the grace period."""
        return self._retention.replace_objects(old_object_ids, new_objects)

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
        return commit_external_objects(self._core, self._uploads, stream_ids, place, marker)

    def clean_stream(self, stream: Stream, policy: CleanPolicy, *, end_offset_max: int | None = None,
                     now_ms: int | None = None, should_stop: Callable[[], bool] = lambda: False) -> CleanReport:
        """One pass of log compaction over ``stream`` if one is due (engine/cleaner.py): the latest record of
        each key kept, in uploaded data below ``end_offset_max`` (None: all of it); ``should_stop`` ends it
        early, between two commits. One pass per stream at a time."""
        core = self._core
        with core.lock:
            st = core.streams.get(stream.stream_id)
        if st is None:
            raise UnknownStreamError(f"no stream {stream.stream_id}")
        return self._cleaner.clean(st, policy, end_offset_max=(1 << 62) if end_offset_max is None else end_offset_max,
                                   now_ms=now_ms, should_stop=should_stop)

    # Upload: uploads.py ----------------------------------------------------------------------------

    def flush(self) -> None:
        """Upload everything appended so far, commit it, and trim the WAL behind it."""
        self._uploads.flush()

    # State -----------------------------------------------------------------------------------------

    @property
    def failure(self) -> BaseException | None:
        """The error that stopped the store (a write, fsync or put that failed for good), or None."""
        return self._core.failure

    @property
    def space_refusal(self) -> str | None:
        """Why appends are refused for want of space now (the disk low, object storage full), or None."""
        return self._core.space.refusal

    @property
    def metadata(self) -> Metadata:
        return self._core.meta

    @property
    def object_store(self) -> ObjectStore:
        return self._core.objects

    def set_txn_view(self, view: TxnView | None) -> None:
        """What the store's owner knows of its streams' Kafka transactions (a broker installs its partition
        leader's at start), for ``Stream.fetch``'s read_committed: engine/txn_view.py. None: nothing."""
        self._parts.reads.txn_view = view

    def watch_completions(self, backstop_s: float) -> CompletionWatch | None:
        """Let the calling thread (an event loop) complete the appends, as the WAL's
        ``watch_completions`` says; release the watch before :meth:`close`."""
        self._core.check_open()
        return self._core.wal.watch_completions(backstop_s)

    def stats(self) -> dict[str, int]:
        core = self._core
        with core.lock:
            oldest = core.cache.oldest
            return {
                "streams": len(core.streams),
                "log_cache_bytes": core.cache.size_bytes,
                "block_cache_bytes": core.blocks.cached_bytes,
                "block_cache_hits": core.blocks.stats.hits,
                "block_cache_misses": core.blocks.stats.misses,
                # How long the oldest appended bytes not yet in objects have waited (0: none wait).
                "upload_lag_ms": 0 if oldest is None else max(0, int((time.monotonic() - oldest) * 1000)),
                "wal_trim_offset": core.wal.trim_offset,
                # The WAL's bytes not yet trimmed: what a restart would replay.
                "wal_used_bytes": max(0, core.wal.durable_offset - core.wal.trim_offset),
                "commit_seq": core.meta.commit_seq,
                "compactions": self._retention.compactions,
                "objects_compacted": self._retention.objects_compacted,
                "cleaner_passes": self._cleaner.passes,
                "cleaner_bytes_read": self._cleaner.bytes_cleaned,
                **core.space.stats(),
            }

    def collectors(self) -> list[Collector]:
        """The store's own Prometheus collectors, in no registry until a broker serving metrics registers
        them: object store calls by operation, and the WAL's write and append times (a device WAL's)."""
        objects = self._core.objects
        found = list(objects.collectors()) if isinstance(objects, MeteredStore) else []
        collectors = getattr(self._core.wal, "collectors", None)
        return found + (collectors() if collectors is not None else [])

    # Lifecycle -------------------------------------------------------------------------------------

    def close(self) -> None:
        """Upload what is left, trim the WAL, and release everything."""
        core = self._core
        with core.cond:
            if core.closed:
                return
            core.closing = True
            core.cond.notify_all()
        self._uploads.join()
        try:
            if core.failure is None and not core.wal.failure:
                last = core.last_wal_future
                if last is not None:
                    last.exception()
                self._uploads.upload(trim_wal=True)
        except OutOfSpaceError as e:   # durable in the WAL: the next open uploads it
            log.warning("closing with appends not yet in objects (the WAL keeps them for the next open): %s",
                        str(e))
        finally:
            core.closed = True
            self._cleaner.close()
            # The last WAL future's callback refers to a stream's state: let it go with the store.
            core.last_wal_future = None
            core.wal.close()
            core.blocks.close()
            core.meta.close()
            core.objects.close()
            unlock_data_dir(self._lock_fd)
            release_frames(core.failure)

    def __enter__(self) -> StreamStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
