"""StratalogAbortedRanges: its bytes, the broker's answer from a partition's transactions, and the Spark
driver's client, which pages through a leader's answers and follows a partition whose leader moved.

The broker runs in-process (no socket): the client's connection is replaced by one that hands each frame
to the broker's handler, through the codec's decoding as the server's, so requests and answers are the
bytes a socket would carry.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import re
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from stratalog.broker import api_txn_ranges
from stratalog.broker.api_registry import all_apis
from stratalog.broker.broker import Broker
from stratalog.broker.config import BrokerConfig
from stratalog.broker.listeners import Listener
from stratalog.broker.session import Session
from stratalog.broker.txn_partitions import AbortedRange
from stratalog.engine import NewRecord, StoreConfig
from stratalog.invariant import InvariantError
from stratalog.kafka import aborted_ranges as wire
from stratalog.kafka.aborted_ranges import (
    API_KEY,
    PARTITIONS_MAX,
    AbortedRangesRequest,
    AbortedRangesResponse,
    AbortedTxn,
    PartitionRanges,
    WantedPartition,
    decode_response,
    encode_request,
    encode_response,
)
from stratalog.kafka.codec import KafkaProtocolError, UnsupportedVersionError, decode_request
from stratalog.spark import txn_ranges
from stratalog.spark.kafka_client import BrokerReadError
from stratalog.spark.txn_ranges import LEADER_LOOKUPS_MAX, aborted_ranges

SERVED = {API_KEY: (0, 0)}
REQUEST = AbortedRangesRequest((("t", (WantedPartition(1, 0, 100),)),))
#: The module docstring's worked example, byte for byte.
REQUEST_BYTES = bytes.fromhex("0000002a 7d02 0000 00000007 000173 00000001 000174 00000001 00000001"
                              "0000000000000000 0000000000000064")
RESPONSE = AbortedRangesResponse(0, None, (("t", (PartitionRanges(1, 0, 90, False, (AbortedTxn(40, 3, 12),)),)),))
RESPONSE_BYTES = bytes.fromhex("00000042 00000007 00000000 0000 ffff 00000001 000174 00000001 00000001 0000"
                               "000000000000005a 00 00000001 0000000000000003 000000000000000c 0000000000000028")


# The bytes ---------------------------------------------------------------------------------------------


def test_the_worked_example_is_the_bytes_on_the_wire() -> None:
    assert encode_request(7, "s", REQUEST) == REQUEST_BYTES
    assert encode_response(7, RESPONSE) == RESPONSE_BYTES
    request = decode_request(REQUEST_BYTES[4:], SERVED)
    assert (request.api_key, request.correlation_id, request.client_id, request.body) == (API_KEY, 7, "s", REQUEST)
    assert decode_response(RESPONSE_BYTES[4:]) == (7, RESPONSE)


def test_every_truncation_of_a_request_or_a_response_is_a_protocol_error() -> None:
    for cut in range(len(REQUEST_BYTES) - 4):
        with pytest.raises(KafkaProtocolError):
            decode_request(REQUEST_BYTES[4:4 + cut], SERVED)
    for cut in range(len(RESPONSE_BYTES) - 4):
        with pytest.raises(KafkaProtocolError):
            decode_response(RESPONSE_BYTES[4:4 + cut])


@pytest.mark.parametrize("at, fmt, value, message", [
    (15, ">i", 1 << 28, "268435456 topics; at most 1000"),
    (15, ">i", -1, "-1 topics cannot fit"),
    (15, ">i", 5, "5 topics cannot fit the 27 bytes left"),
    (19, ">h", wire.TOPIC_NAME_BYTES_MAX + 1, "a string of 250 bytes"),
    (19, ">h", -1, "a string of -1 bytes"),
    (22, ">i", 1 << 20, r"1048576 partitions of 't' \(of 1000 in all\); at most 1000"),
    (22, ">i", 2, "2 partitions of 't' .* cannot fit"),
])
def test_counts_and_lengths_are_bounded_before_anything_is_allocated(at: int, fmt: str, value: int,
                                                                     message: str) -> None:
    frame = bytearray(REQUEST_BYTES)
    struct.pack_into(fmt, frame, at, value)
    with pytest.raises(KafkaProtocolError, match=message):
        decode_request(bytes(frame[4:]), SERVED)


def wanted_frame(*counts: int) -> bytes:
    """A request frame (without its size) of one topic per count, each with that many partitions: written by
    hand, since encode_request refuses what is beyond the bound."""
    out = bytearray(struct.pack(">hhih", API_KEY, 0, 1, -1) + struct.pack(">i", len(counts)))
    for n, count in enumerate(counts):
        out += struct.pack(">h", 1) + b"%d" % n + struct.pack(">i", count)
        out += b"".join(struct.pack(">iqq", p, 0, 1) for p in range(count))
    return bytes(out)


def test_a_request_beyond_partitions_max_in_all_is_refused_by_the_decoder() -> None:
    request = decode_request(wanted_frame(PARTITIONS_MAX - 400, 400), SERVED).body
    assert request.partitions == PARTITIONS_MAX
    with pytest.raises(KafkaProtocolError, match=r"401 partitions of '1' .*at most 400"):
        decode_request(wanted_frame(PARTITIONS_MAX - 400, 401), SERVED)
    with pytest.raises(InvariantError):
        encode_request(1, None, AbortedRangesRequest((("t", (WantedPartition(0, 0, 1),) * (PARTITIONS_MAX + 1)),)))


def test_bytes_after_a_request_or_a_response_are_refused() -> None:
    with pytest.raises(KafkaProtocolError, match="1 bytes after the body"):
        decode_request(REQUEST_BYTES[4:] + b"\0", SERVED)
    with pytest.raises(KafkaProtocolError, match="1 bytes after the body"):
        decode_response(RESPONSE_BYTES[4:] + b"\0")


def response_frame(ranges: int, more: int = 0) -> bytes:
    """A response frame (without its size) of one partition with ``ranges`` ranges, written by hand."""
    out = bytearray(struct.pack(">iihh", 7, 0, 0, -1) + struct.pack(">ih1si", 1, 1, b"t", 1))
    out += struct.pack(">ihqbi", 0, 0, 90, more, ranges)
    out += b"".join(struct.pack(">qqq", 3, 2 * i, 2 * i + 1) for i in range(ranges))
    return bytes(out)


def test_a_response_beyond_ranges_max_or_with_a_flag_not_0_or_1_is_refused() -> None:
    ((_, (answer,)),) = decode_response(response_frame(wire.RANGES_MAX))[1].topics
    assert len(answer.ranges) == wire.RANGES_MAX
    with pytest.raises(KafkaProtocolError, match=r"20001 ranges \(of 20000 in all\); at most 20000"):
        decode_response(response_frame(wire.RANGES_MAX + 1))
    assert decode_response(response_frame(1, more=1))[1].topics[0][1][0].more
    with pytest.raises(KafkaProtocolError, match="a flag of 2"):
        decode_response(response_frame(1, more=2))


def test_other_versions_are_not_served() -> None:
    frame = bytearray(REQUEST_BYTES[4:])
    struct.pack_into(">h", frame, 2, 1)
    with pytest.raises(UnsupportedVersionError):
        decode_request(bytes(frame), SERVED)


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_any_bytes_decode_to_a_request_that_round_trips_or_to_a_protocol_error(data: st.DataObject) -> None:
    """Fuzz: the seed with bytes flipped, cut or appended decodes to a request that re-encodes to the same
    bytes, or raises KafkaProtocolError; never anything else (chaos/fuzz_aborted_ranges.py does it at length)."""
    frame = bytearray(REQUEST_BYTES[4:])
    for _ in range(data.draw(st.integers(0, 4))):
        at = data.draw(st.integers(0, len(frame) - 1))
        frame[at] = data.draw(st.integers(0, 255))
    frame = frame[:data.draw(st.integers(8, len(frame)))] + data.draw(st.binary(max_size=40))
    try:
        request = decode_request(bytes(frame), SERVED)
    except (KafkaProtocolError, UnsupportedVersionError):
        return
    assert encode_request(request.correlation_id, request.client_id, request.body)[4:] == bytes(frame)


def test_the_docs_list_exactly_the_apis_the_broker_serves() -> None:
    text = (Path(__file__).resolve().parent.parent / "docs" / "broker.md").read_text()
    table = text[text.index("## APIs served"):text.index("## Bounds")]
    listed = {}
    for name, key, versions in re.findall(r"\| (\w+) \((\d+)\) \| ([\d-]+) ", table):
        low, _, high = versions.partition("-")
        listed[int(key)] = (name, int(low), int(high or low))
    assert listed == {api.key: (api.name, api.min_version, api.max_version) for api in all_apis()}


# The broker's answer -------------------------------------------------------------------------------------

#: Records appended to each partition of the test's topic (the high watermark).
RECORDS = 100


class World:
    """A broker in-process with topic ``t`` of two partitions of RECORDS records each, and the aborted
    ranges and open transactions each test gives its partitions."""

    def __init__(self, tmp_path: Path) -> None:
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        # The machine's own free space never refuses the test's appends.
        config = BrokerConfig(store=StoreConfig(free_bytes_min=0, free_percent_min=0.0))

        async def open_broker() -> Broker:
            return Broker.open(tmp_path / "data", config)

        self.broker = self.loop.run_until_complete(open_broker())
        self.broker.create_topic("t", 2, {})
        for p in (0, 1):
            self.stream(p).append([NewRecord(b"v%d" % i) for i in range(RECORDS)]).result(30)
        self.session = Session(Listener.parse("PLAINTEXT://127.0.0.1:9092"), "127.0.0.1", self.broker.authorizer,
                               principal="User:ANONYMOUS")
        self.requests: list[AbortedRangesRequest] = []

    def stream(self, partition: int) -> Any:
        stream = self.broker.partition("t", partition)
        assert stream is not None
        return stream

    def give(self, partition: int, aborted: list[AbortedTxn], open_txns: dict[int, int] | None = None) -> None:
        self.broker.partition_txns.restore(self.stream(partition).stream_id, open_txns or {},
                                           [AbortedRange(r.last_offset, r.producer_id, r.first_offset)
                                            for r in aborted])

    def answer(self, frame: bytes) -> bytes:
        """The response frame (without its size) to a request frame (with it), as the server gives it."""
        request = decode_request(frame[4:], SERVED)
        self.requests.append(request.body)

        async def run() -> Any:
            return await self.broker.apis[API_KEY].handler(self.broker, request, self.session)

        answer = self.loop.run_until_complete(run())
        return b"".join(bytes(p) for p in answer.pieces)[4:]

    def ask(self, *wanted: tuple[str, int, int, int]) -> AbortedRangesResponse:
        topics: dict[str, list[WantedPartition]] = {}
        for topic, partition, start, end in wanted:
            topics.setdefault(topic, []).append(WantedPartition(partition, start, end))
        request = AbortedRangesRequest(tuple((t, tuple(ps)) for t, ps in topics.items()))
        return decode_response(self.answer(encode_request(1, "test", request)))[1]

    def close(self) -> None:
        self.loop.run_until_complete(self.broker.close())
        self.loop.close()
        asyncio.set_event_loop(None)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    made = World(tmp_path)
    yield made
    made.close()


#: Three producers' aborted transactions in partition 0: (marker, producer, first offset).
ABORTED = [AbortedTxn(10, 1, 2), AbortedTxn(20, 2, 5), AbortedTxn(30, 1, 25), AbortedTxn(60, 3, 40)]


def test_the_leader_answers_the_ranges_overlapping_the_offsets_and_the_last_stable_offset(world: World) -> None:
    world.give(0, ABORTED, open_txns={7: 70})
    ((topic, (part,)),) = world.ask(("t", 0, 12, 41)).topics
    assert (topic, part.partition, part.error_code, part.more) == ("t", 0, 0, False)
    assert part.ranges == (AbortedTxn(20, 2, 5), AbortedTxn(30, 1, 25), AbortedTxn(60, 3, 40)), \
        "a range ending before 12 or starting at 41 or later is left out"
    assert part.last_stable_offset == 70, "the open transaction's first offset"
    (_, (other,)), = world.ask(("t", 1, 0, RECORDS)).topics
    assert (other.ranges, other.last_stable_offset) == ((), RECORDS), "nothing open: the high watermark"


def test_a_partition_that_is_not_there_or_a_negative_offset_is_refused(world: World) -> None:
    (_, parts), = world.ask(("t", 5, 0, 10), ("t", 0, 0, -1), ("t", 1, -1, 5)).topics
    assert [ErrorCode(p.error_code) for p in parts] == [ErrorCode.unknown_topic_or_partition,
                                                        ErrorCode.invalid_request, ErrorCode.invalid_request]
    (_, (missing,)), = world.ask(("nope", 0, 0, 1)).topics
    assert ErrorCode(missing.error_code) == ErrorCode.unknown_topic_or_partition


def test_from_past_to_lists_the_ranges_ending_at_or_after_it_that_began_before_to(world: World) -> None:
    """A page's continuation: the rest of the ranges overlapping the offsets first asked, past a range that
    ended beyond them."""
    world.give(0, ABORTED)
    (_, (part,)), = world.ask(("t", 0, 11, 6)).topics
    assert (part.error_code, part.ranges) == (0, (AbortedTxn(20, 2, 5),))


def test_a_response_holds_ranges_max_ranges_and_says_more(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(api_txn_ranges, "RANGES_MAX", 3)
    world.give(0, ABORTED)
    world.give(1, [AbortedTxn(50, 9, 45)])
    (_, (first, second)), = world.ask(("t", 0, 0, RECORDS), ("t", 1, 0, RECORDS)).topics
    assert (first.ranges, first.more) == (tuple(ABORTED[:3]), True)
    assert (second.ranges, second.more) == ((), True), "the budget is the response's"


# The Spark driver's client -------------------------------------------------------------------------------


class Leaders:
    """Where each partition is led, as metadata says; ``moves`` lookups name a broker that no longer leads."""

    def __init__(self, moves: int) -> None:
        self.moves = moves
        self.lookups = 0

    def __call__(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], str]:
        self.lookups += 1
        where = "old:1" if self.lookups <= self.moves else "leader:1"
        return dict.fromkeys(partitions, where)


class InProcess:
    """A connection to the in-process broker, as txn_ranges.Connect makes one; ``made``: the addresses
    connected to. A connection to ``old:1`` answers NOT_LEADER_OR_FOLLOWER for every partition."""

    client_id = "spark"

    def __init__(self, world: World) -> None:
        self.world = world
        self.made: list[str] = []
        self.address = ""
        self.ids = itertools.count(1)

    def __call__(self, address: str, settings: dict[str, str]) -> InProcess:
        self.made.append(address)
        self.address = address
        return self

    def __enter__(self) -> InProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def next_correlation_id(self) -> int:
        return next(self.ids)

    def exchange(self, frame: bytes) -> bytes:
        answer = self.world.answer(frame)
        if self.address != "old:1":
            return answer
        correlation_id, response = decode_response(answer)
        moved = tuple((t, tuple(dataclasses.replace(p, error_code=int(ErrorCode.not_leader_or_follower),
                                                    ranges=(), more=False) for p in ps))
                      for t, ps in response.topics)
        return encode_response(correlation_id, dataclasses.replace(response, topics=moved))[4:]


@pytest.fixture
def connect(world: World) -> InProcess:
    return InProcess(world)


def test_the_client_pages_through_every_range_and_splits_requests_by_the_bound(
        world: World, connect: InProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    many = [AbortedTxn(10 + 2 * i, 100 + i % 3, 9 + 2 * i) for i in range(20)]
    world.give(0, many)
    world.give(1, ABORTED)
    monkeypatch.setattr(api_txn_ranges, "RANGES_MAX", 3)
    monkeypatch.setattr(wire, "PARTITIONS_MAX", 1)   # the client's bound: a request per partition
    found = aborted_ranges(Leaders(0), {}, {("t", 0): (0, RECORDS), ("t", 1): (12, 41)}, connect)
    assert found == {("t", 0): many, ("t", 1): ABORTED[1:]}
    assert all(r.partitions == 1 for r in world.requests)
    assert len(world.requests) == 7 + 1, "t/0's 20 ranges in pages of 3; t/1's 3 in one (no more left out)"
    assert connect.made == ["leader:1"], "one connection per leader"


def test_a_page_whose_last_range_ends_past_the_offsets_asked_is_followed_by_the_rest(
        world: World, connect: InProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    # Both began below 10 and end past it: the second page is asked from 51, past the 10 first asked up to.
    long_ones = [AbortedTxn(50, 1, 3), AbortedTxn(60, 2, 4), AbortedTxn(70, 3, 12)]
    world.give(0, long_ones)
    monkeypatch.setattr(api_txn_ranges, "RANGES_MAX", 1)
    assert aborted_ranges(Leaders(0), {}, {("t", 0): (0, 10)}, connect) == {("t", 0): long_ones[:2]}
    assert [r.topics[0][1][0] for r in world.requests] == [WantedPartition(0, 0, 10), WantedPartition(0, 51, 10)], \
        "the second page holds the last range that began below 10: no third"


def test_a_partition_whose_leader_moved_is_asked_of_the_new_one(world: World, connect: InProcess) -> None:
    world.give(0, ABORTED)
    found = aborted_ranges(Leaders(moves=LEADER_LOOKUPS_MAX - 1), {}, {("t", 0): (0, RECORDS), ("t", 1): (0, 5)},
                           connect)
    assert found == {("t", 0): ABORTED, ("t", 1): []}
    assert connect.made == ["old:1"] * (LEADER_LOOKUPS_MAX - 1) + ["leader:1"]
    with pytest.raises(BrokerReadError, match=f"moved {LEADER_LOOKUPS_MAX} times"):
        aborted_ranges(Leaders(moves=LEADER_LOOKUPS_MAX), {}, {("t", 0): (0, RECORDS)}, connect)


def test_an_empty_offset_range_asks_nothing_and_a_refusal_names_the_partition(
        world: World, connect: InProcess) -> None:
    assert aborted_ranges(Leaders(0), {}, {("t", 0): (7, 7)}, connect) == {("t", 0): []} and connect.made == []
    with pytest.raises(BrokerReadError, match="t/5: unknown_topic_or_partition"):
        aborted_ranges(Leaders(0), {}, {("t", 5): (0, 1)}, connect)


# A broken broker's answers: each refused with BrokerReadError, never taken in part. ----------------------

#: What the driver asks in the tests below: two partitions of ``t``.
ASKED = {("t", 0): (10, 50), ("t", 1): (0, 100)}


def answered(*partitions: PartitionRanges, topic: str = "t") -> AbortedRangesResponse:
    return AbortedRangesResponse(topics=((topic, partitions),))


def ok(partition: int, *ranges: AbortedTxn, more: bool = False) -> PartitionRanges:
    return PartitionRanges(partition, 0, 100, more, ranges)


def read(response: AbortedRangesResponse, correlation_id: int = 5) -> txn_ranges.Page:
    return txn_ranges.read_page("b:1", ASKED, 5, encode_response(correlation_id, response)[4:])


def test_a_whole_answer_is_taken_and_a_full_page_is_asked_again_from_past_its_last_range() -> None:
    page = read(answered(ok(0, AbortedTxn(12, 1, 3), AbortedTxn(60, 2, 40), more=True), ok(1)))
    assert page.found == {("t", 0): [AbortedTxn(12, 1, 3), AbortedTxn(60, 2, 40)], ("t", 1): []}
    assert (page.left, page.moved) == ({("t", 0): (61, 50)}, {})


@pytest.mark.parametrize("response, message", [
    (answered(ok(0)), "did not answer for t/1"),
    (answered(ok(0), ok(1), ok(2)), "t/2, which was not asked"),
    (answered(ok(0), ok(1), ok(0)), "t/0, which was not asked or was answered already"),
    (answered(ok(0), ok(1), topic="u"), "u/0, which was not asked"),
    (answered(ok(0, AbortedTxn(30, 1, 3), AbortedTxn(20, 2, 5)), ok(1)), "out of order"),
    (answered(ok(0, AbortedTxn(30, 1, 3), AbortedTxn(30, 2, 5)), ok(1)), "out of order"),
    (answered(ok(0, AbortedTxn(9, 1, 3)), ok(1)), r"does not reach \[10, 50\)"),
    (answered(ok(0, AbortedTxn(70, 1, 50)), ok(1)), r"does not reach \[10, 50\)"),
    (answered(ok(0, AbortedTxn(20, 1, 30)), ok(1)), "does not reach"),
    (answered(ok(0, more=True), ok(1, more=True)), "listed no range and said there were more"),
    (answered(ok(0, AbortedTxn(2**63 - 1, 1, 3), more=True), ok(1)), "after one ending at the last offset"),
    (AbortedRangesResponse(int(ErrorCode.cluster_authorization_failed), "no"), "refused .* no"),
])
def test_an_answer_that_is_not_whole_and_consistent_is_refused(response: AbortedRangesResponse,
                                                                message: str) -> None:
    with pytest.raises(BrokerReadError, match=message):
        read(response)


def test_another_request_s_answer_or_bytes_that_are_none_are_refused() -> None:
    with pytest.raises(BrokerReadError, match="answered request 6, not 5"):
        read(answered(ok(0), ok(1)), correlation_id=6)
    with pytest.raises(BrokerReadError, match="bytes that are not a response"):
        txn_ranges.read_page("b:1", ASKED, 5, b"\0\0\0\5")


def test_a_page_that_says_more_with_nothing_listed_is_asked_again_when_another_moved_on() -> None:
    # The broker's budget ran out before t/1 (RANGES_MAX shared in the order asked): t/1 starts over.
    page = read(answered(ok(0, AbortedTxn(12, 1, 3), more=True), ok(1, more=True)))
    assert page.left == {("t", 0): (13, 50), ("t", 1): (0, 100)}
