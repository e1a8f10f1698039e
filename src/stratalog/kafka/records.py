"""Kafka record batches, magic 2: the ``records`` of Produce requests and Fetch responses.

A Kafka client sends batches packed back to back; the broker checks each one (``split_batches``),
writes its ``baseOffset`` (``with_base_offset``, outside the CRC) and stores it unchanged, compressed
or not. Readers decode records (``decode_records``), decompressing as needed under a bound. Layout
(big-endian; spec in docs/formats/kafka-batch.md)::

    batch   = baseOffset:i64 batchLength:i32 partitionLeaderEpoch:i32 magic:i8 crc:u32
              attributes:i16 lastOffsetDelta:i32 baseTimestamp:i64 maxTimestamp:i64
              producerId:i64 producerEpoch:i16 baseSequence:i32 recordsCount:i32 payload
    payload = record{recordsCount}, or those records compressed as one stream (attributes bits 0-2)
    record  = length:varint attributes:i8 timestampDelta:varlong offsetDelta:varint
              keyLength:varint key valueLength:varint value headersCount:varint
              (headerKeyLength:varint headerKey headerValueLength:varint headerValue)*

``batchLength`` counts the bytes after itself; the CRC32C covers ``attributes`` to the end. Varints
are zigzag-encoded (protobuf's sint); a length of -1 means null.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from enum import IntEnum
from typing import ClassVar, NamedTuple

from stratalog.errors import StratalogError
from stratalog.invariant import invariant
from stratalog.kafka.codecs import Compression, PayloadError, compress, decompress
from stratalog.records import Record
from stratalog.wal.format import crc32c

__all__ = [
    "BatchHeader", "Compression", "TimestampType",
    "KafkaBatchError", "CorruptRecordError", "UnsupportedMagicError", "InvalidRecordError",
    "RecordBatchTooLargeError",
    "split_batches", "check_batch", "with_base_offset", "write_base_offset",
    "decode_records", "record_timestamps", "encode_batch", "recompress", "uncompressed_records",
    "HEADER_BYTES", "MAGIC",
]

# ---------------------------------------------------------------------------------------------------
# The batch header (61 bytes, big-endian, no padding)

#: baseOffset batchLength partitionLeaderEpoch magic crc attributes lastOffsetDelta baseTimestamp
#: maxTimestamp producerId producerEpoch baseSequence recordsCount.
HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_BYTES = 61
BASE_OFFSET = struct.Struct(">q")
CRC = struct.Struct(">I")
BATCH_LENGTH = struct.Struct(">i")
ATTRIBUTES = struct.Struct(">h")

BASE_OFFSET_POSITION = 0
BATCH_LENGTH_POSITION = 8
PARTITION_LEADER_EPOCH_POSITION = 12
MAGIC_POSITION = 16
CRC_POSITION = 17
ATTRIBUTES_POSITION = 21
LAST_OFFSET_DELTA_POSITION = 23
BASE_TIMESTAMP_POSITION = 27
MAX_TIMESTAMP_POSITION = 35
PRODUCER_ID_POSITION = 43
PRODUCER_EPOCH_POSITION = 51
BASE_SEQUENCE_POSITION = 53
RECORDS_COUNT_POSITION = 57
RECORDS_POSITION = HEADER_BYTES
#: The CRC covers attributes to the end of the batch: not baseOffset (the broker writes it), nor
#: partitionLeaderEpoch (the leader writes it), nor magic (read first, to know the layout at all).
CRC_COVERS_FROM_POSITION = ATTRIBUTES_POSITION
#: baseOffset and batchLength, the bytes batchLength does not count (Kafka's LOG_OVERHEAD).
LOG_OVERHEAD_BYTES = 12
#: The smallest batchLength: a header and nothing else (still refused later: a batch has a record).
BATCH_LENGTH_MIN = HEADER_BYTES - LOG_OVERHEAD_BYTES
#: The largest batch the format can describe (batchLength is an int32).
BATCH_BYTES_LIMIT = 0x7FFF_FFFF + LOG_OVERHEAD_BYTES
MAGIC = 2

# Each named position is where the header struct puts that field: the layout is written once.
for _position, _prefix in (
        (BATCH_LENGTH_POSITION, ">q"), (PARTITION_LEADER_EPOCH_POSITION, ">qi"), (MAGIC_POSITION, ">qii"),
        (CRC_POSITION, ">qiib"), (ATTRIBUTES_POSITION, ">qiibI"), (LAST_OFFSET_DELTA_POSITION, ">qiibIh"),
        (BASE_TIMESTAMP_POSITION, ">qiibIhi"), (MAX_TIMESTAMP_POSITION, ">qiibIhiq"),
        (PRODUCER_ID_POSITION, ">qiibIhiqq"), (PRODUCER_EPOCH_POSITION, ">qiibIhiqqq"),
        (BASE_SEQUENCE_POSITION, ">qiibIhiqqqh"), (RECORDS_COUNT_POSITION, ">qiibIhiqqqhi"),
        (HEADER_BYTES, HEADER.format)):
    invariant(struct.calcsize(_prefix) == _position, f"header field at {_position} moved")

# Attributes (int16)
COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_BIT = 0x08        # set: LogAppendTime (the broker's clock), clear: CreateTime
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20               # transaction markers, written by brokers only
DELETE_HORIZON_BIT = 0x40        # baseTimestamp is a compaction delete horizon, not a record time

# ---------------------------------------------------------------------------------------------------
# Records

#: The smallest record: length, attributes, timestampDelta, offsetDelta, keyLength, valueLength and
#: headersCount, one byte each. Bounds recordsCount by the payload before any record is read.
RECORD_BYTES_MIN = 7
#: The same less its length varint: what a record's length must at least say.
RECORD_BODY_BYTES_MIN = RECORD_BYTES_MIN - 1
#: The smallest header: key length and value length, one byte each.
RECORD_HEADER_BYTES_MIN = 2
#: A varlong takes at most 10 bytes (64 bits, 7 per byte); a longer run of continuation bits is damage.
VARLONG_SHIFT_LIMIT = 70
NULL_LENGTH = -1
#: A byte of a varint below this has no continuation bit: it is the varint's last.
VARINT_CONTINUATION = 0x80
INT16_MAX = 0x7FFF
INT32_MAX = 0x7FFF_FFFF
INT64_MIN = -0x8000_0000_0000_0000
INT64_MAX = 0x7FFF_FFFF_FFFF_FFFF

class TimestampType(IntEnum):
    """Attributes bit 3."""

    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


# ---------------------------------------------------------------------------------------------------
# Errors


class KafkaBatchError(StratalogError):
    """A record batch a client sent is not one the broker can take; ``error_code`` is the Kafka error
    to answer with."""

    #: CORRUPT_MESSAGE unless a subclass says otherwise.
    error_code: ClassVar[int] = 2


class CorruptRecordError(KafkaBatchError):
    """Bad CRC, truncated, or lengths that do not add up: the bytes are damaged. Kafka: CORRUPT_MESSAGE."""

    error_code = 2


class UnsupportedMagicError(KafkaBatchError):
    """A batch whose magic is not 2 (message formats 0 and 1 are not supported).
    Kafka: UNSUPPORTED_FOR_MESSAGE_FORMAT."""

    error_code = 43


class InvalidRecordError(KafkaBatchError):
    """A well-formed batch that breaks a rule: no records, a count that disagrees with lastOffsetDelta,
    a negative length, offsets that are not dense. Kafka: INVALID_RECORD."""

    error_code = 87


class RecordBatchTooLargeError(KafkaBatchError):
    """A batch larger than the broker takes (``batch_bytes_max``). Kafka: MESSAGE_TOO_LARGE."""

    error_code = 10


# ---------------------------------------------------------------------------------------------------
# Headers


class BatchHeader(NamedTuple):
    """The 61-byte header of a batch, field by field (a named tuple: one is built per produced batch)."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp_ms: int
    max_timestamp_ms: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def compression(self) -> Compression:
        return Compression(self.attributes & COMPRESSION_MASK)

    @property
    def timestamp_type(self) -> TimestampType:
        return TimestampType.LOG_APPEND_TIME if self.attributes & TIMESTAMP_TYPE_BIT else TimestampType.CREATE_TIME

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_BIT)

    @property
    def batch_bytes(self) -> int:
        """The whole batch, header included."""
        return self.batch_length + LOG_OVERHEAD_BYTES

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta


def check_batch(view: memoryview, position_bytes: int, *, batch_bytes_max: int) -> BatchHeader:
    """The header of the batch at ``view[position_bytes:]``, after checking its bounds, magic, CRC and
    counts, in that order (each check relies on the ones before it). Does not read the records."""
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
    if header.record_count < 1:
        raise InvalidRecordError(f"batch at byte {position_bytes} holds {header.record_count} records")
    if header.last_offset_delta != header.record_count - 1:
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

    A record's offset is baseOffset + its offsetDelta (which must be its index: offsets are dense); its
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
        if header.attributes & TIMESTAMP_TYPE_BIT:
            base_offset, max_ts = header.base_offset, header.max_timestamp_ms
            return ((base_offset + i, max_ts) for i in range(header.record_count))
        data, position_bytes = _records_data(batch, view, header, decompressed_bytes_max)
    return _iter_timestamps(header, data, position_bytes)


def _check_whole_batch(view: memoryview) -> BatchHeader:
    header = check_batch(view, 0, batch_bytes_max=BATCH_BYTES_LIMIT)
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
        data = _decompress(codec, payload, decompressed_bytes_max)
    if header.record_count > len(data) // RECORD_BYTES_MIN:
        raise CorruptRecordError(f"{header.record_count} records cannot fit in {len(data)} decompressed bytes")
    return data, 0


