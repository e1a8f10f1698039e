"""Structured Streaming reads: ``spark.readStream.format("stratalog")``.

A streaming offset must stay small at a million streams, so it does not list streams. It is::

    {"seq": <manifest commit sequence>, "positions": "<name of a positions file>", "cursor": <stream id>}

The positions file holds how far the query has read in every stream (stream id and next offset, as
little-endian int64 pairs, zlib-compressed), under ``spark-positions/<seq>-<digest>.pos`` in the store's
object storage. Its name is a digest of its content, so writing it twice is harmless, and it is written
before Spark records the offset, so a query restarted from its checkpoint finds it and reads only what
came after. A stream missing from the file is read from its start (new streams appear on their own).
The reader deletes the positions files it wrote once Spark commits a later offset.

Each trigger reads at most ``maxRowsPerTrigger`` rows (option; default 1,000,000), taken stream by
stream in id order from ``cursor``, which moves on so that busy low-numbered streams cannot starve the
others. ``Trigger.AvailableNow`` reads up to the ends seen when the query starts, in as many triggers as
the limit needs. Option ``startingOffsets``: ``earliest`` (default) or ``latest``.

Option ``isolationLevel`` as a batch read at rest takes it (source.py): read_committed, the default, ends
each stream of a micro-batch at its stable end at rest and leaves out aborted records (spark/rest_txns.py).
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from stratalog.engine.manifest import Manifest, read_manifest
from stratalog.objects.store import ObjectStore
from stratalog.spark.location import locate, object_store
from stratalog.spark.options import include_headers, int_option, option
from stratalog.spark.plan import (
    BYTES_PER_PARTITION,
    ROWS_PER_PARTITION,
    ReadPartition,
    plan_partitions,
    resolve_streams,
)
from stratalog.spark.reader import open_store, read_partition, shared_store
from stratalog.spark.rest_txns import CommittedPartition, committed_partitions, rest_transactions

POSITIONS_PREFIX = "spark-positions/"
#: Rows per trigger when the query sets no limit: about one partition's worth per core of a small cluster.
MAX_ROWS_PER_TRIGGER = 1_000_000

Positions = dict[int, int]


def encode_positions(positions: Positions) -> bytes:
    ids = np.fromiter(sorted(positions), dtype="<i8", count=len(positions))
    values = np.fromiter((positions[i] for i in ids.tolist()), dtype="<i8", count=len(positions))
    return zlib.compress(np.concatenate([ids, values]).tobytes(), level=1)


def decode_positions(data: bytes) -> Positions:
    pairs = np.frombuffer(zlib.decompress(data), dtype="<i8")
    half = len(pairs) // 2
    return dict(zip(pairs[:half].tolist(), pairs[half:].tolist(), strict=True))


def positions_key(seq: int, data: bytes) -> str:
    return f"{POSITIONS_PREFIX}{seq:020d}-{hashlib.sha256(data).hexdigest()[:32]}.pos"


@dataclass(frozen=True, slots=True)
class Advance:
    positions: Positions
    cursor: int
    rows: int


def advance(manifest: Manifest, stream_ids: Sequence[int], positions: Positions, cursor: int,
            rows_max: int | None, ends: Positions | None = None) -> Advance:
    """Move ``positions`` towards each stream's end (or ``ends``, when a target was fixed), at most
    ``rows_max`` rows in all, stream by stream in id order starting at ``cursor`` and wrapping around."""
    order = sorted(stream_ids)
    split = next((i for i, s in enumerate(order) if s >= cursor), len(order))
    budget = rows_max if rows_max is not None else 1 << 62
    moved = dict(positions)
    rows = 0
    next_cursor = cursor
    for stream_id in order[split:] + order[:split]:
        if budget <= 0:
            next_cursor = stream_id
            break
        info = manifest.streams[stream_id]
        start = max(moved.get(stream_id, info.start_offset), info.start_offset)
        end = info.end_offset if ends is None else min(info.end_offset, ends.get(stream_id, info.start_offset))
        take = min(max(end - start, 0), budget)
        if take:
            moved[stream_id] = start + take
            rows += take
            budget -= take
    return Advance(moved, next_cursor, rows)


class StratalogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader. Picklable: Spark ships it to executors for ``read``."""

    def __init__(self, options: dict[str, str]) -> None:
        from stratalog.spark.broker_source import isolation_level
        from stratalog.spark.kafka_client import READ_COMMITTED

        self.uri = object_store(options)
        location = locate(options)
        self.data_dir = location.data_dir
        self.committed = isolation_level(options, location.kafka) == READ_COMMITTED
        self.streams = option(options, "streams")
        self.rows_max = int_option(options, "rowsPerPartition", ROWS_PER_PARTITION)
        self.bytes_max = int_option(options, "bytesPerPartition", BYTES_PER_PARTITION)
        self.rows_per_trigger = int_option(options, "maxRowsPerTrigger", MAX_ROWS_PER_TRIGGER)
        self.headers = include_headers(options)
        self.starting = (option(options, "startingOffsets") or "earliest").lower()
        if self.starting not in ("earliest", "latest"):
            raise ValueError(f"startingOffsets must be 'earliest' or 'latest', not {self.starting!r}")
        self.target: Positions | None = None
        self.written: list[str] = []

    # Driver side ---------------------------------------------------------------------------------

    def _with_store(self) -> ObjectStore:
        return open_store(self.uri)

    def _load(self, store: ObjectStore, offset: dict[str, object]) -> Positions:
        name = str(offset.get("positions") or "")
        return decode_positions(store.get(name)) if name else {}

    def _save(self, store: ObjectStore, seq: int, positions: Positions) -> str:
        data = encode_positions(positions)
        key = positions_key(seq, data)
        store.put(key, data)
        if key not in self.written:
            self.written.append(key)
        return key

    def initialOffset(self) -> dict[str, object]:
        if self.starting == "earliest":
            return {"seq": 0, "positions": "", "cursor": 0}
        store = self._with_store()
        try:
            manifest = read_manifest(store)
            ends = {s.stream_id: s.end_offset for s in manifest.streams.values()}
            if self.committed:  # latest as a read_committed consumer has it: where each stream is stable
                ends = rest_transactions(self.data_dir, store, manifest, ends).stable_ends
            return {"seq": manifest.seq, "positions": self._save(store, manifest.seq, ends), "cursor": 0}
        finally:
            store.close()

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.rows_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        store = self._with_store()
        try:
            manifest = read_manifest(store)
        finally:
            store.close()
        self.target = {s.stream_id: s.end_offset for s in manifest.streams.values()}

    def latestOffset(self, start: dict[str, object], limit: ReadLimit) -> dict[str, object]:
        rows_max = None if isinstance(limit, ReadAllAvailable) else getattr(limit, "max_rows", None)
        store = self._with_store()
        try:
            manifest = read_manifest(store)
            positions = self._load(store, start)
            cursor = int(str(start.get("cursor", 0)))
            ids = resolve_streams(manifest, self.streams)
            ends = self.target
            if self.committed:  # no further than each stream's stable end
                stable = rest_transactions(self.data_dir, store, manifest, ids).stable_ends
                ends = stable if ends is None else {i: min(e, ends.get(i, e)) for i, e in stable.items()}
            moved = advance(manifest, ids, positions, cursor, rows_max, ends)
            if moved.rows == 0:
                return start
            key = self._save(store, manifest.seq, moved.positions)
            return {"seq": manifest.seq, "positions": key, "cursor": moved.cursor}
        finally:
            store.close()

    def partitions(self, start: dict[str, object], end: dict[str, object]) -> Sequence[InputPartition]:
        if start == end:
            return []
        store = self._with_store()
        try:
            manifest = read_manifest(store)
            begin, finish = self._load(store, start), self._load(store, end)
            ids = [i for i in finish if i in manifest.streams and finish[i] > begin.get(i, 0)]
            # The aborted ranges below ``finish``, stable when it was chosen, are all known still.
            txns = rest_transactions(self.data_dir, store, manifest, ids) if self.committed and ids else None
        finally:
            store.close()
        plan = plan_partitions(manifest, ids, rows_max=self.rows_max, bytes_max=self.bytes_max,
                               starts=begin, ends=finish)
        return [InputPartition(p) for p in (plan if txns is None else committed_partitions(plan, txns))]

    def commit(self, end: dict[str, object]) -> None:
        keep = str(end.get("positions") or "")
        if keep not in self.written:
            return
        done = self.written[:self.written.index(keep)]
        if not done:
            return
        store = self._with_store()
        try:
            for key in done:
                store.delete(key)
        finally:
            store.close()
        self.written = self.written[len(done):]

    # Executor side -------------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        value = partition.value
        if isinstance(value, CommittedPartition):
            yield from value.read(shared_store(self.uri), self.headers)
            return
        assert isinstance(value, ReadPartition)
        yield from read_partition(shared_store(self.uri), value, headers=self.headers)
