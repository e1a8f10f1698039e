"""Where each record of a Kafka batch keeps its fields: the index that readers build Arrow columns from,
with no Python object per record.

An index of ``count`` records is ``INDEX_COLUMNS`` int64 columns of ``count`` rows each, one column after
the other, in one bytes object (``np.frombuffer(index, np.int64).reshape(INDEX_COLUMNS, count)`` reads
it). Positions are byte positions in the data indexed; a key of -1 bytes is a null key; a null value
is indexed as an empty one, as ``records.decode_records`` returns it. OFFSET_DELTA is the record's
offset less the batch's base offset: a stored batch may hold fewer records than the offsets it spans
(log compaction took the others, docs/formats/kafka-batch.md), so a record's offset is its own delta's,
not its row's. The store's own batch encoding has the same index (``stratalog.engine.record_index``, its
offsets dense), so a reader gathers both encodings alike.

``index_kafka_records`` is the reference of the compiled ``stratalog._native.index_kafka_records``. Both
read a stored batch's records as the decoders do, in one walk (``record_check.walk_fields``, with
``gaps_up_to`` the batch's lastOffsetDelta): every length checked against the bytes left, offset deltas
increasing up to lastOffsetDelta, Produce's wording for each error.
"""

from __future__ import annotations

import numpy as np

from stratalog.kafka.batch_compression import uncompressed_records
from stratalog.kafka.batch_format import TIMESTAMP_TYPE_BIT, VARINT_CONTINUATION, BatchHeader, CorruptRecordError
from stratalog.kafka.record_check import Headers, length_error, read_varint, walk_fields, walk_headers
from stratalog.kafka.records import _check_whole_batch
from stratalog.native import native

#: The columns of an index, in order.
INDEX_COLUMNS = 8
(TIMESTAMP_MS, KEY_START, KEY_BYTES, VALUE_START, VALUE_BYTES, HEADERS_START, HEADER_COUNT,
 OFFSET_DELTA) = range(INDEX_COLUMNS)
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def index_kafka_records(data: bytes | memoryview, position: int, count: int, last_offset_delta: int,
                        base_timestamp_ms: int, append_timestamp_ms: int | None) -> bytes:
    """The index of the ``count`` Kafka records at ``data[position:]`` (uncompressed; they must end where
    the data ends) of a stored batch whose lastOffsetDelta is ``last_offset_delta``: their offset deltas
    increase up to it, with gaps where records were compacted away (dense, ``count - 1``, for a batch as
    produced). A record's timestamp is ``base_timestamp_ms`` plus its delta, or ``append_timestamp_ms``
    for every record when that is given (a LogAppendTime batch). HEADERS_START is where a record's first
    header starts (after the header count). Raises CorruptRecordError or InvalidRecordError at the first
    record that is wrong (as ``record_check.walk_fields`` words it), then CorruptRecordError for trailing
    bytes, then for the first timestamp beyond int64."""
    if position < 0:
        raise ValueError("position must not be negative")
    if count < 0:
        raise ValueError("count must not be negative")
    raw = bytes(data)  # indexing bytes is twice as fast as indexing a memoryview
    rows: list[tuple[int, ...]] = []
    note = rows.append
    p = position
    append = append_timestamp_ms
    one_byte = VARINT_CONTINUATION  # (a local: a global lookup per record costs)
    overflow, overflow_ms = -1, 0  # the first timestamp beyond int64: reported once every record is checked
    for fields in walk_fields(raw, position, count, length_error, False, last_offset_delta):
        p, delta, offset_delta, key_at, key_bytes, value_at, value_bytes, _ = fields
        value_kept = max(value_bytes, 0)  # a null value reads as an empty one
        at = value_at + value_kept  # the header count, which the walk has read: one byte up to 63 headers
        b = raw[at]
        if b < one_byte:
            header_count, headers_start = (b >> 1) ^ -(b & 1), at + 1
        else:
            header_count, headers_start = read_varint(raw, at)
        timestamp_ms = base_timestamp_ms + delta if append is None else append
        if overflow < 0 and not INT64_MIN <= timestamp_ms <= INT64_MAX:
            overflow, overflow_ms = len(rows), timestamp_ms
        note((timestamp_ms, key_at, key_bytes, value_at, value_kept, headers_start, header_count, offset_delta))
    if p != len(raw):
        raise CorruptRecordError(f"{len(raw) - p} bytes after the last record")
    if overflow >= 0:
        raise CorruptRecordError(f"record {overflow}: timestamp {overflow_ms} does not fit an int64")
    return as_index(rows)


def index_kafka_batch(batch: memoryview, *,
                      decompressed_bytes_max: int) -> tuple[BatchHeader, bytes | memoryview, bytes]:
    """A whole stored Kafka batch (exactly one, its header and CRC checked now; it may hold fewer records
    than it spans, none even): its header, its records as they are before compression (a view of
    ``batch`` when they are not compressed, else the decompressed bytes, bounded by
    ``decompressed_bytes_max``) and their index, positions counted in those records. Raises
    KafkaBatchError."""
    header = _check_whole_batch(batch)
    records = uncompressed_records(batch, header, decompressed_bytes_max=decompressed_bytes_max)
    append_ms = header.max_timestamp_ms if header.attributes & TIMESTAMP_TYPE_BIT else None
    return header, records, index_records(records, 0, header.record_count, header.last_offset_delta,
                                          header.base_timestamp_ms, append_ms)


def kafka_headers(data: bytes, position: int, count: int) -> Headers:
    """The ``count`` headers of an indexed Kafka record, its HEADERS_START at ``position`` (checked when
    it was indexed)."""
    found: list[tuple[str, bytes | None]] = []
    walk_headers(data, position, len(data), count, 0, found)  # (indexed records were checked: no error names 0)
    return tuple(found)


#: The compiled index where the core is built, else its twin.
index_records = native.index_kafka_records if native is not None else index_kafka_records


def as_index(rows: list[tuple[int, ...]]) -> bytes:
    """The index of records given as rows of INDEX_COLUMNS fields each."""
    return np.array(rows, dtype=np.int64).reshape(len(rows), INDEX_COLUMNS).T.tobytes()
