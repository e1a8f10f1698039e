"""Executor side of a read: fetch a partition's blocks from the object store and yield Arrow batches.

Nothing here needs a running stratalog process or its SQLite metadata: the plan names every block, and
the object store is opened from the same URI the driver used. If compaction replaced and then deleted
an object after the plan was made (its grace period passed during a long job), the slice is planned
again from the newest manifest: the data is the same, only its place changed. A read of a broker as
read_committed hands each task its streams' aborted transactions too (spark/aborted.py), which the
task's batches are filtered by, as does a read_committed read of a data directory at rest
(spark/rest_txns.py); without them every record is returned, markers never. A read_committed read
that has no way to know them (a store's objects alone) fails at the first transactional batch instead.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import pyarrow as pa

from stratalog.engine.manifest import read_manifest
from stratalog.engine.objformat import check_block
from stratalog.kafka.aborted_ranges import AbortedTxn
from stratalog.objects.store import ObjectNotFoundError, ObjectStore
from stratalog.spark.aborted import AbortedIndex, UnknownTransactions
from stratalog.spark.columns import ColumnBuilder
from stratalog.spark.plan import (
    FETCH_BYTES_MAX,
    Fetch,
    OffsetRange,
    ReadPartition,
    StreamSlice,
    plan_fetches,
    plan_partitions,
)

_stores: dict[str, ObjectStore] = {}
_stores_lock = threading.Lock()


def open_store(uri: str) -> ObjectStore:
    """The object store at ``uri``: a local directory path, ``file:///abs/path`` or ``s3://bucket/prefix?...``.

    A plain path names the object directory itself (``<data_dir>/objects`` for the embedded store).
    """
    if "://" not in uri:
        from stratalog.objects.local import LocalDirStore

        return LocalDirStore(Path(uri))
    from stratalog.objects.uri import open_object_store

    return open_object_store(uri, Path("."))


def shared_store(uri: str) -> ObjectStore:
    """One store per URI per process: Spark runs many tasks in one Python worker, and an S3 client is
    costly to make."""
    with _stores_lock:
        store = _stores.get(uri)
        if store is None:
            store = _stores[uri] = open_store(uri)
        return store


#: Each stream's aborted transactions, by stream id (a stream it does not name has none).
Aborted = Mapping[int, AbortedIndex]


def read_partition(store: ObjectStore, partition: ReadPartition, fetch_bytes_max: int = FETCH_BYTES_MAX,
                   headers: bool = False, aborted: Mapping[int, Iterable[AbortedTxn]] | None = None,
                   unknown: str | None = None) -> Iterator[pa.RecordBatch]:
    """The records of ``partition``, one RecordBatch per ranged get (``fetch_bytes_max`` bytes at most,
    unless one block is larger); with a ``headers`` column when ``headers``. ``aborted``: each stream's
    aborted transactions (by stream id), whose batches are left out (read_committed). ``unknown``: why
    they cannot be known (read_committed of objects alone): a transactional batch then fails the read
    with TransactionsUnknownError, saying so."""
    indexes: dict[int, AbortedIndex] = {}
    if unknown is not None:
        indexes = {p.stream_id: UnknownTransactions(p.name, unknown) for p in partition.slices}
    indexes.update((stream_id, AbortedIndex(ranges)) for stream_id, ranges in (aborted or {}).items())
    yield from _read(store, partition, fetch_bytes_max, headers, indexes)


def _read(store: ObjectStore, partition: ReadPartition, fetch_bytes_max: int,
          headers: bool, aborted: Aborted) -> Iterator[pa.RecordBatch]:
    fetches = plan_fetches(partition, fetch_bytes_max)
    for number, fetch in enumerate(fetches):
        try:
            buf = store.get(fetch.key, fetch.start, fetch.end)
        except ObjectNotFoundError:
            # Everything fetched before this get was yielded already; read the rest from where it is now.
            yield from _read_replanned(store, partition, fetches[number:], fetch_bytes_max, headers, aborted)
            return
        blocks = []
        with memoryview(buf) as view:
            for _, ref in fetch.blocks:
                at = ref.entry.position - fetch.start
                check_block(view[at:at + ref.entry.size_bytes], ref.entry)  # a view: no copy of the block
                blocks.append((at, ref.entry))
        builder = ColumnBuilder()
        for (index, _), (at, entry) in zip(fetch.blocks, blocks, strict=True):
            piece = partition.slices[index]
            builder.add_block(buf, at, entry, piece.name, piece.start_offset, piece.end_offset,
                              aborted.get(piece.stream_id))
        yield builder.finish(buf, headers)


def _read_replanned(store: ObjectStore, partition: ReadPartition, remaining: list[Fetch],
                    fetch_bytes_max: int, headers: bool, aborted: Aborted) -> Iterator[pa.RecordBatch]:
    """Read the ranges the ``remaining`` fetches were to cover, planned again from the newest manifest."""
    manifest = read_manifest(store)
    ranges: dict[int, list[tuple[int, int]]] = {}
    for fetch in remaining:
        for index, ref in fetch.blocks:
            piece = partition.slices[index]
            ranges.setdefault(index, []).append((max(piece.start_offset, ref.entry.start_offset),
                                                 min(piece.end_offset, ref.entry.end_offset)))
    for index in sorted(ranges):
        piece = partition.slices[index]
        if piece.stream_id not in manifest.streams:
            continue  # deleted since: nothing left to read
        for start, end in _merged(ranges[index]):
            again = plan_partitions(manifest, [piece.stream_id], OffsetRange(start, end),
                                    rows_max=1 << 62, bytes_max=1 << 62)
            for fresh in again:
                relabelled = ReadPartition(tuple(_relabel(s, piece.name) for s in fresh.slices))
                yield from _read(store, relabelled, fetch_bytes_max, headers, aborted)


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if out and out[-1][1] == start:
            out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def _relabel(piece: StreamSlice, name: str) -> StreamSlice:
    return StreamSlice(piece.stream_id, name, piece.start_offset, piece.end_offset, piece.blocks)
