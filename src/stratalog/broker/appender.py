"""Appends from the event loop that never block it, in the order they were asked for.

While the store has room, an append goes straight to the engine (a WAL append: microseconds). When the
log cache or the WAL is full, the engine would wait for uploads, up to ``append_wait_s_max``, and with
it every connection, heartbeat and fetch of the broker. So an append that finds no room, and every
append after it, is handed to one worker thread that waits in its place; appends go straight to the
engine again once that queue is empty. One worker, first in first out, and no direct append while any
is queued: the engine sees the appends in the order the broker accepted them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any, TypeVar

from stratalog.engine import BackpressureError, Stream

T = TypeVar("T")


class OrderedAppender:
    def __init__(self) -> None:
        self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="stratalog-appender")
        #: Appends handed to the worker whose engine call has not returned yet (read and written on the loop).
        self._queued = 0

    @property
    def queued(self) -> int:
        return self._queued

    def append(self, stream: Stream, batch: memoryview, count: int, max_timestamp_ms: int) -> asyncio.Future[int]:
        """The future of the batch's base offset, complete once durable. Errors the engine raises at once
        (a closed or failed store, a batch too large) are raised here when the append goes straight."""
        loop = asyncio.get_running_loop()
        if not self._queued:
            try:
                return on_loop(stream.append_kafka(batch, count, max_timestamp_ms, wait_s_max=0), loop)
            except BackpressureError:
                pass  # no room now: wait in the worker, and let later appends queue behind this one
        self._queued += 1
        done: asyncio.Future[int] = loop.create_future()
        handed = self._worker.submit(stream.append_kafka, batch, count, max_timestamp_ms)
        handed.add_done_callback(lambda f: loop.call_soon_threadsafe(self._appended, f, done))
        return done

    def drained(self) -> asyncio.Future[None]:
        """A future complete once every append handed to the worker before this call has reached the engine
        (the worker runs them in order): a handoff waits for it after it stops taking the partition's
        appends, so none of them can join later."""
        loop = asyncio.get_running_loop()
        if not self._queued:
            done: asyncio.Future[None] = loop.create_future()
            done.set_result(None)
            return done
        return asyncio.wrap_future(self._worker.submit(_nothing), loop=loop)

    def _appended(self, handed: concurrent.futures.Future[Any], done: asyncio.Future[int]) -> None:
        self._queued -= 1
        error = handed.exception()
        if error is not None:
            if not done.done():
                done.set_exception(error)
            return
        _bridge(handed.result(), done)

    def close(self) -> None:
        self._worker.shutdown(wait=True, cancel_futures=False)


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


def _nothing() -> None:
    pass
