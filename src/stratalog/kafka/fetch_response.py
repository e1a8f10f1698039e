"""Fetch responses encoded without copying their records: a frame as a list of pieces.

A Fetch response is almost all record bytes: the stored batches, returned whole. Encoding it through
``codec.encode_response`` copied each of them twice (joined per partition, then written into kio's
buffer), which for a 16 MiB fetch was most of the broker's time. This module writes the few bytes
around the records itself and hands the batches on untouched, as views of the stored bytes, so the
server can pass the pieces to a gather write (Kafka itself answers fetches with sendfile).

The layout is Kafka's FetchResponse.json, versions 4 to 12 (the ones the broker serves), and the bytes
are exactly kio's for the same values (tests compare them for every version):

    frame      = size:i32 header body
    header     = correlation_id:i32                 (v4-v11: response header v0)
               | correlation_id:i32 tags            (v12: response header v1)
    body       = throttle_time_ms:i32 [error_code:i16 session_id:i32] (v7+) topics [tags]
    topic      = name:string partitions [tags]
    partition  = partition_index:i32 error_code:i16 high_watermark:i64 last_stable_offset:i64
                 [log_start_offset:i64] (v5+) aborted_transactions [preferred_read_replica:i32] (v11+)
                 records:bytes [tags]
    aborted    = producer_id:i64 first_offset:i64 [tags]

Up to v11 an array's or string's length is an i32 (an i16 for strings), -1 for null; from v12
(flexible) it is an unsigned varint of length + 1, 0 for null, and every struct ends with its tagged
fields, written here as an empty section (the default-valued tagged fields of v12 are left out, as kio
and Kafka leave them out). Pure functions: no sockets.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from stratalog.invariant import invariant

FETCH_VERSION_MIN = 4
FETCH_VERSION_MAX = 12
#: The first flexible Fetch version (compact lengths, tagged fields, response header v1).
FETCH_FIRST_FLEXIBLE_VERSION = 12
#: Fields added after v4: log_start_offset (v5), top-level error_code and session_id (v7),
#: preferred_read_replica (v11).
LOG_START_OFFSET_VERSION = 5
SESSION_VERSION = 7
PREFERRED_READ_REPLICA_VERSION = 11

FRAME_SIZE = struct.Struct(">i")
CORRELATION_ID = struct.Struct(">i")
THROTTLE = struct.Struct(">i")
THROTTLE_ERROR_SESSION = struct.Struct(">ihi")
ARRAY_LENGTH = struct.Struct(">i")
STRING_LENGTH = struct.Struct(">h")
BYTES_LENGTH = struct.Struct(">i")
#: partition_index, error_code, high_watermark, last_stable_offset (v4).
PARTITION_V4 = struct.Struct(">ihqq")
#: ... and log_start_offset (v5 on).
PARTITION_V5 = struct.Struct(">ihqqq")
ABORTED_TRANSACTION = struct.Struct(">qq")
PREFERRED_READ_REPLICA = struct.Struct(">i")
#: An empty tagged-field section: the unsigned varint 0.
NO_TAGGED_FIELDS = b"\0"
NULL_LENGTH = -1
#: Unsigned varints carry 7 bits a byte, the high bit set on every byte but the last.
VARINT_LOW_BITS = 0x7F
VARINT_MORE = 0x80


@dataclass(frozen=True, slots=True)
class AbortedTransaction:
    producer_id: int
    first_offset: int


@dataclass(frozen=True, slots=True)
class FetchPartitionResult:
    """One partition of a Fetch response. ``records``: the stored batches, each whole, in order; they
    are passed on as they are (not joined, not copied)."""

    partition_index: int
    error_code: int
    high_watermark: int
    last_stable_offset: int = -1
    log_start_offset: int = -1
    preferred_read_replica: int = -1
    aborted_transactions: Sequence[AbortedTransaction] | None = None
    records: Sequence[bytes | memoryview] = ()


@dataclass(frozen=True, slots=True)
class FetchTopicResult:
    topic: str
    partitions: Sequence[FetchPartitionResult]


def encode_fetch_response(correlation_id: int, version: int, throttle_time_ms: int, error_code: int,
                          session_id: int, topics: Sequence[FetchTopicResult]) -> list[bytes | memoryview]:
    """The whole response frame (its size first) as pieces: the bytes between the records, and each
    record view of ``topics`` itself (the same object). ``b"".join`` of them is the frame.
    ``error_code`` and ``session_id`` exist from v7 on and are left out before."""
    invariant(FETCH_VERSION_MIN <= version <= FETCH_VERSION_MAX, f"Fetch v{version} is not encoded here")
    flexible = version >= FETCH_FIRST_FLEXIBLE_VERSION
    out = _Pieces()
    head = out.head
    head += CORRELATION_ID.pack(correlation_id)
    if flexible:
        head += NO_TAGGED_FIELDS  # response header v1
    if version >= SESSION_VERSION:
        head += THROTTLE_ERROR_SESSION.pack(throttle_time_ms, error_code, session_id)
    else:
        head += THROTTLE.pack(throttle_time_ms)
    _array_length(out.head, len(topics), flexible)
    for topic in topics:
        _string(out.head, topic.topic, flexible)
        _array_length(out.head, len(topic.partitions), flexible)
        for partition in topic.partitions:
            _partition(out, partition, version, flexible)
        if flexible:
            out.head += NO_TAGGED_FIELDS
    if flexible:
        out.head += NO_TAGGED_FIELDS
    return out.finish()


class _Pieces:
    """The frame being built: finished pieces, and the header bytes since the last record view."""

    def __init__(self) -> None:
        self.pieces: list[bytes | memoryview] = []
        self.head = bytearray(FRAME_SIZE.size)  # the size, filled in by finish
        self.size_bytes = 0

    def records(self, views: Sequence[bytes | memoryview]) -> None:
        self._flush()
        for view in views:
            self.pieces.append(view)
            self.size_bytes += len(view)

    def finish(self) -> list[bytes | memoryview]:
        self._flush()
        first = self.pieces[0]
        invariant(isinstance(first, bytes), "a frame starts with its header")
        self.pieces[0] = FRAME_SIZE.pack(self.size_bytes - FRAME_SIZE.size) + first[FRAME_SIZE.size:]
        return self.pieces

    def _flush(self) -> None:
        if self.head:
            self.pieces.append(bytes(self.head))
            self.size_bytes += len(self.head)
            self.head = bytearray()


def _partition(out: _Pieces, p: FetchPartitionResult, version: int, flexible: bool) -> None:
    head = out.head
    if version >= LOG_START_OFFSET_VERSION:
        head += PARTITION_V5.pack(p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset,
                                  p.log_start_offset)
    else:
        head += PARTITION_V4.pack(p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset)
    aborted = p.aborted_transactions
    if aborted is None:
        _null_length(head, flexible)
    else:
        _array_length(head, len(aborted), flexible)
        for a in aborted:
            head += ABORTED_TRANSACTION.pack(a.producer_id, a.first_offset)
            if flexible:
                head += NO_TAGGED_FIELDS
    if version >= PREFERRED_READ_REPLICA_VERSION:
        head += PREFERRED_READ_REPLICA.pack(p.preferred_read_replica)
    records_bytes = sum(len(view) for view in p.records)
    if flexible:
        _uvarint(head, records_bytes + 1)
    else:
        head += BYTES_LENGTH.pack(records_bytes)
    out.records(p.records)
    if flexible:
        out.head += NO_TAGGED_FIELDS


def _array_length(head: bytearray, length: int, flexible: bool) -> None:
    if flexible:
        _uvarint(head, length + 1)
    else:
        head += ARRAY_LENGTH.pack(length)


def _null_length(head: bytearray, flexible: bool) -> None:
    if flexible:
        _uvarint(head, 0)
    else:
        head += ARRAY_LENGTH.pack(NULL_LENGTH)


def _string(head: bytearray, value: str, flexible: bool) -> None:
    encoded = value.encode()
    if flexible:
        _uvarint(head, len(encoded) + 1)
    else:
        head += STRING_LENGTH.pack(len(encoded))
    head += encoded


def _uvarint(head: bytearray, value: int) -> None:
    invariant(value >= 0, f"an unsigned varint of {value}")
    while value > VARINT_LOW_BITS:
        head.append((value & VARINT_LOW_BITS) | VARINT_MORE)
        value >>= 7
    head.append(value)
