"""Fuzz targets of StratalogAbortedRanges (kafka/aborted_ranges.py), the broker's own request for partitions'
aborted transactions, on both sides of the wire.

``kafka_aborted_ranges``: the broker's side. ``codec.decode_request`` on a whole frame, as the server reads
one: a request it returns is within every bound of the format (PARTITIONS_MAX partitions and topics, topic
names of TOPIC_NAME_BYTES_MAX bytes at most) and re-encodes to exactly the frame; anything else raises
KafkaProtocolError (UnsupportedVersionError for another key or version).

``spark_aborted_ranges``: the Spark driver's side, against a broken or hostile broker whose answers are
the input. ``spark.txn_ranges.aborted_ranges`` asks for one to three partitions (their spans and leaders
chosen by the input's first bytes) and every answer it reads is the input's next frame; it returns ranges
that each overlap what was asked, in marker order, every one of them sent by the broker, or raises
BrokerReadError. Every request it sends is one the broker's decoder takes, asking only for what was
wanted, and every response frame that decodes is within the bounds and re-encodes to the same bytes.

Seeds are real encodings: the module docstring's worked example and requests from the encoder for the
first; for the second, sessions recorded against a model broker (``PartitionTxns``, the broker's own
selection of ranges, paged a few ranges at a time), one per shape: paging, two leaders, a partition
whose leader moved, a range ending past the offsets asked, a refusal.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable

from kio.schema.errors import ErrorCode

from stratalog.broker.txn_partitions import AbortedRange, PartitionTxns
from stratalog.chaos.fuzz_targets import FuzzTarget, Reader, check
from stratalog.kafka import aborted_ranges as wire
from stratalog.kafka.aborted_ranges import (
    API_KEY,
    PARTITIONS_MAX,
    RANGES_MAX,
    TOPIC_NAME_BYTES_MAX,
    VERSION,
    AbortedRangesRequest,
    AbortedRangesResponse,
    AbortedTxn,
    PartitionRanges,
    WantedPartition,
)
from stratalog.kafka.client import BrokerConnectionError
from stratalog.kafka.codec import FRAME_SIZE, KafkaProtocolError, UnsupportedVersionError, decode_request
from stratalog.spark.kafka_client import BrokerReadError, TopicPartition
from stratalog.spark.txn_ranges import Wanted, aborted_ranges

SERVED = {API_KEY: (VERSION, VERSION)}

# ---------------------------------------------------------------------------------------------------
# The broker's side: requests

#: A request of PARTITIONS_MAX partitions takes 20 KB (20 bytes each, and the topics' names): inputs reach
#: the bound and one partition past it. It costs throughput (such an input takes about 3 ms: 400 inputs a
#: second on a busy 2-vCPU machine against 2,400 without the seed at the bound), and only so is the
#: partitions' bound within the fuzzer's reach.
REQUEST_INPUT_BYTES_MAX = 24 << 10


def check_request(frame: bytes) -> None:
    request = decode_request(frame, SERVED)
    body = request.body
    check(isinstance(body, AbortedRangesRequest), f"key {API_KEY} decoded to a {type(body).__name__}")
    check(len(body.topics) <= PARTITIONS_MAX and body.partitions <= PARTITIONS_MAX,
          f"a request of {len(body.topics)} topics and {body.partitions} partitions decoded")
    check(all(len(name.encode()) <= TOPIC_NAME_BYTES_MAX for name, _ in body.topics),
          "a topic name longer than TOPIC_NAME_BYTES_MAX decoded")
    check(request.frame_bytes == len(frame), "frame_bytes is not the frame's length")
    again = wire.encode_request(request.correlation_id, request.client_id, body)
    check(again[FRAME_SIZE.size:] == frame, "a decoded request re-encodes to other bytes")


def request_seeds() -> list[bytes]:
    def frame(correlation_id: int, client_id: str | None, *topics: tuple[str, tuple[WantedPartition, ...]]) -> bytes:
        return wire.encode_request(correlation_id, client_id, AbortedRangesRequest(topics))[FRAME_SIZE.size:]

    def partitions(count: int, start: int = 0) -> tuple[WantedPartition, ...]:
        return tuple(WantedPartition(p, 10 * p, 10 * p + 100) for p in range(start, start + count))

    return [
        frame(7, "s", ("t", (WantedPartition(1, 0, 100),))),        # the module docstring's worked example
        frame(1, "stratalog-spark", ("clicks", partitions(3)), ("v\u00e9nements", (WantedPartition(0, 61, 10),))),
        frame(2, None, ("t" * TOPIC_NAME_BYTES_MAX, partitions(1)), ("", ())),
        frame(3, ""),
        frame(4, "spark", ("a", partitions(PARTITIONS_MAX - 400)), ("b", partitions(400, PARTITIONS_MAX))),
    ]


# ---------------------------------------------------------------------------------------------------
# The driver's side: a broker's answers

#: The partitions a run may ask for, the first one to three of them (the input's first byte).
PARTITIONS: tuple[TopicPartition, ...] = (("t", 0), ("t", 1), ("u", 0))
#: The two brokers a partition may be led by (a bit of the input's second byte each).
ADDRESSES = ("a:1", "b:2")
#: Control byte of an answer: bit 0 writes the request's correlation id over the frame's first bytes, so
#: mutated frames still answer the request they follow.
ANSWERS_REQUEST = 0x01


class _Broker:
    """The connections of one run: each request is checked as the broker's decoder reads it, each answer is
    the input's next frame (or, recording a seed, the model's answer)."""

    client_id = "fuzz"

    def __init__(self, wanted: Wanted, answer: Callable[[AbortedRangesRequest, int], bytes | None]) -> None:
        self.wanted = wanted
        self.answer = answer
        self.ids = itertools.count(1)
        #: Each exchange: the partitions asked for, and the response (None: bytes that are no response).
        self.exchanges: list[tuple[list[TopicPartition], AbortedRangesResponse | None]] = []

    def __call__(self, address: str, settings: dict[str, str]) -> _Broker:
        return self

    def __enter__(self) -> _Broker:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def next_correlation_id(self) -> int:
        return next(self.ids)

    def exchange(self, frame: bytes) -> bytes:
        request = decode_request(frame[FRAME_SIZE.size:], SERVED)   # a request the broker refuses is a finding
        body = request.body
        assert isinstance(body, AbortedRangesRequest)
        asked = [(topic, p.partition) for topic, partitions in body.topics for p in partitions]
        for topic, partitions in body.topics:
            for p in partitions:
                span = self.wanted.get((topic, p.partition))
                check(span is not None and span[0] <= p.from_offset and p.to_offset == span[1],
                      f"asked for {topic}/{p.partition} from {p.from_offset} to {p.to_offset}, wanted {span}")
        check(len(set(asked)) == len(asked), "a request names a partition twice")
        answer = self.answer(body, request.correlation_id)
        if answer is None:
            raise BrokerConnectionError("the broker closed the connection")
        self.exchanges.append((asked, _decoded(answer, request.correlation_id)))
        return answer


def _decoded(frame: bytes, correlation_id: int) -> AbortedRangesResponse | None:
    """The response in ``frame`` if it is one to the request (checked: within the bounds, re-encoding to the
    same bytes); None if it is not."""
    try:
        answered, response = wire.decode_response(frame)
    except KafkaProtocolError:
        return None
    answers = [p for _, ps in response.topics for p in ps]
    check(len(response.topics) <= PARTITIONS_MAX and len(answers) <= PARTITIONS_MAX
          and sum(len(p.ranges) for p in answers) <= RANGES_MAX, "a response beyond the bounds decoded")
    check(wire.encode_response(answered, response)[FRAME_SIZE.size:] == frame,
          "a decoded response re-encodes to other bytes")
    return response if answered == correlation_id else None


def _choices(reader: Reader) -> tuple[Wanted, dict[TopicPartition, str]]:
    """The partitions asked for, their spans and their leaders, from the input's first bytes."""
    count = 1 + reader.u8() % len(PARTITIONS)
    leaders_bits = reader.u8()
    wanted = {}
    for tp in PARTITIONS[:count]:
        start = reader.uint(2)
        wanted[tp] = (start, start + reader.uint(2))
    leaders = {tp: ADDRESSES[(leaders_bits >> n) & 1] for n, tp in enumerate(PARTITIONS[:count])}
    return wanted, leaders


