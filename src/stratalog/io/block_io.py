"""The WAL's block writes: each block written at its position (and synced when asked) by a thread of its
own, its result handed to a ``done(token, error)`` callback. Two engines, one behaviour:

- :class:`ThreadedBlockIO`, the reference: Python threads call :meth:`Device.pwrite` and :meth:`Device.sync`,
  then ``done`` in the same thread. Works on any device, the fault-injecting MemDevice included.
- :class:`NativeBlockIO`: ``stratalog._native.BlockWriter``'s threads write and sync a FileDevice's file
  without ever taking the GIL, so a write starts as soon as it is submitted, however busy the
  interpreter; one reaper thread takes their results and calls ``done``, or an event loop does, in its
  own thread (:meth:`NativeBlockIO.watch`): no thread then wakes and takes the GIL between a finished
  write and the loop that answers for it.

Both sync the way the WAL needs. Group commit: a write is durable once a sync that started after it
finished has ended; syncs are serialized, so one thread syncs for every write that finished while the
previous sync ran (with four threads writing, up to four writes a sync). Fsyncgate: once a sync fails,
every later one of that engine fails too, so nothing written after a failed sync is reported durable.
``done`` gets None when the block is written (and synced, if asked), else the OSError; it may be called
in any order across blocks (the WAL acknowledges in offset order itself). :func:`open_block_io` picks the engine.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from stratalog.io.device import Device
from stratalog.native import native

log = logging.getLogger("stratalog.io")

#: done(token, error): error None once the block is durable (written, and synced when asked).
Done = Callable[[object, BaseException | None], None]


@dataclass(frozen=True)
class CompletionWatch:
    """A block writer's results, taken in the watching thread: call ``reap()`` when ``fd`` is readable, and
    ``release()`` before the writer closes, to hand them back to the writer's own thread."""

    fd: int
    reap: Callable[[], None]
    release: Callable[[], None]


class BlockIO(Protocol):
    def submit(self, buf: mmap.mmap, length_bytes: int, position_bytes: int, token: object) -> None:
        """Write ``buf[:length_bytes]`` at ``position_bytes``; ``done(token, ...)`` follows. The buffer must
        stay open until then."""
        ...

    def watch(self, backstop_s: float) -> CompletionWatch | None:
        """Let the calling thread take the results (see :class:`CompletionWatch`); None where the engine's
        own threads call ``done`` and cannot hand that over."""
        ...

    def syncs(self) -> int:
        """The device syncs made so far: with group commit, fewer than the writes synced."""
        ...

    def close(self) -> None:
        """Finish every submitted write (``done`` called for each), then stop the threads."""
        ...


class ThreadedBlockIO:
    """Python threads: the reference engine, for any device."""

    def __init__(self, device: Device, threads: int, sync_each: bool, done: Done, thread_name: str) -> None:
        self._device = device
        self._sync_each = sync_each
        self._done = done
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix=thread_name)
        # Group commit (see the module): the number of syncs started and of the last that succeeded.
        self._sync_done = threading.Condition()
        self._syncing = False
        self._syncs_started = 0
        self._syncs_done = 0
        self._sync_failure: BaseException | None = None

    def submit(self, buf: mmap.mmap, length_bytes: int, position_bytes: int, token: object) -> None:
        self._pool.submit(self._write, buf, length_bytes, position_bytes, token)

    def _write(self, buf: mmap.mmap, length_bytes: int, position_bytes: int, token: object) -> None:
        try:
            with memoryview(buf) as view:
                self._device.pwrite(view[:length_bytes], position_bytes)
            if self._sync_each:
                self._sync()
        except BaseException as e:
            self._done(token, e)
            return
        self._done(token, None)

    def watch(self, backstop_s: float) -> None:
        """None: each I/O thread calls ``done`` for its own write."""
        return None

    def _sync(self) -> None:
        """Return once every write finished before the call is durable (see the module's group commit)."""
        with self._sync_done:
            needed = self._syncs_started + 1  # a sync running now may have started before this write ended
            while self._syncs_done < needed and self._sync_failure is None:
                if self._syncing:
                    self._sync_done.wait()
                    continue
                self._syncing = True
                self._syncs_started += 1
                mine = self._syncs_started
                self._sync_done.release()  # the others wait for it, or write meanwhile
                failure: BaseException | None = None
                try:
                    self._device.sync()
                except BaseException as e:
                    failure = e
                self._sync_done.acquire()
                self._syncing = False
                if failure is None:
                    self._syncs_done = mine
                else:
                    self._sync_failure = failure  # no later sync can succeed
                self._sync_done.notify_all()
            if self._syncs_done < needed:
                assert self._sync_failure is not None
                raise self._sync_failure

    def syncs(self) -> int:
        """The device syncs made so far (one covers many writes)."""
        with self._sync_done:
            return self._syncs_started

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class NativeBlockIO:
    """The compiled writer's threads, for a file descriptor; their results taken by a reaper thread, or by
    an event loop that watches :meth:`watch`'s file descriptor with the reaper as its backstop."""

    def __init__(self, fd: int, threads: int, sync_each: bool, done: Done, thread_name: str) -> None:
        assert native is not None
        self._writer = native.BlockWriter(fd, threads, sync_each)
        self._done = done
        self._closing = False
        self._reaper = threading.Thread(target=self._reap_loop, name=f"{thread_name}-reaper", daemon=True)
        self._reaper.start()

    def submit(self, buf: mmap.mmap, length_bytes: int, position_bytes: int, token: object) -> None:
        self._writer.submit(buf, length_bytes, position_bytes, token)

    def watch(self, backstop_s: float) -> CompletionWatch:
        """Let the caller's thread take the results, in ``reap()`` once the watch's file descriptor is
        readable. The reaper thread takes only results left ``backstop_s`` unreaped: the watching thread
        may be blocked, even waiting for one of them."""
        self._writer.set_backstop(backstop_s)  # under the writer's lock: the reaper's wait cannot miss it
        return CompletionWatch(int(self._writer.fileno()), self.reap, self._unwatch)

    def _unwatch(self) -> None:
        self._writer.set_backstop(0.0)

    def syncs(self) -> int:
        """The fdatasync calls made so far (one covers many writes)."""
        return int(self._writer.syncs())

    def reap(self) -> None:
        """``done`` for each write finished since the last look, in this thread."""
        for token, error in self._writer.reap():
            try:
                self._done(token, None if error == 0 else OSError(error, os.strerror(error)))
            except Exception:
                # The WAL stops itself before raising out of done; the other results must still be reaped.
                log.exception("completing a block write failed")

    def _reap_loop(self) -> None:
        while not self._closing:
            if self._writer.wait():
                self.reap()

    def close(self) -> None:
        self._closing = True
        self._writer.stop()  # the queued writes are done once it returns; the reaper's wait returns
        self._reaper.join()
        self.reap()  # anything that finished after the reaper's last look


def open_block_io(device: Device, threads: int, sync_each: bool, done: Done, thread_name: str, *,
                  compiled: bool = True) -> BlockIO:
    """The compiled engine for a device with a file descriptor where the core is built (unless ``compiled``
    is False), else the Python threads."""
    fileno = getattr(device, "fileno", None)
    if compiled and native is not None and callable(fileno):
        return NativeBlockIO(fileno(), threads, sync_each, done, thread_name)
    return ThreadedBlockIO(device, threads, sync_each, done, thread_name)
