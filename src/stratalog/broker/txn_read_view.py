"""The partition leader's transactions (txn_partitions.py) as the stream store's reads ask for them
(engine/txn_view.py's TxnView), from whatever thread reads.

``Stream.fetch`` is read_committed by default, and the broker installs this view in its store at start.
PartitionTxns is the event loop's alone (the loop changes it as produce and markers go on, unlocked), and
a fetch may run on another thread: the web console's (console/views.py, a partition's messages) or a
worker of ``asyncio.to_thread``. So a call made on the loop's thread, or while the loop does not run (it
changes nothing then: a test between two ``run_until_complete``, a broker stopping), asks PartitionTxns at
once, and a call from any other thread is handed to the running loop and waited for, ``LOOP_WAIT_S`` at
most. What comes back is the loop's own answer: an int, or a list made for the caller.

A thread that waits here must be one the loop never waits for: the reads ask the view with no store lock
held (the loop's appends take the store lock), and the broker itself reads records on the loop or with
read_uncommitted (api_log.py's ListOffsets by time).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from collections.abc import Callable
from typing import TypeVar

from stratalog.broker.txn_partitions import AbortedRange, PartitionTxns
from stratalog.errors import StratalogError

T = TypeVar("T")

#: How long a read off the loop waits for the loop to answer: as long as the console waits for it to read
#: the broker's tables (commands/serve_http.py), since a loop busy for this long is itself the news.
LOOP_WAIT_S = 10.0


class TxnViewUnavailableError(StratalogError):
    """The broker's event loop did not answer a read's question on its transactions in time (busy for
    ``LOOP_WAIT_S``, or stopping): retry, or read with isolation="read_uncommitted"."""


class LoopTxnView:
    """PartitionTxns read from any thread (see the module's docstring): a TxnView for the stream store."""

    def __init__(self, txns: PartitionTxns, loop: asyncio.AbstractEventLoop) -> None:
        self._txns = txns
        self._loop = loop

    def last_stable_offset(self, stream_id: int, high_watermark: int) -> int:
        return self._call(functools.partial(self._txns.last_stable_offset, stream_id, high_watermark))

    def aborted_ranges(self, stream_id: int, from_offset: int, to_offset: int) -> list[AbortedRange]:
        return self._call(functools.partial(self._txns.aborted_ranges, stream_id, from_offset, to_offset))

    def _call(self, ask: Callable[[], T]) -> T:
        """``ask()`` at once on the loop's thread or with the loop idle, else handed to the loop and waited for."""
        try:
            on_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:   # no loop runs in this thread
            on_loop = False
        if on_loop or not self._loop.is_running():
            return ask()
        done: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            if done.set_running_or_notify_cancel():   # not given up on meanwhile
                try:
                    done.set_result(ask())
                except BaseException as e:
                    done.set_exception(e)

        self._loop.call_soon_threadsafe(run)
        try:
            return done.result(LOOP_WAIT_S)
        except TimeoutError:
            done.cancel()
            raise TxnViewUnavailableError(
                f"the broker's event loop did not say within {LOOP_WAIT_S:g} s which transactions are open or "
                "aborted (busy, or stopping): retry, or read with isolation='read_uncommitted'") from None
