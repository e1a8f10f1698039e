"""Writes through Spark: tasks stage objects, the driver registers them where they are, with dense offsets.

How a write goes:

1. Each task groups its rows by stream, encodes them as batches with *task-relative* offsets (0, 1, ...
   per stream) under provisional stream ids (the position of the stream's name in the object's sorted
   name list), and puts object-format objects flagged *provisional* under ``spark-staging/<write id>/``.
   It returns a small :class:`WriteMessage` naming its staged objects and how many records each holds
   per stream.
2. The driver's ``commit`` opens the store's data directory (option ``data_dir``: the store of record is
   the SQLite metadata there, and the manifest it publishes), creates streams that do not exist yet,
   flushes, and gives each task a base offset per stream, in task order, from the stream's end. For each
   staged object it reads the footer and index only (two ranged gets), and makes the index entries
   metadata will hold: real stream id, offsets shifted by the task's base; position, size, record count,
   time and CRC as the task wrote them. It then *moves* each object to a fresh ``data/<id>.slo`` key
   (:meth:`ObjectStore.rename`) and :meth:`StreamStore.commit_external_objects` registers all of them in
   one metadata transaction and publishes the manifest once, so readers see the whole write or none of it.
3. ``abort`` (and ``commit`` once done) deletes everything under the write's staging prefix. A commit
   that fails, or that finds its streaming batch already committed, deletes the objects it moved. A crash
   between moving and the metadata commit leaves ``data/`` objects no commit names; the store deletes
   those when it next opens, as it does for an interrupted upload.

Why the bytes are not rewritten: offsets are dense and assigned at commit (a failed task must leave no
hole), so a task cannot know them. Readers never take a block's stream id or offsets from its batch
headers: the block's range row or manifest entry places it (record *i* of a block starting at offset *a*
is offset *a + i*), and its CRC, checked before anything in it is returned, covers the batches as the
task wrote them. So the provisional ids stay inside the object, the footer says so, and metadata is
authoritative (docs/formats/object.md). The commit's cost is a few small gets and one rename per staged
object, whatever the data size; nothing flows through the driver.

Why rename and not registering the staged key in place: ``data/`` stays the one prefix that holds
committed objects, with keys from the durable object-id counter that are never reused, so the store's
orphan cleanup (everything under ``data/`` that no commit names) covers a crashed commit unchanged, and
``abort``, ``retention --clean-staging`` and a failed commit may delete everything under
``spark-staging/`` without asking metadata what it still needs. On a local directory the move is an atomic
``os.replace``; on S3 a server-side copy then a delete (no byte through the driver either, but the copy
runs at the server's speed): if the delete is lost, the staged copy is deleted with the rest of the
staging prefix.

Streaming writes (``writeStream.format("stratalog")``) need option ``sinkId``: the commit of micro-batch
``b`` stores ``b`` under ``spark.sink.<sinkId>`` in the same metadata transaction, and a commit for a
batch id at or below the stored one writes nothing (a batch replayed after a driver crash). Through a
broker the broker commits instead (spark/broker_write.py); a write to a broker stages an object per
partition, since the brokers of a cluster commit each partition at its leader.

Writes need the store closed elsewhere: the driver holds the data directory while it commits.
Columns: ``stream`` (string) and ``value`` (binary or string) are required; ``key`` (binary or string),
``timestamp`` (timestamp; default: now) and ``headers`` (array of struct key string, value binary, as a
read with ``includeHeaders`` gives) are optional; other columns (such as ``offset``) are ignored. Rows
without headers are encoded column-wise; rows of a batch with a ``headers`` column one by one (slower).
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from stratalog.engine.batch import BATCH_HEADER, BATCH_HEADER_BYTES, ENCODING_NATIVE, RECORD_HEAD, encode_batch
from stratalog.engine.config import StoreConfig
from stratalog.engine.objformat import (
    FLAG_PROVISIONAL,
    ObjectBuilder,
    StreamBatch,
)
from stratalog.engine.record_layout import lay_out_records
from stratalog.engine.sink_markers import SINK_MARKER_PREFIX, sink_marker_key
from stratalog.engine.staging import (
    STAGING_PREFIX,
    CommitResult,
    StagedObject,
    StagedStream,
    commit_staged,
    delete_staging,
)
from stratalog.engine.store import StreamStore
from stratalog.objects.store import ObjectStore, put_parts
from stratalog.records import NewRecord
from stratalog.spark.broker_source import reachable_objects
from stratalog.spark.broker_write import Destinations, choose_partitions, commit_through_broker
from stratalog.spark.kafka_client import BrokerView
from stratalog.spark.location import Location, locate
from stratalog.spark.options import int_option, option, required
from stratalog.spark.reader import open_store, shared_store
from stratalog.wal.config import WALConfig
from stratalog.wal.format import crc32c

log = logging.getLogger("stratalog.spark")

STAGED_OBJECT_BYTES = 64 << 20
#: Records of one stream are encoded into batches of about this size (the unit inside a data block).
BATCH_BYTES_TARGET = 256 << 10
#: A task gathers this much of Spark's input before encoding it, so each stream gets few, large batches.
ENCODE_BYTES_TARGET = 32 << 20


@dataclass(frozen=True, slots=True)
class WriteMessage(WriterCommitMessage):
    """What one task staged: sent to the driver, so it stays small (one entry per object and stream)."""

    partition: int
    objects: tuple[StagedObject, ...]


# Task side ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EncodedBatch:
    """A batch's records, encoded, after room for its header: the header (stream id, offsets) is written
    into that room last, in place, when the batch goes into an object."""

    count: int
    max_timestamp_ms: int
    #: BATCH_HEADER_BYTES of room, then the records: a view into the buffer the rows were encoded into.
    frame: memoryview
    #: CRC32C of the records (the batch header's crc field).
    crc: int


class StagingWriter:
    """Encodes one task's rows into staged objects. Not thread-safe; one per task.

    ``split``: each object holds one stream (the writes through a broker, whose partitions brokers of a
    cluster commit each at its leader); else each holds every stream pending when it is put."""

    def __init__(self, store: ObjectStore, prefix: str, object_bytes: int = STAGED_OBJECT_BYTES, *,
                 split: bool = False) -> None:
        self._store = store
        self._prefix = prefix
        self._object_bytes = object_bytes
        self._split = split
        self._next_relative: dict[str, int] = {}
        self._pending: dict[str, list[tuple[int, EncodedBatch]]] = {}
        self._pending_bytes = 0
        self._staged: list[StagedObject] = []
        self._seq = 0

    def add(self, name: str, records: Sequence[NewRecord]) -> None:
        """Append ``records`` of stream ``name`` (in order) to this task's staged data."""
        start = 0
        while start < len(records):
            stop, size = start, 0
            while stop < len(records) and (stop == start or size < BATCH_BYTES_TARGET):
                rec = records[stop]
                size += len(rec.value) + (len(rec.key) if rec.key is not None else 0) + 32
                stop += 1
            data, max_ts = encode_batch(0, 0, records[start:stop])
            crc = BATCH_HEADER.unpack_from(data)[-1]
            self.add_encoded(name, [EncodedBatch(stop - start, max_ts, memoryview(bytearray(data)), crc)])
            start = stop

    def add_encoded(self, name: str, batches: Sequence[EncodedBatch]) -> None:
        """Append already encoded batches of stream ``name`` (in order)."""
        for batch in batches:
            base = self._next_relative.get(name, 0)
            self._pending.setdefault(name, []).append((base, batch))
            self._next_relative[name] = base + batch.count
            self._pending_bytes += len(batch.frame)
            if self._pending_bytes >= self._object_bytes:
                self._put()

    def finish(self) -> tuple[StagedObject, ...]:
        """Put what is pending; return every staged object of this task."""
        if self._pending_bytes:
            self._put()
        return tuple(self._staged)

    def discard(self) -> None:
        """Delete what this task staged (the task is failing)."""
        for staged in self._staged:
            self._store.delete(staged.key)

    def _put(self) -> None:
        names = sorted(n for n, b in self._pending.items() if b)
        for group in ([[name] for name in names] if self._split else [names]):
            self._put_object(group)
        self._pending = {}
        self._pending_bytes = 0

    def _put_object(self, names: list[str]) -> None:
        """Put the pending batches of ``names`` as one object."""
        builder = ObjectBuilder(flags=FLAG_PROVISIONAL)
        streams = []
        for provisional, name in enumerate(names):
            batches = []
            for base, b in self._pending[name]:
                BATCH_HEADER.pack_into(b.frame, 0, provisional, base, b.count, len(b.frame), b.max_timestamp_ms,
                                       ENCODING_NATIVE, b.crc)
                batches.append(StreamBatch(base, b.count, b.max_timestamp_ms, b.frame))
            builder.add_stream(provisional, batches)
            streams.append(StagedStream(name, batches[0].base_offset, sum(b.count for b in batches)))
        parts = builder.finish_parts()  # written part by part: the object is never joined
        key = f"{self._prefix}{uuid.uuid4().hex}-{self._seq}.slo"
        self._seq += 1
        put_parts(self._store, key, parts)
        self._staged.append(StagedObject(key, sum(map(len, parts)), tuple(streams)))


