"""Kafka record batches, magic 2: the ``records`` of Produce requests and Fetch responses.

A Kafka client sends batches packed back to back; the broker checks each one (``split_batches``),
writes its ``baseOffset`` (``with_base_offset``, outside the CRC) and stores it unchanged, compressed
or not. Readers decode records (``decode_records``), decompressing as needed under a bound; the broker
and the engine build batches of their own (``encode_batch``).

This is where callers take the batch from. Its siblings hold the parts, re-exported here: the layout's
constants, the header and the errors (``batch_format.py``), the one walk of the records' grammar that
Produce's check and these decoders share (``record_check.py``), and a payload's compression
(``batch_compression.py`` over ``codecs.py``). Spec: docs/formats/kafka-batch.md.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence

from stratalog.invariant import invariant
from stratalog.kafka.batch_compression import decompress_payload, recompress, uncompressed_records
from stratalog.kafka.batch_format import (
    ATTRIBUTES,
    ATTRIBUTES_POSITION,
    BASE_OFFSET,
    BASE_OFFSET_POSITION,
    BASE_SEQUENCE_POSITION,
    BASE_TIMESTAMP_POSITION,
    BATCH_BYTES_LIMIT,
    BATCH_LENGTH,
    BATCH_LENGTH_MIN,
    BATCH_LENGTH_POSITION,
    COMPRESSION_MASK,
    CONTROL_BIT,
    CRC,
    CRC_COVERS_FROM_POSITION,
    CRC_POSITION,
    DELETE_HORIZON_BIT,
    HEADER,
    HEADER_BYTES,
    INT16_MAX,
    INT32_MAX,
    INT64_MAX,
    INT64_MIN,
    LAST_OFFSET_DELTA_POSITION,
    LOG_OVERHEAD_BYTES,
    MAGIC,
    MAGIC_POSITION,
    MAX_TIMESTAMP_POSITION,
    NULL_LENGTH,
    PARTITION_LEADER_EPOCH_POSITION,
    PRODUCER_EPOCH_POSITION,
    PRODUCER_ID_POSITION,
    RECORD_BODY_BYTES_MIN,
    RECORD_BYTES_MIN,
    RECORDS_COUNT_POSITION,
    RECORDS_POSITION,
    TIMESTAMP_TYPE_BIT,
    TRANSACTIONAL_BIT,
    VARINT_CONTINUATION,
    VARLONG_SHIFT_LIMIT,
    BatchHeader,
    CorruptRecordError,
    InvalidRecordError,
    KafkaBatchError,
    RecordBatchTooLargeError,
    TimestampType,
    UnsupportedMagicError,
)
from stratalog.kafka.codecs import Compression, compress
from stratalog.kafka.record_check import walk_fields
from stratalog.records import Record
from stratalog.wal.format import crc32c

__all__ = [
    "BatchHeader", "Compression", "TimestampType",
    "KafkaBatchError", "CorruptRecordError", "UnsupportedMagicError", "InvalidRecordError",
    "RecordBatchTooLargeError",
    "split_batches", "check_batch", "with_base_offset", "write_base_offset",
    "decode_records", "record_timestamps", "encode_batch", "encode_record", "recompress", "uncompressed_records",
    # The layout (batch_format.py), for callers that read or patch header fields.
    "HEADER", "HEADER_BYTES", "BASE_OFFSET", "CRC", "BATCH_LENGTH", "ATTRIBUTES",
    "BASE_OFFSET_POSITION", "BATCH_LENGTH_POSITION", "PARTITION_LEADER_EPOCH_POSITION", "MAGIC_POSITION",
    "CRC_POSITION", "ATTRIBUTES_POSITION", "LAST_OFFSET_DELTA_POSITION", "BASE_TIMESTAMP_POSITION",
    "MAX_TIMESTAMP_POSITION", "PRODUCER_ID_POSITION", "PRODUCER_EPOCH_POSITION", "BASE_SEQUENCE_POSITION",
    "RECORDS_COUNT_POSITION", "RECORDS_POSITION", "CRC_COVERS_FROM_POSITION", "LOG_OVERHEAD_BYTES",
    "BATCH_LENGTH_MIN", "BATCH_BYTES_LIMIT", "MAGIC", "COMPRESSION_MASK", "TIMESTAMP_TYPE_BIT",
    "TRANSACTIONAL_BIT", "CONTROL_BIT", "DELETE_HORIZON_BIT", "RECORD_BYTES_MIN", "RECORD_BODY_BYTES_MIN",
    "VARLONG_SHIFT_LIMIT", "NULL_LENGTH", "VARINT_CONTINUATION", "INT16_MAX", "INT32_MAX", "INT64_MIN",
    "INT64_MAX",
]

# ---------------------------------------------------------------------------------------------------
# Batches: checked, split, numbered


def check_batch(view: memoryview, position_bytes: int, *, batch_bytes_max: int, stored: bool = False) -> BatchHeader:
    """The header of the batch at ``view[position_bytes:]``, after checking its bounds, magic, CRC and
    counts, in that order (each check relies on the ones before it). Does not read the records.

    A produced batch holds lastOffsetDelta + 1 records, at least one. A ``stored`` one (read back from a
    log) may hold fewer, none even: log compaction removes records and keeps the batch's offsets."""
    available = len(view) - position_bytes
    if available < HEADER_BYTES:
        raise CorruptRecordError(f"batch at byte {position_bytes}: {available} bytes left, "
                                 f"less than a {HEADER_BYTES}-byte header")
    header = BatchHeader(*HEADER.unpack_from(view, position_bytes))
    batch_bytes = header.batch_length + LOG_OVERHEAD_BYTES
    if header.batch_length < BATCH_LENGTH_MIN:
        raise CorruptRecordError(f"batch at byte {position_bytes}: batchLength {header.batch_length} is "
                                 f"less than its header ({BATCH_LENGTH_MIN})")
    if batch_bytes > batch_bytes_max:
        raise RecordBatchTooLargeError(f"batch at byte {position_bytes} is {batch_bytes} bytes; at most "
                                       f"{batch_bytes_max} are accepted")
    if batch_bytes > available:
        raise CorruptRecordError(f"batch at byte {position_bytes} claims {batch_bytes} bytes; "
                                 f"{available} are there (truncated)")
    if header.magic != MAGIC:
        raise UnsupportedMagicError(f"batch at byte {position_bytes} has magic {header.magic}; only "
                                    f"{MAGIC} is supported (upgrade the client or set its message format)")
    if crc32c(view[position_bytes + CRC_COVERS_FROM_POSITION:position_bytes + batch_bytes]) != header.crc:
        raise CorruptRecordError(f"batch at byte {position_bytes}: bad CRC")
    codec = header.attributes & COMPRESSION_MASK
    if codec > Compression.ZSTD:
        raise CorruptRecordError(f"batch at byte {position_bytes}: unknown compression codec {codec}")
    if stored:
        if header.last_offset_delta < 0 or not 0 <= header.record_count <= header.last_offset_delta + 1:
            raise InvalidRecordError(f"batch at byte {position_bytes}: recordsCount {header.record_count} with "
                                     f"lastOffsetDelta {header.last_offset_delta}")
    elif header.record_count < 1:
        raise InvalidRecordError(f"batch at byte {position_bytes} holds {header.record_count} records")
    elif header.last_offset_delta != header.record_count - 1:
        raise InvalidRecordError(f"batch at byte {position_bytes}: recordsCount {header.record_count} but "
                                 f"lastOffsetDelta {header.last_offset_delta}")
    if codec == Compression.NONE and header.record_count > (batch_bytes - HEADER_BYTES) // RECORD_BYTES_MIN:
        raise CorruptRecordError(f"batch at byte {position_bytes}: {header.record_count} records cannot fit "
                                 f"in {batch_bytes - HEADER_BYTES} bytes")
    return header


