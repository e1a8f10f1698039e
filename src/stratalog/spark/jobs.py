"""The store's bulk jobs on Spark: compaction, retention, export. Also ``stratalog pipeline ...``.

Compaction and retention change the store of record, so the driver opens the store's data directory
(nothing else may have it open); executors do the object I/O. Each job is safe to run again after a
crash at any point:

- ``compact``: objects written by a run that crashed before its commit are in ``data/`` but in no
  commit; opening the store deletes them, and the new run plans again from the committed state. After
  the commit (one atomic ``replace_objects``), the replaced objects are only *unreferenced*; they are
  deleted once their grace period has passed (by ``retention``, or the store's own background pass).
- ``retention``: trims are metadata commits; an object is forgotten in metadata only after its delete
  succeeded, so a rerun deletes (again, harmlessly) what a crashed run may have deleted already.
- ``export``: Spark's Parquet commit protocol replaces the output directory as a whole.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from stratalog.engine.batch import with_placement
from stratalog.engine.config import StoreConfig
from stratalog.engine.manifest import BlockRef, read_manifest
from stratalog.engine.metadata import NewObject
from stratalog.engine.objformat import ObjectBuilder, StreamBatch, check_block, placed_batches
from stratalog.engine.staging import STAGED_OBJECTS_MAX, STAGING_PREFIX
from stratalog.engine.store import object_key
from stratalog.spark.location import KAFKA_SCHEME
from stratalog.spark.plan import FETCH_BYTES_MAX, ReadPartition, StreamSlice, plan_fetches
from stratalog.spark.reader import open_store, shared_store
from stratalog.spark.write import open_data_dir, store_config_for

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: A compacted per-stream object holds at most this much data (it may hold less: a stream's run of
#: blocks also ends where its offsets stop being contiguous).
COMPACTED_OBJECT_BYTES_MAX = 64 << 20
#: Outputs written per Spark task in compaction; deletes per task in retention.
OUTPUTS_PER_TASK = 32
DELETES_PER_TASK = 256

_T = TypeVar("_T")
_R = TypeVar("_R")

#: Called with (units done, units in all) as a job progresses.
Progress = Callable[[int, int], None]


def no_progress(done: int, total: int) -> None:
    pass


# Compaction --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CompactionOutput:
    """One per-stream object to write: its id and key, and the blocks (in offset order) it takes over."""

    object_id: int
    key: str
    stream_id: int
    blocks: tuple[BlockRef, ...]


@dataclass(frozen=True, slots=True)
class CompactReport:
    objects_replaced: int
    objects_written: int
    bytes_written: int
    seconds: float

    @property
    def mb_per_s(self) -> float:
        return self.bytes_written / 1e6 / self.seconds if self.seconds else 0.0


def compaction_candidates(blocks_by_stream: dict[int, list[BlockRef]],
                          small_bytes_max: int = COMPACTED_OBJECT_BYTES_MAX // 4) -> set[str]:
    """Keys of the objects worth compacting: every object holding blocks of more than one stream, and
    small per-stream objects (under ``small_bytes_max`` bytes) of a stream that has several of them
    (earlier compactions of a slowly growing stream)."""
    streams_of: dict[str, set[int]] = {}
    size_of: dict[str, int] = {}
    for stream_id, refs in blocks_by_stream.items():
        for ref in refs:
            streams_of.setdefault(ref.key, set()).add(stream_id)
            size_of[ref.key] = size_of.get(ref.key, 0) + ref.entry.size_bytes
    keys = {k for k, s in streams_of.items() if len(s) > 1}
    small_of: dict[int, list[str]] = {}
    for key, streams in streams_of.items():
        if len(streams) == 1 and size_of[key] < small_bytes_max:
            small_of.setdefault(next(iter(streams)), []).append(key)
    for stream_id, small in small_of.items():
        if len(small) > 1 or any(r.key in keys for r in blocks_by_stream[stream_id]):
            keys.update(small)
    return keys


def plan_compaction(blocks_by_stream: dict[int, list[BlockRef]], keys: set[str],
                    object_bytes_max: int = COMPACTED_OBJECT_BYTES_MAX) -> list[list[BlockRef]]:
    """Group the blocks held by ``keys`` into per-stream runs: offsets contiguous, at most
    ``object_bytes_max`` bytes each (a single larger block makes a run of its own)."""
    runs: list[list[BlockRef]] = []
    for stream_id in sorted(blocks_by_stream):
        run: list[BlockRef] = []
        size = 0
        for ref in sorted((r for r in blocks_by_stream[stream_id] if r.key in keys),
                          key=lambda r: r.entry.start_offset):
            contiguous = run and run[-1].entry.end_offset == ref.entry.start_offset
            if run and (not contiguous or size + ref.entry.size_bytes > object_bytes_max):
                runs.append(run)
                run, size = [], 0
            run.append(ref)
            size += ref.entry.size_bytes
        if run:
            runs.append(run)
    return runs


def write_compacted(uri: str, outputs: Iterable[CompactionOutput]) -> Iterator[NewObject]:
    """Executor side: read each output's blocks and put them as one per-stream object."""
    store = shared_store(uri)
    for output in outputs:
        piece = StreamSlice(output.stream_id, "", output.blocks[0].entry.start_offset,
                            output.blocks[-1].entry.end_offset, output.blocks)
        batches: list[StreamBatch] = []
        for fetch in plan_fetches(ReadPartition((piece,)), FETCH_BYTES_MAX):
            buf = store.get(fetch.key, fetch.start, fetch.end)
            for _, ref in fetch.blocks:
                at = ref.entry.position - fetch.start
                block = check_block(buf[at:at + ref.entry.size_bytes], ref.entry)
                # Placed by the manifest's entry; headers get the real stream id and offsets (a block a
                # Spark write committed has provisional ones), so the new object is not provisional.
                for pos, info in placed_batches(block, ref.entry):
                    batches.append(StreamBatch(info.base_offset, info.count, info.max_timestamp_ms,
                                               with_placement(block, pos, info.stream_id, info.base_offset)))
        builder = ObjectBuilder()
        builder.add_stream(output.stream_id, batches)
        data = builder.finish()
        store.put(output.key, data)
        yield NewObject(output.object_id, output.key, len(data), builder.entries)


