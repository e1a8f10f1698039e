"""The Delta WAL: a ring of 4 KiB-aligned blocks on a file or raw device, acknowledged in offset order.

Write path (all under one lock, a few microseconds per record)::

    append(data) -> record packed into the current block's aligned buffer -> AppendResult(offset, future)
    current block sealed by size (block_bytes_soft_max) or age (block_linger_s, by the sealer thread)
    sealed blocks -> pending -> the I/O engine's queue, within window_bytes_max -> io_threads write at once
    a block is acknowledged (its future completes) once it and every block before it are durable

Every record in a block shares the block's future: one Future per block, not per record, keeps the
per-record cost small. The future's result is the offset up to which the log is durable.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from enum import Enum
from typing import NamedTuple

from prometheus_client import Histogram
from prometheus_client.registry import Collector

from stratalog.errors import (
    CapacityMismatchError,
    CorruptHeaderError,
    OverCapacityError,
    RecordTooLargeError,
    WALClosedError,
    WALFailedError,
    WALStateError,
    WriteBufferFullError,
    release_frames,
)
from stratalog.invariant import invariant
from stratalog.io.block_io import BlockIO, CompletionWatch, open_block_io
from stratalog.io.device import Device, FileDevice, aligned_buffer
from stratalog.wal.config import FsyncPolicy, WALConfig
from stratalog.wal.format import (
    ALIGN_BYTES,
    FORMAT_VERSION,
    HEADER_SLOT_BYTES,
    HEADER_SLOTS,
    HEADERS_BYTES,
    RECORD_HEADER,
    RECORD_HEADER_BYTES,
    RECORD_HEADER_CRC_COVERS_BYTES,
    RECORD_MAGIC,
    TRIM_NONE,
    ShutdownType,
    WALHeader,
    align_up,
    crc32c,
    decode_header,
    encode_header,
    encode_pad,
    header_version,
    place_record,
)
from stratalog.wal.recovery import RecoveredRecord, RecoveryStats, read_header_slots, scan

log = logging.getLogger("stratalog.wal")

_ZEROS = bytes(ALIGN_BYTES)


class AppendResult(NamedTuple):
    """Where a record went and when it is durable.

    ``offset``: the record's logical offset (use it for trim). ``future``: completes with the offset up
    to which the log is durable once this record is; futures complete in offset order. On a write or
    sync error it raises WALFailedError instead.
    """

    offset: int
    future: Future[int]


class _State(Enum):
    NEEDS_RECOVERY = "needs recovery"
    RECOVERING = "recovering"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


#: From a page cache's tens of microseconds to a slow disk's or a busy machine's quarter second.
WAL_SECONDS_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class _Block:
    """A run of records written with one aligned write; the unit of I/O and of acknowledgement."""

    __slots__ = ("buf", "end", "future", "limit", "opened_at", "pad", "start", "submitted_at", "used", "written")

    def __init__(self, start: int, buf: mmap.mmap, limit: int) -> None:
        self.start = start
        self.buf = buf
        self.limit = limit  # bytes this block may hold: buffer size, ring end and capacity allowing
        self.used = 0
        self.end = start
        self.future: Future[int] = Future()
        self.opened_at = 0.0
        self.submitted_at = 0.0
        self.written = False
        self.pad = False


class WriteAheadLog:
    """A durable, ordered write-ahead log over a preallocated file or a raw block device.

    Open it, run :meth:`recover` to its end (it returns every record after the trim point and then
    positions the writer), then :meth:`append`, :meth:`trim` and finally :meth:`close`.
    """

    def __init__(self, device: Device, header: WALHeader, config: WALConfig, *, owns_device: bool) -> None:
        self._device = device
        self._config = config
        self._owns_device = owns_device
        self._capacity_bytes = header.capacity_bytes
        self._ring_bytes = header.ring_bytes
        self._trim_offset = header.trim_offset
        self._header_window_bytes = header.window_bytes_max
        self._recovered_window_bytes = header.window_bytes_max
        self._sequence = header.sequence
        self._last_shutdown = header.shutdown
        # Held across a header write and the state it records, so headers land in the order decided.
        self._header_lock = threading.RLock()
        self._lock = threading.Lock()
        self._sealer_wake = threading.Condition(self._lock)
        self._space_free = threading.Condition(self._lock)
        self._complete_lock = threading.Lock()
        self._sync_lock = threading.Lock()
        self._state = _State.NEEDS_RECOVERY
        self._fresh = False
        self._failure: WALFailedError | None = None
        self._current: _Block | None = None
        self._next_offset = 0
        self._pending: deque[_Block] = deque()
        self._unacked: deque[_Block] = deque()
        self._writing = 0
        self._buffered_bytes = 0
        # Aligned buffers kept for reuse, by size: mapping and faulting in fresh pages costs more than
        # the copy into them. Bounded by _pool_bytes_max: as much as may be buffered, so an appender that
        # runs ahead to buffered_bytes_max finds every buffer it needs when the writes catch up (at half
        # that, a flat-out run of 256 KiB records mapped a fresh buffer for more than a quarter of its
        # blocks).
        self._free_buffers: dict[int, list[mmap.mmap]] = {}
        self._pool_bytes = 0
        self._pool_bytes_max = config.buffered_bytes_max
        self._durable_offset = 0
        self._io: BlockIO | None = None
        self._threads: list[threading.Thread] = []
        self._stop_background = threading.Event()
        self.recovery_stats = RecoveryStats()
        #: For /metrics (registered by a broker that serves them): a block's write, its sync included,
        #: and a block's time from its first record to its acknowledgement (linger, queue, write, sync).
        self._write_seconds = Histogram("stratalog_wal_write_seconds", "Time of a WAL block's write and "
                                        "sync (submitted to written durably)", buckets=WAL_SECONDS_BUCKETS,
                                        registry=None)
        self._append_seconds = Histogram("stratalog_wal_append_seconds", "Time from a WAL block's first "
                                         "append to its acknowledgement (linger, queue, write, sync)",
                                         buckets=WAL_SECONDS_BUCKETS, registry=None)
        # Writes need a sync after them unless the device makes each write durable by itself.
        self._sync_after_write = config.fsync is FsyncPolicy.ALWAYS and not device.durable_writes

    # Opening ---------------------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str] | Device,
        capacity_bytes: int | None = None,
        create: bool = True,
        config: WALConfig | None = None,
    ) -> WriteAheadLog:
        """Open the log at ``path`` (a regular file, a block device, or a :class:`Device`).

        A missing file is created and preallocated to ``capacity_bytes`` when ``create`` is true. An
        existing log keeps the capacity in its header; a different ``capacity_bytes`` is an error, as is
        a file or device smaller than that capacity. Call :meth:`recover` before appending.
        """
        config = config or WALConfig()
        config.validate()
        if capacity_bytes is not None and (capacity_bytes % ALIGN_BYTES or capacity_bytes <= HEADERS_BYTES):
            raise ValueError(f"capacity_bytes must be a multiple of {ALIGN_BYTES} above {HEADERS_BYTES}")
        owns = not hasattr(path, "pwrite")
        if owns:
            fspath = os.fspath(path)  # type: ignore[arg-type]
            created = not os.path.exists(fspath)
            device: Device = FileDevice.open(
                fspath, size_bytes=capacity_bytes, create=create,
                sync_writes=config.fsync is FsyncPolicy.ALWAYS,
            )
        else:
            device = path  # type: ignore[assignment]
            created = False
        try:
            return cls._open_device(device, capacity_bytes, create, config, created, owns)
        except BaseException:
            if owns:
                device.close()
            raise

    @classmethod
    def _open_device(cls, device: Device, capacity_bytes: int | None, create: bool, config: WALConfig,
                     created: bool, owns: bool) -> WriteAheadLog:
        slots = read_header_slots(device)
        found = [h for h in map(decode_header, slots) if h is not None]
        if found:
            header = max(found, key=lambda h: h.sequence)
            if capacity_bytes is not None and capacity_bytes != header.capacity_bytes:
                raise CapacityMismatchError(
                    f"the WAL was made with capacity_bytes={header.capacity_bytes}, not {capacity_bytes}: "
                    "pass the original capacity (or None to take it from the header)"
                )
            if device.size_bytes < header.capacity_bytes:
                raise CapacityMismatchError(
                    f"the device holds {device.size_bytes} bytes but the WAL header says "
                    f"{header.capacity_bytes}: the file was truncated or this is another device"
                )
            config.validate(header.ring_bytes)
            return cls(device, header, config, owns_device=owns)
        newer = [v for v in map(header_version, slots) if v is not None and v > FORMAT_VERSION]
        if newer:
            raise CorruptHeaderError(
                f"this WAL has format version {max(newer)}; this stratalog reads version {FORMAT_VERSION}: "
                "upgrade stratalog"
            )
        if not (create and (created or not any(any(slot) for slot in slots))):
            raise CorruptHeaderError(
                "neither header slot holds a valid WAL header: this is not a stratalog WAL, or both "
                "headers are damaged; refusing to format it (move it aside to start a new log)"
            )
        capacity = capacity_bytes if capacity_bytes is not None else device.size_bytes
        capacity -= capacity % ALIGN_BYTES
        if capacity > device.size_bytes:
            raise CapacityMismatchError(
                f"capacity_bytes={capacity} is larger than the device ({device.size_bytes} bytes)"
            )
        header = WALHeader(0, capacity, TRIM_NONE, config.window_bytes_max, ShutdownType.UNCLEAN)
        config.validate(header.ring_bytes)
        if not created:
            # An existing device with blank headers may still hold an older log's records at the
            # offsets this log will use first: clear the ring so none can pass as ours.
            _zero_ring(device, capacity)
        wal = cls(device, header, config, owns_device=owns)
        wal._write_header(ShutdownType.UNCLEAN)
        wal._fresh = True
        wal._start_writer(0)
        return wal

    # Recovery --------------------------------------------------------------------------------------

    def recover(self) -> Iterator[RecoveredRecord]:
        """Yield every valid record after the trim offset, in offset order, then open for appends.

        Run it to its end: appends are refused until it has finished. It never yields a record that
        fails its CRC, one from an earlier lap of the ring, or one at or below the trim offset.
        ``recovery_stats`` tells what it saw.
        """
        if self._fresh:
            self._fresh = False
            return iter(())  # a log made by this open: nothing to recover
        if self._state is not _State.NEEDS_RECOVERY:
            raise WALStateError(f"recover() runs once, before any append (the log is {self._state.value})")
        self._state = _State.RECOVERING
        return self._recover()

    def _recover(self) -> Iterator[RecoveredRecord]:
        stats = self.recovery_stats
        yield from scan(
            self._device,
            ring_bytes=self._ring_bytes,
            trim_offset=self._trim_offset,
            window_bytes_max=self._header_window_bytes,
            read_bytes=self._config.recovery_read_bytes,
            stats=stats,
        )
        if stats.stale_end:
            self._erase(stats.valid_end, stats.stale_end)
        # Make what recovery saw durable before writing past it: after a kill -9 the records may sit
        # unsynced in the page cache, and new acknowledged records must never follow a hole.
        self._device.sync()
        self._write_header(ShutdownType.UNCLEAN)
        self._start_writer(stats.next_offset)

    def _erase(self, start: int, end: int) -> None:
        """Zero logical ``[start, end)`` on the device (made durable by the sync that follows).

        Recovery calls this for torn records past the last valid one: the new writer reuses their
        offsets, and a header left in place would make a later scan skip over the new records.
        """
        position = start
        while position < end:
            page = position - position % ALIGN_BYTES
            physical = HEADERS_BYTES + page % self._ring_bytes
            room = self._ring_bytes - page % self._ring_bytes  # never write across the ring's end
            length = min(align_up(end) - page, room, 1 << 20)
            buf = aligned_buffer(length)
            try:
                with memoryview(buf) as view:
                    if position > page:  # keep the bytes before ``start`` in its first page
                        self._device.pread_into(view[:ALIGN_BYTES], physical)
                        view[position - page:ALIGN_BYTES] = bytes(ALIGN_BYTES - (position - page))
                    self._device.pwrite(view, physical)
            finally:
                buf.close()
            self.recovery_stats.stale_bytes_erased += page + length - position
            position = page + length

    def _start_writer(self, next_offset: int) -> None:
        self._next_offset = next_offset
        self._durable_offset = next_offset
        self._io = open_block_io(self._device, self._config.io_threads, self._sync_after_write, self._block_done,
                                 "stratalog-wal-io", compiled=self._config.compiled_io)
        self._state = _State.OPEN
        sealer = threading.Thread(target=self._sealer_loop, name="stratalog-wal-sealer", daemon=True)
        sealer.start()
        self._threads.append(sealer)
        if self._config.fsync is FsyncPolicy.INTERVAL:
            syncer = threading.Thread(target=self._interval_sync_loop, name="stratalog-wal-sync", daemon=True)
            syncer.start()
            self._threads.append(syncer)

    # Appending -------------------------------------------------------------------------------------

    def append(self, data: bytes | bytearray | memoryview | Sequence[bytes | bytearray | memoryview], *,
               wait_s_max: float | None = None) -> AppendResult:
        """Add one record; return its offset and a future that completes once it is durable. ``data``: the
        record's body, or its parts in order (gathered into the write buffer: no joined copy first).
        ``wait_s_max``: how long to wait for room in the write buffer (default ``append_wait_s_max``).

        Raises OverCapacityError when the ring has no room left (trim, then retry) or when the write
        buffer stayed full for ``wait_s_max`` (WriteBufferFullError at once if that is 0);
        RecordTooLargeError above ``record_bytes_max``; WALFailedError after a write or sync error.
        """
        parts = (data,) if isinstance(data, (bytes, bytearray, memoryview)) else data
        views = [memoryview(part).cast("B") for part in parts]
        body_bytes = sum(map(len, views))
        if body_bytes > self._config.record_bytes_max:
            raise RecordTooLargeError(
                f"record of {body_bytes} bytes exceeds record_bytes_max={self._config.record_bytes_max}"
            )
        self._fresh = False
        size = RECORD_HEADER_BYTES + body_bytes
        with self._lock:
            block = self._current
            if block is None or block.used + size > block.limit:
                block = self._roll(size, self._config.append_wait_s_max if wait_s_max is None else wait_s_max)
            pos = block.used
            offset = block.start + pos
            # Header, body and both CRCs in one pass (a large body without the GIL: the I/O engine's
            # completions need it meanwhile).
            block.used = place_record(block.buf, pos, views, offset)
            if pos == 0:
                block.opened_at = time.monotonic()
            if block.used >= self._config.block_bytes_soft_max or (pos == 0 and self._device_idle()):
                self._seal(block)
            elif pos == 0:
                self._sealer_wake.notify()
            return AppendResult(offset, block.future)

    def _roll(self, size: int, wait_s_max: float) -> _Block:
        """Seal the current block and open one that can take a record of ``size`` bytes (lock held), waiting
        up to ``wait_s_max`` for room in the write buffer."""
        deadline = None
        while True:
            self._check_writable()
            current = self._current
            if current is not None and current.used + size <= current.limit:
                return current  # another appender opened a block while this one waited
            if current is not None:
                if current.used:
                    self._seal(current)
                else:
                    self._current = None
                    self._release_buffer(current)
            block_bytes = align_up(size)
            buffer_bytes = self._buffer_bytes(block_bytes)
            if self._has_room(buffer_bytes):
                break
            # Backpressure: the device is behind; wait for blocks to be acknowledged.
            if wait_s_max <= 0:
                raise WriteBufferFullError(
                    f"write buffer full ({self._buffered_bytes} bytes waiting for the device): the device is "
                    "slower than the appends")
            now = time.monotonic()
            deadline = deadline or now + wait_s_max
            if now >= deadline:
                raise OverCapacityError(
                    f"write buffer full ({self._buffered_bytes} bytes waiting for the device) for "
                    f"{wait_s_max} s: the device is slower than the appends"
                )
            self._space_free.wait(deadline - now)
        start = self._next_offset
        room = self._ring_bytes - start % self._ring_bytes
        if block_bytes > room:
            # The record would cross the ring's physical end: pad to it, start the next lap.
            self._check_room(start, ALIGN_BYTES)
            self._emit_pad(start, start + room)
            start += room
            room = self._ring_bytes
        self._check_room(start, block_bytes)
        buf = self._take_buffer(buffer_bytes)
        live_end = max(self._trim_offset, 0) + self._ring_bytes
        limit = min(buffer_bytes, room, live_end - start)
        block = _Block(start, buf, limit - limit % ALIGN_BYTES)
        self._buffered_bytes += buffer_bytes
        self._current = block
        return block

    def _buffer_bytes(self, block_bytes: int) -> int:
        """The buffer a new block takes when its first record needs ``block_bytes`` (aligned): room for
        more records after it, up to the size a block is sealed at."""
        return max(self._config.block_bytes_soft_max, block_bytes)

    def _has_room(self, buffer_bytes: int) -> bool:
        """Whether a block buffer of this size fits the write buffer now (lock held). A block larger than
        the whole bound (a record near ``record_bytes_max``) goes alone, once nothing else is buffered."""
        return self._buffered_bytes + buffer_bytes <= self._config.buffered_bytes_max or not self._buffered_bytes

    def wait_for_room(self, size_bytes: int, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` until a record of ``size_bytes`` would find room in the write buffer
        (or the log stopped); whether it would. For a caller that appended with ``wait_s_max=0`` and must
        not wait while holding a lock of its own."""
        buffer_bytes = self._buffer_bytes(align_up(RECORD_HEADER_BYTES + size_bytes))
        with self._lock:
            return self._space_free.wait_for(
                lambda: self._has_room(buffer_bytes) or self._failure is not None or self._state is not _State.OPEN,
                timeout_s)

    def _check_room(self, start: int, block_bytes: int) -> None:
        live_end = max(self._trim_offset, 0) + self._ring_bytes
        if start + block_bytes > live_end:
            raise OverCapacityError(
                f"the WAL ring is full: {start - max(self._trim_offset, 0)} of {self._ring_bytes} bytes "
                "hold untrimmed records; trim what has been uploaded, then retry"
            )

    def _emit_pad(self, start: int, ring_end: int) -> None:
        buf = aligned_buffer(ALIGN_BYTES)
        buf[:RECORD_HEADER_BYTES] = encode_pad(start, ring_end)
        pad = _Block(start, buf, ALIGN_BYTES)
        pad.used = RECORD_HEADER_BYTES
        pad.pad = True
        self._buffered_bytes += ALIGN_BYTES
        self._seal(pad, end=ring_end)

    def _seal(self, block: _Block, end: int | None = None) -> None:
        """Close ``block`` to further records and queue it for writing (lock held)."""
        block.end = end if end is not None else block.start + align_up(block.used)
        fill = align_up(block.used) - block.used
        if fill:  # a reused buffer holds an earlier block's bytes: never copy them to a new place
            block.buf[block.used:block.used + fill] = _ZEROS[:fill]
        self._next_offset = block.end
        if self._current is block:
            self._current = None
        self._pending.append(block)
        self._unacked.append(block)
        self._dispatch()

    def _device_idle(self) -> bool:
        """Whether a block sealed now would be written at once (lock held)."""
        return self._config.seal_when_idle and not self._pending and self._writing < self._config.io_threads

    def _dispatch(self) -> None:
        """Hand pending blocks to the I/O engine while the window allows (lock held). The engine queues
        what its threads cannot start yet, so a thread that finishes a block takes the next at once,
        without a round trip through this thread and the GIL (256 KiB blocks: 0.62-0.70x -> 0.82-0.85x
        of raw O_DIRECT writes in `bench wal`)."""
        window_max = self._config.window_bytes_max
        while self._pending:
            block = self._pending[0]
            oldest = self._unacked[0]
            if block is not oldest and block.end - oldest.start > window_max:
                return
            self._pending.popleft()
            self._writing += 1
            assert self._io is not None
            block.submitted_at = time.monotonic()
            self._io.submit(block.buf, _length(block), HEADERS_BYTES + block.start % self._ring_bytes, block)

    # I/O threads -----------------------------------------------------------------------------------

    def _block_done(self, token: object, error: BaseException | None) -> None:
        """The I/O engine's word on a block: written (and synced when asked), or the error that stops the log."""
        assert isinstance(token, _Block)
        block = token
        if error is not None:
            self._fail(error, f"writing {_length(block)} bytes at logical offset {block.start}", writer=True)
            return
        self._write_seconds.observe(time.monotonic() - block.submitted_at)
        try:
            with self._lock:
                block.written = True
                self._writing -= 1
                self._dispatch()
                current = self._current
                if current is not None and current.used and self._device_idle():
                    self._seal(current)  # records that gathered while every thread was busy
                ready = bool(self._unacked) and self._unacked[0].written
            if ready:
                self._complete_in_order()
        except BaseException as e:
            # The executor would swallow this and leave every later future pending: stop instead.
            self._fail(e, f"completing the block at logical offset {block.start}")
            raise

    def _sync(self) -> None:
        # Serialized, and never retried: once one sync fails, a later one may report success for data
        # the kernel already dropped (fsyncgate), so nothing may be acknowledged after a failure.
        with self._sync_lock:
            if self._failure is not None:
                raise self._failure
            try:
                self._device.sync()
            except BaseException as e:
                # Recorded before the lock is released, so no other thread's sync can succeed in between.
                self._fail(e, "syncing the device")
                raise

    def _complete_in_order(self) -> None:
        with self._complete_lock:
            while True:
                with self._lock:
                    if self._failure is not None or not self._unacked or not self._unacked[0].written:
                        return
                    block = self._unacked.popleft()
                    invariant(block.start >= self._durable_offset, "blocks acknowledged out of order")
                    self._durable_offset = block.end
                    self._release_buffer(block)
                    self._dispatch()
                    self._space_free.notify_all()
                self._append_seconds.observe(time.monotonic() - block.opened_at)
                block.future.set_result(block.end)

    def collectors(self) -> list[Collector]:
        """The WAL's timings, for a broker's /metrics."""
        return [self._write_seconds, self._append_seconds]

    def _release_buffer(self, block: _Block) -> None:
        size = len(block.buf)
        self._buffered_bytes -= size
        if block.pad or self._pool_bytes + size > self._pool_bytes_max:
            block.buf.close()
            return
        self._free_buffers.setdefault(size, []).append(block.buf)
        self._pool_bytes += size

    def _take_buffer(self, size: int) -> mmap.mmap:
        free = self._free_buffers.get(size)
        if free:
            self._pool_bytes -= size
            return free.pop()
        if self._pool_bytes + size > self._pool_bytes_max:
            # Record sizes changed: drop buffers of other sizes rather than hold them forever.
            for buffers in self._free_buffers.values():
                for buf in buffers:
                    buf.close()
            self._free_buffers.clear()
            self._pool_bytes = 0
        return aligned_buffer(size)

    def _fail(self, error: BaseException, what: str, writer: bool = False) -> None:
        """Stop the log: fail every unacknowledged append and refuse new ones (fail-stop)."""
        with self._lock:
            first = self._failure is None
            if first:
                self._failure = WALFailedError(
                    f"the WAL stopped after an I/O error while {what}: {error}. Nothing after it is "
                    "acknowledged; reopen the log to recover what is durable"
                )
                self._failure.__cause__ = error
            failed = list(self._unacked)
            self._unacked.clear()
            self._pending.clear()
            if self._current is not None and self._current.used:
                failed.append(self._current)
            self._current = None
            if writer:
                self._writing -= 1
            self._space_free.notify_all()
            self._sealer_wake.notify_all()
        if first:
            log.error("%s", str(self._failure))
        with self._complete_lock:
            for block in failed:
                if not block.future.done():
                    block.future.set_exception(self._failure)

    def _check_writable(self) -> None:
        if self._failure is not None:
            raise self._failure
        if self._state is not _State.OPEN:
            if self._state in (_State.CLOSING, _State.CLOSED):
                raise WALClosedError("the WAL is closed")
            raise WALStateError("run recover() to its end before appending")

    # Background threads ----------------------------------------------------------------------------

    def _sealer_loop(self) -> None:
        """Seal the current block once its first record has waited ``block_linger_s``."""
        linger_s = self._config.block_linger_s
        with self._lock:
            while self._state is _State.OPEN and self._failure is None:
                block = self._current
                if block is None or not block.used:
                    self._sealer_wake.wait()
                    continue
                wait_s = block.opened_at + linger_s - time.monotonic()
                if wait_s > 0:
                    self._sealer_wake.wait(wait_s)
                    continue
                self._seal(block)

    def _interval_sync_loop(self) -> None:
        while not self._stop_background.wait(self._config.fsync_interval_s):
            try:
                self._sync()
            except BaseException as e:
                self._fail(e, "the periodic sync")
                return

    # Trim, header, close ---------------------------------------------------------------------------

    def trim(self, offset: int) -> None:
        """Let records at offsets <= ``offset`` be overwritten; recovery no longer returns them.

        Durable when it returns (the header is written and synced). ``offset`` must be the offset of a
        durable record (one whose future completed); recovery starts its scan there, so any other
        offset is refused. Trimming backwards is a no-op.
        """
        with self._header_lock:
            with self._lock:
                self._check_writable()
                if offset <= self._trim_offset:
                    return
                if offset >= self._durable_offset:
                    raise ValueError(
                        f"cannot trim to {offset}: only durable records can be trimmed "
                        f"(durable below {self._durable_offset}); wait for the append's future"
                    )
            self._check_record_at(offset)
            # The new trim must be durable before the space it frees is reused.
            self._write_header(ShutdownType.UNCLEAN, trim_offset=offset)
            with self._lock:
                self._trim_offset = offset

    def _check_record_at(self, offset: int) -> None:
        """Raise ValueError unless a valid record header lies at logical ``offset`` on the device."""
        page = offset - offset % ALIGN_BYTES
        room = self._ring_bytes - page % self._ring_bytes
        buf = aligned_buffer(2 * ALIGN_BYTES)
        try:
            with memoryview(buf) as view:
                self._device.pread_into(view[:min(len(buf), room)], HEADERS_BYTES + page % self._ring_bytes)
            at = offset - page
            magic, _, stored, _, header_crc = RECORD_HEADER.unpack_from(buf, at)
            valid = magic == RECORD_MAGIC and stored == offset and header_crc == crc32c(
                buf[at:at + RECORD_HEADER_CRC_COVERS_BYTES])
        finally:
            buf.close()
        if not valid:
            raise ValueError(f"cannot trim to {offset}: no record starts there (pass an offset from append)")

    def _write_header(self, shutdown: ShutdownType, trim_offset: int | None = None) -> None:
        with self._header_lock:
            trim = self._trim_offset if trim_offset is None else trim_offset
            sequence = self._sequence + 1
            # Never a window below the one this log was recovered with: the records it recovered may lie
            # past holes that only that window bridges, and the next recovery scans with the window
            # written here. Writing a smaller config's window lost them, and every record appended
            # after them, acknowledged ones too (found by fuzzing: a header window of 6.9 MB, records
            # after 24 KiB of holes, a config window of 16 KiB).
            window = max(self._config.window_bytes_max, self._recovered_window_bytes)
            header = WALHeader(sequence, self._capacity_bytes, trim, window, shutdown)
            buf = aligned_buffer(HEADER_SLOT_BYTES)
            buf[:] = encode_header(header)
            try:
                self._device.pwrite(buf, (sequence % HEADER_SLOTS) * HEADER_SLOT_BYTES)
                if not self._device.durable_writes:
                    self._sync()
            except WALFailedError:
                raise
            except BaseException as e:
                self._fail(e, "writing the WAL header")
                assert self._failure is not None
                raise self._failure from e
            finally:
                buf.close()
            self._sequence = sequence
            self._header_window_bytes = header.window_bytes_max

    def watch_completions(self, backstop_s: float) -> CompletionWatch | None:
        """Let the calling thread complete the appends: an event loop that watches the returned file
        descriptor and calls its ``reap()`` completes each append in its own thread, with no thread woken
        and no GIL handed over between the write and the loop (the I/O threads' reaper still takes what
        waits ``backstop_s``). None with Python I/O threads, which complete appends themselves. Release
        the watch before :meth:`close`."""
        with self._lock:
            io = self._io
        return io.watch(backstop_s) if io is not None else None

    def close(self) -> None:
        """Write out and acknowledge everything appended, mark a graceful shutdown, release the device."""
        with self._lock:
            if self._state in (_State.CLOSING, _State.CLOSED):
                return
            was_open = self._state is _State.OPEN
            self._state = _State.CLOSING
            if self._current is not None and self._current.used and self._failure is None:
                self._seal(self._current)
            futures = [b.future for b in self._unacked]
            self._sealer_wake.notify_all()
            self._space_free.notify_all()   # a wait_for_room ends: no room will come
        for future in futures:
            future.exception()  # wait; a failure is already recorded in self._failure
        self._stop_background.set()
        for thread in self._threads:
            thread.join()
        if self._io is not None:
            self._io.close()
            self._io = None  # it holds this log's completion: no cycle left to keep the log alive
        try:
            if was_open and self._failure is None:
                self._write_header(ShutdownType.GRACEFUL)
        finally:
            with self._lock:
                self._state = _State.CLOSED
                for buffers in self._free_buffers.values():
                    for buf in buffers:
                        with contextlib.suppress(BufferError):  # a caller still holds a view: unmapped with it
                            buf.close()
                self._free_buffers.clear()
                self._pool_bytes = 0
            release_frames(self._failure)
            if self._owns_device:
                self._device.close()

    def __enter__(self) -> WriteAheadLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Introspection ---------------------------------------------------------------------------------

    @property
    def capacity_bytes(self) -> int:
        return self._capacity_bytes

    @property
    def trim_offset(self) -> int:
        """Records at or below this offset are gone (-1: nothing trimmed yet)."""
        return self._trim_offset

    @property
    def durable_offset(self) -> int:
        """Every record below this offset is acknowledged."""
        return self._durable_offset

    @property
    def failure(self) -> WALFailedError | None:
        return self._failure

    @property
    def last_shutdown(self) -> ShutdownType:
        """How the previous writer stopped, from the header found at open."""
        return self._last_shutdown

    @property
    def device(self) -> Device:
        return self._device


def _length(block: _Block) -> int:
    """The bytes a block's write covers: its records to a 4 KiB boundary, or the one page of a pad."""
    return ALIGN_BYTES if block.pad else block.end - block.start


def _zero_ring(device: Device, capacity_bytes: int) -> None:
    chunk = aligned_buffer(min(4 << 20, capacity_bytes - HEADERS_BYTES))
    try:
        position = HEADERS_BYTES
        while position < capacity_bytes:
            n = min(len(chunk), capacity_bytes - position)
            with memoryview(chunk) as view:
                device.pwrite(view[:n], position)
            position += n
        if not device.durable_writes:
            device.sync()
    finally:
        chunk.close()
