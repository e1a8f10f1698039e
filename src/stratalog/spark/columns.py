"""Record batches <-> Arrow columns, in the exact Arrow schema Spark expects for the source's columns.

Decoding indexes each batch's records in one call (where each record's offset, timestamp, key, value and
headers lie: the format is a chain of variable-length records), compiled where the core is built, then
gathers every column of a fetched range from those indexes with numpy and Arrow: no Python object and no
Python step per record, in either encoding a batch is stored in. A Kafka batch that log compaction
rewrote holds fewer records than the offsets it spans (none, even): each record's offset is its own
(the index's OFFSET_DELTA), never its place in the batch.
"""

from __future__ import annotations

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
    KAFKA_DECOMPRESSED_BYTES_MAX,
    BatchInfo,
    decode_headers,
)
from stratalog.engine.objformat import BlockEntry, CorruptObjectError, placed_batches
from stratalog.engine.record_index import index_records as index_native
from stratalog.invariant import invariant
from stratalog.kafka.record_index import (
    HEADER_COUNT,
    HEADERS_START,
    INDEX_COLUMNS,
    KEY_BYTES,
    KEY_START,
    OFFSET_DELTA,
    TIMESTAMP_MS,
    VALUE_BYTES,
    VALUE_START,
    index_kafka_batch,
    kafka_headers,
)
from stratalog.kafka.records import KafkaBatchError
from stratalog.spark.aborted import AbortedIndex, keeps

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


