"""OrderedAppender: a full store never blocks the event loop, and appends reach the engine in order."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from typing import Any

import pytest

from stratalog.broker.appender import OrderedAppender
from stratalog.engine import BackpressureError
from waiting import WAIT_S


class FullThenFreeStream:
    """Refuses appends without waiting until ``room`` is set; an append that may wait blocks until then."""

    def __init__(self) -> None:
        self.room = threading.Event()
        self.appended: list[int] = []
        self.next_offset = 0
        self.lock = threading.Lock()

    def append_kafka(self, batch: Any, count: int, max_timestamp_ms: int, *,
                     wait_s_max: float | None = None) -> Future[int]:
        if not self.room.is_set():
            if wait_s_max == 0:
                raise BackpressureError("full")
            assert self.room.wait(WAIT_S), "the worker waits for room"
        with self.lock:
            self.appended.append(batch)
            offset, self.next_offset = self.next_offset, self.next_offset + count
        done: Future[int] = Future()
        done.set_result(offset)
        return done


def test_appends_wait_off_the_loop_and_keep_their_order() -> None:
    async def scenario() -> tuple[list[int], list[int], int]:
        stream = FullThenFreeStream()
        appender = OrderedAppender()
        futures = [appender.append(stream, i, 1, 0) for i in range(5)]  # type: ignore[arg-type]
        assert appender.queued == 5, "every append after the first refused one queues behind it"
        ticks = 0
        for _ in range(20):  # the loop keeps running while the worker waits for room
            await asyncio.sleep(0)
            ticks += 1
        stream.room.set()
        offsets = list(await asyncio.gather(*futures))
        later = await appender.append(stream, 5, 1, 0)  # type: ignore[arg-type]
        assert appender.queued == 0
        appender.close()
        return stream.appended, [*offsets, later], ticks

    appended, offsets, ticks = asyncio.run(scenario())
    assert ticks == 20
    assert appended == [0, 1, 2, 3, 4, 5], "the engine saw the appends in the order they were asked for"
    assert offsets == [0, 1, 2, 3, 4, 5]


def test_once_the_worker_made_room_the_queued_appends_go_straight_on_the_loop() -> None:
    """The worker only waits: after its append went in, those queued behind it are appended by the loop
    itself (no wait allowed), and only one that finds no room again goes to the worker."""
    class RoomForThree(FullThenFreeStream):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[tuple[int, float | None, bool]] = []   # batch, wait_s_max, in the loop's thread
            self.loop_thread = threading.get_ident()
            self.room_left = 0

        def append_kafka(self, batch: Any, count: int, max_timestamp_ms: int, *,
                         wait_s_max: float | None = None) -> Future[int]:
            self.calls.append((batch, wait_s_max, threading.get_ident() == self.loop_thread))
            if self.room.is_set() and wait_s_max == 0:
                if not self.room_left:
                    raise BackpressureError("full again")
                self.room_left -= 1
            return super().append_kafka(batch, count, max_timestamp_ms, wait_s_max=wait_s_max)

    full: list[int] = []

    async def scenario() -> RoomForThree:
        stream = RoomForThree()
        appender = OrderedAppender(on_full=lambda: full.append(len(stream.calls)))
        futures = [appender.append(stream, i, 1, 0) for i in range(6)]  # type: ignore[arg-type]
        assert appender.queued == 6
        stream.room_left = 3
        stream.room.set()
        assert list(await asyncio.gather(*futures)) == [0, 1, 2, 3, 4, 5]
        assert appender.queued == 0
        appender.close()
        return stream

    stream = asyncio.run(scenario())
    assert stream.appended == [0, 1, 2, 3, 4, 5]
    assert stream.calls == [
        (0, 0, True),        # refused: the worker takes it
        (0, None, False),    # the worker waits for room and appends it
        (1, 0, True), (2, 0, True), (3, 0, True),   # room for three: straight, on the loop
        (4, 0, True),        # full again: the worker takes it
        (4, None, False),
        (5, 0, True),        # still full: the worker again
        (5, None, False),
    ]
    assert full == [1, 6, 8], "each refusal told, as it happened (the log cache full: /metrics counts it)"


def test_close_runs_what_is_still_queued_in_order() -> None:
    async def scenario() -> tuple[list[int], list[int]]:
        stream = FullThenFreeStream()
        appender = OrderedAppender()
        futures = [appender.append(stream, i, 1, 0) for i in range(4)]  # type: ignore[arg-type]
        stream.room.set()
        appender.close()   # at once: the loop has not yet heard that the worker's append went in
        offsets = list(await asyncio.wait_for(asyncio.gather(*futures), WAIT_S))
        return stream.appended, offsets

    assert asyncio.run(scenario()) == ([0, 1, 2, 3], [0, 1, 2, 3])


def test_an_append_that_waits_too_long_fails_with_backpressure() -> None:
    class AlwaysFull:
        def append_kafka(self, batch: Any, count: int, max_timestamp_ms: int, *,
                         wait_s_max: float | None = None) -> Future[int]:
            raise BackpressureError("appends waited 30 s for uploads to free room")

    async def scenario() -> BaseException | None:
        appender = OrderedAppender()
        future = appender.append(AlwaysFull(), b"", 1, 0)  # type: ignore[arg-type]
        try:
            await future
        except BackpressureError as e:
            return e
        finally:
            appender.close()
        return None

    assert isinstance(asyncio.run(scenario()), BackpressureError)


class GatedStream:
    """Always full: an append that may wait goes through once the test releases one pass of ``gate``."""

    def __init__(self) -> None:
        self.gate = threading.Semaphore(0)
        self.appended: list[int] = []

    def append_kafka(self, batch: Any, count: int, max_timestamp_ms: int, *,
                     wait_s_max: float | None = None) -> Future[int]:
        if wait_s_max == 0:
            raise BackpressureError("full")
        assert self.gate.acquire(timeout=WAIT_S), "the test lets the append through"
        self.appended.append(batch)
        done: Future[int] = Future()
        done.set_result(len(self.appended) - 1)
        return done


def test_drained_waits_for_the_appends_queued_before_it_and_not_for_later_ones() -> None:
    async def scenario() -> None:
        stream = GatedStream()
        appender = OrderedAppender()
        await asyncio.wait_for(appender.drained(), WAIT_S)       # nothing queued: at once
        earlier = [appender.append(stream, i, 1, 0) for i in range(3)]  # type: ignore[arg-type]
        drained = appender.drained()
        later = [appender.append(stream, i, 1, 0) for i in range(3, 5)]  # type: ignore[arg-type]
        for _ in range(20):
            await asyncio.sleep(0)
        assert not drained.done(), "three appends queued before it still wait for room"
        for _ in range(3):
            stream.gate.release()
        await asyncio.wait_for(drained, WAIT_S)
        assert stream.appended == [0, 1, 2] and appender.queued == 2, "the later two still wait"
        assert await asyncio.gather(*earlier) == [0, 1, 2]
        for _ in range(2):
            stream.gate.release()
        assert await asyncio.gather(*later) == [3, 4]
        appender.close()

    asyncio.run(scenario())


def test_on_loop_completes_in_the_loop_thread_at_once_and_never_cancels_the_source() -> None:
    from stratalog.broker.appender import on_loop

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        here: Future[int] = Future()
        mirrored = on_loop(here, loop)
        here.set_result(7)  # completed in the loop's own thread: no turn of the loop needed
        assert mirrored.done() and mirrored.result() == 7
        elsewhere: Future[int] = Future()
        from_thread = on_loop(elsewhere, loop)
        threading.Thread(target=elsewhere.set_exception, args=(OSError("disk"),)).start()
        with pytest.raises(OSError, match="disk"):
            await from_thread
        pending: Future[int] = Future()
        abandoned = on_loop(pending, loop)
        abandoned.cancel()
        await asyncio.sleep(0)
        assert not pending.cancelled(), "the engine's append cannot be called back"
        pending.set_result(1)  # and completing it later is no error

    asyncio.run(scenario())