def split_batches(records: bytes | bytearray | memoryview, *,
                  batch_bytes_max: int) -> list[tuple[int, BatchHeader]]:
    """``(position_bytes, header)`` of each batch packed back to back in ``records`` (a Produce
    request's records field), each checked by ``check_batch``; any bad batch refuses the whole field.
    Reads only headers (no decompression, no per-record work). An empty field holds no batches."""
    invariant(batch_bytes_max >= HEADER_BYTES, "batch_bytes_max smaller than a batch header")
    out: list[tuple[int, BatchHeader]] = []
    with memoryview(records) as view:
        end = len(view)
        position_bytes = 0
        while position_bytes < end:
            header = check_batch(view, position_bytes, batch_bytes_max=batch_bytes_max)
            out.append((position_bytes, header))
            position_bytes += header.batch_length + LOG_OVERHEAD_BYTES
    return out


def _check_base_offset(base_offset: int) -> None:
    if not 0 <= base_offset <= INT64_MAX:
        raise ValueError(f"base offset {base_offset} is not a Kafka offset (0 to 2**63 - 1)")


def with_base_offset(batch: bytes | bytearray | memoryview, base_offset: int) -> bytes:
    """``batch`` with its baseOffset set to ``base_offset``; the CRC, which does not cover it, stays valid."""
    _check_base_offset(base_offset)
    with memoryview(batch) as view:
        if len(view) < HEADER_BYTES:
            raise CorruptRecordError(f"{len(view)} bytes is shorter than a batch header")
        return b"".join((BASE_OFFSET.pack(base_offset), view[BASE_OFFSET_POSITION + BASE_OFFSET.size:]))


