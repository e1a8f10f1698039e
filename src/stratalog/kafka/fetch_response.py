"""Fetch responses encoded without copying their records: a frame as a list of pieces.

A Fetch response is almost all record bytes: the stored batches, returned whole. Encoding it through
``codec.encode_response`` copied each of them twice (joined per partition, then written into kio's
buffer), which for a 16 MiB fetch was most of the broker's time. This module writes the few bytes
around the records itself and hands the batches on untouched, as views of the stored bytes, so the
server can pass the pieces to a gather write (Kafka itself answers fetches with sendfile).

The layout is Kafka's FetchResponse.json, versions 4 to 18 (the ones the broker serves), and the bytes
are exactly kio's for the same values (tests compare them for every version):

    frame      = size:i32 header body
    header     = correlation_id:i32                 (v4-v11: response header v0)
               | correlation_id:i32 tags            (v12+: response header v1)
    body       = throttle_time_ms:i32 [error_code:i16 session_id:i32] (v7+) topics [tags] (v12+)
    topic      = name:string (v4-v12) | topic_id:uuid (v13+)   partitions [tags]
    partition  = partition_index:i32 error_code:i16 high_watermark:i64 last_stable_offset:i64
                 [log_start_offset:i64] (v5+) aborted_transactions [preferred_read_replica:i32] (v11+)
                 records:bytes [tags]
    aborted    = producer_id:i64 first_offset:i64 [tags]
    tags       = count:uvarint (tag:uvarint size:uvarint value)*

Up to v11 an array's or string's length is an i32 (an i16 for strings), -1 for null; from v12
(flexible) it is an unsigned varint of length + 1, 0 for null, and every struct ends with its tagged
fields. Tagged fields equal to their default are left out, as kio and Kafka leave them out; the ones
written here are a partition's current leader (tag 1, v12+: leader_id:i32 leader_epoch:i32 tags) and the
response's node endpoints (tag 0, v16+: an array of node_id:i32 host:string port:i32 rack:string tags),
which Kafka fills for a partition answered NOT_LEADER_OR_FOLLOWER or FENCED_LEADER_EPOCH (KIP-951).
Pure functions: no sockets.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from stratalog.invariant import invariant

FETCH_VERSION_MIN = 4
FETCH_VERSION_MAX = 18
#: The first flexible Fetch version (compact lengths, tagged fields, response header v1).
FETCH_FIRST_FLEXIBLE_VERSION = 12
#: Fields added after v4: log_start_offset (v5), top-level error_code and session_id (v7),
#: preferred_read_replica (v11), topic ids in place of names (v13, KIP-516), node endpoints (v16,
#: KIP-951).
LOG_START_OFFSET_VERSION = 5
SESSION_VERSION = 7
PREFERRED_READ_REPLICA_VERSION = 11
TOPIC_ID_VERSION = 13
NODE_ENDPOINTS_VERSION = 16
#: Tags of the tagged fields written: a partition's current leader, the response's node endpoints.
CURRENT_LEADER_TAG = 1
NODE_ENDPOINTS_TAG = 0
#: The topic id of a topic named by name, or of an answer without one.
NO_TOPIC_ID = uuid.UUID(int=0)

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
#: leader_id, leader_epoch (LeaderIdAndEpoch); node_id, and port (NodeEndpoint).
LEADER_AND_EPOCH = struct.Struct(">ii")
INT32 = struct.Struct(">i")
#: An empty tagged-field section: the unsigned varint 0.
NO_TAGGED_FIELDS = b"\0"
NULL_LENGTH = -1
#: Unsigned varints carry 7 bits a byte, the high bit set on every byte but the last.
VARINT_LOW_BITS = 0x7F
VARINT_MORE = 0x80

#: Fetch's and ListOffsets' isolation levels: read_uncommitted reads up to the high watermark,
#: read_committed up to the last stable offset (no record of a transaction still open).
READ_UNCOMMITTED, READ_COMMITTED = 0, 1


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
    #: The partition's leader as (leader_id, leader_epoch), for an answer that sends the client elsewhere
    #: (v12+; None: left out, as its default (-1, -1) is).
    current_leader: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class FetchTopicResult:
    topic: str
    partitions: Sequence[FetchPartitionResult]
    #: What names the topic from v13 on (``topic`` before).
    topic_id: uuid.UUID = NO_TOPIC_ID


@dataclass(frozen=True, slots=True)
class NodeEndpoint:
    """Where a broker named as a partition's current leader is reached (v16+)."""

    node_id: int
    host: str
    port: int
    rack: str | None = None


def encode_fetch_response(correlation_id: int, version: int, throttle_time_ms: int, error_code: int,
                          session_id: int, topics: Sequence[FetchTopicResult],
                          node_endpoints: Sequence[NodeEndpoint] = ()) -> list[bytes | memoryview]:
    """The whole response frame (its size first) as pieces: the bytes between the records, and each
    record view of ``topics`` itself (the same object). ``b"".join`` of them is the frame.
    ``error_code`` and ``session_id`` exist from v7 on and are left out before; ``node_endpoints`` from
    v16."""
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
        if version >= TOPIC_ID_VERSION:
            out.head += topic.topic_id.bytes
        else:
            _string(out.head, topic.topic, flexible)
        _array_length(out.head, len(topic.partitions), flexible)
        for partition in topic.partitions:
            _partition(out, partition, version, flexible)
        if flexible:
            out.head += NO_TAGGED_FIELDS
    if flexible:
        if node_endpoints and version >= NODE_ENDPOINTS_VERSION:
            _tagged(out.head, NODE_ENDPOINTS_TAG, _node_endpoints(node_endpoints))
        else:
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
        if p.current_leader is not None and p.current_leader != (-1, -1):
            _tagged(out.head, CURRENT_LEADER_TAG, LEADER_AND_EPOCH.pack(*p.current_leader) + NO_TAGGED_FIELDS)
        else:
            out.head += NO_TAGGED_FIELDS


def _tagged(head: bytearray, tag: int, value: bytes | bytearray) -> None:
    """A tagged-field section of one field."""
    _uvarint(head, 1)
    _uvarint(head, tag)
    _uvarint(head, len(value))
    head += value


def _node_endpoints(endpoints: Sequence[NodeEndpoint]) -> bytearray:
    out = bytearray()
    _array_length(out, len(endpoints), True)
    for e in endpoints:
        out += INT32.pack(e.node_id)
        _string(out, e.host, True)
        out += INT32.pack(e.port)
        if e.rack is None:
            _null_length(out, True)
        else:
            _string(out, e.rack, True)
        out += NO_TAGGED_FIELDS
    return out


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