#: What record_bytes counts besides key and value: timestamp, key and value lengths, header count.
_RECORD_FIXED_BYTES = RECORD_HEAD.size - 4


def encode_rows(batch: pa.RecordBatch, now_ms: int,
                batch_bytes_target: int = BATCH_BYTES_TARGET) -> Iterator[tuple[str, list[EncodedBatch]]]:
    """The rows of an Arrow batch as encoded batches per stream (row order kept within each stream).

    Vectorized: rows are grouped by a stable sort on the stream, numpy works out where each record goes
    (batches of about ``batch_bytes_target``, each after room for its header), and one call
    (``record_layout``, compiled where the core is built) writes every record head and copies every key
    and value straight from the Arrow buffers into one output buffer. Python then works per batch (a
    view and a CRC), not per record.
    """
    rows = batch.num_rows
    if rows == 0:
        return
    names = batch.column("stream")
    values = _as_binary(batch.column("value"))
    if names.null_count:
        raise ValueError("a row has no stream name: the stream column must not be null")
    if values.null_count:
        raise ValueError("a row has a null value: the value column must not be null")
    schema_names = batch.schema.names
    if "timestamp" in schema_names:
        micros = pc.cast(batch.column("timestamp"), pa.timestamp("us", tz="UTC")).cast(pa.int64())
        stamps_ms = pc.fill_null(micros, now_ms * 1000).to_numpy(zero_copy_only=False) // 1000
    else:
        stamps_ms = np.full(rows, now_ms, dtype=np.int64)
    codes = names.dictionary_encode()
    code_of_row = codes.indices.to_numpy(zero_copy_only=False)
    order = np.argsort(code_of_row, kind="stable")
    sorted_codes = code_of_row[order]
    if "key" in schema_names:
        key_starts, key_bytes, key_data = _binary_parts(_as_binary(batch.column("key")))
    else:
        key_starts, key_bytes, key_data = np.zeros(rows, np.int64), np.full(rows, -1, np.int64), b""
    value_starts, value_bytes, value_data = _binary_parts(values)
    key_starts, key_bytes, stamps_ms = key_starts[order], key_bytes[order], stamps_ms[order]
    value_starts, value_bytes = value_starts[order], value_bytes[order]
    sizes = 4 + _RECORD_FIXED_BYTES + np.maximum(key_bytes, 0) + value_bytes
    record_ends = np.cumsum(sizes)
    record_starts = record_ends - sizes
    group_ends = [*(np.flatnonzero(np.diff(sorted_codes)) + 1).tolist(), rows]
    cuts = _batch_cuts(record_starts, record_ends, group_ends, batch_bytes_target)
    first_rows = np.array([start for start, _ in cuts], dtype=np.int64)
    # Each record moves on by the header room of every batch that starts at or before it.
    batches_before = np.searchsorted(first_rows, np.arange(rows, dtype=np.int64), side="right")
    dest = record_starts + BATCH_HEADER_BYTES * batches_before
    # Not zeroed: the records and the header room (written when the batch goes into an object) cover it.
    view = np.empty(int(record_ends[-1]) + BATCH_HEADER_BYTES * len(cuts), dtype=np.uint8).data
    lay_out_records(view, key_data, value_data, dest, key_starts, key_bytes, value_starts, value_bytes,
                    np.ascontiguousarray(stamps_ms, dtype=np.int64))
    dictionary = codes.dictionary.to_pylist()
    by_stream: dict[str, list[EncodedBatch]] = {}
    for start, stop in cuts:
        frame_start = int(dest[start]) - BATCH_HEADER_BYTES
        frame = view[frame_start:int(dest[stop - 1] + sizes[stop - 1])]
        encoded = EncodedBatch(stop - start, int(stamps_ms[start:stop].max()), frame,
                               crc32c(frame[BATCH_HEADER_BYTES:]))
        by_stream.setdefault(dictionary[int(sorted_codes[start])], []).append(encoded)
    yield from by_stream.items()