def write_base_offset(buffer: bytearray | memoryview, position_bytes: int, base_offset: int) -> None:
    """Set the baseOffset of the batch at ``buffer[position_bytes:]`` in place (a position that
    ``split_batches`` returned)."""
    _check_base_offset(base_offset)
    invariant(0 <= position_bytes <= len(buffer) - HEADER_BYTES, "no batch header at that position")
    BASE_OFFSET.pack_into(buffer, position_bytes + BASE_OFFSET_POSITION, base_offset)


# ---------------------------------------------------------------------------------------------------
# Reading records


def decode_records(batch: bytes | bytearray | memoryview, *, start_offset: int = 0,
                   decompressed_bytes_max: int) -> Iterator[Record]:
    """The records of ``batch`` (exactly one whole batch) from ``start_offset`` on. The batch is
    checked (bounds, CRC, counts) and decompressed now; each record is checked as it is read.

    A record's offset is baseOffset + its offsetDelta (increasing; gaps are what log compaction left); its
    timestamp is baseTimestamp + timestampDelta, or maxTimestamp for every record of a LogAppendTime
    batch. A null value is returned as ``b""``: ``Record.value`` is bytes. Control batches are decoded
    like any other (``BatchHeader.is_control`` tells them apart)."""
    header, data, position_bytes = _open_batch(batch, decompressed_bytes_max)
    return _iter_records(header, data, position_bytes, start_offset)


def record_timestamps(batch: bytes | bytearray | memoryview, *,
                      decompressed_bytes_max: int) -> Iterator[tuple[int, int]]:
    """``(offset, timestamp_ms)`` of each record of ``batch``, without copying keys or values. A
    LogAppendTime batch is answered from its header alone (every record has maxTimestamp)."""
    with memoryview(batch) as view:
        header = _check_whole_batch(view)
        if header.attributes & TIMESTAMP_TYPE_BIT and header.record_count == header.last_offset_delta + 1:
            base_offset, max_ts = header.base_offset, header.max_timestamp_ms
            return ((base_offset + i, max_ts) for i in range(header.record_count))
        data, position_bytes = _records_data(batch, view, header, decompressed_bytes_max)
    return _iter_timestamps(header, data, position_bytes)


def _check_whole_batch(view: memoryview) -> BatchHeader:
    """A stored batch's header (the readers' check: its records may have gaps), the batch exactly one."""
    header = check_batch(view, 0, batch_bytes_max=BATCH_BYTES_LIMIT, stored=True)
    if header.batch_bytes != len(view):
        raise CorruptRecordError(f"a batch of {header.batch_bytes} bytes followed by "
                                 f"{len(view) - header.batch_bytes} more")
    return header


