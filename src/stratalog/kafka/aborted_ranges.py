"""The broker's own request StratalogAbortedRanges: the aborted transactions of partitions over offset ranges.

A Spark read of a live broker reads uploaded records from objects, not through Fetch, so no Fetch response
tells it which of them an aborted transaction wrote. Kafka has no request that lists a partition's aborted
transactions over an offset range (Fetch lists them only for the records it sends), so the broker serves
one of its own, beside StratalogCommitStaged (kafka/staged_commit.py: the same framing, request header v1
and response header v0, so TLS, SASL, quotas and ACLs apply). The partition's leader answers from what it
keeps of its transactions (broker/txn_partitions.py), as it answers Fetch read_committed.

Bytes in, values out, no I/O (broker/api_txn_ranges.py serves it; spark/txn_ranges.py asks it). Every
count and length is checked against the bytes left before anything is allocated. Integers are big-endian;
a string is an int16 length (-1: null) then UTF-8.

Request v0::

    topic_count      int32
    topics           [name string, partition_count int32,
                      partitions [partition int32, from_offset int64, to_offset int64]]

Response v0::

    throttle_time_ms int32, error_code int16, error_message string (nullable),
    topic_count      int32
    topics           [name string, partition_count int32,
                      partitions [partition int32, error_code int16, last_stable_offset int64,
                                  more int8, range_count int32,
                                  ranges [producer_id int64, first_offset int64, last_offset int64]]]

A partition's ranges are those overlapping ``[from_offset, to_offset)``: the producer's transactional
batches from ``first_offset`` up to its abort marker at ``last_offset`` were aborted. They come ordered by
``last_offset``; ``more`` = 1 says the response had no room for the rest, which a request from the last
one's ``last_offset + 1`` lists (no range is lost that way: every range left out ends after it).

Worked example: correlation id 7, client id ``"s"``, topic ``"t"`` partition 1 from 0 to 100 (46 bytes)::

    00 00 00 2a  7d 02  00 00  00 00 00 07  00 01 73    size 42; key 32002, version 0, id 7, "s"
    00 00 00 01  00 01 74  00 00 00 01                  one topic "t", one partition
    00 00 00 01  00 00 00 00 00 00 00 00                partition 1, from 0
    00 00 00 00 00 00 00 64                             to 100

and its answer, one range (producer 3 from offset 12 to its abort marker at 40), stable up to 90 (70 bytes)::

    00 00 00 42  00 00 00 07  00 00 00 00  00 00  ff ff size 66; id 7, no throttle, no error, null message
    00 00 00 01  00 01 74  00 00 00 01                  one topic "t", one partition
    00 00 00 01  00 00  00 00 00 00 00 00 00 5a  00     partition 1, no error, stable 90, no more
    00 00 00 01  00 00 00 00 00 00 00 03                one range: producer 3,
    00 00 00 00 00 00 00 0c  00 00 00 00 00 00 00 28    first offset 12, last offset 40
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from stratalog.kafka.codec import FRAME_SIZE, KafkaProtocolError
from stratalog.kafka.records import INT16_MAX

#: The next of the broker's own keys (kafka/staged_commit.py has 32000 and 32001).
API_KEY = 32_002
API_NAME = "StratalogAbortedRanges"
VERSION = 0
#: Partitions one request may name: the client's response bound (kafka/client.py RESPONSE_BYTES_MAX,
#: 1 MiB) must hold their entries (at most 19 bytes each, and 255 of topic name) beside RANGES_MAX ranges.
PARTITIONS_MAX = 1_000
#: Ranges one response holds at most (24 bytes each: 480 KB); a partition with more is paged (``more``).
RANGES_MAX = 20_000
#: Kafka's longest topic name (ASCII): a longer one names no topic.
TOPIC_NAME_BYTES_MAX = 249

_I8, _I16, _I32, _I64 = struct.Struct(">b"), struct.Struct(">h"), struct.Struct(">i"), struct.Struct(">q")
_HEADER_V1 = struct.Struct(">hhi")
#: The fewest bytes a topic, a wanted partition, a partition's answer and a range take.
_TOPIC_BYTES_MIN = 2 + 4
_WANTED_BYTES_MIN = 4 + 8 + 8
_ANSWER_BYTES_MIN = 4 + 2 + 8 + 1 + 4
_RANGE_BYTES = 8 + 8 + 8


@dataclass(frozen=True, slots=True, order=True)
class AbortedTxn:
    """``producer_id``'s transactional batches from ``first_offset`` up to its abort marker at
    ``last_offset`` were aborted. Ordered by marker, as the broker sends them."""

    last_offset: int
    producer_id: int
    first_offset: int


@dataclass(frozen=True, slots=True)
class WantedPartition:
    partition: int
    from_offset: int
    to_offset: int


@dataclass(frozen=True, slots=True)
class AbortedRangesRequest:
    #: (topic, its partitions) pairs.
    topics: tuple[tuple[str, tuple[WantedPartition, ...]], ...]

    @property
    def partitions(self) -> int:
        return sum(len(parts) for _, parts in self.topics)


@dataclass(frozen=True, slots=True)
class PartitionRanges:
    partition: int
    error_code: int
    last_stable_offset: int
    #: The response had no room for every range: ask again from the last one's last_offset + 1.
    more: bool
    ranges: tuple[AbortedTxn, ...]


@dataclass(frozen=True, slots=True)
class AbortedRangesResponse:
    error_code: int = 0
    error_message: str | None = None
    topics: tuple[tuple[str, tuple[PartitionRanges, ...]], ...] = ()
    throttle_time_ms: int = 0


class _Reader:
    def __init__(self, data: bytes | memoryview, at: int) -> None:
        self.data = memoryview(data)
        self.at = at

    def left(self) -> int:
        return len(self.data) - self.at

    def fixed(self, fmt: struct.Struct) -> int:
        if self.left() < fmt.size:
            raise KafkaProtocolError(f"{API_NAME}: the frame ends inside a field at byte {self.at}")
        (value,) = fmt.unpack_from(self.data, self.at)
        self.at += fmt.size
        return int(value)

    def string(self, nullable: bool = False, bytes_max: int = INT16_MAX) -> str | None:
        length = self.fixed(_I16)
        if length == -1 and nullable:
            return None
        if length < 0 or length > self.left() or length > bytes_max:
            raise KafkaProtocolError(f"{API_NAME}: a string of {length} bytes at byte {self.at} (bytes left: "
                                     f"{self.left()}, at most {bytes_max})")
        raw = bytes(self.data[self.at:self.at + length])
        self.at += length
        try:
            return raw.decode()
        except UnicodeDecodeError as e:
            raise KafkaProtocolError(f"{API_NAME}: a string that is not UTF-8 ({e})") from None

    def count(self, entry_bytes_min: int, what: str) -> int:
        n = self.fixed(_I32)
        if n < 0 or n * entry_bytes_min > self.left():
            raise KafkaProtocolError(f"{API_NAME}: {n} {what} cannot fit the {self.left()} bytes left")
        return n


def _string(out: bytearray, value: str | None) -> None:
    if value is None:
        out += _I16.pack(-1)
        return
    raw = value.encode()
    if len(raw) > INT16_MAX:
        raise ValueError(f"a string of {len(raw)} bytes does not fit an int16 length")
    out += _I16.pack(len(raw)) + raw


def _framed(out: bytearray) -> bytes:
    FRAME_SIZE.pack_into(out, 0, len(out) - FRAME_SIZE.size)
    return bytes(out)


# The request ------------------------------------------------------------------------------------------


def encode_request(correlation_id: int, client_id: str | None, request: AbortedRangesRequest) -> bytes:
    """The whole request frame, its size first."""
    out = bytearray(FRAME_SIZE.size)
    out += _HEADER_V1.pack(API_KEY, VERSION, correlation_id)
    _string(out, client_id)
    out += _I32.pack(len(request.topics))
    for name, partitions in request.topics:
        _string(out, name)
        out += _I32.pack(len(partitions))
        for p in partitions:
            out += _I32.pack(p.partition) + _I64.pack(p.from_offset) + _I64.pack(p.to_offset)
    return _framed(out)


def decode_request_body(frame: bytes | memoryview, at: int) -> AbortedRangesRequest:
    """The request body starting at byte ``at`` of ``frame``; KafkaProtocolError for bytes that are not one."""
    r = _Reader(frame, at)
    topics = []
    for _ in range(r.count(_TOPIC_BYTES_MIN, "topics")):
        name = str(r.string(bytes_max=TOPIC_NAME_BYTES_MAX))
        partitions = tuple(WantedPartition(r.fixed(_I32), r.fixed(_I64), r.fixed(_I64))
                           for _ in range(r.count(_WANTED_BYTES_MIN, "partitions")))
        topics.append((name, partitions))
    return AbortedRangesRequest(tuple(topics))


# The response -----------------------------------------------------------------------------------------


def encode_response(correlation_id: int, response: AbortedRangesResponse) -> bytes:
    """The whole response frame, its size first."""
    out = bytearray(FRAME_SIZE.size)
    out += _I32.pack(correlation_id) + _I32.pack(response.throttle_time_ms) + _I16.pack(response.error_code)
    _string(out, response.error_message)
    out += _I32.pack(len(response.topics))
    for name, partitions in response.topics:
        _string(out, name)
        out += _I32.pack(len(partitions))
        for p in partitions:
            out += (_I32.pack(p.partition) + _I16.pack(p.error_code) + _I64.pack(p.last_stable_offset)
                    + _I8.pack(1 if p.more else 0) + _I32.pack(len(p.ranges)))
            for r in p.ranges:
                out += _I64.pack(r.producer_id) + _I64.pack(r.first_offset) + _I64.pack(r.last_offset)
    return _framed(out)


def decode_response(frame: bytes | memoryview) -> tuple[int, AbortedRangesResponse]:
    """(correlation id, response) of a response frame without its size; KafkaProtocolError for bytes that
    are not one."""
    r = _Reader(frame, 0)
    correlation_id = r.fixed(_I32)
    throttle_ms = r.fixed(_I32)
    error_code = r.fixed(_I16)
    message = r.string(nullable=True)
    topics = []
    for _ in range(r.count(_TOPIC_BYTES_MIN, "topics")):
        name = str(r.string(bytes_max=TOPIC_NAME_BYTES_MAX))
        partitions = []
        for _ in range(r.count(_ANSWER_BYTES_MIN, "partitions")):
            partition, code, stable, more = r.fixed(_I32), r.fixed(_I16), r.fixed(_I64), r.fixed(_I8) != 0
            ranges = []
            for _ in range(r.count(_RANGE_BYTES, "ranges")):
                producer_id, first = r.fixed(_I64), r.fixed(_I64)
                ranges.append(AbortedTxn(r.fixed(_I64), producer_id, first))
            partitions.append(PartitionRanges(partition, code, stable, more, tuple(ranges)))
        topics.append((name, tuple(partitions)))
    return correlation_id, AbortedRangesResponse(error_code, message, tuple(topics), throttle_ms)
