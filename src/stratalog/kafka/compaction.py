"""Kafka batches as log compaction reads and rewrites them (engine/cleaner.py decides what is kept).

A compacted batch is the batch it was with fewer records: the same base offset, last offset delta, base and
max timestamps, producer fields, attributes and codec, each kept record's bytes as they were (its offset
and timestamp deltas unchanged), a new record count and CRC. Its offsets then have gaps, as a Kafka broker's
compacted batches do. A run of batches that lost every record becomes one empty batch over their offsets
(no producer, no records): clients skip it to the offset after it, as they skip Kafka's.

The store's own encoding (``engine.batch``, encoding 0) carries no Kafka fields: its records are written
here as Kafka records of a new batch, numbered by their offsets.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from stratalog.kafka.batch_compression import uncompressed_records
from stratalog.kafka.batch_format import (
    MAGIC,
    BatchHeader,
)
from stratalog.kafka.codecs import Compression, compress
from stratalog.kafka.record_check import walk_fields
from stratalog.kafka.records import _check_whole_batch, encode_record, packed_batch
from stratalog.records import Record

#: What a Kafka batch may expand to when the cleaner decompresses it (as a reader's bound: engine.batch).
DECOMPRESSED_BYTES_MAX = 128 << 20
#: Producer fields of a batch no producer wrote (the empty batch over a gap, the store's own records).
NO_PRODUCER_ID, NO_PRODUCER_EPOCH, NO_SEQUENCE = -1, -1, -1
#: Kafka's NO_TIMESTAMP: the max timestamp of a batch with no records.
NO_TIMESTAMP = -1


@dataclass(frozen=True, slots=True)
class RawRecord:
    """One record of a batch as compaction needs it: where it sits, its key, whether it is a tombstone,
    and its bytes as stored (its length varint first), to be written again unchanged."""

    offset: int
    timestamp_ms: int
    key: bytes | None
    null_value: bool
    raw: bytes


@dataclass(frozen=True, slots=True)
class SourceBatch:
    """A batch's records and the header fields a compacted copy keeps."""

    header: BatchHeader
    records: list[RawRecord]


def kafka_batch_records(batch: bytes | memoryview) -> SourceBatch:
    """Every record of a stored Kafka batch (one whole batch; offsets may have gaps already)."""
    view = memoryview(batch)
    header = _check_whole_batch(view)
    data = uncompressed_records(view, header, decompressed_bytes_max=DECOMPRESSED_BYTES_MAX)
    data = data if isinstance(data, bytes) else bytes(data)
    records: list[RawRecord] = []
    start = 0
    for end, timestamp_delta, offset_delta, key_at, key_bytes, _, value_bytes, _ in walk_fields(
            data, 0, header.record_count, gaps_up_to=header.last_offset_delta):
        records.append(RawRecord(header.base_offset + offset_delta, header.base_timestamp_ms + timestamp_delta,
                                 None if key_bytes < 0 else data[key_at:key_at + key_bytes], value_bytes < 0,
                                 data[start:end]))
        start = end
    return SourceBatch(header, records)


def native_batch_records(records: Sequence[Record], base_offset: int, span: int) -> SourceBatch:
    """The store's own records of a batch at ``base_offset`` over ``span`` offsets, as Kafka records (a
    CreateTime batch of no producer, its base timestamp the first record's)."""
    base_ts = records[0].timestamp_ms if records else NO_TIMESTAMP
    max_ts = max((r.timestamp_ms for r in records), default=NO_TIMESTAMP)
    raw = [RawRecord(r.offset, r.timestamp_ms, r.key, False,
                     encode_record(r.offset - base_offset, r.timestamp_ms - base_ts, r.key, r.value, r.headers))
           for r in records]
    header = BatchHeader(base_offset, 0, -1, MAGIC, 0, 0, span - 1, base_ts, max_ts, NO_PRODUCER_ID,
                         NO_PRODUCER_EPOCH, NO_SEQUENCE, len(raw))
    return SourceBatch(header, raw)


def rebuilt_batch(source: SourceBatch, kept: Sequence[RawRecord]) -> bytes:
    """``source`` with only the records ``kept`` (at least one), in its codec, everything else as it was."""
    h = source.header
    records = b"".join(r.raw for r in kept)
    payload = records if h.compression == Compression.NONE else compress(h.compression, records)
    return packed_batch(h.base_offset, h.partition_leader_epoch, h.attributes, h.last_offset_delta,
                        h.base_timestamp_ms, h.max_timestamp_ms, h.producer_id, h.producer_epoch, h.base_sequence,
                        len(kept), payload)


def gap_batch(base_offset: int, span: int) -> bytes:
    """An empty batch over ``span`` offsets from ``base_offset``: where batches lost every record."""
    return packed_batch(base_offset, -1, 0, span - 1, NO_TIMESTAMP, NO_TIMESTAMP, NO_PRODUCER_ID,
                        NO_PRODUCER_EPOCH, NO_SEQUENCE, 0, b"")

