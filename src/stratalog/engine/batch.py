"""Record batches: the unit a stream appends, the WAL stores and objects hold, in one encoding.

A batch is encoded once, at append, and its bytes then travel unchanged: WAL record body, LogCache
entry, object data block. Readers decode only what they return. Layout (little-endian; spec in
docs/formats/object.md, "Batches")::

    batch   = header record*
    header  = stream_id:u64 base_offset:u64 count:u32 batch_bytes:u32 max_timestamp_ms:i64
              encoding:u8 pad:u8{3} crc32c:u32 -- crc32c of the body (the bytes after the header)
    body    = record*                          -- encoding 0 (ENCODING_NATIVE), below
            | kafka_record_batch               -- encoding 1 (ENCODING_KAFKA): docs/formats/kafka-batch.md
    record  = record_bytes:u32 timestamp_ms:i64 key_bytes:i32 value_bytes:i32 header_count:u16
              key value (name_bytes:u16 name header_value_bytes:i32 header_value)*
              -- key_bytes / header_value_bytes of -1 mean None; record_bytes counts what follows it

The batch CRC lets a batch be checked wherever it sits (an object's data block also has its own CRC).
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from stratalog.errors import StratalogError
from stratalog.records import NewRecord, Record
from stratalog.wal.format import crc32c

BATCH_HEADER = struct.Struct("<QQIIqB3xI")
BATCH_HEADER_BYTES = BATCH_HEADER.size
#: The body is this module's records (what ``Stream.append`` writes).
ENCODING_NATIVE = 0
#: The body is one Kafka RecordBatch (magic 2) exactly as a producer sent it, its baseOffset set to the
#: batch's base offset: the broker stores it and serves it to consumers without decoding it.
ENCODING_KAFKA = 1
ENCODINGS = frozenset({ENCODING_NATIVE, ENCODING_KAFKA})
#: A Kafka RecordBatch starts with its base offset (big-endian, as all of Kafka's format).
_KAFKA_BASE_OFFSET = struct.Struct(">q")
_INT64_MAX = (1 << 63) - 1
#: What one compressed Kafka batch may expand to when a reader decodes it: a Kafka batch is bounded by
#: the WAL record (8 MiB by default); 16x covers real compression ratios and stops decompression bombs.
KAFKA_DECOMPRESSED_BYTES_MAX = 128 << 20
RECORD_HEAD = struct.Struct("<IqiiH")
#: What record_bytes counts besides key, value and headers: timestamp, key and value lengths, header count.
_RECORD_FIXED_BYTES = RECORD_HEAD.size - 4
_HEADER_NAME = struct.Struct("<H")
_HEADER_VALUE = struct.Struct("<i")
#: Bounds on one record's parts; a batch must also fit a WAL record (record_bytes_max).
HEADER_COUNT_MAX = 0xFFFF
HEADER_NAME_BYTES_MAX = 0xFFFF


class CorruptBatchError(StratalogError):
    """A batch failed its CRC or its structure is inconsistent: the bytes are damaged."""


@dataclass(frozen=True, slots=True)
class BatchInfo:
    """A batch's header fields."""

    stream_id: int
    base_offset: int
    count: int
    batch_bytes: int
    max_timestamp_ms: int
    encoding: int = ENCODING_NATIVE

    @property
    def end_offset(self) -> int:
        return self.base_offset + self.count


@dataclass(frozen=True, slots=True)
class StoredBatch:
    """A batch as a reader of whole batches gets it: where it is placed, and its body (a view of the
    stored bytes, not a copy) in its ``encoding``."""

    base_offset: int
    count: int
    max_timestamp_ms: int
    encoding: int
    body: memoryview

    @property
    def end_offset(self) -> int:
        return self.base_offset + self.count


def stored_batch(buf: bytes | memoryview, pos: int, info: BatchInfo) -> StoredBatch:
    """The batch ``info`` at ``buf[pos:]`` as a StoredBatch (a Kafka body carries the placed base offset)."""
    if info.encoding == ENCODING_KAFKA:
        body = kafka_body(buf, pos, info)
    else:
        body = memoryview(buf)[pos + BATCH_HEADER_BYTES:pos + info.batch_bytes]
    return StoredBatch(info.base_offset, info.count, info.max_timestamp_ms, info.encoding, body)