def _read_varint(data: bytes, p: int) -> tuple[int, int]:
    """The zigzag varint (or varlong) at ``data[p:]`` and the position after it."""
    b = data[p]
    if b < 0x80:  # one byte: -64..63, most lengths and deltas
        return (b >> 1) ^ -(b & 1), p + 1
    raw = b & 0x7F
    shift = 7
    while True:
        p += 1
        b = data[p]
        raw |= (b & 0x7F) << shift
        if b < 0x80:
            return (raw >> 1) ^ -(raw & 1), p + 1
        shift += 7
        if shift >= VARLONG_SHIFT_LIMIT:
            raise CorruptRecordError(f"a varint longer than {VARLONG_SHIFT_LIMIT // 7} bytes at byte {p}")


def _read_record_start(data: bytes, p: int, end: int, index: int) -> tuple[int, int, int]:
    """The position after a record, its timestampDelta, and the position of its key length."""
    read_varint = _read_varint
    length, p = read_varint(data, p)
    record_end = p + length
    if length < RECORD_BODY_BYTES_MIN or record_end > end:
        raise _bad_record_length(length, index)
    p += 1  # attributes: int8, no bits defined for records
    timestamp_delta, p = read_varint(data, p)
    offset_delta, p = read_varint(data, p)
    if offset_delta != index:
        raise InvalidRecordError(f"record {index} has offsetDelta {offset_delta}: offsets must be dense")
    return record_end, timestamp_delta, p


def _bad_record_length(length: int, index: int) -> KafkaBatchError:
    if length < 0:
        return InvalidRecordError(f"record {index}: negative length {length}")
    if length < RECORD_BODY_BYTES_MIN:
        return CorruptRecordError(f"record {index}: length {length} is shorter than any record")
    return CorruptRecordError(f"record {index}: length {length} runs past the records")