def _batch_cuts(record_starts: np.ndarray, record_ends: np.ndarray, group_ends: list[int],
                batch_bytes_target: int) -> list[tuple[int, int]]:
    """``(first row, row after the last)`` of each batch: runs within one stream's rows, each ending with
    the record that brings it to ``batch_bytes_target`` bytes (or the stream's last)."""
    cuts = []
    group_start = 0
    for group_end in group_ends:
        at = group_start
        while at < group_end:
            cut = int(np.searchsorted(record_ends, record_starts[at] + batch_bytes_target, side="left")) + 1
            cut = min(max(cut, at + 1), group_end)
            cuts.append((at, cut))
            at = cut
        group_start = group_end
    return cuts


def _binary_parts(column: pa.Array) -> tuple[np.ndarray, np.ndarray, pa.Buffer | bytes]:
    """Where each row's bytes start in the column's data buffer, how many there are (-1 for a null),
    and that buffer: an Arrow binary column read in place."""
    if len(column) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), b""
    width = np.int32 if pa.types.is_binary(column.type) else np.int64
    _, offsets_buffer, data = column.buffers()
    offsets = np.frombuffer(offsets_buffer, dtype=width)[column.offset:column.offset + len(column) + 1]
    offsets = offsets.astype(np.int64)
    lengths = np.diff(offsets)
    if column.null_count:
        lengths[~column.is_valid().to_numpy(zero_copy_only=False)] = -1
    return offsets[:-1], lengths, data if data is not None else b""


