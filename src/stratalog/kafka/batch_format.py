"""The Kafka record batch format, magic 2: its layout as constants, its header as a named tuple, and the
errors of a batch that breaks it. Every other module of the batch imports these: ``records.py`` (checks,
decoders, the encoder), ``record_check.py`` (the one walk of the records' grammar), and
``batch_compression.py`` (a batch's payload compressed and decompressed). Layout (big-endian; spec in
docs/formats/kafka-batch.md)::

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
from enum import IntEnum
from typing import ClassVar, NamedTuple

from stratalog.errors import StratalogError
from stratalog.invariant import invariant
from stratalog.kafka.codecs import Compression

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
