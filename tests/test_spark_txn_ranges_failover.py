"""The driver's question for aborted transactions across a failover (spark/txn_ranges.py): a leader that
cannot be reached, or no leader named yet, is asked again after a wait for as long as the caller allows;
a connection that breaks mid-answer asks the unanswered page again whole; past the bound the read fails."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from stratalog.kafka import aborted_ranges as wire
from stratalog.kafka.aborted_ranges import AbortedTxn
from stratalog.kafka.client import BrokerConnectionError
from stratalog.kafka.codec import decode_request
from stratalog.spark.kafka_client import BrokerReadError, TopicPartition
from stratalog.spark.txn_ranges import UNREACHABLE_WAIT_S, aborted_ranges

RANGES = {("t", 0): [AbortedTxn(5, 7, 3)], ("t", 1): [AbortedTxn(9, 8, 8)]}
WANTED = {("t", 0): (0, 20), ("t", 1): (0, 20)}


class LiveLeader:
    """Answers every page with the ranges of RANGES."""

    client_id = "test"

    def __init__(self) -> None:
        self.ids = iter(range(1, 1000))

    def next_correlation_id(self) -> int:
        return next(self.ids)

    def exchange(self, frame: bytes) -> bytes:
        request = decode_request(frame[4:], {wire.API_KEY: (0, 0)})
        body = request.body
        assert isinstance(body, wire.AbortedRangesRequest)
        topics = tuple((topic, tuple(wire.PartitionRanges(p.partition, 0, 20, False,
                                                          tuple(RANGES[(topic, p.partition)])) for p in parts))
                       for topic, parts in body.topics)
        return wire.encode_response(request.correlation_id, wire.AbortedRangesResponse(topics=topics))[4:]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_a_dead_leader_is_asked_again_at_the_new_one_after_a_wait() -> None:
    clock = Clock()
    looks: list[list[TopicPartition]] = []

    def leaders(partitions: list[TopicPartition]) -> dict[TopicPartition, str]:
        looks.append(partitions)
        if len(looks) == 1:
            return dict.fromkeys(partitions, "dead:1")
        if len(looks) == 2:
            raise BrokerReadError("no leader of t/0")   # the failover under way
        return dict.fromkeys(partitions, "live:2")

    @contextmanager
    def connect(address: str, settings: dict[str, str]) -> Iterator[LiveLeader]:
        if address == "dead:1":
            raise BrokerConnectionError("connection refused")
        yield LiveLeader()

    found = aborted_ranges(leaders, {}, WANTED, connect, unreachable_s_max=30.0, sleep=clock.sleep,
                           clock=lambda: clock.now)
    assert found == RANGES
    assert len(looks) == 3 and clock.slept == [UNREACHABLE_WAIT_S, 2 * UNREACHABLE_WAIT_S]


def test_a_connection_broken_mid_answer_asks_the_page_again_whole() -> None:
    clock = Clock()
    attempts: list[str] = []

    class Breaking(LiveLeader):
        def exchange(self, frame: bytes) -> bytes:
            if len(attempts) == 1:
                raise BrokerConnectionError("the broker closed the connection")
            return super().exchange(frame)

    @contextmanager
    def connect(address: str, settings: dict[str, str]) -> Iterator[LiveLeader]:
        attempts.append(address)
        yield Breaking()

    found = aborted_ranges(lambda ps: dict.fromkeys(ps, "b:1"), {}, WANTED, connect, unreachable_s_max=30.0,
                           sleep=clock.sleep, clock=lambda: clock.now)
    assert found == RANGES, "each range once"
    assert attempts == ["b:1", "b:1"]


def test_a_leader_unreachable_past_the_bound_fails_the_read_and_without_one_at_once() -> None:
    clock = Clock()

    @contextmanager
    def connect(address: str, settings: dict[str, str]) -> Iterator[LiveLeader]:
        raise BrokerConnectionError("connection refused")
        yield LiveLeader()

    with pytest.raises(BrokerReadError, match="asking dead:1 for aborted transactions: connection refused"):
        aborted_ranges(lambda ps: dict.fromkeys(ps, "dead:1"), {}, WANTED, connect, unreachable_s_max=5.0,
                       sleep=clock.sleep, clock=lambda: clock.now)
    assert 4.0 <= sum(clock.slept) <= 5.0
    clock.slept.clear()
    with pytest.raises(BrokerReadError, match="connection refused"):
        aborted_ranges(lambda ps: dict.fromkeys(ps, "dead:1"), {}, WANTED, connect, sleep=clock.sleep,
                       clock=lambda: clock.now)
    assert clock.slept == [], "no bound given: the first failure fails the read"
