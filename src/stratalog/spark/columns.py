"""Record batches <-> Arrow columns, in the exact Arrow schema Spark expects for the source's columns.

Decoding walks each batch's records once in Python to find where keys and values lie (the format is a
chain of variable-length records), then gathers all values of a fetched range with one numpy mask, so
the per-record Python work is a struct unpack and a few list appends.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from stratalog.engine.batch import (
    BATCH_HEADER_BYTES,
    ENCODING_KAFKA,
    RECORD_HEAD,
    BatchInfo,
    decode_headers,
    decode_records,
    encode_batch,
    read_batch_info,
)
from stratalog.engine.objformat import BlockEntry, CorruptObjectError, placed_batches
from stratalog.records import NewRecord

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
#: With option ``includeHeaders``: each record's headers, in order (an empty array when it has none).
HEADERS_DDL = "headers array<struct<key: string, value: binary>>"
_HEADER_TYPE = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
SPARK_SCHEMA_WITH_HEADERS = StructType([*SPARK_SCHEMA.fields, StructField(
    "headers", ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())])))])
ARROW_SCHEMA_WITH_HEADERS = ARROW_SCHEMA.append(pa.field("headers", pa.list_(pa.field("element", _HEADER_TYPE))))


def spark_schema(headers: bool) -> StructType:
    return SPARK_SCHEMA_WITH_HEADERS if headers else SPARK_SCHEMA


def arrow_schema(headers: bool) -> pa.Schema:
    return ARROW_SCHEMA_WITH_HEADERS if headers else ARROW_SCHEMA


#: Where a record's fields lie from its first byte: record_bytes u32, timestamp i64, key_bytes i32,
#: value_bytes i32, header_count u16, then the key.
_TS_AT, _KEY_BYTES_AT, _VALUE_BYTES_AT, _HEADER_COUNT_AT = 4, 12, 16, 20
_RECORD_BYTES = struct.Struct("<I")


@dataclass(slots=True)
class ColumnBuilder:
    """Collects records of several streams out of one fetched buffer, then builds one RecordBatch.

    Per record, Python only follows the chain of lengths to the next record and notes where each one
    starts; ``finish`` reads every field from those positions with numpy.
    """

    labels: list[str] = field(default_factory=list)
    label_rows: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    #: (first offset, count) of each run of records taken from one batch.
    runs: list[tuple[int, int]] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return len(self.positions)

    def add_block(self, buf: bytes, position: int, entry: BlockEntry, label: str, start: int, end: int) -> None:
        """Take the records with offsets in ``[start, end)`` from the block ``entry`` at ``buf[position:]``.

        The block's CRC must already be checked (it covers every batch header and record in it). Offsets
        count from ``entry.start_offset`` (the manifest's word), not from the batch headers, which are
        provisional in an object a Spark write committed.
        """
        before = len(self.positions)
        unpack = _RECORD_BYTES.unpack_from
        at_batch = position
        block_end = position + entry.size_bytes
        base = entry.start_offset
        while at_batch < block_end:
            header = read_batch_info(buf, at_batch)
            info = BatchInfo(entry.stream_id, base, header.count, header.batch_bytes, header.max_timestamp_ms)
            base += header.count
            if info.end_offset > start and info.base_offset < end:
                first = max(start - info.base_offset, 0)
                stop = min(end - info.base_offset, info.count)
                at = at_batch + BATCH_HEADER_BYTES
                found: list[int] = []
                note = found.append
                for _ in range(stop):
                    note(at)
                    at += 4 + unpack(buf, at)[0]
                self.positions.extend(found[first:] if first else found)
                self.runs.append((info.base_offset + first, stop - first))
            at_batch += info.batch_bytes
        if base != entry.end_offset:
            raise CorruptObjectError(f"data block of stream {entry.stream_id} at {entry.start_offset}: its batches "
                                     f"hold {base - entry.start_offset} records, the manifest says "
                                     f"{entry.end_offset - entry.start_offset}")
        taken = len(self.positions) - before
        if taken:
            if self.labels and self.labels[-1] == label:
                self.label_rows[-1] += taken
            else:
                self.labels.append(label)
                self.label_rows.append(taken)

    def finish(self, buf: bytes, headers: bool = False) -> pa.RecordBatch:
        """The collected rows as one RecordBatch over ``buf`` (the buffer every position refers to),
        with a ``headers`` column when ``headers``."""
        if not self.rows:
            return empty_batch(headers)
        data = np.frombuffer(buf, dtype=np.uint8)
        positions = np.asarray(self.positions, dtype=np.int64)
        stream = pa.array(self.labels, pa.string()).take(
            pa.array(np.repeat(np.arange(len(self.labels), dtype=np.int32), self.label_rows)))
        firsts = np.fromiter((r[0] for r in self.runs), dtype=np.int64, count=len(self.runs))
        counts = np.fromiter((r[1] for r in self.runs), dtype=np.int64, count=len(self.runs))
        run_starts = np.cumsum(counts) - counts
        offsets = np.repeat(firsts - run_starts, counts) + np.arange(len(positions), dtype=np.int64)
        timestamps_us = _field(data, positions + _TS_AT, "<i8") * 1000
        key_lengths = _field(data, positions + _KEY_BYTES_AT, "<i4").astype(np.int64)
        value_lengths = _field(data, positions + _VALUE_BYTES_AT, "<i4").astype(np.int64)
        key_starts = positions + _RECORD_HEAD_BYTES
        key_valid = key_lengths >= 0
        key_lengths = np.maximum(key_lengths, 0)
        keys = gather_binary(data, key_starts, key_lengths, key_valid)
        values = gather_binary(data, key_starts + key_lengths, value_lengths, None)
        columns = [stream, pa.array(offsets), pa.array(timestamps_us, pa.timestamp("us", tz="UTC")), keys, values]
        if headers:
            header_counts = _field(data, positions + _HEADER_COUNT_AT, "<u2")
            columns.append(_headers(buf, key_starts + key_lengths + value_lengths, header_counts))
        return pa.RecordBatch.from_arrays(columns, schema=arrow_schema(headers))


def native_blocks(buf: bytes,
                  blocks: list[tuple[int, BlockEntry]]) -> tuple[bytes, list[tuple[int, BlockEntry]]] | None:
    """The blocks (each at its position in ``buf``, CRC already checked) with every batch in the native
    encoding, in a new buffer, and their entries placed in it; None when no batch is a Kafka batch (the
    common case, which costs one walk of the batch headers). Kafka batches, stored as producers sent
    them, are decoded record by record: the columns are gathered from native records only."""
    if not any(info.encoding == ENCODING_KAFKA for at, entry in blocks
               for _, info in placed_batches(memoryview(buf)[at:at + entry.size_bytes], entry)):
        return None
    out = bytearray()
    placed = []
    for at, entry in blocks:
        block = buf[at:at + entry.size_bytes]
        start = len(out)
        for pos, info in placed_batches(block, entry):
            if info.encoding != ENCODING_KAFKA:
                out += block[pos:pos + info.batch_bytes]
                continue
            records = [NewRecord(r.value, r.key, r.timestamp_ms, r.headers) for r in decode_records(block, pos, info)]
            out += encode_batch(entry.stream_id, info.base_offset, records)[0]
        placed.append((start, BlockEntry(entry.stream_id, entry.start_offset, entry.end_offset, start,
                                         len(out) - start, entry.record_count, entry.max_timestamp_ms, 0)))
    return bytes(out), placed


def _field(data: np.ndarray, at: np.ndarray, dtype: str) -> np.ndarray:
    """The little-endian integers of ``dtype`` starting at each byte position ``at`` (unaligned)."""
    width = np.dtype(dtype).itemsize
    return data[at[:, None] + np.arange(width)].copy().view(dtype).reshape(-1)


def gather_binary(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray, valid: np.ndarray | None) -> pa.Array:
    """A binary array of ``data[starts[i]:starts[i] + lengths[i]]`` for each i (null where not ``valid``).

    The pieces never overlap and come in buffer order, so they and the gaps between them tile the
    buffer: an Arrow view of that tiling (offsets 0, s0, e0, s1, e1, ...) over the buffer itself costs
    no copy, and Arrow's ``take`` of every second element copies the pieces out in one pass.
    """
    count = len(starts)
    if len(data) > np.iinfo(np.int32).max:
        raise ValueError("a fetched range over 2 GiB does not fit Arrow's binary offsets; fetch less")
    tiling = np.empty(2 * count + 1, dtype=np.int32)
    tiling[0] = 0
    tiling[1::2] = starts
    tiling[2::2] = starts + lengths
    view = pa.Array.from_buffers(pa.binary(), 2 * count, [None, pa.py_buffer(tiling), pa.py_buffer(data)])
    picked = view.take(pa.array(np.arange(1, 2 * count, 2, dtype=np.int32)))
    if valid is None or valid.all():
        return picked
    validity = pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(pa.binary(), count, [validity, *picked.buffers()[1:]],
                                 null_count=int(count - valid.sum()))


def _headers(buf: bytes, starts: np.ndarray, counts: np.ndarray) -> pa.Array:
    """The headers column: records with headers are few, so they are decoded one by one."""
    list_offsets = np.zeros(len(counts) + 1, dtype=np.int32)
    np.cumsum(counts, out=list_offsets[1:])
    names: list[str] = []
    values: list[bytes | None] = []
    view = memoryview(buf)
    for row in np.flatnonzero(counts).tolist():
        decoded, _ = decode_headers(view, int(starts[row]), int(counts[row]))
        for name, value in decoded:
            names.append(name)
            values.append(value)
    entries = pa.StructArray.from_arrays([pa.array(names, pa.string()), pa.array(values, pa.binary())],
                                         fields=list(_HEADER_TYPE))
    return pa.ListArray.from_arrays(pa.array(list_offsets), entries, type=pa.list_(pa.field("element", _HEADER_TYPE)))


def empty_batch(headers: bool = False) -> pa.RecordBatch:
    """A RecordBatch with no rows in the source's schema."""
    return pa.RecordBatch.from_pylist([], schema=arrow_schema(headers))
