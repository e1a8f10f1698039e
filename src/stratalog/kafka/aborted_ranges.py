"""The broker's own request StratalogAbortedRanges: the aborted transactions of partitions over offset ranges.

A Spark read of a live broker reads uploaded records from objects, not through Fetch, so no Fetch response
tells it which of them an aborted transaction wrote. Kafka has no request that lists a partition's aborted
transactions over an offset range (Fetch lists them only for the records it sends), so the broker serves
one of its own, beside StratalogCommitStaged (kafka/staged_commit.py: the same framing, request header v1
and response header v0, so TLS, SASL, quotas and ACLs apply). The partition's leader answers from what it
keeps of its transactions (broker/txn_partitions.py), as it answers Fetch read_committed.

Bytes in, values out, no I/O (broker/api_txn_ranges.py serves it; spark/txn_ranges.py asks it). Every
count is checked against its bound and against the bytes left, and every length against the bytes left,
before anything is allocated; a frame with bytes after its body is refused (only stratalog's own client
sends this request, and it writes none), so whatever decodes re-encodes to the same bytes. Integers are
big-endian; a string is an int16 length (-1: null) then UTF-8; ``more`` is 0 or 1.

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

Bounds: a request names at most PARTITIONS_MAX partitions (and topics), each topic name at most
TOPIC_NAME_BYTES_MAX bytes; a response answers as many and lists at most RANGES_MAX ranges in all. Either
side refuses a frame beyond them as a protocol error.

A partition's ranges are those whose abort marker is at or after ``from_offset`` (``last_offset >=
from_offset``) and whose transaction began before ``to_offset`` (``first_offset < to_offset``): those
overlapping ``[from_offset, to_offset)``. They come ordered by ``last_offset``; ``more`` = 1 says the
response had no room for the rest, which a request from the last one's ``last_offset + 1`` with the same
``to_offset`` lists (every range left out ends after it). That ``from_offset`` may lie past ``to_offset``
(a range listed may end past the offsets asked); the same rule still selects the rest. Offsets are never
negative.

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

from stratalog.invariant import invariant
from stratalog.kafka.codec import FRAME_SIZE
from stratalog.kafka.own_fields import I8, I16, I32, I64, FieldReader, framed, put_string

#: The next of the broker's own keys (kafka/staged_commit.py has 32000 and 32001).
API_KEY = 32_002
API_NAME = "StratalogAbortedRanges"
VERSION = 0
#: Partitions one request may name, and topics (an empty topic is bounded alike): the client's response
#: bound (kafka/client.py RESPONSE_BYTES_MAX, 1 MiB) must hold their answers (19 bytes each, and 255 for a
#: topic's name and count: 274 KB at most) beside RANGES_MAX ranges.
PARTITIONS_MAX = 1_000
#: Ranges one response holds at most (24 bytes each: 480 KB); a partition with more is paged (``more``).
RANGES_MAX = 20_000
#: Kafka's longest topic name (ASCII): a longer one names no topic.
TOPIC_NAME_BYTES_MAX = 249

_HEADER_V1 = struct.Struct(">hhi")
#: The fewest bytes a topic, a wanted partition, a partition's answer and a range take.
_TOPIC_BYTES_MIN = 2 + 4
_WANTED_BYTES = 4 + 8 + 8
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
    """A partition asked for: its ranges with a marker at or after ``from_offset`` that began before
    ``to_offset`` (the module docstring says why ``from_offset`` may pass ``to_offset``)."""

    partition: int
    from_offset: int
    to_offset: int


@dataclass(frozen=True, slots=True)
class AbortedRangesRequest:
    """The partitions asked for, by topic: at most PARTITIONS_MAX in all."""

    #: (topic, its partitions) pairs.
    topics: tuple[tuple[str, tuple[WantedPartition, ...]], ...]

    @property
    def partitions(self) -> int:
        return sum(len(parts) for _, parts in self.topics)


@dataclass(frozen=True, slots=True)
class PartitionRanges:
    """One partition's answer: an error (Kafka's codes), or its last stable offset and ranges."""

    partition: int
    error_code: int
    last_stable_offset: int
    #: The response had no room for every range: ask again from the last one's last_offset + 1.
    more: bool
    ranges: tuple[AbortedTxn, ...]


@dataclass(frozen=True, slots=True)
class AbortedRangesResponse:
    """A response: a request-wide error, or each topic's partitions' answers (RANGES_MAX ranges at most)."""

    error_code: int = 0
    error_message: str | None = None
    topics: tuple[tuple[str, tuple[PartitionRanges, ...]], ...] = ()
    throttle_time_ms: int = 0


def _topic_name(out: bytearray, name: str) -> None:
    # Paired with the reader's bound: a name no topic can have never goes out (the caller's bug).
    invariant(len(name.encode()) <= TOPIC_NAME_BYTES_MAX, f"topic name {name[:40]!r}... longer than a topic's")
    put_string(out, name)


# The request ------------------------------------------------------------------------------------------


def encode_request(correlation_id: int, client_id: str | None, request: AbortedRangesRequest) -> bytes:
    """The whole request frame, its size first. At most PARTITIONS_MAX partitions (the caller splits)."""
    invariant(request.partitions <= PARTITIONS_MAX and len(request.topics) <= PARTITIONS_MAX,
              f"{request.partitions} partitions in one {API_NAME} request; at most {PARTITIONS_MAX}")
    out = bytearray(FRAME_SIZE.size)
    out += _HEADER_V1.pack(API_KEY, VERSION, correlation_id)
    put_string(out, client_id)
    out += I32.pack(len(request.topics))
    for name, partitions in request.topics:
        _topic_name(out, name)
        out += I32.pack(len(partitions))
        for p in partitions:
            out += I32.pack(p.partition) + I64.pack(p.from_offset) + I64.pack(p.to_offset)
    return framed(out)


def decode_request_body(frame: bytes | memoryview, at: int) -> AbortedRangesRequest:
    """The request body starting at byte ``at`` of ``frame`` and ending with it; KafkaProtocolError for
    bytes that are not one, or for a request beyond PARTITIONS_MAX."""
    r = FieldReader(frame, at, API_NAME)
    topics = []
    left = PARTITIONS_MAX   # partitions the rest of the request may still name
    for _ in range(r.count(_TOPIC_BYTES_MIN, "topics", PARTITIONS_MAX)):
        name = r.string(TOPIC_NAME_BYTES_MAX)
        count = r.count(_WANTED_BYTES, f"partitions of {name!r} (of {PARTITIONS_MAX} in all)", left)
        left -= count
        partitions = tuple(WantedPartition(r.fixed(I32), r.fixed(I64), r.fixed(I64)) for _ in range(count))
        topics.append((name, partitions))
    r.end()
    return AbortedRangesRequest(tuple(topics))


# The response -----------------------------------------------------------------------------------------


def encode_response(correlation_id: int, response: AbortedRangesResponse) -> bytes:
    """The whole response frame, its size first. Within the bounds the reader checks (the caller's)."""
    partitions = sum(len(ps) for _, ps in response.topics)
    ranges = sum(len(p.ranges) for _, ps in response.topics for p in ps)
    invariant(partitions <= PARTITIONS_MAX and len(response.topics) <= PARTITIONS_MAX and ranges <= RANGES_MAX,
              f"a {API_NAME} response of {partitions} partitions and {ranges} ranges")
    out = bytearray(FRAME_SIZE.size)
    out += I32.pack(correlation_id) + I32.pack(response.throttle_time_ms) + I16.pack(response.error_code)
    put_string(out, response.error_message)
    out += I32.pack(len(response.topics))
    for name, answers in response.topics:
        _topic_name(out, name)
        out += I32.pack(len(answers))
        for p in answers:
            out += (I32.pack(p.partition) + I16.pack(p.error_code) + I64.pack(p.last_stable_offset)
                    + I8.pack(1 if p.more else 0) + I32.pack(len(p.ranges)))
            for r in p.ranges:
                out += I64.pack(r.producer_id) + I64.pack(r.first_offset) + I64.pack(r.last_offset)
    return framed(out)


def decode_response(frame: bytes | memoryview) -> tuple[int, AbortedRangesResponse]:
    """(correlation id, response) of a response frame without its size; KafkaProtocolError for bytes that
    are not one, or for a response beyond PARTITIONS_MAX or RANGES_MAX."""
    r = FieldReader(frame, 0, API_NAME)
    correlation_id = r.fixed(I32)
    throttle_ms = r.fixed(I32)
    error_code = r.fixed(I16)
    message = r.nullable_string()
    topics = []
    partitions_left, ranges_left = PARTITIONS_MAX, RANGES_MAX
    for _ in range(r.count(_TOPIC_BYTES_MIN, "topics", PARTITIONS_MAX)):
        name = r.string(TOPIC_NAME_BYTES_MAX)
        count = r.count(_ANSWER_BYTES_MIN, f"partitions of {name!r} (of {PARTITIONS_MAX} in all)", partitions_left)
        partitions_left -= count
        answers = []
        for _ in range(count):
            partition, code, stable, more = r.fixed(I32), r.fixed(I16), r.fixed(I64), r.flag()
            ranges = []
            for _ in range(r.count(_RANGE_BYTES, f"ranges (of {RANGES_MAX} in all)", ranges_left)):
                producer_id, first = r.fixed(I64), r.fixed(I64)
                ranges.append(AbortedTxn(r.fixed(I64), producer_id, first))
            ranges_left -= len(ranges)
            answers.append(PartitionRanges(partition, code, stable, more, tuple(ranges)))
        topics.append((name, tuple(answers)))
    r.end()
    return correlation_id, AbortedRangesResponse(error_code, message, tuple(topics), throttle_ms)
