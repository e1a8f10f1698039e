"""Where each record of a Kafka batch keeps its fields: the index that readers build Arrow columns from,
with no Python object per record.

An index of ``count`` records is ``INDEX_COLUMNS`` int64 columns of ``count`` rows each, one column after
the other, in one bytes object (``np.frombuffer(index, np.int64).reshape(INDEX_COLUMNS, count)`` reads
it). Positions are byte positions in the data indexed; a key of -1 bytes is a null key; a null value
is indexed as an empty one, as ``records.decode_records`` returns it. The store's own batch encoding has
the same index (``stratalog.engine.record_index``), so a reader gathers both encodings alike.

``index_kafka_records`` is the reference of the compiled ``stratalog._native.index_kafka_records``: the
records are checked first with the produce-time check's rules and errors (``record_check.walk_records``),
then read a second time for the fields, which the check has proved are there.
"""

from __future__ import annotations

import numpy as np

from stratalog.kafka.record_check import walk_records
from stratalog.kafka.records import (
    TIMESTAMP_TYPE_BIT,
    BatchHeader,
    CorruptRecordError,
    _check_whole_batch,
    _read_headers,
    _read_varint,
    uncompressed_records,
)
from stratalog.native import native

#: The columns of an index, in order.
INDEX_COLUMNS = 7
TIMESTAMP_MS, KEY_START, KEY_BYTES, VALUE_START, VALUE_BYTES, HEADERS_START, HEADER_COUNT = range(INDEX_COLUMNS)
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def index_kafka_records(data: bytes | memoryview, position: int, count: int, base_timestamp_ms: int,
                        append_timestamp_ms: int | None) -> bytes:
    """The index of the ``count`` Kafka records at ``data[position:]`` (uncompressed; they must end where
    the data ends). A record's timestamp is ``base_timestamp_ms`` plus its delta, or
    ``append_timestamp_ms`` for every record when that is given (a LogAppendTime batch). HEADERS_START
    is where a record's first header starts (after the header count). Raises CorruptRecordError or
    InvalidRecordError as the produce-time check does, and CorruptRecordError for trailing bytes or a
    timestamp beyond int64."""
    if position < 0:
        raise ValueError("position must not be negative")
    if count < 0:
        raise ValueError("count must not be negative")
    end = walk_records(data, position, count)
    if end != len(data):
        raise CorruptRecordError(f"{len(data) - end} bytes after the last record")
    raw = bytes(data)
    rows: list[tuple[int, ...]] = []
    note = rows.append
    p = position
    for i in range(count):
        length, p = _read_varint(raw, p)
        record_end = p + length
        delta, p = _read_varint(raw, p + 1)  # after the attributes byte
        _, p = _read_varint(raw, p)  # offsetDelta: the check made it i
        key_bytes, p = _read_varint(raw, p)
        key_start = p
        p += max(key_bytes, 0)
        value_bytes, p = _read_varint(raw, p)
        value_start = p
        value_bytes = max(value_bytes, 0)
        p += value_bytes
        header_count, p = _read_varint(raw, p)
        timestamp_ms = base_timestamp_ms + delta if append_timestamp_ms is None else append_timestamp_ms
        if not INT64_MIN <= timestamp_ms <= INT64_MAX:
            raise CorruptRecordError(f"record {i}: timestamp {timestamp_ms} does not fit an int64")
        note((timestamp_ms, key_start, key_bytes, value_start, value_bytes, p,
                                           header_count))
        p = record_end
    return as_index(rows)


def index_kafka_batch(batch: memoryview, *,
                      decompressed_bytes_max: int) -> tuple[BatchHeader, bytes | memoryview, bytes]:
    """A whole Kafka batch (exactly one, its header and CRC checked now): its header, its records as they
    are before compression (a view of ``batch`` when they are not compressed, else the decompressed bytes,
    bounded by ``decompressed_bytes_max``) and their index, positions counted in those records. Raises
    KafkaBatchError."""
    header = _check_whole_batch(batch)
    records = uncompressed_records(batch, header, decompressed_bytes_max=decompressed_bytes_max)
    append_ms = header.max_timestamp_ms if header.attributes & TIMESTAMP_TYPE_BIT else None
    return header, records, index_records(records, 0, header.record_count, header.base_timestamp_ms, append_ms)


def kafka_headers(data: bytes, position: int, count: int) -> tuple[tuple[str, bytes | None], ...]:
    """The ``count`` headers of an indexed Kafka record, its HEADERS_START at ``position`` (checked when
    it was indexed)."""
    return _read_headers(data, position, len(data), count)[0]


#: The compiled index where the core is built, else its twin.
index_records = native.index_kafka_records if native is not None else index_kafka_records


def as_index(rows: list[tuple[int, ...]]) -> bytes:
    """The index of records given as rows of INDEX_COLUMNS fields each."""
    return np.array(rows, dtype=np.int64).reshape(len(rows), INDEX_COLUMNS).T.tobytes()
