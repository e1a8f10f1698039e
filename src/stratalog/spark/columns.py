"""Record batches <-> Arrow columns, in the exact Arrow schema Spark expects for the source's columns.

Decoding walks each batch's records once in Python to find where keys and values lie (the format is a
chain of variable-length records), then gathers all values of a fetched range with one numpy mask, so
the per-record Python work is a struct unpack and a few list appends.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType, TimestampType

from stratalog.engine.batch import BATCH_HEADER_BYTES, RECORD_HEAD, read_batch_info

#: The data source's schema, as Spark DDL and as a StructType (which needs no JVM to build).
SCHEMA_DDL = "stream string, offset bigint, timestamp timestamp, key binary, value binary"
SPARK_SCHEMA = StructType([
    StructField("stream", StringType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
])
#: The Arrow schema of every RecordBatch the reader yields: what Spark's Arrow conversion of SCHEMA_DDL
#: gives (nullable fields, microsecond timestamps in UTC, 32-bit-offset binary and string).
ARROW_SCHEMA = pa.schema([
    pa.field("stream", pa.string()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", pa.timestamp("us", tz="UTC")),
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
])
_RECORD_HEAD_BYTES = RECORD_HEAD.size


@dataclass(slots=True)
class ColumnBuilder:
    """Collects records of several streams out of fetched buffers, then builds one RecordBatch."""

    labels: list[str] = field(default_factory=list)
    label_rows: list[int] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    timestamps_ms: list[int] = field(default_factory=list)
    key_starts: list[int] = field(default_factory=list)
    key_lengths: list[int] = field(default_factory=list)
    value_starts: list[int] = field(default_factory=list)
    value_lengths: list[int] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return len(self.offsets)

    def add_block(self, buf: bytes, position: int, size_bytes: int, label: str, start: int, end: int) -> None:
        """Take the records with offsets in ``[start, end)`` from the block at ``buf[position:]``.

        The block's CRC must already be checked (it covers every batch header and record in it).
        """
        before = len(self.offsets)
        offsets, timestamps = self.offsets, self.timestamps_ms
        key_starts, key_lengths = self.key_starts, self.key_lengths
        value_starts, value_lengths = self.value_starts, self.value_lengths
        unpack = RECORD_HEAD.unpack_from
        at_batch = position
        block_end = position + size_bytes
        while at_batch < block_end:
            info = read_batch_info(buf, at_batch)
            next_batch = at_batch + info.batch_bytes
            if info.end_offset > start and info.base_offset < end:
                at = at_batch + BATCH_HEADER_BYTES
                for offset in range(info.base_offset, info.end_offset):
                    body_bytes, ts, key_bytes, value_bytes, _ = unpack(buf, at)
                    if start <= offset < end:
                        p = at + _RECORD_HEAD_BYTES
                        offsets.append(offset)
                        timestamps.append(ts)
                        key_starts.append(p)
                        key_lengths.append(key_bytes)
                        value_starts.append(p + key_bytes if key_bytes > 0 else p)
                        value_lengths.append(value_bytes)
                    at += 4 + body_bytes
            at_batch = next_batch
        taken = len(self.offsets) - before
        if taken:
            if self.labels and self.labels[-1] == label:
                self.label_rows[-1] += taken
            else:
                self.labels.append(label)
                self.label_rows.append(taken)

    def finish(self, buf: bytes) -> pa.RecordBatch:
        """The collected rows as one RecordBatch over ``buf`` (the buffer every position refers to)."""
        if not self.rows:
            return empty_batch()
        data = np.frombuffer(buf, dtype=np.uint8)
        stream = pa.array(self.labels, pa.string()).take(
            pa.array(np.repeat(np.arange(len(self.labels), dtype=np.int32), self.label_rows)))
        timestamps_us = np.asarray(self.timestamps_ms, dtype=np.int64) * 1000
        key_lengths = np.asarray(self.key_lengths, dtype=np.int64)
        key_valid = key_lengths >= 0
        keys = _gather(data, np.asarray(self.key_starts, dtype=np.int64), np.maximum(key_lengths, 0), key_valid)
        values = _gather(data, np.asarray(self.value_starts, dtype=np.int64),
                         np.asarray(self.value_lengths, dtype=np.int64), None)
        return pa.RecordBatch.from_arrays(
            [stream, pa.array(np.asarray(self.offsets, dtype=np.int64)),
             pa.array(timestamps_us, pa.timestamp("us", tz="UTC")), keys, values],
            schema=ARROW_SCHEMA,
        )


def _gather(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray, valid: np.ndarray | None) -> pa.Array:
    """A binary array of ``data[starts[i]:starts[i] + lengths[i]]`` for each i (null where not ``valid``).

    The pieces never overlap and come in buffer order, so one mask over the buffer selects them all.
    """
    count = len(starts)
    offsets = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] > np.iinfo(np.int32).max:
        raise ValueError("more than 2 GiB of keys or values in one Arrow batch; fetch smaller ranges")
    # +1 where a piece starts, -1 where it ends: the running sum is 1 inside pieces, 0 between them.
    # Starts are distinct, and so are ends, so each fancy-indexed update touches an index once.
    marks = np.zeros(len(data) + 1, dtype=np.int8)
    marks[starts] += 1
    marks[starts + lengths] -= 1
    gathered = data[np.cumsum(marks[:len(data)], dtype=np.int8) > 0]
    validity = None
    null_count = 0
    if valid is not None and not valid.all():
        validity = pa.py_buffer(np.packbits(valid, bitorder="little"))
        null_count = int(count - valid.sum())
    return pa.Array.from_buffers(pa.binary(), count, [validity, pa.py_buffer(offsets.astype(np.int32)),
                                                      pa.py_buffer(gathered)], null_count=null_count)


def empty_batch() -> pa.RecordBatch:
    """A RecordBatch with no rows in the source's schema."""
    return pa.RecordBatch.from_pylist([], schema=ARROW_SCHEMA)
