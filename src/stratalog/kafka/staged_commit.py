"""The broker's own requests for Spark jobs: StratalogCommitStaged (a write's staged objects become the
next records of partitions) and StratalogReplaceObjects (a compaction's staged objects take the place of
the objects they merge).

Kafka has no request for "these objects, already in your object storage, are the next records of these
partitions", so the broker serves one of its own under an API key Kafka does not use. It travels in a
Kafka frame with request header v1 (api key, version, correlation id, client id) and response header v0
(correlation id), so it shares the connection, TLS, SASL login, quotas and ACLs of every other request.
Clients that do not know it never send it; ApiVersions lists it like any API.

Bytes in, values out, no I/O (the broker's server and the Spark driver's client do that). Every count
and length is checked against the bytes left before anything is allocated. Integers are big-endian;
a string is an int16 length (-1: null) then UTF-8.

Request v0::

    sink_id        string (nullable)     streaming writes: the sink; null for a batch write
    batch_id       int64                 streaming writes: the micro-batch; -1 for a batch write
    object_count   int32
    objects        [partition int32 (the Spark task), key string, size_bytes int64,
                    stream_count int32, streams [name string ("topic/partition"), start int64, count int64]]

StratalogReplaceObjects request v0::

    replaced_count int32, replaced [key string]      objects under data/ that the staged ones replace
    staged_count   int32, staged [key string, size_bytes int64]

Response v0 (both)::

    throttle_time_ms int32, error_code int16, error_message string (nullable),
    committed int8 (0: the batch was committed before, nothing written), records int64, objects int32

StratalogCommitStaged v1 (a broker of a cluster answers per partition): the request is v0's; the response
is v0's, then what became of each partition the request named::

    partition_count int32
    partitions     [name string ("topic/partition"), error_code int16, error_message string (nullable),
                    committed int8, records int64]

A v1 response's top-level error refuses the whole request (malformed, or more objects than allowed); a
partition's error refuses that partition alone (NOT_LEADER_OR_FOLLOWER: another broker leads it, and its
staged objects are left as they were for the driver to send there). ``committed`` 0 with no error: the
sink's micro-batch was committed to that partition before. A v0 request is answered in v0 (one result).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from stratalog.kafka.codec import FRAME_SIZE
from stratalog.kafka.own_fields import I8, I16, I32, I64, FieldReader, framed, put_string

#: Outside the numbers Kafka gives its APIs (0 up; under 100 today), so no Kafka release takes it.
API_KEY = 32_000
API_NAME = "StratalogCommitStaged"
REPLACE_API_KEY = 32_001
REPLACE_API_NAME = "StratalogReplaceObjects"
#: StratalogReplaceObjects' one version, and the versions of StratalogCommitStaged (v1: per-partition results).
VERSION = 0
COMMIT_VERSION_MAX = 1
#: An object key is at most this long (keys the writers make are under 100 bytes).
KEY_BYTES_MAX = 1024

_HEADER_V1 = struct.Struct(">hhi")
#: The fewest bytes one object and one stream entry take (empty strings), bounding counts by bytes left.
_OBJECT_BYTES_MIN = 4 + 2 + 8 + 4
_STREAM_BYTES_MIN = 2 + 8 + 8
#: The fewest bytes one partition result of a v1 response takes (an empty name, a null message).
_RESULT_BYTES_MIN = 2 + 2 + 2 + 1 + 8


@dataclass(frozen=True, slots=True)
class StagedStreamEntry:
    name: str
    start: int
    count: int


@dataclass(frozen=True, slots=True)
class StagedObjectEntry:
    partition: int
    key: str
    size_bytes: int
    streams: tuple[StagedStreamEntry, ...]


@dataclass(frozen=True, slots=True)
class CommitStagedRequest:
    sink_id: str | None
    batch_id: int
    objects: tuple[StagedObjectEntry, ...]


@dataclass(frozen=True, slots=True)
class ReplaceObjectsRequest:
    replaced: tuple[str, ...]
    #: (key, size in bytes) of each staged object.
    staged: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class PartitionResult:
    """What became of one partition of a v1 request."""

    name: str
    error_code: int = 0
    error_message: str | None = None
    committed: bool = False
    records: int = 0


@dataclass(frozen=True, slots=True)
class CommitStagedResponse:
    error_code: int = 0
    error_message: str | None = None
    committed: bool = False
    records: int = 0
    objects: int = 0
    throttle_time_ms: int = 0
    #: v1 only: one entry per partition the request named.
    partitions: tuple[PartitionResult, ...] = ()


def decode_request_body(frame: bytes | memoryview, at: int) -> CommitStagedRequest:
    """The request body starting at byte ``at`` of ``frame``; KafkaProtocolError for bytes that are not one."""
    r = FieldReader(frame, at, API_NAME)
    sink_id = r.nullable_string()
    batch_id = r.fixed(I64)
    objects = []
    for _ in range(r.count(_OBJECT_BYTES_MIN, "objects")):
        partition = r.fixed(I32)
        key = r.string(KEY_BYTES_MAX)
        size_bytes = r.fixed(I64)
        streams = []
        for _ in range(r.count(_STREAM_BYTES_MIN, "streams")):
            name = r.string()
            streams.append(StagedStreamEntry(name, r.fixed(I64), r.fixed(I64)))
        objects.append(StagedObjectEntry(partition, str(key), size_bytes, tuple(streams)))
    return CommitStagedRequest(sink_id, batch_id, tuple(objects))


def decode_replace_body(frame: bytes | memoryview, at: int) -> ReplaceObjectsRequest:
    """A StratalogReplaceObjects body starting at byte ``at``; KafkaProtocolError for bytes that are not one."""
    r = FieldReader(frame, at, REPLACE_API_NAME)
    replaced = tuple(r.string(KEY_BYTES_MAX) for _ in range(r.count(2, "replaced objects")))
    staged = []
    for _ in range(r.count(2 + 8, "staged objects")):
        key = r.string(KEY_BYTES_MAX)
        staged.append((key, r.fixed(I64)))
    return ReplaceObjectsRequest(replaced, tuple(staged))


def encode_replace_request(correlation_id: int, client_id: str | None, request: ReplaceObjectsRequest) -> bytes:
    """The whole StratalogReplaceObjects frame, its size first."""
    out = bytearray(FRAME_SIZE.size)
    out += _HEADER_V1.pack(REPLACE_API_KEY, VERSION, correlation_id)
    put_string(out, client_id)
    out += I32.pack(len(request.replaced))
    for key in request.replaced:
        put_string(out, key)
    out += I32.pack(len(request.staged))
    for key, size in request.staged:
        put_string(out, key)
        out += I64.pack(size)
    return framed(out)


def encode_request(correlation_id: int, client_id: str | None, request: CommitStagedRequest,
                   version: int = COMMIT_VERSION_MAX) -> bytes:
    """The whole request frame, its size first (v0 and v1 carry the same body)."""
    if not 0 <= version <= COMMIT_VERSION_MAX:
        raise ValueError(f"{API_NAME} has versions 0 to {COMMIT_VERSION_MAX}, not {version}")
    out = bytearray(FRAME_SIZE.size)
    out += _HEADER_V1.pack(API_KEY, version, correlation_id)
    put_string(out, client_id)
    put_string(out, request.sink_id)
    out += I64.pack(request.batch_id) + I32.pack(len(request.objects))
    for o in request.objects:
        out += I32.pack(o.partition)
        put_string(out, o.key)
        out += I64.pack(o.size_bytes) + I32.pack(len(o.streams))
        for s in o.streams:
            put_string(out, s.name)
            out += I64.pack(s.start) + I64.pack(s.count)
    return framed(out)


def encode_response(correlation_id: int, response: CommitStagedResponse, version: int = 0) -> bytes:
    """The whole response frame, its size first; v1 adds the partitions' results (StratalogReplaceObjects
    answers v0)."""
    out = bytearray(FRAME_SIZE.size)
    out += I32.pack(correlation_id) + I32.pack(response.throttle_time_ms) + I16.pack(response.error_code)
    put_string(out, response.error_message)
    out += I8.pack(1 if response.committed else 0) + I64.pack(response.records) + I32.pack(response.objects)
    if version >= 1:
        out += I32.pack(len(response.partitions))
        for p in response.partitions:
            put_string(out, p.name)
            out += I16.pack(p.error_code)
            put_string(out, p.error_message)
            out += I8.pack(1 if p.committed else 0) + I64.pack(p.records)
    return framed(out)


def decode_response(frame: bytes | memoryview, version: int = 0) -> tuple[int, CommitStagedResponse]:
    """(correlation id, response) of a response frame without its size, as the request's ``version``
    is answered."""
    r = FieldReader(frame, 0, API_NAME)
    correlation_id = r.fixed(I32)
    throttle = r.fixed(I32)
    error_code = r.fixed(I16)
    message = r.nullable_string()
    committed = r.fixed(I8) != 0
    records, objects = r.fixed(I64), r.fixed(I32)
    partitions = []
    if version >= 1:
        for _ in range(r.count(_RESULT_BYTES_MIN, "partition results")):
            name = r.string()
            code = r.fixed(I16)
            text = r.nullable_string()
            done = r.fixed(I8) != 0
            partitions.append(PartitionResult(name, code, text, done, r.fixed(I64)))
    return correlation_id, CommitStagedResponse(error_code, message, committed, records, objects, throttle,
                                                tuple(partitions))
