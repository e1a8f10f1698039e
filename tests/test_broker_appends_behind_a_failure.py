"""An append queued for room that fails takes every append queued behind it down with it: none of them
goes in after it. Otherwise the next batch of the same idempotent producer lands after a gap in its
sequence, the broker (which forgets the failed batch and those in flight after it) no longer knows it is
in the log, and the producer's retry of it is written a second time: one record twice, with the same
producer id, epoch and sequence (docs/cluster.md, "Why an idempotent record is never written twice")."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from stratalog.broker.api_log import _check_and_append
from stratalog.broker.appender import OrderedAppender
from stratalog.broker.broker import Broker
from stratalog.broker.config import BrokerConfig
from stratalog.broker.listeners import Listener
from stratalog.broker.session import Session
from stratalog.engine import BackpressureError, StoreFullError, Stream
from stratalog.errors import RecordTooLargeError
from stratalog.kafka.records import encode_batch
from waiting import WAIT_S

PRODUCER_ID = 7
#: What the engine says when an append waited append_wait_s_max (30 s) for room in vain.
NO_ROOM = "appends waited 30 s for uploads to free room"


class RoomTooLate:
    """A store that is full until its first waiting append gives up (when the test says): room comes a
    moment too late for that one, in time for every append after it."""

    def __init__(self, give_up: BaseException) -> None:
        self.give_up = give_up
        self.full = True
        self.released = threading.Event()

    def refuse(self, wait_s_max: float | None) -> None:
        """Raise as the engine does while the store is full (the worker's append after the test's word)."""
        if wait_s_max == 0:
            raise BackpressureError("full")
        assert self.released.wait(WAIT_S), "the test lets the waiting append give up"
        self.full = False
        raise self.give_up


class FakeStream:
    def __init__(self, room: RoomTooLate) -> None:
        self.room = room
        self.appended: list[int] = []

    def append_kafka(self, batch: Any, count: int, max_timestamp_ms: int, *,
                     wait_s_max: float | None = None) -> Future[int]:
        if self.room.full:
            self.room.refuse(wait_s_max)
        self.appended.append(batch)
        done: Future[int] = Future()
        done.set_result(len(self.appended) - 1)
        return done


@pytest.mark.parametrize(("give_up", "behind"), [
    (BackpressureError(NO_ROOM), NO_ROOM),                 # the store's state: the same error for all
    (StoreFullError("the disk is full"), "the disk is full"),
    # This batch's own fault: the others are told that one before them failed, as a wait for room.
    (RecordTooLargeError("too large"), "not appended: an append queued before it failed (too large)"),
])
def test_appends_queued_behind_one_that_failed_fail_too_and_none_goes_in(give_up: BaseException,
                                                                         behind: str) -> None:
    async def scenario() -> tuple[list[BaseException | int], list[int], int]:
        stream = FakeStream(RoomTooLate(give_up))
        appender = OrderedAppender()
        futures = [appender.append(stream, i, 1, 0) for i in range(3)]  # type: ignore[arg-type]
        drained = appender.drained()
        stream.room.released.set()
        answers = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), WAIT_S)
        await asyncio.wait_for(drained, WAIT_S)     # a failed append has reached the engine too
        later = await appender.append(stream, 3, 1, 0)  # type: ignore[arg-type]
        appender.close()
        return answers, stream.appended, later

    answers, appended, later = asyncio.run(scenario())
    assert answers[0] is give_up
    assert [str(a) for a in answers[1:]] == [behind] * 2
    assert all(isinstance(a, (BackpressureError, StoreFullError)) for a in answers[1:]), "errors producers retry"
    assert appended == [3] and later == 0, "none of the three went in; an append after them does"


def batch(sequence: int) -> bytes:
    return encode_batch([(None, f"v{sequence}".encode(), (), 1_000)], base_offset=0, producer_id=PRODUCER_ID,
                        producer_epoch=0, base_sequence=sequence)


def test_a_batch_queued_behind_a_failed_one_is_not_written_so_its_retry_is_written_once(
        loop: asyncio.AbstractEventLoop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches 1 and 2 of one producer wait for room behind each other; 1 gives up (30 s, room came a
    moment later). The producer sends 1 again (its answer: REQUEST_TIMED_OUT) and 2 again (its answer lost
    with a connection): the partition must hold 0, 1, 2 once each, in order."""
    room = RoomTooLate(BackpressureError(NO_ROOM))
    room.full = False
    engine_append = Stream.append_kafka

    def append_kafka(self: Stream, kafka_batch: Any, count: int, max_timestamp_ms: int, *,
                     wait_s_max: float | None = None) -> Future[int]:
        if room.full:
            room.refuse(wait_s_max)
        return engine_append(self, kafka_batch, count, max_timestamp_ms, wait_s_max=wait_s_max)

    monkeypatch.setattr(Stream, "append_kafka", append_kafka)

    async def open_broker() -> Broker:
        return Broker.open(tmp_path / "data", BrokerConfig())

    broker = loop.run_until_complete(open_broker())
    try:
        broker.create_topic("t", 1, {})
        session = Session(Listener.parse("PLAINTEXT://127.0.0.1:9092"), "127.0.0.1", broker.authorizer,
                          principal="User:ANONYMOUS")

        async def produce(sequence: int) -> int | BaseException:
            future, _ = _check_and_append(broker, session, "t", 0, batch(sequence))
            try:
                return await asyncio.wait_for(future, WAIT_S)
            except BackpressureError as e:
                return e

        async def scenario() -> list[int | BaseException]:
            assert await produce(0) == 0
            room.full = True
            one = asyncio.ensure_future(produce(1))      # waits for room in the worker
            two = asyncio.ensure_future(produce(2))      # queued behind it
            await asyncio.sleep(0)
            room.released.set()
            first = [await one, await two]
            assert isinstance(first[0], BackpressureError)
            return [*first, await produce(1), await produce(2)]

        answers = loop.run_until_complete(scenario())
        stream = broker.partition("t", 0)
        assert stream is not None
        values = [r.value for r in stream.fetch(0)]
        assert values == [b"v0", b"v1", b"v2"], f"answers {answers}"
        assert answers[2:] == [1, 2]
    finally:
        loop.run_until_complete(broker.close())