@dataclass(slots=True)
class ColumnBuilder:
    """Collects records of several streams out of one fetched buffer, then builds one RecordBatch.

    Each batch's records are indexed by one call (``record_index``: compiled, or its Python twin), in
    either encoding: the store's own, or a Kafka batch as a producer sent it (or as compaction left it,
    offsets with gaps). ``finish`` gathers every
    column from those indexes with numpy and Arrow. The records of a compressed Kafka batch are
    decompressed into a piece of their own; the columns then come from the fetched bytes and those
    pieces laid end to end in order (one copy, made only where a batch was compressed).
    """

    labels: list[str] = field(default_factory=list)
    label_rows: list[int] = field(default_factory=list)
    #: (first offset, count) of each run of records taken from one batch, its offsets following each other...
    runs: list[tuple[int, int]] = field(default_factory=list)
    #: ... but for the runs of batches compaction left gaps in: (run number, the offset of each record).
    gapped: list[tuple[int, np.ndarray]] = field(default_factory=list)
    #: The index of each run (INDEX_COLUMNS x its rows), positions counted in the pieces laid end to end.
    indexes: list[np.ndarray] = field(default_factory=list)
    #: Whether each run came from a Kafka batch (its headers are in Kafka's encoding).
    kafka: list[bool] = field(default_factory=list)
    pieces: list[bytes | memoryview] = field(default_factory=list)
    pieces_bytes: int = 0
    #: How much of the fetched buffer the pieces hold (from its start).
    fetched_bytes_taken: int = 0
    decompressed: bool = False
    #: Records taken so far.
    rows: int = 0

    def add_block(self, buf: bytes, position: int, entry: BlockEntry, label: str, start: int, end: int,
                  aborted: AbortedIndex | None = None) -> None:
        """Take the records with offsets in ``[start, end)`` from the block ``entry`` at ``buf[position:]``,
        but those of markers and, given the stream's ``aborted`` transactions (read_committed), of the
        batches they wrote (spark/aborted.py).

        The block's CRC must already be checked (it covers every batch header and record in it), and
        blocks must come in the order of their positions. Offsets count from ``entry.start_offset`` (the
        manifest's word), not from the batch headers, which are provisional in an object a Spark write
        committed: a record's offset is its batch's placed base offset plus its offset delta.
        """
        taken = 0
        block = memoryview(buf)[position:position + entry.size_bytes]
        for at, info in placed_batches(block, entry):
            if info.end_offset <= start or info.base_offset >= end:
                continue
            index = self._index(buf, position + at, info, aborted)
            base = info.base_offset
            # Offset deltas increase below the batch's span (the index checked it): with a record for every
            # offset, row i is offset base + i; with gaps (compaction), the records in range are still one slice.
            dense = index.shape[1] == info.count
            if dense:
                first, stop = max(start - base, 0), min(end - base, info.count)
            else:
                first, stop = np.searchsorted(index[OFFSET_DELTA], (start - base, end - base)).tolist()
            if first >= stop:
                continue  # none in range: compaction took them, or emptied the batch
            if not dense:
                self.gapped.append((len(self.runs), base + index[OFFSET_DELTA, first:stop]))
            self.runs.append((base + first, stop - first))
            self.indexes.append(index[:, first:stop])
            self.kafka.append(info.encoding == ENCODING_KAFKA)
            taken += stop - first
        if taken:
            self.rows += taken
            if self.labels and self.labels[-1] == label:
                self.label_rows[-1] += taken
            else:
                self.labels.append(label)
                self.label_rows.append(taken)

    def _index(self, buf: bytes, at: int, info: BatchInfo, aborted: AbortedIndex | None) -> np.ndarray:
        """The index of the batch at ``buf[at:]``, its positions counted in the pieces (none for a batch
        the read drops)."""
        batch_end = at + info.batch_bytes
        if info.encoding != ENCODING_KAFKA:
            shift = self._take_fetched(buf, at, batch_end)
            raw = index_native(buf, at + BATCH_HEADER_BYTES, batch_end, info.count)
        else:
            try:
                header, records, raw = index_kafka_batch(memoryview(buf)[at + BATCH_HEADER_BYTES:batch_end],
                                                         decompressed_bytes_max=KAFKA_DECOMPRESSED_BYTES_MAX)
            except KafkaBatchError as e:
                raise CorruptObjectError(f"the Kafka batch at offset {info.base_offset}: {e}") from e
            if header.last_offset_delta + 1 != info.count:
                raise CorruptObjectError(f"a Kafka batch over {header.last_offset_delta + 1} offsets where the "
                                         f"store's header says {info.count}")
            # A transaction's marker is an offset and no row (as Stream.fetch); so is an aborted batch's
            # record under read_committed. Offsets are the placed ones (info), as everywhere here.
            if not keeps(aborted, control=header.is_control, transactional=header.is_transactional,
                         producer_id=header.producer_id, base_offset=info.base_offset,
                         last_offset=info.end_offset - 1):
                return np.empty((INDEX_COLUMNS, 0), dtype=np.int64)
            if isinstance(records, memoryview):  # not compressed: the records are in buf, up to batch_end
                shift = self._take_fetched(buf, at, batch_end) + batch_end - len(records)
            else:
                shift = self._take_piece(records)
        index = np.frombuffer(raw, dtype=np.int64).reshape(INDEX_COLUMNS, -1)
        if shift:
            index = index.copy()
            index[[KEY_START, VALUE_START, HEADERS_START]] += shift
        return index

    def _take_fetched(self, buf: bytes, at: int, batch_end: int) -> int:
        """Lay the fetched bytes up to ``batch_end`` into the pieces; the shift from a position in ``buf``
        to its place in the pieces."""
        invariant(at >= self.fetched_bytes_taken, "blocks are added in the order of their positions")
        shift = self.pieces_bytes - self.fetched_bytes_taken
        self.pieces.append(memoryview(buf)[self.fetched_bytes_taken:batch_end])
        self.pieces_bytes += batch_end - self.fetched_bytes_taken
        self.fetched_bytes_taken = batch_end
        return shift

    def _take_piece(self, data: bytes) -> int:
        shift = self.pieces_bytes
        self.pieces.append(data)
        self.pieces_bytes += len(data)
        self.decompressed = True
        return shift

    def finish(self, buf: bytes, headers: bool = False) -> pa.RecordBatch:
        """The collected rows as one RecordBatch over ``buf`` (the fetched buffer every block was in),
        with a ``headers`` column when ``headers``."""
        if not self.rows:
            return empty_batch(headers)
        # Without a decompressed piece, the pieces are buf's own first bytes: positions are buf's.
        laid = b"".join(self.pieces) if self.decompressed else buf
        data = np.frombuffer(laid, dtype=np.uint8)
        index = np.concatenate(self.indexes, axis=1) if len(self.indexes) > 1 else self.indexes[0]
        stream = pa.array(self.labels, pa.string()).take(
            pa.array(np.repeat(np.arange(len(self.labels), dtype=np.int32), self.label_rows)))
        firsts = np.fromiter((r[0] for r in self.runs), dtype=np.int64, count=len(self.runs))
        counts = np.fromiter((r[1] for r in self.runs), dtype=np.int64, count=len(self.runs))
        run_starts = np.cumsum(counts) - counts
        offsets = np.repeat(firsts - run_starts, counts) + np.arange(self.rows, dtype=np.int64)
        for run, gapped in self.gapped:
            offsets[run_starts[run]:run_starts[run] + len(gapped)] = gapped
        key_lengths = index[KEY_BYTES]
        keys = gather_binary(data, index[KEY_START], np.maximum(key_lengths, 0), key_lengths >= 0)
        values = gather_binary(data, index[VALUE_START], index[VALUE_BYTES], None)
        columns = [stream, pa.array(offsets), pa.array(index[TIMESTAMP_MS] * 1000, pa.timestamp("us", tz="UTC")),
                   keys, values]
        if headers:
            kafka_rows = np.repeat(np.array(self.kafka, dtype=bool), counts)
            columns.append(_headers(laid, index[HEADERS_START], index[HEADER_COUNT], kafka_rows))
        return pa.RecordBatch.from_arrays(columns, schema=arrow_schema(headers))


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


def _headers(buf: bytes, starts: np.ndarray, counts: np.ndarray, kafka_rows: np.ndarray) -> pa.Array:
    """The headers column: records with headers are few, so they are decoded one by one, each in its
    batch's encoding."""
    list_offsets = np.zeros(len(counts) + 1, dtype=np.int32)
    np.cumsum(counts, out=list_offsets[1:])
    names: list[str] = []
    values: list[bytes | None] = []
    view = memoryview(buf)
    for row in np.flatnonzero(counts).tolist():
        if kafka_rows[row]:
            decoded = kafka_headers(buf, int(starts[row]), int(counts[row]))
        else:
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