def _input_answers(reader: Reader) -> Callable[[AbortedRangesRequest, int], bytes | None]:
    """Answers from the input: a control byte, a size (2 bytes, little-endian), the frame; None once the
    input is spent (the broker closed the connection)."""
    def answer(request: AbortedRangesRequest, correlation_id: int) -> bytes | None:
        if not reader.remaining:
            return None
        control = reader.u8()
        frame = reader.take(reader.uint(2))
        if control & ANSWERS_REQUEST and len(frame) >= FRAME_SIZE.size:
            frame = FRAME_SIZE.pack(correlation_id) + frame[FRAME_SIZE.size:]
        return frame
    return answer


def check_client(data: bytes) -> None:
    reader = Reader(data)
    wanted, leaders = _choices(reader)
    broker = _Broker(wanted, _input_answers(reader))
    found = aborted_ranges(lambda asked: {tp: leaders[tp] for tp in asked}, {}, wanted, broker)
    # It returned: so it took every answer, each of which must have been one whole, to its own request.
    sent: dict[TopicPartition, set[AbortedTxn]] = {tp: set() for tp in wanted}
    for asked, response in broker.exchanges:
        check(response is not None and response.error_code == 0,
              "the client took bytes that are no answer to its request, or a refusal")
        assert response is not None
        answered = [(topic, p.partition) for topic, ps in response.topics for p in ps]
        check(sorted(answered) == sorted(asked), f"the client took answers for {answered}, having asked {asked}")
        for topic, ps in response.topics:
            for p in ps:
                if p.error_code == 0:
                    sent[(topic, p.partition)].update(p.ranges)
    check(set(found) == set(wanted), f"ranges for {sorted(found)}, asked for {sorted(wanted)}")
    for tp, ranges in found.items():
        start, end = wanted[tp]
        check(all(a.last_offset < b.last_offset for a, b in itertools.pairwise(ranges)),
              f"{tp}'s ranges are not in strictly rising marker order")
        check(all(r.last_offset >= start and r.first_offset < end for r in ranges),
              f"{tp}: a range that does not overlap [{start}, {end})")
        check(set(ranges) == sent[tp], f"{tp}: the ranges returned are not those the broker sent")