def _iter_records(header: BatchHeader, data: bytes, p: int, start_offset: int) -> Iterator[Record]:
    # The hot loop of every Kafka read: one-byte varints (lengths under 64, small deltas) are decoded
    # inline, longer ones by _read_varint; each field's bound is checked before it is sliced.
    base_offset = header.base_offset
    base_ts = header.base_timestamp_ms
    append_ts = header.max_timestamp_ms if header.attributes & TIMESTAMP_TYPE_BIT else None
    end = len(data)
    read_varint = _read_varint
    new_record = tuple.__new__  # Record(...) goes through a Python-level __new__: a third of the cost
    try:
        for i in range(header.record_count):
            b = data[p]
            if b < 0x80:
                length = (b >> 1) ^ -(b & 1)
                p += 1
            elif data[p + 1] < 0x80:  # two bytes: records of 64 bytes to 8 KiB
                raw = (b & 0x7F) | (data[p + 1] << 7)
                length = (raw >> 1) ^ -(raw & 1)
                p += 2
            else:
                length, p = read_varint(data, p)
            record_end = p + length
            if length < RECORD_BODY_BYTES_MIN or record_end > end:
                raise _bad_record_length(length, i)
            offset = base_offset + i
            if offset < start_offset:
                p = record_end
                continue
            p += 1  # attributes: int8, no bits defined for records
            b = data[p]
            if b < 0x80:
                timestamp_delta = (b >> 1) ^ -(b & 1)
                p += 1
            elif data[p + 1] < 0x80:  # two bytes: up to 8 s after the first record
                raw = (b & 0x7F) | (data[p + 1] << 7)
                timestamp_delta = (raw >> 1) ^ -(raw & 1)
                p += 2
            else:
                timestamp_delta, p = read_varint(data, p)
            b = data[p]
            if b < 0x80:
                offset_delta = (b >> 1) ^ -(b & 1)
                p += 1
            else:
                offset_delta, p = read_varint(data, p)
            if offset_delta != i:
                raise InvalidRecordError(f"record {i} has offsetDelta {offset_delta}: offsets must be dense")
            b = data[p]
            if b < 0x80:
                key_length = (b >> 1) ^ -(b & 1)
                p += 1
            else:
                key_length, p = read_varint(data, p)
            key = None
            if key_length >= 0:
                key = data[p:p + key_length]
                p += key_length
            elif key_length != NULL_LENGTH:
                raise InvalidRecordError(f"record at offset {offset}: key length {key_length}")
            b = data[p]
            if b < 0x80:
                value_length = (b >> 1) ^ -(b & 1)
                p += 1
            elif data[p + 1] < 0x80:  # two bytes: values of 64 bytes to 8 KiB
                raw = (b & 0x7F) | (data[p + 1] << 7)
                value_length = (raw >> 1) ^ -(raw & 1)
                p += 2
            else:
                value_length, p = read_varint(data, p)
            value = b""
            if value_length >= 0:
                value = data[p:p + value_length]
                p += value_length
            elif value_length != NULL_LENGTH:
                raise InvalidRecordError(f"record at offset {offset}: value length {value_length}")
            if p >= record_end:  # a key or value ran past the record (headersCount is still to come)
                raise CorruptRecordError(f"record at offset {offset}: key or value runs past its record")
            b = data[p]
            headers: tuple[tuple[str, bytes | None], ...] = ()
            if b:
                header_count, p = read_varint(data, p)
                if header_count < 0:
                    raise InvalidRecordError(f"record at offset {offset}: {header_count} headers")
                if header_count > (record_end - p) // RECORD_HEADER_BYTES_MIN:
                    raise CorruptRecordError(f"record at offset {offset}: {header_count} headers cannot "
                                             f"fit in its {record_end - p} remaining bytes")
                headers, p = _read_headers(data, p, record_end, header_count)
            else:
                p += 1
            if p != record_end:
                raise CorruptRecordError(f"record at offset {offset}: its parts do not add up to its length")
            timestamp_ms = base_ts + timestamp_delta if append_ts is None else append_ts
            yield new_record(Record, (offset, timestamp_ms, key, value, headers))
        if p != end:
            raise CorruptRecordError(f"{end - p} bytes after the last record")
    except IndexError:  # a varint ran off the end of the data
        raise CorruptRecordError("a record runs past the end of the batch") from None


def _read_headers(data: bytes, p: int, record_end: int,
                  count: int) -> tuple[tuple[tuple[str, bytes | None], ...], int]:
    """``count`` record headers at ``data[p:]`` and the position after them (one-byte lengths inline)."""
    out = []
    read_varint = _read_varint
    for _ in range(count):
        b = data[p]
        if b < 0x80:
            length = (b >> 1) ^ -(b & 1)
            p += 1
        else:
            length, p = read_varint(data, p)
        if length < 0:
            raise InvalidRecordError("a header key is null" if length == NULL_LENGTH else
                                     f"header key length {length}")
        q = p + length
        if q > record_end:
            raise CorruptRecordError(f"header key of {length} bytes runs past its record")
        try:
            key = data[p:q].decode()
        except UnicodeDecodeError:
            raise CorruptRecordError(f"header key {data[p:min(q, p + 40)]!r} is not UTF-8") from None
        p = q
        b = data[p]
        if b < 0x80:
            length = (b >> 1) ^ -(b & 1)
            p += 1
        else:
            length, p = read_varint(data, p)
        value = None
        if length >= 0:
            q = p + length
            if q > record_end:
                raise CorruptRecordError(f"header value of {length} bytes runs past its record")
            value = data[p:q]
            p = q
        elif length != NULL_LENGTH:
            raise InvalidRecordError(f"header value length {length}")
        out.append((key, value))
    return tuple(out), p


def _iter_timestamps(header: BatchHeader, data: bytes, p: int) -> Iterator[tuple[int, int]]:
    base_offset = header.base_offset
    base_ts = header.base_timestamp_ms
    end = len(data)
    try:
        for i in range(header.record_count):
            record_end, timestamp_delta, _ = _read_record_start(data, p, end, i)
            yield base_offset + i, base_ts + timestamp_delta
            p = record_end
        if p != end:
            raise CorruptRecordError(f"{end - p} bytes after the last record")
    except IndexError:
        raise CorruptRecordError("a record runs past the end of the batch") from None