def records_with_headers(batch: pa.RecordBatch, now_ms: int) -> Iterator[tuple[str, list[NewRecord]]]:
    """Rows with a ``headers`` column (array of struct key, value), grouped by stream: encoded record by
    record, the slow path kept for the rare writes that carry headers."""
    names = batch.column("stream").to_pylist()
    values = _as_binary(batch.column("value")).to_pylist()
    schema_names = batch.schema.names
    keys = _as_binary(batch.column("key")).to_pylist() if "key" in schema_names else [None] * len(values)
    if "timestamp" in schema_names:
        micros = pc.cast(batch.column("timestamp"), pa.timestamp("us", tz="UTC")).cast(pa.int64()).to_pylist()
        stamps_ms = [now_ms if t is None else t // 1000 for t in micros]
    else:
        stamps_ms = [now_ms] * len(values)
    headers = batch.column("headers").to_pylist()
    groups: dict[str, list[NewRecord]] = {}
    for name, value, key, ts, pairs in zip(names, values, keys, stamps_ms, headers, strict=True):
        if name is None or value is None:
            raise ValueError("the stream and value columns must not be null")
        kept = tuple((p["key"], p["value"]) for p in pairs or ())
        groups.setdefault(name, []).append(NewRecord(value, key, ts, kept))
    yield from groups.items()


def _as_binary(column: Any) -> Any:
    return column.cast(pa.binary()) if pa.types.is_string(column.type) else column


def write_task(store: ObjectStore, prefix: str, partition: int, batches: Iterator[pa.RecordBatch],
               object_bytes: int = STAGED_OBJECT_BYTES, *, split: bool = False) -> WriteMessage:
    """Stage one task's rows (``split``: an object per stream); on failure delete what it staged before
    raising."""
    writer = StagingWriter(store, f"{prefix}{partition:06d}-", object_bytes, split=split)
    now_ms = int(time.time() * 1000)

    def encode(held: list[pa.RecordBatch]) -> None:
        combined = pa.Table.from_batches(held).combine_chunks().to_batches()
        for batch in combined:
            if "headers" in batch.schema.names:
                for name, records in records_with_headers(batch, now_ms):
                    writer.add(name, records)
                continue
            for name, encoded in encode_rows(batch, now_ms):
                writer.add_encoded(name, encoded)

    try:
        held: list[pa.RecordBatch] = []
        held_bytes = 0
        for batch in batches:
            # Spark hands over ~10,000 rows at a time; gathering more first makes batches of many
            # records per stream even when rows of many streams are interleaved.
            held.append(batch)
            held_bytes += batch.nbytes
            if held_bytes >= ENCODE_BYTES_TARGET:
                encode(held)
                held, held_bytes = [], 0
        if held:
            encode(held)
        return WriteMessage(partition, writer.finish())
    except BaseException:
        writer.discard()
        raise


# Driver side -------------------------------------------------------------------------------------

#: Records stay at least this large however small the WAL (a page).
_RECORD_BYTES_FLOOR = 4096
#: More than the WAL's header slots, and than a record's header and alignment: room to spare, not a fit.
_SLACK_BYTES = 8192


def store_config_for(data_dir: Path) -> StoreConfig:
    """A StoreConfig that opens an existing data directory: the WAL keeps the capacity it was made with,
    and records must fit its ring four times over (a test store's WAL may be a few MiB)."""
    base = StoreConfig()
    wal_path = data_dir / "wal"
    if not wal_path.exists():
        return base
    from stratalog.wal.inspect import open_read_only, read_headers

    device = open_read_only(wal_path)
    try:
        capacity = read_headers(device).current.capacity_bytes
    finally:
        device.close()
    record_bytes_max = base.wal.record_bytes_max
    while record_bytes_max > _RECORD_BYTES_FLOOR and capacity - _SLACK_BYTES < 4 * (record_bytes_max + _SLACK_BYTES):
        record_bytes_max //= 2
    block = record_bytes_max + _SLACK_BYTES
    wal = WALConfig(record_bytes_max=record_bytes_max, window_bytes_max=max(block, min(16 << 20, capacity // 4)),
                    buffered_bytes_max=max(block, min(64 << 20, capacity // 2)))
    return replace(base, wal_capacity_bytes=capacity, wal=wal)


def open_data_dir(data_dir: str | os.PathLike[str], uri: str, config: StoreConfig | None = None) -> StreamStore:
    """Open the store of record for a commit: ``data_dir`` with its objects at ``uri``."""
    path = Path(data_dir)
    return StreamStore.open(path, open_store(uri), config or store_config_for(path))


# Spark writers -----------------------------------------------------------------------------------


def _partition_id() -> int:
    from pyspark import TaskContext

    context = TaskContext.get()
    return context.partitionId() if context is not None else 0


class _WriterBase:
    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise ValueError("stratalog streams are append-only: use mode('append')")
        names = schema.fieldNames()
        location = locate(options)
        self.bootstrap = location.bootstrap
        self.kafka = location.kafka
        self.destinations: Destinations | None = None
        if location.broker:
            self.uri, counts = _broker_objects(location, options)
            self.destinations = Destinations(names, option(options, "topic"), counts)
            self.data_dir = None
        else:
            if not {"stream", "value"} <= set(names):
                raise ValueError(f"writing to stratalog needs columns 'stream' and 'value'; got {sorted(names)}")
            assert location.objects is not None
            self.uri = location.objects
            self.data_dir = option(options, "data_dir") or location.data_dir
            if self.data_dir is None:
                raise ValueError("writing to a store at rest needs its data directory: give it as 'path' (or as "
                                 "option 'data_dir' beside its object store), or write through a broker "
                                 "(path kafka://HOST:PORT)")
        if "value" not in names:
            raise ValueError(f"writing to stratalog needs a 'value' column; got {sorted(names)}")
        self.object_bytes = int_option(options, "objectBytes", STAGED_OBJECT_BYTES)
        self.prefix = f"{STAGING_PREFIX}{uuid.uuid4().hex}/"

    def _write(self, iterator: Iterator[pa.RecordBatch]) -> WriteMessage:
        task = _partition_id()
        if self.destinations is not None:
            iterator = choose_partitions(self.destinations, iterator, task)
        return write_task(shared_store(self.uri), self.prefix, task, iterator, self.object_bytes,
                          split=self.destinations is not None)

    def _commit(self, messages: Sequence[WriterCommitMessage | None],
                marker: tuple[str, int] | None) -> CommitResult:
        ours = [m for m in messages if isinstance(m, WriteMessage)]
        if self.bootstrap is not None:
            try:
                sink = None if marker is None else (marker[0][len(SINK_MARKER_PREFIX):], marker[1])
                return commit_through_broker(self.bootstrap, self.kafka, [(m.partition, m.objects) for m in ours], sink,
                                             staged_exist=self._staged_exist)
            finally:
                self._abort()  # the broker moved what it committed; the rest goes
        assert self.data_dir is not None
        store = open_data_dir(self.data_dir, self.uri)
        try:
            return commit_staged(store, ours, marker)
        finally:
            delete_staging(store.object_store, self.prefix)
            store.close()

    def _staged_exist(self, keys: Sequence[str]) -> bool:
        """Whether every one of ``keys`` is still staged (a broker commits a staged object by moving it)."""
        there = {info.key for info in shared_store(self.uri).list(self.prefix)}
        return all(key in there for key in keys)

    def _abort(self) -> None:
        delete_staging(shared_store(self.uri), self.prefix)   # after every commit: the client is kept


def _broker_objects(location: Location, options: dict[str, str]) -> tuple[str, dict[str, int]]:
    """Where tasks stage for a broker (its object storage, read and written from here with the s3.* options'
    credentials: ValueError, saying what it needs, otherwise), and its topics' partition counts (driver
    side, when the writer is made)."""
    assert location.bootstrap is not None
    uri = reachable_objects(location, options)
    view = BrokerView(location.bootstrap, location.kafka)
    try:
        return uri, view.topics(None)
    finally:
        view.close()


class StratalogBatchWriter(_WriterBase, DataSourceArrowWriter):
    """``df.write.format("stratalog")``: option ``path`` (a broker, or a data directory); ``objectBytes``."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return self._write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self._commit(messages, None)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        self._abort()


class StratalogStreamWriter(_WriterBase, DataSourceStreamArrowWriter):
    """``df.writeStream.format("stratalog")``: as the batch writer, plus the required option ``sinkId``."""

    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool) -> None:
        super().__init__(options, schema, overwrite)
        self.sink_id = required(options, "sinkId")

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return self._write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        result = self._commit(messages, (sink_marker_key(self.sink_id), batchId))
        if not result.committed:
            log.warning("micro-batch %d of sink %r was committed before, so nothing was written: a batch replayed "
                        "after a restart. A new query (a new checkpoint) needs a sinkId of its own, or its first "
                        "batches are taken for replays", batchId, self.sink_id)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        self._abort()