def _open_batch(batch: bytes | bytearray | memoryview,
                decompressed_bytes_max: int) -> tuple[BatchHeader, bytes, int]:
    with memoryview(batch) as view:
        header = _check_whole_batch(view)
        data, position_bytes = _records_data(batch, view, header, decompressed_bytes_max)
    return header, data, position_bytes


def _records_data(batch: bytes | bytearray | memoryview, view: memoryview, header: BatchHeader,
                  decompressed_bytes_max: int) -> tuple[bytes, int]:
    """The bytes holding the records of a checked batch (the batch itself, or its payload
    decompressed) and the position of the first record in them."""
    codec = header.attributes & COMPRESSION_MASK
    if codec == Compression.NONE:
        return (batch if isinstance(batch, bytes) else bytes(view)), RECORDS_POSITION  # values slice it
    with view[RECORDS_POSITION:] as payload:
        data = decompress_payload(codec, payload, decompressed_bytes_max)
    if header.record_count > len(data) // RECORD_BYTES_MIN:
        raise CorruptRecordError(f"{header.record_count} records cannot fit in {len(data)} decompressed bytes")
    return data, 0


def _decoded_length_error(length: int, index: int) -> KafkaBatchError:
    """A bad record length as the decoders word it (Produce's check calls a negative one short)."""
    if length < 0:
        return InvalidRecordError(f"record {index}: negative length {length}")
    if length < RECORD_BODY_BYTES_MIN:
        return CorruptRecordError(f"record {index}: length {length} is shorter than any record")
    return CorruptRecordError(f"record {index}: length {length} runs past the records")


def _iter_records(header: BatchHeader, data: bytes, p: int, start_offset: int) -> Iterator[Record]:
    # The hot loop of every Kafka read in Python: walk_fields checks each record, its positions slice it.
    base_ts = header.base_timestamp_ms
    append_ts = header.max_timestamp_ms if header.attributes & TIMESTAMP_TYPE_BIT else None
    end = len(data)
    new_record = tuple.__new__  # Record(...) goes through a Python-level __new__: a third of the cost
    base = header.base_offset
    # Stored batches may have gaps in their offsets (log compaction): each record's offset is its delta's.
    for fields in walk_fields(data, p, header.record_count, _decoded_length_error, True, header.last_offset_delta):
        p, delta, offset_delta, key_at, key_bytes, value_at, value_bytes, headers = fields
        offset = base + offset_delta
        if offset < start_offset:
            continue
        yield new_record(Record, (offset, base_ts + delta if append_ts is None else append_ts,
                                  data[key_at:key_at + key_bytes] if key_bytes >= 0 else None,
                                  data[value_at:value_at + value_bytes] if value_bytes >= 0 else b"",
                                  headers))
    if p != end:
        raise CorruptRecordError(f"{end - p} bytes after the last record")


def _iter_timestamps(header: BatchHeader, data: bytes, p: int) -> Iterator[tuple[int, int]]:
    append_ts = header.max_timestamp_ms if header.attributes & TIMESTAMP_TYPE_BIT else None
    base_ts = header.base_timestamp_ms
    end = len(data)
    base = header.base_offset
    for fields in walk_fields(data, p, header.record_count, _decoded_length_error, False, header.last_offset_delta):
        p = fields[0]
        yield base + fields[2], base_ts + fields[1] if append_ts is None else append_ts
    if p != end:
        raise CorruptRecordError(f"{end - p} bytes after the last record")


# ---------------------------------------------------------------------------------------------------
# Writing


#: A record given as fields: key, value (None: null), headers, timestamp_ms.
RecordFields = tuple[bytes | None, bytes | None, Sequence[tuple[str, bytes | None]], int]


