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
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from stratalog.kafka.codec import FRAME_SIZE, KafkaProtocolError
from stratalog.kafka.records import INT16_MAX

#: Outside the numbers Kafka gives its APIs (0 up; under 100 today), so no Kafka release takes it.
API_KEY = 32_000
API_NAME = "StratalogCommitStaged"
REPLACE_API_KEY = 32_001
REPLACE_API_NAME = "StratalogReplaceObjects"
VERSION = 0
#: An object key is at most this long (keys the writers make are under 100 bytes).
KEY_BYTES_MAX = 1024

_I8, _I16, _I32, _I64 = struct.Struct(">b"), struct.Struct(">h"), struct.Struct(">i"), struct.Struct(">q")
_HEADER_V1 = struct.Struct(">hhi")
#: The fewest bytes one object and one stream entry take (empty strings), bounding counts by bytes left.
_OBJECT_BYTES_MIN = 4 + 2 + 8 + 4
_STREAM_BYTES_MIN = 2 + 8 + 8


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
class CommitStagedResponse:
    error_code: int = 0
    error_message: str | None = None
    committed: bool = False
    records: int = 0
    objects: int = 0
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

    def string(self, nullable: bool = False, bytes_max: int | None = None) -> str | None:
        length = self.fixed(_I16)
        if length == -1 and nullable:
            return None
        if length < 0 or length > self.left() or (bytes_max is not None and length > bytes_max):
            raise KafkaProtocolError(f"{API_NAME}: a string of {length} bytes at byte {self.at} (bytes left: "
                                     f"{self.left()})")
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


def decode_request_body(frame: bytes | memoryview, at: int) -> CommitStagedRequest:
    """The request body starting at byte ``at`` of ``frame``; KafkaProtocolError for bytes that are not one."""
    r = _Reader(frame, at)
    sink_id = r.string(nullable=True)
    batch_id = r.fixed(_I64)
    objects = []
    for _ in range(r.count(_OBJECT_BYTES_MIN, "objects")):
        partition = r.fixed(_I32)
        key = r.string(bytes_max=KEY_BYTES_MAX)
        size_bytes = r.fixed(_I64)
        streams = []
        for _ in range(r.count(_STREAM_BYTES_MIN, "streams")):
            name = r.string()
            streams.append(StagedStreamEntry(str(name), r.fixed(_I64), r.fixed(_I64)))
        objects.append(StagedObjectEntry(partition, str(key), size_bytes, tuple(streams)))
    return CommitStagedRequest(sink_id, batch_id, tuple(objects))


def decode_replace_body(frame: bytes | memoryview, at: int) -> ReplaceObjectsRequest:
    """A StratalogReplaceObjects body starting at byte ``at``; KafkaProtocolError for bytes that are not one."""
    r = _Reader(frame, at)
    replaced = tuple(str(r.string(bytes_max=KEY_BYTES_MAX)) for _ in range(r.count(2, "replaced objects")))
    staged = []
    for _ in range(r.count(2 + 8, "staged objects")):
        key = str(r.string(bytes_max=KEY_BYTES_MAX))
        staged.append((key, r.fixed(_I64)))
    return ReplaceObjectsRequest(replaced, tuple(staged))


def encode_replace_request(correlation_id: int, client_id: str | None, request: ReplaceObjectsRequest) -> bytes:
    """The whole StratalogReplaceObjects frame, its size first."""
    out = bytearray(FRAME_SIZE.size)
    out += _HEADER_V1.pack(REPLACE_API_KEY, VERSION, correlation_id)
    _string(out, client_id)
    out += _I32.pack(len(request.replaced))
    for key in request.replaced:
        _string(out, key)
    out += _I32.pack(len(request.staged))
    for key, size in request.staged:
        _string(out, key)
        out += _I64.pack(size)
    FRAME_SIZE.pack_into(out, 0, len(out) - FRAME_SIZE.size)
    return bytes(out)


def decode_request_header(frame: bytes | memoryview) -> tuple[int, int, int, str | None, int]:
    """(api key, version, correlation id, client id, where the body starts) of a frame with header v1."""
    r = _Reader(frame, 0)
    api_key, version, correlation_id = r.fixed(_I16), r.fixed(_I16), r.fixed(_I32)
    client_id = r.string(nullable=True)
    return api_key, version, correlation_id, client_id, r.at


def _string(out: bytearray, value: str | None) -> None:
    if value is None:
        out += _I16.pack(-1)
        return
    raw = value.encode()
    if len(raw) > INT16_MAX:
        raise ValueError(f"a string of {len(raw)} bytes does not fit an int16 length")
    out += _I16.pack(len(raw)) + raw


def encode_request(correlation_id: int, client_id: str | None, request: CommitStagedRequest) -> bytes:
    """The whole request frame, its size first."""
    out = bytearray(FRAME_SIZE.size)
    out += _HEADER_V1.pack(API_KEY, VERSION, correlation_id)
    _string(out, client_id)
    _string(out, request.sink_id)
    out += _I64.pack(request.batch_id) + _I32.pack(len(request.objects))
    for o in request.objects:
        out += _I32.pack(o.partition)
        _string(out, o.key)
        out += _I64.pack(o.size_bytes) + _I32.pack(len(o.streams))
        for s in o.streams:
            _string(out, s.name)
            out += _I64.pack(s.start) + _I64.pack(s.count)
    FRAME_SIZE.pack_into(out, 0, len(out) - FRAME_SIZE.size)
    return bytes(out)


def encode_response(correlation_id: int, response: CommitStagedResponse) -> bytes:
    """The whole response frame, its size first."""
    out = bytearray(FRAME_SIZE.size)
    out += _I32.pack(correlation_id) + _I32.pack(response.throttle_time_ms) + _I16.pack(response.error_code)
    _string(out, response.error_message)
    out += _I8.pack(1 if response.committed else 0) + _I64.pack(response.records) + _I32.pack(response.objects)
    FRAME_SIZE.pack_into(out, 0, len(out) - FRAME_SIZE.size)
    return bytes(out)


def decode_response(frame: bytes | memoryview) -> tuple[int, CommitStagedResponse]:
    """(correlation id, response) of a response frame without its size."""
    r = _Reader(frame, 0)
    correlation_id = r.fixed(_I32)
    throttle = r.fixed(_I32)
    error_code = r.fixed(_I16)
    message = r.string(nullable=True)
    committed = r.fixed(_I8) != 0
    return correlation_id, CommitStagedResponse(error_code, message, committed, r.fixed(_I64), r.fixed(_I32),
                                                throttle)
