"""Appends: a batch gets the stream's next offsets under the store lock, goes to the WAL and the log cache,
and its future completes with its base offset once the WAL says it is durable.

An append never waits inside the WAL: with the WAL's write buffer full or its ring full, or the log
cache at its bound, it waits on the store's condition (or the WAL's room) with the lock let go, up to
``append_wait_s_max``, then raises BackpressureError.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from stratalog.engine.batch import encode_batch, wrap_kafka_batch
from stratalog.engine.core import StoreCore
from stratalog.engine.errors import BackpressureError, StoreFailedError, StoreFullError
from stratalog.engine.log_cache import LogEntry, StreamState
from stratalog.errors import OverCapacityError, RecordTooLargeError, WALFailedError, WriteBufferFullError
from stratalog.records import NewRecord


class Appends:
    """The store's append path (see the module's docstring)."""

    def __init__(self, core: StoreCore) -> None:
        self._core = core

    def append(self, st: StreamState, records: Sequence[bytes | NewRecord]) -> Future[int]:
        if not records:
            raise ValueError("append needs at least one record")
        return self._append_encoded(st, len(records), lambda base: encode_batch(st.stream_id, base, records))

    def append_kafka(self, st: StreamState, kafka_batch: bytes | memoryview, count: int,
                     max_timestamp_ms: int, wait_s_max: float | None = None) -> Future[int]:
        if count < 1:
            raise ValueError("a Kafka batch holds at least one record")
        return self._append_encoded(st, count, lambda base: (
            wrap_kafka_batch(st.stream_id, base, count, max_timestamp_ms, kafka_batch), max_timestamp_ms),
            wait_s_max)

    def _append_encoded(self, st: StreamState, count: int, encode: Callable[[int], tuple[bytes, int]],
                        wait_s_max: float | None = None) -> Future[int]:
        """Append the batch ``encode(base_offset)`` returns (its bytes and max timestamp) of ``count``
        records; the base offset is the stream's next, given under the store lock."""
        core = self._core
        config = core.config
        if core.space.refusal is not None and core.space.recheck() is not None:
            raise StoreFullError(f"appends refused: {core.space.refusal}")
        wait_s = config.append_wait_s_max if wait_s_max is None else wait_s_max
        deadline: float | None = None
        with core.cond:
            while True:
                core.check_open()
                behind_bytes = 0   # > 0: the WAL's write buffer is full (its device or store is behind)
                if core.cache.size_bytes < config.log_cache_bytes_max and not st.fenced:
                    data, max_ts = encode(st.next_offset)
                    if len(data) > config.wal.record_bytes_max:
                        raise RecordTooLargeError(
                            f"a batch of {len(data)} bytes exceeds wal.record_bytes_max={config.wal.record_bytes_max}:"
                            " append fewer or smaller records at a time"
                        )
                    try:
                        # Never waits under the store's lock (nor on a broker's event loop): below if at all.
                        res = core.wal.append(data, wait_s_max=0)
                        break
                    except WriteBufferFullError:
                        behind_bytes = len(data)
                    except OverCapacityError:
                        pass  # the ring is full until the uploader trims it: wait below
                    except WALFailedError as e:
                        core.stop_locked(e)  # the WAL logged it
                        raise StoreFailedError(f"the store stopped after an error: {e}") from e
                deadline = deadline or time.monotonic() + wait_s
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise self._backpressure(st, wait_s, behind_bytes)
                if behind_bytes:
                    self._wait_for_wal_room(behind_bytes, remaining)
                    continue
                core.upload_wanted = True
                core.cond.notify_all()
                core.cond.wait(remaining)
            entry = LogEntry(st.next_offset, count, data, max_ts, res.offset, time.monotonic())
            st.next_offset += count
            if core.cache.add(st, entry):
                core.cond.notify_all()  # the uploader sleeps without an upload deadline while nothing is cached
            core.last_wal_future = res.future
            if core.cache.size_bytes >= config.upload_bytes_threshold:
                core.cond.notify_all()
        done: Future[int] = Future()
        res.future.add_done_callback(lambda wal_future: _on_durable(st, entry, done, wal_future))
        return done

    def _backpressure(self, st: StreamState, wait_s: float, wal_behind_bytes: int) -> BackpressureError:
        """Why an append found no room for ``wait_s`` (lock held)."""
        if wal_behind_bytes:
            return BackpressureError(f"appends waited {wait_s} s for room in the WAL's write buffer: its device "
                                     "(or object store) is slower than the appends")
        if st.fenced:
            return BackpressureError(f"appends to stream {st.stream_id} waited {wait_s} s for a commit of "
                                     "external objects (a Spark write) to place its records")
        return BackpressureError(
            f"appends waited {wait_s} s for uploads to free room "
            f"({self._core.cache.size_bytes} bytes not yet in objects): object storage is too slow or failing")

    def _wait_for_wal_room(self, size_bytes: int, timeout_s: float) -> None:
        """Wait for the WAL's write buffer with the store's lock let go (held on entry and on return): reads,
        uploads and the WAL's completions go on meanwhile."""
        cond = self._core.cond
        cond.release()
        try:
            self._core.wal.wait_for_room(size_bytes, timeout_s)
        finally:
            cond.acquire()


def _on_durable(st: StreamState, entry: LogEntry, done: Future[int], wal_future: Future[int]) -> None:
    # Runs in the WAL's completion order, which is append order: durable_end only grows.
    error = wal_future.exception()
    if error is not None:
        done.set_exception(StoreFailedError(f"the append was not made durable: {error}"))
        return
    st.durable_end = entry.end_offset
    done.set_result(entry.base_offset)