def encode_batch(stream_id: int, base_offset: int, records: Sequence[bytes | NewRecord],
                 now_ms: int | None = None) -> tuple[bytes, int]:
    """Encode ``records`` as one batch; return its bytes and its max timestamp."""
    if not records:
        raise ValueError("a batch needs at least one record")
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    parts: list[bytes] = []
    max_ts = -1
    pack_head = RECORD_HEAD.pack
    for rec in records:
        if isinstance(rec, bytes | bytearray | memoryview):
            value = bytes(rec)
            parts.append(pack_head(_RECORD_FIXED_BYTES + len(value), now_ms, -1, len(value), 0))
            parts.append(value)
            max_ts = max(max_ts, now_ms)
            continue
        ts = now_ms if rec.timestamp_ms is None else rec.timestamp_ms
        max_ts = max(max_ts, ts)
        key = rec.key
        tail = _encode_headers(rec.headers)
        body_bytes = _RECORD_FIXED_BYTES + (len(key) if key is not None else 0) + len(rec.value) + len(tail)
        parts.append(pack_head(body_bytes, ts, -1 if key is None else len(key), len(rec.value),
                               len(rec.headers)))
        if key is not None:
            parts.append(key)
        parts.append(rec.value)
        parts.append(tail)
    body = b"".join(parts)
    header = BATCH_HEADER.pack(stream_id, base_offset, len(records), BATCH_HEADER_BYTES + len(body), max_ts,
                               ENCODING_NATIVE, crc32c(body))
    return header + body, max_ts


def wrap_kafka_batch(stream_id: int, base_offset: int, count: int, max_timestamp_ms: int,
                     kafka_batch: bytes | memoryview) -> bytes:
    """A batch whose body is ``kafka_batch`` (a checked Kafka RecordBatch) with its baseOffset set to
    ``base_offset``; nothing else of it changes (baseOffset is outside the Kafka batch's own CRC)."""
    base = _KAFKA_BASE_OFFSET.pack(base_offset)
    with memoryview(kafka_batch) as view:
        rest = view[_KAFKA_BASE_OFFSET.size:]
        crc = crc32c(rest, crc32c(base))  # the body's CRC, its new base offset first, without joining it
        header = BATCH_HEADER.pack(stream_id, base_offset, count, BATCH_HEADER_BYTES + len(view), max_timestamp_ms,
                                   ENCODING_KAFKA, crc)
        return b"".join((header, base, rest))  # the one copy of the batch


def _encode_headers(headers: Sequence[tuple[str, bytes | None]]) -> bytes:
    if not headers:
        return b""
    if len(headers) > HEADER_COUNT_MAX:
        raise ValueError(f"a record has at most {HEADER_COUNT_MAX} headers")
    out = bytearray()
    for name, value in headers:
        raw = name.encode()
        if len(raw) > HEADER_NAME_BYTES_MAX:
            raise ValueError(f"header name longer than {HEADER_NAME_BYTES_MAX} bytes")
        out += _HEADER_NAME.pack(len(raw)) + raw
        out += _HEADER_VALUE.pack(-1 if value is None else len(value))
        if value is not None:
            out += value
    return bytes(out)


def read_batch_info(buf: bytes | memoryview, pos: int = 0) -> BatchInfo:
    """The header of the batch at ``buf[pos:]`` (no CRC check)."""
    if len(buf) - pos < BATCH_HEADER_BYTES:
        raise CorruptBatchError(f"truncated batch header at {pos}")
    stream_id, base, count, batch_bytes, max_ts, encoding, _ = BATCH_HEADER.unpack_from(buf, pos)
    if batch_bytes < BATCH_HEADER_BYTES or pos + batch_bytes > len(buf):
        raise CorruptBatchError(f"batch at {pos} claims {batch_bytes} bytes; {len(buf) - pos} are there")
    if encoding not in ENCODINGS:
        raise CorruptBatchError(f"batch at {pos} has unknown encoding {encoding}")
    return BatchInfo(stream_id, base, count, batch_bytes, max_ts, encoding)