# ---------------------------------------------------------------------------------------------------
# Compression (codecs.py), its errors as the batch's


def _decompress(codec: int, payload: memoryview, bytes_max: int) -> bytes:
    try:
        return decompress(codec, payload, bytes_max)
    except PayloadError as e:
        raise CorruptRecordError(str(e)) from None


def recompress(view: memoryview, header: BatchHeader, codec: Compression, *, decompressed_bytes_max: int,
               records: bytes | memoryview | None = None) -> tuple[bytes, BatchHeader]:
    """The batch ``view`` (checked: ``header`` is its own) with its records compressed by ``codec`` instead,
    as a broker stores it under a topic's ``compression.type``. Every header field but the length, the
    codec bits and the CRC stays as the producer sent it (offsets, timestamps, producer id, epoch and
    sequence): the records are the same, only their payload's encoding changes. ``records``: the batch's
    records uncompressed, when the caller has them already (``check_records`` returns them); else they are
    decompressed here. Returns the new batch and its header."""
    if records is None:
        records = uncompressed_records(view, header, decompressed_bytes_max=decompressed_bytes_max)
    payload = bytes(records) if codec == Compression.NONE else compress(codec, bytes(records))
    batch_bytes = HEADER_BYTES + len(payload)
    if batch_bytes > BATCH_BYTES_LIMIT:
        raise RecordBatchTooLargeError(f"the batch recompressed with {codec.name.lower()} is {batch_bytes} bytes, "
                                       "more than the format allows")
    attributes = (header.attributes & ~COMPRESSION_MASK) | int(codec)
    out = bytearray(view[:HEADER_BYTES])
    BATCH_LENGTH.pack_into(out, BATCH_LENGTH_POSITION, batch_bytes - LOG_OVERHEAD_BYTES)
    ATTRIBUTES.pack_into(out, ATTRIBUTES_POSITION, attributes)
    out += payload
    crc = crc32c(memoryview(out)[CRC_COVERS_FROM_POSITION:])
    CRC.pack_into(out, CRC_POSITION, crc)
    return bytes(out), header._replace(batch_length=batch_bytes - LOG_OVERHEAD_BYTES, attributes=attributes, crc=crc)


def uncompressed_records(view: memoryview, header: BatchHeader, *, decompressed_bytes_max: int
                         ) -> bytes | memoryview:
    """The records of the batch ``view`` (exactly one batch, ``header`` its own) as they are before
    compression (a view when they are not compressed); decompression is bounded by
    ``decompressed_bytes_max``."""
    codec = header.attributes & COMPRESSION_MASK
    if codec == Compression.NONE:
        return view[RECORDS_POSITION:]
    return _decompress(codec, view[RECORDS_POSITION:], decompressed_bytes_max)


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
        record = bytearray(b"\x00")  # attributes
        _put_varint(record, timestamp_ms - base_ts)
        _put_varint(record, i)
        _put_nullable(record, key)
        _put_nullable(record, value)
        _put_varint(record, len(headers))
        for name, header_value in headers:
            _put_nullable(record, name.encode())
            _put_nullable(record, header_value)
        _put_varint(body, len(record))
        body += record
    payload = bytes(body) if compression == Compression.NONE else compress(compression, bytes(body))
    batch_bytes = HEADER_BYTES + len(payload)
    if batch_bytes > BATCH_BYTES_LIMIT:
        raise ValueError(f"a batch of {batch_bytes} bytes is larger than the format allows")
    attributes = int(compression) | (TRANSACTIONAL_BIT if is_transactional else 0)
    out = bytearray(HEADER_BYTES)
    try:
        HEADER.pack_into(out, 0, base_offset, batch_bytes - LOG_OVERHEAD_BYTES, partition_leader_epoch, MAGIC, 0,
                         attributes, len(records) - 1, base_ts, max_ts, producer_id, producer_epoch,
                         base_sequence, len(records))
    except struct.error as e:
        raise ValueError(f"a header field is out of range: {e}") from None
    out += payload
    CRC.pack_into(out, CRC_POSITION, crc32c(memoryview(out)[CRC_COVERS_FROM_POSITION:]))
    return bytes(out)