def _put_varint(out: bytearray, value: int) -> None:
    raw = value << 1 if value >= 0 else (-value << 1) - 1  # zigzag
    if raw < 0x80:
        out.append(raw)
        return
    while raw >= 0x80:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)


def _put_nullable(out: bytearray, data: bytes | None) -> None:
    if data is None:
        out.append(1)  # zigzag(-1)
        return
    _put_varint(out, len(data))
    out += data


def encode_record(offset_delta: int, timestamp_delta: int, key: bytes | None, value: bytes | None,
                  headers: Sequence[tuple[str, bytes | None]]) -> bytes:
    """One record of a batch, its length first (no attributes are defined for records)."""
    record = bytearray(b"\x00")  # attributes
    _put_varint(record, timestamp_delta)
    _put_varint(record, offset_delta)
    _put_nullable(record, key)
    _put_nullable(record, value)
    _put_varint(record, len(headers))
    for name, header_value in headers:
        _put_nullable(record, name.encode())
        _put_nullable(record, header_value)
    out = bytearray()
    _put_varint(out, len(record))
    return bytes(out + record)


def encode_batch(records: Sequence[Record | RecordFields], *, base_offset: int, producer_id: int = -1,
                 producer_epoch: int = -1, base_sequence: int = -1, partition_leader_epoch: int = -1,
                 compression: Compression = Compression.NONE, is_transactional: bool = False) -> bytes:
    """One CreateTime batch of ``records``, numbered densely from ``base_offset`` (a ``Record``'s own
    offset is ignored). baseTimestamp is the first record's timestamp. A partition leader epoch of -1
    means none (what producers send)."""
    if not records:
        raise ValueError("a batch needs at least one record")
    if len(records) > INT32_MAX:
        raise ValueError(f"a batch holds at most {INT32_MAX} records")
    _check_base_offset(base_offset)
    body = bytearray()
    base_ts = max_ts = 0
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes | None]]
    for i, rec in enumerate(records):
        if isinstance(rec, Record):
            key, value, headers, timestamp_ms = rec.key, rec.value, rec.headers, rec.timestamp_ms
        else:
            key, value, headers, timestamp_ms = rec
        if not INT64_MIN <= timestamp_ms <= INT64_MAX:
            raise ValueError(f"timestamp {timestamp_ms} does not fit an int64")
        if i == 0:
            base_ts = max_ts = timestamp_ms
        max_ts = max(max_ts, timestamp_ms)
        body += encode_record(i, timestamp_ms - base_ts, key, value, headers)
    payload = bytes(body) if compression == Compression.NONE else compress(compression, bytes(body))
    batch_bytes = HEADER_BYTES + len(payload)
    if batch_bytes > BATCH_BYTES_LIMIT:
        raise ValueError(f"a batch of {batch_bytes} bytes is larger than the format allows")
    attributes = int(compression) | (TRANSACTIONAL_BIT if is_transactional else 0)
    return packed_batch(base_offset, partition_leader_epoch, attributes, len(records) - 1, base_ts, max_ts,
                        producer_id, producer_epoch, base_sequence, len(records), payload)


def packed_batch(base_offset: int, leader_epoch: int, attributes: int, last_offset_delta: int, base_ts: int,
                 max_ts: int, producer_id: int, producer_epoch: int, base_sequence: int, count: int,
                 payload: bytes) -> bytes:
    """A batch of ``payload`` (its records, in the codec ``attributes`` names) under a header of these
    fields, its length and CRC computed. ValueError for a field out of its type's range."""
    out = bytearray(HEADER_BYTES)
    try:
        HEADER.pack_into(out, 0, base_offset, HEADER_BYTES - LOG_OVERHEAD_BYTES + len(payload), leader_epoch, MAGIC,
                         0, attributes, last_offset_delta, base_ts, max_ts, producer_id, producer_epoch,
                         base_sequence, count)
    except struct.error as e:
        raise ValueError(f"a header field is out of range: {e}") from None
    out += payload
    CRC.pack_into(out, CRC_POSITION, crc32c(memoryview(out)[CRC_COVERS_FROM_POSITION:]))
    return bytes(out)