def with_placement(buf: bytes | memoryview, pos: int, stream_id: int, base_offset: int) -> bytes:
    """The batch at ``buf[pos:]`` with ``stream_id`` and ``base_offset`` in its header. Its records and
    their CRC are unchanged (the CRC covers only the records)."""
    old_stream_id, old_base, count, batch_bytes, max_ts, encoding, crc = BATCH_HEADER.unpack_from(buf, pos)
    if (old_stream_id, old_base) == (stream_id, base_offset):
        return bytes(buf[pos:pos + batch_bytes])
    if encoding == ENCODING_KAFKA:
        # The Kafka batch carries its base offset too (outside its own CRC, inside ours).
        with memoryview(buf) as view:
            body = view[pos + BATCH_HEADER_BYTES:pos + batch_bytes]
            return wrap_kafka_batch(stream_id, base_offset, count, max_ts, body)
    return BATCH_HEADER.pack(stream_id, base_offset, count, batch_bytes, max_ts, encoding, crc) + \
        bytes(buf[pos + BATCH_HEADER_BYTES:pos + batch_bytes])


def check_batch(buf: bytes | memoryview, pos: int = 0) -> BatchInfo:
    """The header of the batch at ``buf[pos:]``, after checking its CRC."""
    info = read_batch_info(buf, pos)
    crc = BATCH_HEADER.unpack_from(buf, pos)[-1]
    with memoryview(buf) as view:
        ok = crc32c(view[pos + BATCH_HEADER_BYTES:pos + info.batch_bytes]) == crc
    if not ok:
        raise CorruptBatchError(f"batch of stream {info.stream_id} at offset {info.base_offset}: bad CRC")
    return info


def iter_batches(buf: bytes | memoryview) -> Iterator[tuple[int, BatchInfo]]:
    """``(position, info)`` of each batch packed back to back in ``buf``, CRC-checked."""
    pos = 0
    while pos < len(buf):
        info = check_batch(buf, pos)
        yield pos, info
        pos += info.batch_bytes


def decode_records(buf: bytes | memoryview, pos: int, info: BatchInfo,
                   start_offset: int = 0) -> Iterator[Record]:
    """The records of the batch at ``buf[pos:]`` from ``start_offset`` on (header already checked)."""
    if info.encoding == ENCODING_KAFKA:
        yield from _decode_kafka(buf, pos, info, start_offset)
        return
    yield from _native_records(buf, pos + BATCH_HEADER_BYTES, pos + info.batch_bytes, info.base_offset, info.count,
                               start_offset)


def stored_records(batch: StoredBatch, start_offset: int = 0) -> Iterator[Record]:
    """The records of a StoredBatch (either encoding) from ``start_offset`` on."""
    if batch.encoding == ENCODING_KAFKA:
        yield from _kafka_records(batch.body, batch.base_offset, start_offset)
        return
    yield from _native_records(batch.body, 0, len(batch.body), batch.base_offset, batch.count, start_offset)


def _native_records(buf: bytes | memoryview, at: int, end: int, base: int, count: int,
                    start_offset: int) -> Iterator[Record]:
    """The native records ``buf[at:end]`` of a batch based at ``base``, from ``start_offset`` on."""
    data = buf if isinstance(buf, bytes) else bytes(buf)  # slices of bytes are the values: one copy each
    unpack = RECORD_HEAD.unpack_from
    head_bytes = RECORD_HEAD.size
    for i in range(count):
        if at + head_bytes > end:
            raise CorruptBatchError(f"batch at offset {base}: record {i} runs past the batch")
        body_bytes, ts, key_bytes, value_bytes, header_count = unpack(data, at)
        next_at = at + 4 + body_bytes
        if base + i < start_offset:
            at = next_at
            continue
        p = at + head_bytes
        key = None
        if key_bytes >= 0:
            key = data[p:p + key_bytes]
            p += key_bytes
        value = data[p:p + value_bytes]
        p += value_bytes
        headers: tuple[tuple[str, bytes | None], ...] = ()
        if header_count:
            headers, p = decode_headers(memoryview(data), p, header_count)
        if p != next_at or next_at > end:
            raise CorruptBatchError(f"record {base + i}: its parts do not add up to its length")
        yield Record(base + i, ts, key, value, headers)
        at = next_at