class _Model:
    """An honest broker for recording seeds: each partition's ranges selected by the broker's own
    PartitionTxns, ``page_ranges`` to a response; partitions in ``moved`` answer NOT_LEADER_OR_FOLLOWER once.
    Its answers, recorded, make a seed."""

    def __init__(self, ranges: dict[TopicPartition, list[AbortedTxn]], page_ranges: int,
                 moved: frozenset[TopicPartition] = frozenset(), refused: bool = False) -> None:
        self.txns = PartitionTxns()
        self.ids = {tp: n for n, tp in enumerate(PARTITIONS)}
        for tp, listed in ranges.items():
            self.txns.restore(self.ids[tp], {}, [AbortedRange(r.last_offset, r.producer_id, r.first_offset)
                                                 for r in listed])
        self.page_ranges = page_ranges
        self.moved = set(moved)
        self.refused = refused
        self.recorded = bytearray()

    def answer(self, request: AbortedRangesRequest, correlation_id: int) -> bytes:
        if self.refused:
            response = AbortedRangesResponse(int(ErrorCode.cluster_authorization_failed), "refused")
        else:
            left = self.page_ranges
            topics = []
            for topic, partitions in request.topics:
                answers = []
                for p in partitions:
                    if (topic, p.partition) in self.moved:
                        self.moved.discard((topic, p.partition))
                        answers.append(PartitionRanges(p.partition, int(ErrorCode.not_leader_or_follower), -1,
                                                       False, ()))
                        continue
                    found = self.txns.aborted_ranges(self.ids[(topic, p.partition)], p.from_offset, p.to_offset)
                    taken = tuple(AbortedTxn(r.last_offset, r.producer_id, r.first_offset) for r in found[:left])
                    left -= len(taken)
                    answers.append(PartitionRanges(p.partition, 0, 1000, len(taken) < len(found), taken))
                topics.append((topic, tuple(answers)))
            response = AbortedRangesResponse(topics=tuple(topics))
        frame = wire.encode_response(correlation_id, response)[FRAME_SIZE.size:]
        self.recorded += bytes([ANSWERS_REQUEST]) + len(frame).to_bytes(2, "little") + frame
        return frame