def compact(spark: SparkSession, data_dir: str | os.PathLike[str], uri: str, *,
            object_bytes_max: int = COMPACTED_OBJECT_BYTES_MAX, config: StoreConfig | None = None,
            progress: Progress = no_progress) -> CompactReport:
    """Merge the store's multi-stream objects into per-stream objects and swap them in atomically."""
    started = time.monotonic()
    store = open_data_dir(data_dir, uri, config)
    try:
        store.flush()
        manifest = read_manifest(store.object_store)  # the store published a snapshot when it opened
        keys = compaction_candidates(manifest.blocks, object_bytes_max // 4)
        runs = plan_compaction(manifest.blocks, keys, object_bytes_max)
        if not runs:
            return CompactReport(0, 0, 0, time.monotonic() - started)
        outputs = []
        for run in runs:
            object_id = store.metadata.allocate_object_id()
            outputs.append(CompactionOutput(object_id, object_key(object_id), run[0].entry.stream_id, tuple(run)))
        written = run_tasks(spark, outputs, OUTPUTS_PER_TASK, lambda part: write_compacted(uri, part), progress)
        ids = {o.key: o.object_id for o in store.metadata.objects()}
        store.replace_objects(sorted(ids[k] for k in keys), written)
        return CompactReport(len(keys), len(written), sum(o.size_bytes for o in written),
                             time.monotonic() - started)
    finally:
        store.close()


def compact_live(spark: SparkSession, address: str, *, objects: str | None = None,
                 options: dict[str, str] | None = None, object_bytes_max: int = COMPACTED_OBJECT_BYTES_MAX,
                 progress: Progress = no_progress) -> CompactReport:
    """Compaction beside a running broker (``address``: ``kafka://HOST:PORT``): tasks write the per-stream
    objects under ``spark-staging/``, and the broker swaps them in (StratalogReplaceObjects) if the objects
    they replace still hold the same ranges; otherwise it refuses (BrokerWriteError) and a later run plans
    again. Needs Alter on the cluster when the broker checks ACLs. A run writes at most STAGED_OBJECTS_MAX
    objects (the most one request may swap in); a store that needs more is compacted over several runs.
    ``objects``: the broker's object storage as this machine reaches it, when not where the broker says;
    ``options``: the data source's (``kafka.*``)."""
    from stratalog.spark.broker_source import reachable_objects
    from stratalog.spark.broker_write import replace_through_broker
    from stratalog.spark.location import locate

    started = time.monotonic()
    opts = {**{k.lower(): v for k, v in (options or {}).items()}, "path": address}
    if objects is not None:  # the broker's objects as this machine reaches them
        opts.update(path=objects, bootstrap=address.removeprefix(KAFKA_SCHEME))
    location = locate(opts)
    if location.bootstrap is None:
        raise ValueError(f"{address!r} names no broker: compact a store at rest with its data directory")
    uri = reachable_objects(location, opts)
    store = open_store(uri)
    try:
        manifest = read_manifest(store)
    finally:
        store.close()
    keys = compaction_candidates(manifest.blocks, object_bytes_max // 4)
    runs = plan_compaction(manifest.blocks, keys, object_bytes_max)
    while len(runs) > STAGED_OBJECTS_MAX:  # the most one request may swap in: this run takes fewer objects
        keys = set(sorted(keys)[:len(keys) // 2])
        runs = plan_compaction(manifest.blocks, keys, object_bytes_max)
    if not runs:
        return CompactReport(0, 0, 0, time.monotonic() - started)
    prefix = f"{STAGING_PREFIX}compact-{uuid.uuid4().hex}/"
    outputs = [CompactionOutput(0, f"{prefix}{n:06d}.slo", run[0].entry.stream_id, tuple(run))
               for n, run in enumerate(runs)]
    try:
        written = run_tasks(spark, outputs, OUTPUTS_PER_TASK, lambda part: write_compacted(uri, part), progress)
        replace_through_broker(location.bootstrap, location.kafka, sorted(keys),
                               [(o.key, o.size_bytes) for o in written])
    finally:
        store = open_store(uri)
        try:
            for info in store.list(prefix):  # what the broker did not move (it deletes what it took)
                store.delete(info.key)
        finally:
            store.close()
    return CompactReport(len(keys), len(written), sum(o.size_bytes for o in written), time.monotonic() - started)


# Retention ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RetentionReport:
    streams_trimmed: int
    objects_deleted: int
    seconds: float
    staged_objects_deleted: int = 0


def delete_keys(uri: str, keys: Iterable[str]) -> Iterator[str]:
    """Executor side: delete each key (an absent key is not an error) and pass it on once deleted."""
    store = shared_store(uri)
    for key in keys:
        store.delete(key)
        yield key


def retention(spark: SparkSession, data_dir: str | os.PathLike[str], uri: str, *, now_ms: int | None = None,
              config: StoreConfig | None = None, clean_staging: bool = False,
              progress: Progress = no_progress) -> RetentionReport:
    """Apply every stream's time and byte retention as of ``now_ms`` (default: now), then delete (on
    executors) the objects that have been unreferenced for the grace period.

    ``clean_staging`` also deletes every object Spark writes staged and never committed or aborted (a
    driver that died mid-write leaves them). Use it only while no Spark write to this store runs: a
    running write would lose its staged objects and fail (safely: it commits nothing).
    """
    started = time.monotonic()
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    config = config or store_config_for(Path(data_dir))
    # The store's own pass would delete on the driver: give it a grace nothing reaches, and delete below.
    store = open_data_dir(data_dir, uri, replace(config, object_grace_s=float(1 << 40)))
    try:
        before = {s.stream_id: s.start_offset for s in store.streams()}
        store.apply_retention(now_ms)
        trimmed = sum(1 for s in store.streams() if s.start_offset != before.get(s.stream_id))
        # Grace is measured on the wall clock, like the unreferenced times metadata records; ``now_ms``
        # only says which records retention counts as old.
        wall_ms = int(time.time() * 1000)
        gone = store.metadata.collect_unreferenced(wall_ms - int(config.object_grace_s * 1000))
        ids = {o.key: o.object_id for o in gone}
        staged = [info.key for info in store.object_store.list(STAGING_PREFIX)] if clean_staging else []
        deleted = run_tasks(spark, sorted(ids) + staged, DELETES_PER_TASK, lambda part: delete_keys(uri, part),
                             progress)
        for key in deleted:
            if key in ids:
                store.metadata.forget_object(ids[key])
        return RetentionReport(trimmed, len(deleted) - len(staged), time.monotonic() - started, len(staged))
    finally:
        store.close()


# Export ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ExportReport:
    rows: int
    seconds: float


def export(spark: SparkSession, uri: str, out: str, *, streams: str | None = None, queues: str | None = None,
           progress: Progress = no_progress) -> ExportReport:
    """Write the chosen streams (all when None) to Parquet under ``out``, partitioned by stream; with
    ``queues`` (``*`` or a comma list of names), the chosen queues of a queue store instead. ``uri`` is
    anything the data source's ``path`` takes: a live broker's ``kafka://HOST:PORT`` too."""
    from stratalog.spark.source import StratalogReader

    if streams is not None and queues is not None:
        raise ValueError("export streams or queues, not both")
    started = time.monotonic()
    options = {"path": uri, **({"streams": streams} if streams else {}), **({"queues": queues} if queues else {})}
    at_rest = not uri.startswith(KAFKA_SCHEME)
    # At rest, the offsets planned: the records, or more where log compaction left gaps.
    progress(0, sum(p.rows for p in StratalogReader(options).plan()) if at_rest else 0)
    df = spark.read.format("stratalog").options(**options).load()
    df.write.mode("overwrite").partitionBy("stream").parquet(out)
    rows = spark.read.parquet(out).count()  # (from the files' footers)
    progress(rows, rows)
    return ExportReport(rows, time.monotonic() - started)


# Running tasks -----------------------------------------------------------------------------------


def run_tasks(spark: SparkSession, items: Sequence[_T], per_task: int,
               work: Callable[[list[_T]], Iterable[_R]], progress: Progress) -> list[_R]:
    """Run ``work`` over ``items`` in Spark tasks of ``per_task`` items; collect results as tasks finish."""
    total = len(items)
    progress(0, total)
    if not items:
        return []
    chunks = [list(items[i:i + per_task]) for i in range(0, total, per_task)]
    rdd = spark.sparkContext.parallelize(chunks, len(chunks)).flatMap(work)
    results: list[_R] = []
    for result in rdd.toLocalIterator(prefetchPartitions=True):
        results.append(result)
        progress(len(results), total)
    return results
