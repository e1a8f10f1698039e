"""QueueStore: a million small queues as streams of the engine's bulk path.

The facade: it makes the parts, owns their three threads and the store's lifecycle, and answers the
public calls. Each part is a module of its own:

- pending.py (PendingPuts): what put and put_many handed over; a put is one list extend, no lock (one C
  call where the compiled core is built: ``_native.QueuePutter``, with :meth:`QueueStore.put` its twin).
- writer.py (Writer): queue names and dense ids, and the drains that turn pending puts into bulk
  records in the WAL and the log cache (the writer thread drains every few milliseconds).
- logcache.py (LogCache, View): records not yet in objects, and the view readers take of them and of
  the objects.
- reader.py (Reader): gets, from objects (RunIndex, objects.py) and from the log cache.
- uploader.py (plan_upload, Uploader): the log cache into one run object, the manifest, the WAL trim
  (the uploader thread).
- compactor.py (Compactor): merges of consecutive objects (compaction.py, merge_worker.py) and the
  deletion of what they replaced (the compactor thread).
- recovery.py (recover, its decision table): objects' indexes, then the WAL replayed at open.

``flush`` hands what is pending to the WAL and waits until it is durable.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc

from stratalog.datadir import lock_data_dir, prepare_data_dir, unlock_data_dir
from stratalog.engine.metadata import Metadata
from stratalog.engine.store import StoreFailedError
from stratalog.errors import OutOfSpaceError, release_frames
from stratalog.free_space import SpaceGuard
from stratalog.invariant import invariant
from stratalog.io.device import Device
from stratalog.native import native
from stratalog.objects.local import LocalDirStore
from stratalog.objects.store import ObjectStore
from stratalog.queues.compactor import CompactionCancelledError, Compactor
from stratalog.queues.config import GROUP_NAME_CHARS_MAX, QUEUE_NAME_CHARS_MAX, QueueConfig
from stratalog.queues.errors import MessageTooLargeError, QueueStoreFullError, check_name, too_many_queues
from stratalog.queues.lifecycle import Lifecycle
from stratalog.queues.logcache import LogCache
from stratalog.queues.pending import UNKNOWN_ID, PendingPuts
from stratalog.queues.puts import as_bytes, messages_as_arrow, names_as_arrow, plain_name
from stratalog.queues.reader import Reader
from stratalog.queues.recovery import QueueRecoveryReport, recover
from stratalog.queues.uploader import Uploader
from stratalog.queues.writer import QueueArrays, Writer
from stratalog.wal import WriteAheadLog

log = logging.getLogger("stratalog.queues")

_COMMIT_KEY = "queue-commit:{}:{}:{}"


class QueueStore:
    """Durable named queues, created on first put, offsets dense from 0. Thread-safe."""

    def __init__(self, data_dir: Path, objects: ObjectStore, config: QueueConfig,
                 wal_device: Device | None = None) -> None:
        config.validate()
        self._dir = data_dir
        self._config = config
        self._objects = objects
        self._lock_fd = lock_data_dir(data_dir)
        self._meta = Metadata(data_dir / "meta.sqlite")
        self._small_max = min(config.small_message_bytes_max, config.message_bytes_max)
        # Lock order, outermost first (a thread holding one takes only those after it):
        #   1. Writer.lock (one drain at a time)  or  Uploader.lock (uploads, merge commits, manifests):
        #      never held together;
        #   2. LogCache's tail-index lock (one rebuild at a time);
        #   3. LogCache.lock (the view and the log cache's counts; writers and uploads wait on it);
        #   4. leaves, taken alone: PendingPuts' condition (take holds it under Writer.lock), the run
        #      cache's lock, the Reader's counts lock.
        self.pending = PendingPuts(config.pending_messages_wake, config.pending_messages_max,
                                   config.pending_bytes_max)
        self._wake_slots = self.pending.wake_slots
        if native is not None:
            # put as one C call: the plain put (a small bytes message, a plain name) appends its slots
            # there, anything else goes to the method below, its twin (close drops the putter: it holds
            # the store).
            self.put = native.QueuePutter(  # type: ignore[method-assign]
                self.pending, types.MethodType(QueueStore.put, self), self._backpressure, UNKNOWN_ID,
                self._small_max, QUEUE_NAME_CHARS_MAX, self._wake_slots).put
        self.log_cache = LogCache(config)
        self._lifecycle = Lifecycle(self.pending, self.log_cache)
        self._wake = threading.Event()          # wakes the writer thread
        # Whether a put has set _wake since the writer last cleared it: a plain attribute, so the puts that
        # come while the writer is behind (each of them past pending_messages_wake) do not each call
        # Event.is_set.
        self._woken = False
        self._compact_wake = threading.Event()  # wakes the compactor thread (an upload, close)
        self._wal = WriteAheadLog.open(data_dir / "wal" if wal_device is None else wal_device,
                                       capacity_bytes=config.wal_capacity_bytes, create=True, config=config.wal)
        self.writer = Writer(record_bytes_target=config.record_bytes_target, wal_wait_s_max=config.put_wait_s_max,
                             queues_max=config.queues_max, wal=self._wal, log_cache=self.log_cache,
                             lifecycle=self._lifecycle, queues=QueueArrays())
        self.reader = Reader(objects=objects, pending=self.pending, writer=self.writer, log_cache=self.log_cache,
                             lifecycle=self._lifecycle, config=config)
        # get is the reader's (the method below says what it does): a Python call fewer on every get.
        self.get = self.reader.get  # type: ignore[method-assign]
        self.uploader = Uploader(config, objects, self._meta, self._wal, self.log_cache, self.writer,
                                 self._compact_wake)
        self.compactor = Compactor(config=config, objects=objects, meta=self._meta, log_cache=self.log_cache,
                                   uploader=self.uploader, writer=self.writer, reader=self.reader,
                                   pending=self.pending, lifecycle=self._lifecycle)
        local_roots = [objects.root] if isinstance(objects, LocalDirStore) else []
        self._space = space = SpaceGuard([data_dir, *local_roots], config.headroom, log)
        # A merge writes its whole output before the objects it replaces go: none while the disk is low.
        # (Through the guard, not the store: the compactor must not hold the store; see lifecycle.py.)
        self.compactor.may_merge = lambda: space.refusal is None
        #: After an upload ran out of room: no upload is tried before this (monotonic seconds).
        self._upload_retry_at = 0.0
        self._check_space()   # a store opened on a full disk refuses puts from the start
        self.recovery: QueueRecoveryReport = recover(
            objects=objects, meta=self._meta, wal=self._wal, writer=self.writer, log_cache=self.log_cache,
            uploader=self.uploader, upload_bytes_threshold=config.upload_bytes_threshold)
        self._writer_thread = threading.Thread(target=self._writer_loop, name="stratalog-queue-writer",
                                               daemon=True)
        self._uploader_thread = threading.Thread(target=self._uploader_loop, name="stratalog-queue-uploader",
                                                 daemon=True)
        self._compactor_thread = threading.Thread(target=self._compactor_loop, name="stratalog-queue-compactor",
                                                  daemon=True)
        self._writer_thread.start()
        self._uploader_thread.start()
        self._compactor_thread.start()

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
        # here cost more than the rest of a put at a million queues (its cache misses).
        if type(queue_name) is not str or not 0 < len(queue_name) <= QUEUE_NAME_CHARS_MAX \
                or not queue_name.isascii():
            check_name(queue_name)
        # PendingPuts.add, inlined (a Python call more cost a tenth of a put): one extend of a tuple, atomic
        # under the GIL, no lock.
        slots = self.pending.slots
        slots.extend((queue_name, message, UNKNOWN_ID))
        if len(slots) >= self._wake_slots:
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
        self.pending.add_large(queue_name, message)
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
        # thread; -1: not known yet, the writer resolves (or creates) those.
        known = self.writer.known_ids(names)
        # Only names not known yet are checked: a known one was checked when its queue was made (a name
        # equal to it is the same name).
        unknown_at = np.flatnonzero(known < 0)
        unknown = names.take(unknown_at).to_pylist() if len(unknown_at) else []
        if not all(map(plain_name, unknown)):
            for name in unknown:
                check_name(name)
        # Refused here, before any of the batch is put, when its new queues alone pass the bound (the
        # writer checks again: single puts and concurrent batches may create queues meanwhile).
        queues, queues_max = self.writer.stream_count, self._config.queues_max
        if unknown and queues + len(unknown) > queues_max and queues + len(set(unknown)) > queues_max:
            raise too_many_queues(queues, len(set(unknown)), queues_max)
        self.pending.add_bulk(names, known, batch, int(pc.sum(lengths).as_py() or 0), len(unknown_at))
        self._backpressure()

    def _backpressure(self) -> None:
        """Wake the writer; wait while the puts not yet written are at their bound. Called by every put
        while the writer is behind, so the way through is short: a store that stopped or closed refuses
        the put before this (PendingPuts.refuse), and is checked for here only before waiting."""
        if not self._woken:
            self._woken = True
            self._wake.set()
        if not self.pending.full():
            return
        self._lifecycle.check_open()
        self.pending.wait_for_room(self._config.put_wait_s_max, self._lifecycle.check_open)

    def flush(self) -> None:
        """Return once every put made before this call is durable (survives kill -9 and power loss)."""
        self._lifecycle.check_open()
        self.writer.drain(self.pending)
        last = self.writer.last_future
        if last is not None:
            error = last.exception()
            if error is not None:
                raise StoreFailedError(f"the queue store's WAL failed: {error}") from error

    # Read ------------------------------------------------------------------------------------------

    def get(self, queue_name: str, offset: int, num: int) -> list[bytes]:
        """Messages ``offset .. offset + num - 1`` of ``queue_name`` that exist, in order. Sees every put
        made before it (durable or not: a message not yet flushed may be gone after a crash)."""
        return self.reader.get(queue_name, offset, num)

    # Consumer positions ----------------------------------------------------------------------------

    def commit(self, group: str, queue_name: str, offset: int) -> None:
        """Record that ``group`` consumed ``queue_name`` up to ``offset``; durable when it returns."""
        check_name(group, "group")
        check_name(queue_name)
        if type(offset) is not int or offset < 0:
            raise ValueError(f"offset must be an int >= 0, got {offset!r}")
        self._lifecycle.check_open()
        invariant(len(group) <= GROUP_NAME_CHARS_MAX)
        self._meta.set_meta(_COMMIT_KEY.format(len(group), group, queue_name), offset)

    def committed(self, group: str, queue_name: str) -> int | None:
        """The offset ``group`` last committed on ``queue_name``, or None."""
        check_name(group, "group")
        check_name(queue_name)
        self._lifecycle.check_not_closed()
        value = self._meta.get_meta(_COMMIT_KEY.format(len(group), group, queue_name), -1)
        return None if value < 0 else value

    # Threads ---------------------------------------------------------------------------------------

    def _writer_loop(self) -> None:
        while True:
            self._wake.wait(self._config.linger_s)
            self._wake.clear()
            self._woken = False     # after the clear: a put in between is taken by the drain below
            if self._lifecycle.closing:
                return
            try:
                self.writer.drain(self.pending)
            except BaseException as e:
                self._lifecycle.fail(e)
                return

    def _uploader_loop(self) -> None:
        """Uploads, and the free-space checks. An upload that runs out of room does not stop the store:
        puts are refused (see _check_space) and the upload is tried again every free_space_check_interval_s
        until it goes through."""
        cache = self.log_cache
        check_s = self._config.free_space_check_interval_s
        wait_s = min(self._config.upload_idle_s, 0.1, check_s)
        next_check = time.monotonic() + check_s
        while True:
            with cache.lock:
                while not self._lifecycle.closing:
                    now = time.monotonic()
                    if now >= next_check or (now >= self._upload_retry_at and self.uploader.due()):
                        break
                    cache.lock.wait(wait_s)
                if self._lifecycle.closing:
                    return
            if time.monotonic() >= next_check:
                self._check_space()
                next_check = time.monotonic() + check_s
            if time.monotonic() < self._upload_retry_at or not self.uploader.due():
                continue
            with cache.lock:
                cache.upload_wanted = False
            try:
                self.uploader.upload()
                self._space.objects_ok()
                self._follow_space()
            except OutOfSpaceError as e:
                self._space.objects_full(e)
                self._follow_space()
                self._upload_retry_at = time.monotonic() + check_s
            except BaseException as e:
                self._lifecycle.fail(e)
                return

    # Free space ------------------------------------------------------------------------------------

    def _check_space(self) -> None:
        self._space.check()
        self._follow_space()

    def _follow_space(self) -> None:
        """Pause or resume the puts as the space guard says. Pausing also drops the spare files: they are
        room the store holds for reuse, and a disk that is low needs it back."""
        if self._space.refusal is None:
            self.pending.resume()
        else:
            self.pending.pause(self._admit)
            self.compactor.drop_spares()

    def _admit(self) -> None:
        """A put while puts are paused: QueueStoreFullError while the space guard (looked at again, at most
        every free_space_recheck_interval_s) still refuses; else puts resume and this one lands."""
        self._lifecycle.check_open()
        if self._space.recheck() is not None:
            raise QueueStoreFullError(f"puts refused: {self._space.refusal}")
        self.pending.resume()

    def _compactor_loop(self) -> None:
        compactor = self.compactor
        while True:
            self._compact_wake.wait(1.0)
            self._compact_wake.clear()
            if self._lifecycle.closing:
                return
            try:
                compactor.work()
            except CompactionCancelledError:
                compactor.merge_cancelled = True
                return
            except OutOfSpaceError as e:
                # The merge's output did not fit: its pieces are gone, the objects it read stay; puts are
                # refused until space is back, and merging goes on then.
                log.warning("a merge ran out of room: %s", str(e))
                self._space.objects_full(e)
                self._follow_space()
            except BaseException as e:
                # The objects stay as they are and reads go on; only merging stops (until the next open).
                log.error("queue compaction stopped: %s", str(e))
                compactor.compaction_error = e

    # Lifecycle -------------------------------------------------------------------------------------

    @property
    def compactions(self) -> int:
        return self.compactor.compactions

    @property
    def compaction_error(self) -> BaseException | None:
        return self.compactor.compaction_error

    def close(self) -> None:
        """Make every put durable, upload, trim the WAL, and release everything."""
        lifecycle = self._lifecycle
        if lifecycle.closed or lifecycle.closing:
            return
        try:
            if lifecycle.failure is None:
                self.flush()
        finally:
            lifecycle.closing = True
            self.pending.refuse(lifecycle.check_open)
            vars(self).pop("put", None)   # the compiled putter, and the cycle through it
            self._wake.set()
            self.log_cache.wake_all()
            self._compact_wake.set()
            self._writer_thread.join()
            self._uploader_thread.join()
            self._compactor_thread.join()
            try:
                if lifecycle.failure is None and not self._wal.failure:
                    self.uploader.upload()
                self.compactor.retire_due(everything=True)
                self.compactor.drop_spares()
                if self.compactor.merge_cancelled and isinstance(self._objects, LocalDirStore):
                    # The killed worker's piece (a spare it was writing over may be gigabytes): nothing
                    # writes here any more, so every temp file is a leftover.
                    self._objects.remove_temp_files()
            finally:
                lifecycle.closed = True
                self._wal.close()
                for obj in self.log_cache.view.objects:
                    if obj.reader is not None:
                        obj.reader.close()
                self._meta.close()
                self._objects.close()
                unlock_data_dir(self._lock_fd)
                release_frames(lifecycle.failure)

    def __enter__(self) -> QueueStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stats(self) -> dict[str, int]:
        """Queues, messages, and the bytes of each in-memory structure."""
        view = self.log_cache.view
        objects = view.objects
        writer, reader, compactor = self.writer, self.reader, self.compactor
        stream_count = writer.stream_count
        return {
            "queues": stream_count,
            "messages": int(writer.next_offsets[:stream_count].sum()),
            "objects": len(objects),
            "index_bytes": view.index.nbytes,
            "index_bytes_used": view.index.used_bytes,
            "page_crc_bytes": sum(o.pages.nbytes for o in objects),
            "queue_state_bytes": writer.queues.nbytes,
            "name_dict_bytes": sys.getsizeof(writer.ids) + writer.name_bytes,
            "name_index_bytes": writer.names.nbytes,
            "log_cache_bytes": self.log_cache.cache_bytes,
            "log_cache_records": len(view.records),
            "read_cache_bytes": reader.run_cache.size,
            "read_ahead_bytes": sum(len(held[0]) for obj in objects for held in obj.chunks.values()),
            "object_reads": reader.object_reads,
            "object_read_bytes": reader.object_read_bytes,
            "object_reads_waited": reader.object_reads_waited,
            "compactions": compactor.compactions,
            "compactions_at_rest": compactor.compactions_at_rest,
            "merge_worker_peak_rss_bytes": compactor.merge_worker_peak_rss_bytes,
            "compacted_bytes": compactor.compacted_bytes,
            "spare_bytes": self._objects.spare_bytes() if isinstance(self._objects, LocalDirStore) else 0,
            **self._space.stats(),
        }