def _session(spans: list[tuple[int, int]], leaders_bits: int, model: _Model) -> bytes:
    """A seed: the choices of ``spans`` (one per partition, in PARTITIONS' order) and leaders, then the
    model's answers to the client, recorded."""
    head = bytearray([len(spans) - 1, leaders_bits])
    for start, end in spans:
        head += start.to_bytes(2, "little") + (end - start).to_bytes(2, "little")
    reader = Reader(bytes(head))
    wanted, leaders = _choices(reader)
    with contextlib.suppress(BrokerReadError):   # a refusal's session is a seed too
        aborted_ranges(lambda asked: {tp: leaders[tp] for tp in asked}, {}, wanted, _Broker(wanted, model.answer))
    return bytes(head + model.recorded)


def client_seeds() -> list[bytes]:
    t0 = [AbortedTxn(12, 1, 3), AbortedTxn(20, 2, 15), AbortedTxn(31, 1, 25), AbortedTxn(60, 3, 40),
          AbortedTxn(75, 2, 70)]
    t1 = [AbortedTxn(55, 9, 45)]
    long_ones = [AbortedTxn(50, 1, 3), AbortedTxn(60, 2, 4), AbortedTxn(70, 3, 12)]
    return [
        _session([(0, 100)], 0, _Model({("t", 0): t0}, page_ranges=2)),
        _session([(10, 50), (0, 100), (7, 7)], 0b010, _Model({("t", 0): t0, ("t", 1): t1}, page_ranges=3)),
        _session([(0, 100), (50, 60)], 0, _Model({("t", 0): t0, ("t", 1): t1}, page_ranges=20,
                                                 moved=frozenset({("t", 1)}))),
        _session([(0, 10)], 0, _Model({("t", 0): long_ones}, page_ranges=1)),
        _session([(0, 100)], 0, _Model({}, page_ranges=1, refused=True)),
        bytes([0, 0, 0, 0, 100, 0, ANSWERS_REQUEST, 4, 0]) + b"\0\0\0\0",   # an answer cut short
    ]


TARGETS = (
    FuzzTarget("kafka_aborted_ranges", "codec.decode_request of StratalogAbortedRanges: bounds kept, re-encodes "
               "to the same bytes", check_request, (KafkaProtocolError, UnsupportedVersionError), request_seeds,
               input_bytes_max=REQUEST_INPUT_BYTES_MAX),
    FuzzTarget("spark_aborted_ranges", "the Spark driver's StratalogAbortedRanges client against a broker answering "
               "with the input: ranges it returns were sent and overlap what was asked, or BrokerReadError",
               check_client, (BrokerReadError,), client_seeds),
)