def kafka_body(buf: bytes | memoryview, pos: int, info: BatchInfo) -> memoryview:
    """The Kafka RecordBatch a batch of ENCODING_KAFKA holds, its base offset the batch's (placed) one."""
    body = memoryview(buf)[pos + BATCH_HEADER_BYTES:pos + info.batch_bytes]
    if len(body) < _KAFKA_BASE_OFFSET.size or info.base_offset > _INT64_MAX:
        # A Kafka batch starts with its base offset, an int64; a shorter body or a larger offset let
        # struct.error out (found by fuzzing).
        raise CorruptBatchError(f"batch at offset {info.base_offset}: not a Kafka batch of {len(body)} bytes "
                                "that can start at this offset")
    if _KAFKA_BASE_OFFSET.unpack_from(body)[0] != info.base_offset:
        copy = bytearray(body)
        _KAFKA_BASE_OFFSET.pack_into(copy, 0, info.base_offset)
        return memoryview(copy)
    return body


def _decode_kafka(buf: bytes | memoryview, pos: int, info: BatchInfo, start_offset: int) -> Iterator[Record]:
    yield from _kafka_records(kafka_body(buf, pos, info), info.base_offset, start_offset)


def _kafka_records(body: memoryview, base_offset: int, start_offset: int) -> Iterator[Record]:
    from stratalog.kafka.records import KafkaBatchError
    from stratalog.kafka.records import decode_records as decode_kafka_records

    if is_control_batch(body):
        return   # a transaction's marker: it takes an offset and holds no record of the stream's
    try:
        yield from decode_kafka_records(body, start_offset=start_offset,
                                        decompressed_bytes_max=KAFKA_DECOMPRESSED_BYTES_MAX)
    except KafkaBatchError as e:
        raise CorruptBatchError(f"Kafka batch at offset {base_offset}: {e}") from e


def is_control_batch(body: bytes | memoryview) -> bool:
    """Whether a stored Kafka batch is a control batch (a transaction's commit or abort marker)."""
    from stratalog.kafka.batch_format import ATTRIBUTES, ATTRIBUTES_POSITION, CONTROL_BIT

    return len(body) >= ATTRIBUTES_POSITION + ATTRIBUTES.size and \
        bool(ATTRIBUTES.unpack_from(body, ATTRIBUTES_POSITION)[0] & CONTROL_BIT)


def decode_headers(view: memoryview, p: int, count: int) -> tuple[tuple[tuple[str, bytes | None], ...], int]:
    """``count`` record headers encoded at ``view[p:]`` and the position after them (see object.md).
    Raises CorruptBatchError when they run past the view or a name is not UTF-8."""
    try:
        return _decode_headers(view, p, count)
    except (struct.error, UnicodeDecodeError) as e:
        # A damaged record (its batch CRC checked or not) let struct.error and UnicodeDecodeError out
        # of the reader (found by fuzzing); one try around the loop costs nothing per header.
        raise CorruptBatchError(f"record headers at byte {p}: {e}") from None


def _decode_headers(view: memoryview, p: int, count: int) -> tuple[tuple[tuple[str, bytes | None], ...], int]:
    out = []
    for _ in range(count):
        (name_bytes,) = _HEADER_NAME.unpack_from(view, p)
        p += 2
        name = bytes(view[p:p + name_bytes]).decode()
        p += name_bytes
        (value_bytes,) = _HEADER_VALUE.unpack_from(view, p)
        p += 4
        value = None
        if value_bytes >= 0:
            value = bytes(view[p:p + value_bytes])
            p += value_bytes
        out.append((name, value))
    return tuple(out), p


def record_timestamps(buf: bytes | memoryview, pos: int, info: BatchInfo) -> Iterator[tuple[int, int]]:
    """``(offset, timestamp_ms)`` of each record of a batch, without copying keys or values."""
    if info.encoding == ENCODING_KAFKA:
        yield from ((r.offset, r.timestamp_ms) for r in _decode_kafka(buf, pos, info, 0))
        return
    at = pos + BATCH_HEADER_BYTES
    end = pos + info.batch_bytes
    unpack = RECORD_HEAD.unpack_from
    for i in range(info.count):
        if at + RECORD_HEAD.size > end:   # as decode_records checks (struct.error escaped: found by fuzzing)
            raise CorruptBatchError(f"batch at offset {info.base_offset}: record {i} runs past the batch")
        body_bytes, ts, _, _, _ = unpack(buf, at)
        yield info.base_offset + i, ts
        at += 4 + body_bytes
