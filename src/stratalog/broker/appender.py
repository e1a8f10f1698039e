"""Appends from the event loop that never block it, in the order they were asked for.

While the store has room, an append goes straight to the engine (a WAL append: microseconds). When the
log cache or the WAL is full, the engine would wait for uploads, up to ``append_wait_s_max``, and with
it every connection, heartbeat and fetch of the broker. So the append that finds no room is handed to one
worker thread that waits in its place, and every append after it queues on the loop behind it. Once the
worker's append has gone in, the loop appends the queued ones straight again, until one finds no room and
goes to the worker in its turn. The worker only ever waits: appends that find room run on the loop, and a
burst that fills the store does not send every later append through a thread (each a wake-up and a turn
for the interpreter's lock). First in first out, and no straight append while any is queued: the engine
sees the appends in the order the broker accepted them. And a prefix of that order: once a queued append
fails (it waited ``append_wait_s_max`` for room in vain), every append queued behind it fails too instead
of going in. One of them may be the next batch of the same idempotent producer on the same partition,
which must not land in the log after a gap in the producer's sequence: the broker forgets the failed
batch and those recorded in flight after it, so a batch that landed anyway would be unknown to its
producer state, and a retry of it would be written a second time (docs/cluster.md).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from stratalog.engine import BackpressureError, StoreClosedError, StoreFailedError, StoreFullError, Stream

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class _Queued:
    stream: Stream
    batch: memoryview
    count: int
    max_timestamp_ms: int
    done: asyncio.Future[int]


class OrderedAppender:
    def __init__(self, on_full: Callable[[], None] = lambda: None) -> None:
        #: Told each time an append finds no room (the log cache full: uploads have to make some).
        self._on_full = on_full
        self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="stratalog-appender")
        #: Appends asked for after one found no room, in order, not yet handed on (only the loop touches
        #: these fields).
        self._waiting: collections.deque[_Queued] = collections.deque()
        #: The append the worker holds (waiting for room), if any.
        self._in_worker: _Queued | None = None
        #: Appends queued so far, and how many of them have reached the engine (or failed): for drained().
        self._queued_total = 0
        self._reached_total = 0
        self._drain_waiters: list[tuple[int, asyncio.Future[None]]] = []

    @property
    def queued(self) -> int:
        """Appends waiting for room: the worker's and those behind it."""
        return len(self._waiting) + (self._in_worker is not None)

    def append(self, stream: Stream, batch: memoryview, count: int, max_timestamp_ms: int) -> asyncio.Future[int]:
        """The future of the batch's base offset, complete once durable. Errors the engine raises at once
        (a closed or failed store, a batch too large) are raised here when the append goes straight."""
        loop = asyncio.get_running_loop()
        if not self.queued:
            try:
                return on_loop(stream.append_kafka(batch, count, max_timestamp_ms, wait_s_max=0), loop)
            except BackpressureError:
                self._on_full()   # no room now: wait in the worker, and let later appends queue behind this one
        entry = _Queued(stream, batch, count, max_timestamp_ms, loop.create_future())
        self._queued_total += 1
        if self._in_worker is None:
            self._hand_to_worker(entry)
        else:
            self._waiting.append(entry)
        return entry.done

    def drained(self) -> asyncio.Future[None]:
        """A future complete once every append queued before this call has reached the engine: a handoff
        waits for it after it stops taking the partition's appends, so none of them can join later."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._reached_total == self._queued_total:
            done.set_result(None)
        else:
            self._drain_waiters.append((self._queued_total, done))
        return done

    def _hand_to_worker(self, entry: _Queued) -> None:
        loop = entry.done.get_loop()
        self._in_worker = entry
        handed = self._worker.submit(entry.stream.append_kafka, entry.batch, entry.count, entry.max_timestamp_ms)
        handed.add_done_callback(lambda f: loop.call_soon_threadsafe(self._worker_done, f))

    def _worker_done(self, handed: concurrent.futures.Future[concurrent.futures.Future[int]]) -> None:
        entry, self._in_worker = self._in_worker, None
        assert entry is not None
        self._settle(entry, handed)
        failed = handed.exception()
        while self._waiting:  # room was made: the queued appends go straight until one finds none
            entry = self._waiting.popleft()
            answer: concurrent.futures.Future[concurrent.futures.Future[int]] = concurrent.futures.Future()
            if failed is not None:   # never after a gap: see the module's doc
                answer.set_exception(_behind(failed))
                self._settle(entry, answer)
                continue
            try:
                answer.set_result(entry.stream.append_kafka(entry.batch, entry.count, entry.max_timestamp_ms,
                                                            wait_s_max=0))
            except BackpressureError:
                self._on_full()
                self._hand_to_worker(entry)
                break
            except Exception as error:  # a failed or closed store, a batch too large: this append's answer
                answer.set_exception(error)
                failed = error
            self._settle(entry, answer)
        self._wake_drain_waiters()

    def _settle(self, entry: _Queued, answer: concurrent.futures.Future[concurrent.futures.Future[int]]) -> None:
        """``entry`` reached the engine: ``answer`` holds the engine's future of it, or the engine's error."""
        self._reached_total += 1
        error = answer.exception()
        if error is not None:
            if not entry.done.done():
                entry.done.set_exception(error)
            return
        _bridge(answer.result(), entry.done)

    def _wake_drain_waiters(self) -> None:
        still = []
        for target, waiter in self._drain_waiters:
            if self._reached_total < target:
                still.append((target, waiter))
            elif not waiter.done():
                waiter.set_result(None)
        self._drain_waiters = still

    def close(self) -> None:
        """Run what is still queued through the worker, in order, and wait for it (the store is still open
        here; its answers reach the loop's futures as ever)."""
        for entry in self._waiting:
            handed = self._worker.submit(entry.stream.append_kafka, entry.batch, entry.count, entry.max_timestamp_ms)
            handed.add_done_callback(
                lambda f, e=entry: e.done.get_loop().call_soon_threadsafe(self._settle, e, f))  # type: ignore[misc]
        self._waiting.clear()
        self._worker.shutdown(wait=True, cancel_futures=False)


def _behind(error: BaseException) -> BaseException:
    """What an append queued behind one that failed with ``error`` fails with: the same error when it is
    the store's (no room for too long, a full disk, a failed or closed store: the later append would have
    met it too), else a BackpressureError naming it (a batch too large says nothing of the others). The
    broker answers either with an error its producers retry."""
    if isinstance(error, (BackpressureError, StoreFullError, StoreFailedError, StoreClosedError)):
        return error
    return BackpressureError(f"not appended: an append queued before it failed ({error})")


def on_loop(source: concurrent.futures.Future[T], loop: asyncio.AbstractEventLoop) -> asyncio.Future[T]:
    """``source`` as a future of ``loop`` (called in the loop's thread). Unlike ``asyncio.wrap_future``, a
    ``source`` completed in the loop's own thread (the broker's loop completes the WAL's appends itself)
    completes it there and then, without a wake-up through the loop's self-pipe and a turn of the loop;
    and cancelling it leaves ``source`` alone: an append in the engine cannot be called back."""
    out: asyncio.Future[T] = loop.create_future()
    _bridge(source, out)
    return out


def _bridge(source: concurrent.futures.Future[T], target: asyncio.Future[T]) -> None:
    """``target`` (of the loop running in this thread) completes as ``source`` does."""
    loop, loop_thread = target.get_loop(), threading.get_ident()

    def copy(done: concurrent.futures.Future[T]) -> None:
        if threading.get_ident() == loop_thread:
            _copy_state(done, target)
        else:
            loop.call_soon_threadsafe(_copy_state, done, target)
    source.add_done_callback(copy)


def _copy_state(source: concurrent.futures.Future[T], target: asyncio.Future[T]) -> None:
    if target.done():
        return
    error = source.exception()
    if error is not None:
        target.set_exception(error)
    else:
        target.set_result(source.result())


