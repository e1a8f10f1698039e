"""The object WAL: a write-ahead log kept in object storage, so that it outlives the machine that wrote it.

Write path::

    append(data) -> record added to the open batch -> AppendResult(offset, future)
    the batch is sealed after linger_s (once the window has room), or when it holds object_bytes_soft_max
    sealed batches -> put, each as one object wal/<owner>/<first offset>, at most puts_in_flight_max of
        them put or being put and not yet acknowledged (the window)
    a batch is acknowledged (its future completes) once its object and every earlier one are put

Offsets are record numbers. Every record in a batch shares the batch's future, whose result is the
offset up to which the log is durable. A put that still fails after ``put_attempts_max`` tries and
``put_retry_s_min`` seconds stops the log: every unacknowledged future fails with WALFailedError, and so
does every later call (as the device WAL does).

Another process can open the same owner's prefix once the owner is dead and read every acknowledged
record (:meth:`ObjectWAL.recover`, or :func:`read_records`, which changes nothing). Nothing stops two live
writers on one prefix yet: fencing belongs to the metadata database (docs/formats/object-wal.md).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from enum import Enum

from stratalog.errors import (
    OverCapacityError,
    RecordTooLargeError,
    RecoveryReadError,
    WALClosedError,
    WALFailedError,
    WALStateError,
    WriteBufferFullError,
    release_frames,
)
from stratalog.invariant import invariant
from stratalog.objects.store import ObjectStore, ObjectStoreError
from stratalog.wal.config import ObjectWALConfig
from stratalog.wal.format import RECORD_HEADER_BYTES, crc32c
from stratalog.wal.log import AppendResult
from stratalog.wal.object_format import (
    DAMAGED_DIR,
    TRIM_KEY,
    encode_record_header,
    encode_trim_marker,
    join_object,
    object_key,
    offset_of_key,
    owner_prefix,
)
from stratalog.wal.object_recovery import (
    Cleanup,
    LiveObject,
    ObjectReader,
    ObjectRecoveryStats,
    scan_objects,
    with_retries,
)
from stratalog.wal.recovery import RecoveredRecord

log = logging.getLogger("stratalog.wal.objects")

Data = bytes | bytearray | memoryview


class _State(Enum):
    NEEDS_RECOVERY = "needs recovery"
    RECOVERING = "recovering"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


class _Batch:
    """Records put as one object; the unit of I/O and of acknowledgement."""

    __slots__ = ("end", "first", "future", "opened_at", "parts", "put_done", "size_bytes")

    def __init__(self, first: int, opened_at: float) -> None:
        self.first = first
        self.end = first
        self.parts: list[bytes | memoryview] = []
        self.size_bytes = 0
        self.future: Future[int] = Future()
        self.opened_at = opened_at
        self.put_done = False


class ObjectWAL:
    """A durable, ordered write-ahead log in one owner's prefix of an object store.

    Open it, run :meth:`recover` to its end, then :meth:`append`, :meth:`trim` and :meth:`close`. The
    caller keeps the object store and closes it after the log.
    """

    def __init__(self, store: ObjectStore, owner: str, config: ObjectWALConfig) -> None:
        self._store = store
        self._owner = owner
        self._prefix = owner_prefix(owner)
        self._config = config
        self._lock = threading.Lock()
        self._sealer_wake = threading.Condition(self._lock)
        self._space_free = threading.Condition(self._lock)
        self._complete_lock = threading.Lock()
        self._trim_lock = threading.Lock()
        self._state = _State.NEEDS_RECOVERY
        self._fresh = False
        self._failure: WALFailedError | None = None
        self._current: _Batch | None = None
        self._pending: deque[_Batch] = deque()
        self._unacked: deque[_Batch] = deque()
        self._live: deque[LiveObject] = deque()
        self._buffered_bytes = 0
        self._next_offset = 0
        self._durable_offset = 0
        self._trim_offset = -1
        self._puts: ThreadPoolExecutor | None = None
        self._deletes: ThreadPoolExecutor | None = None
        self._sealer: threading.Thread | None = None
        self.recovery_stats = ObjectRecoveryStats()

    # Opening and recovery ---------------------------------------------------------------------------

    @classmethod
    def open(cls, store: ObjectStore, owner: str, config: ObjectWALConfig | None = None) -> ObjectWAL:
        """The log of ``owner`` (a name of 1-64 letters, digits, '.', '_', '-') in ``store``, under
        ``wal/<owner>/``. A prefix with nothing in it starts a new log; call :meth:`recover` either way."""
        config = config or ObjectWALConfig()
        config.validate()
        wal = cls(store, owner, config)
        keys = ObjectReader(store, config, wal.recovery_stats).list(wal._prefix)
        if not any(key == wal._prefix + TRIM_KEY or offset_of_key(wal._prefix, key) is not None for key in keys):
            wal._fresh = True
            wal.recovery_stats.finished = True
            wal._start_writer(0, [])
        return wal

    def recover(self) -> Iterator[RecoveredRecord]:
        """Yield every acknowledged record after the trim point, in offset order, then open for appends.

        Run it to its end: appends are refused until it has finished. It never yields a record that fails
        a CRC. It raises :class:`~stratalog.wal.object_recovery.LostRecordsError` (changing nothing) when
        the objects show that an acknowledged record is missing or damaged. ``recovery_stats`` tells what
        it saw.
        """
        if self._fresh:
            self._fresh = False
            return iter(())
        if self._state is not _State.NEEDS_RECOVERY:
            raise WALStateError(f"recover() runs once, before any append (the log is {self._state.value})")
        self._state = _State.RECOVERING
        return self._recover()

    def _recover(self) -> Iterator[RecoveredRecord]:
        cleanup = Cleanup()
        yield from scan_objects(self._store, self._prefix, self._config, self.recovery_stats, cleanup)
        # Before the first put: new objects reuse the offsets of the ones removed here, and a stale object
        # left in place would overlap them at the next recovery.
        if self._state is not _State.RECOVERING:
            return  # closed while recovering: change nothing, start nothing
        for key in cleanup.move_aside:
            aside = f"{self._prefix}{DAMAGED_DIR}/{key[len(self._prefix):]}-{time.time_ns()}"
            self._change(f"moving damaged WAL object {key} aside", functools.partial(self._store.rename, key, aside))
        for key in cleanup.delete:
            self._change(f"deleting WAL object {key}", functools.partial(self._store.delete, key))
        self._trim_offset = self.recovery_stats.trim_offset
        self._start_writer(self.recovery_stats.next_offset, cleanup.live)

    def _change(self, what: str, step: Callable[[], object]) -> None:
        try:
            with_retries(what, step, self._config.read_attempts_max, self._config.put_backoff_s)
        except ObjectStoreError as e:
            raise RecoveryReadError(f"{what} failed ({e}); recovery stopped before any new object was put: "
                                    "reopen to try again") from e

    def _start_writer(self, next_offset: int, live: list[LiveObject]) -> None:
        self._next_offset = self._durable_offset = next_offset
        self._live.extend(live)
        self._puts = ThreadPoolExecutor(self._config.puts_in_flight_max, thread_name_prefix="stratalog-owal-put")
        self._deletes = ThreadPoolExecutor(1, thread_name_prefix="stratalog-owal-delete")
        self._state = _State.OPEN
        self._sealer = threading.Thread(target=self._sealer_loop, name="stratalog-owal-sealer", daemon=True)
        self._sealer.start()

    # Appending -----------------------------------------------------------------------------------------

    def append(self, data: Data | Sequence[Data], *, wait_s_max: float | None = None) -> AppendResult:
        """Add one record; return its offset and a future that completes once its object is put (and every
        earlier one). ``data``: the record's body, or its parts in order. ``wait_s_max``: how long to wait
        for room under ``buffered_bytes_max`` (default ``append_wait_s_max``).

        Raises RecordTooLargeError above ``record_bytes_max``; OverCapacityError when appended bytes stayed
        above ``buffered_bytes_max`` for ``wait_s_max`` (WriteBufferFullError at once if that is 0);
        WALFailedError after a put failed.
        """
        parts = (data,) if isinstance(data, (bytes, bytearray, memoryview)) else data
        if len(parts) == 1 and isinstance(parts[0], bytes):
            body = parts[0]  # immutable: kept as it is until its object is put
        else:
            body = b"".join(memoryview(part).cast("B") for part in parts)
        if len(body) > self._config.record_bytes_max:
            raise RecordTooLargeError(
                f"record of {len(body)} bytes exceeds record_bytes_max={self._config.record_bytes_max}")
        body_crc = crc32c(body)
        size = RECORD_HEADER_BYTES + len(body)
        self._fresh = False
        with self._lock:
            self._wait_for_room(size, self._config.append_wait_s_max if wait_s_max is None else wait_s_max)
            batch = self._current
            if batch is not None and batch.size_bytes and batch.size_bytes + size > self._config.object_bytes_soft_max:
                self._seal(batch)
                batch = None
            if batch is None:
                batch = self._current = _Batch(self._next_offset, time.monotonic())
                self._sealer_wake.notify_all()
            offset = self._next_offset
            self._next_offset += 1
            batch.parts.append(encode_record_header(offset, len(body), body_crc))
            batch.parts.append(body)
            batch.size_bytes += size
            batch.end = self._next_offset
            self._buffered_bytes += size
            if batch.size_bytes >= self._config.object_bytes_soft_max:
                self._seal(batch)
            return AppendResult(offset, batch.future)

    def _wait_for_room(self, size: int, wait_s_max: float) -> None:
        """Wait (lock held) until the record fits under ``buffered_bytes_max``; raise when it cannot."""
        deadline: float | None = None
        while True:
            self._check_writable()
            if self._buffered_bytes + size <= self._config.buffered_bytes_max:
                return
            if wait_s_max <= 0:
                raise WriteBufferFullError(
                    f"{self._buffered_bytes} bytes appended to the object WAL wait for their puts "
                    f"(buffered_bytes_max={self._config.buffered_bytes_max}): the object store is too slow")
            now = time.monotonic()
            deadline = deadline or now + wait_s_max
            if now >= deadline:
                raise OverCapacityError(
                    f"{self._buffered_bytes} bytes appended to the object WAL wait for their puts "
                    f"(buffered_bytes_max={self._config.buffered_bytes_max}): the object store is too slow")
            self._space_free.wait(deadline - now)

    def wait_for_room(self, size_bytes: int, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` until a record of ``size_bytes`` would fit under ``buffered_bytes_max``
        (or the log stopped); whether it would (see WriteAheadLog.wait_for_room)."""
        size = RECORD_HEADER_BYTES + size_bytes
        with self._lock:
            return self._space_free.wait_for(
                lambda: self._buffered_bytes + size <= self._config.buffered_bytes_max or self._failure is not None
                or self._state is not _State.OPEN,
                timeout_s)

    def _seal(self, batch: _Batch) -> None:
        """Close ``batch`` to further records and queue its put (lock held)."""
        if self._current is batch:
            self._current = None
        self._pending.append(batch)
        self._unacked.append(batch)
        self._dispatch()

    def _window_full(self) -> bool:
        """Whether ``puts_in_flight_max`` batches are put or being put and not yet acknowledged (lock held).

        Counted from the oldest unacknowledged batch, not as puts under way: once later puts finish while
        an earlier one is slow, starting more would let objects land any distance past the one missing at
        a crash, and recovery could no longer tell that gap from a lost acknowledged object (found by the
        random crash tests: 22 objects past a slow put with 5 in flight)."""
        return len(self._unacked) - len(self._pending) >= self._config.puts_in_flight_max

    def _dispatch(self) -> None:
        """Start puts of sealed batches while the window allows (lock held)."""
        while self._pending and not self._window_full():
            batch = self._pending.popleft()
            assert self._puts is not None
            self._puts.submit(self._put, batch)

    # Put threads -----------------------------------------------------------------------------------------

    def _put(self, batch: _Batch) -> None:
        key = object_key(self._prefix, batch.first)
        try:
            data = join_object(batch.first, batch.end - batch.first, batch.parts, self._config.puts_in_flight_max)
            config = self._config

            def put_unless_stopped() -> bool:
                if self._failure is not None:
                    return False  # the log stopped meanwhile: this batch's future has failed already
                self._store.put(key, data)
                return True

            if not with_retries(f"putting WAL object {key}", put_unless_stopped, config.put_attempts_max,
                                config.put_backoff_s, config.put_retry_s_min, config.put_backoff_s_max):
                return
        except BaseException as e:
            self._fail(e, f"putting WAL object {key} ({self._config.put_attempts_max} tries and "
                          f"{self._config.put_retry_s_min:g} s at least)")
            return
        try:
            with self._lock:
                batch.put_done = True
                ready = bool(self._unacked) and self._unacked[0].put_done
            if ready:
                self._complete_in_order()
        except BaseException as e:
            # The executor would swallow this and leave every later future pending: stop instead.
            self._fail(e, f"completing WAL object {key}")
            raise

    def _complete_in_order(self) -> None:
        with self._complete_lock:
            while True:
                with self._lock:
                    if self._failure is not None or not self._unacked or not self._unacked[0].put_done:
                        return
                    batch = self._unacked.popleft()
                    invariant(batch.first == self._durable_offset, "objects acknowledged out of order")
                    self._durable_offset = batch.end
                    self._buffered_bytes -= batch.size_bytes
                    batch.parts = []
                    self._live.append(LiveObject(batch.first, batch.end, object_key(self._prefix, batch.first)))
                    self._dispatch()
                    self._space_free.notify_all()
                    self._sealer_wake.notify_all()  # the window moved: a batch left open may be sealed
                batch.future.set_result(batch.end)

    def _fail(self, error: BaseException, what: str) -> None:
        """Stop the log: fail every unacknowledged append and refuse new ones (fail-stop)."""
        with self._lock:
            first = self._failure is None
            if first:
                self._failure = WALFailedError(
                    f"the object WAL stopped after an error while {what}: {error}. Nothing after it is "
                    "acknowledged; reopen the log to recover what is durable")
                self._failure.__cause__ = error
            failed = list(self._unacked)
            self._unacked.clear()
            self._pending.clear()
            if self._current is not None:
                failed.append(self._current)
            self._current = None
            self._space_free.notify_all()
            self._sealer_wake.notify_all()
        if first:
            log.error("%s", str(self._failure))
        with self._complete_lock:
            for batch in failed:
                if not batch.future.done():
                    batch.future.set_exception(self._failure)

    def _check_writable(self) -> None:
        if self._failure is not None:
            raise self._failure
        if self._state is not _State.OPEN:
            if self._state in (_State.CLOSING, _State.CLOSED):
                raise WALClosedError("the WAL is closed")
            raise WALStateError("run recover() to its end before appending")

    def _sealer_loop(self) -> None:
        """Seal the open batch once its first record has waited ``linger_s`` and the window has room.

        While the window is full the batch stays open and keeps gathering records (up to its size bound),
        so a slow store gets fewer, larger puts rather than a queue of small ones."""
        linger_s = self._config.linger_s
        with self._lock:
            while self._state is _State.OPEN and self._failure is None:
                batch = self._current
                if batch is None:
                    self._sealer_wake.wait()
                    continue
                wait_s = batch.opened_at + linger_s - time.monotonic()
                if wait_s > 0:
                    self._sealer_wake.wait(wait_s)
                    continue
                if self._pending or self._window_full():
                    self._sealer_wake.wait()  # woken when the window moves
                    continue
                self._seal(batch)

    # Trim and close ------------------------------------------------------------------------------------

    def trim(self, offset: int) -> None:
        """Drop records at offsets <= ``offset``; recovery no longer returns them. Durable when it returns
        (the trim marker is put); objects wholly at or below it are deleted in the background.

        ``offset`` must be below :attr:`durable_offset`. Trimming backwards is a no-op. A failed marker put
        stops the log (WALFailedError).
        """
        with self._trim_lock:
            with self._lock:
                self._check_writable()
                if offset <= self._trim_offset:
                    return
                if offset >= self._durable_offset:
                    raise ValueError(f"cannot trim to {offset}: only durable records can be trimmed (durable below "
                                     f"{self._durable_offset}); wait for the append's future")
            key = self._prefix + TRIM_KEY
            marker = encode_trim_marker(offset)
            try:
                config = self._config
                with_retries(f"putting the WAL trim marker {key}", lambda: self._store.put(key, marker),
                             config.put_attempts_max, config.put_backoff_s, config.put_retry_s_min,
                             config.put_backoff_s_max)
            except BaseException as e:
                self._fail(e, f"putting the trim marker {key}")
                assert self._failure is not None
                raise self._failure from e
            with self._lock:
                self._trim_offset = offset
                doomed = []
                while self._live and self._live[0].end_offset - 1 <= offset:
                    doomed.append(self._live.popleft().key)
            if doomed:
                assert self._deletes is not None
                self._deletes.submit(self._delete, doomed)

    def _delete(self, keys: list[str]) -> None:
        # Best effort: an object left at or below the trim is never returned, and recovery deletes it.
        for key in keys:
            try:
                with_retries(f"deleting trimmed WAL object {key}", functools.partial(self._store.delete, key),
                             self._config.read_attempts_max, self._config.put_backoff_s)
            except ObjectStoreError as e:
                log.warning("deleting trimmed WAL object %s failed; recovery will delete it: %s", key, str(e))

    def watch_completions(self, backstop_s: float) -> None:
        """None: the uploader's threads complete the appends themselves."""
        return None

    def close(self) -> None:
        """Put and acknowledge everything appended, finish the trim's deletes, stop the threads. The object
        store stays open: it belongs to the caller."""
        with self._lock:
            if self._state in (_State.CLOSING, _State.CLOSED):
                return
            self._state = _State.CLOSING
            if self._current is not None and self._failure is None:
                self._seal(self._current)
            futures = [b.future for b in self._unacked]
            self._sealer_wake.notify_all()
            self._space_free.notify_all()   # a wait_for_room ends: no room will come
        for future in futures:
            future.exception()  # wait; a failure is already recorded in self._failure
        if self._sealer is not None:
            self._sealer.join()
        with self._trim_lock:  # a trim under way hands its deletes over before the pool stops
            for pool in (self._puts, self._deletes):
                if pool is not None:
                    pool.shutdown(wait=True)
        with self._lock:
            self._state = _State.CLOSED
        release_frames(self._failure)

    def __enter__(self) -> ObjectWAL:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Introspection ---------------------------------------------------------------------------------------

    @property
    def owner(self) -> str:
        return self._owner

    @property
    def prefix(self) -> str:
        """The owner's prefix in the object store, ``wal/<owner>/``."""
        return self._prefix

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
    def config(self) -> ObjectWALConfig:
        return self._config


def read_records(store: ObjectStore, owner: str, config: ObjectWALConfig | None = None,
                 stats: ObjectRecoveryStats | None = None) -> Iterator[RecoveredRecord]:
    """The records after ``owner``'s trim point, as :meth:`ObjectWAL.recover` returns them, changing nothing
    in the store: what another broker reads to replay a dead owner's records before it takes over."""
    config = config or ObjectWALConfig()
    config.validate()
    yield from scan_objects(store, owner_prefix(owner), config, stats or ObjectRecoveryStats(), Cleanup())
