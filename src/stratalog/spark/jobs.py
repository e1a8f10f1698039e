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
from stratalog.engine.manifest import BlockRef, Manifest, read_manifest
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
    #: Against a cluster: candidates left for a later run, their partitions led by several brokers (or by
    #: none, a failover under way), and each broker's refusal (its partitions moved since the plan).
    objects_skipped: int = 0
    refusals: tuple[str, ...] = ()

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


def split_by_leader(blocks_by_stream: dict[int, list[BlockRef]], keys: set[str],
                    leader_of: dict[int, str | None]) -> tuple[dict[str, set[str]], set[str]]:
    """The candidate ``keys`` by the broker that must swap them (a broker of a cluster swaps only objects
    whose partitions it leads): ``({leader: keys}, keys no one broker can swap)``. An object holding
    partitions of several leaders (uploaded before a failover moved some), or of a partition with no
    leader (``leader_of`` None or missing: a failover under way, or not a partition), is left out."""
    leaders_of: dict[str, set[str | None]] = {}
    for stream_id, refs in blocks_by_stream.items():
        for ref in refs:
            if ref.key in keys:
                leaders_of.setdefault(ref.key, set()).add(leader_of.get(stream_id))
    groups: dict[str, set[str]] = {}
    skipped: set[str] = set()
    for key, leaders in leaders_of.items():
        leader = next(iter(leaders))
        if len(leaders) == 1 and leader is not None:
            groups.setdefault(leader, set()).add(key)
        else:
            skipped.add(key)
    return groups, skipped


def compact_live(spark: SparkSession, address: str, *, objects: str | None = None,
                 options: dict[str, str] | None = None, object_bytes_max: int = COMPACTED_OBJECT_BYTES_MAX,
                 progress: Progress = no_progress) -> CompactReport:
    """Compaction beside a running broker or cluster (``address``: ``kafka://HOST:PORT[,...]``): tasks
    write the per-stream objects under ``spark-staging/``, and the broker swaps them in
    (StratalogReplaceObjects) if the objects they replace still hold the same ranges; otherwise it refuses
    (BrokerWriteError) and a later run plans again. In a cluster each broker is sent the objects of the
    partitions it leads (:func:`split_by_leader`); a broker's refusal leaves its objects for a later run
    and the others go on (``CompactReport.refusals``). Needs Alter on the cluster when the broker checks
    ACLs. A run writes at most STAGED_OBJECTS_MAX objects per broker (the most one request may swap in); a
    store that needs more is compacted over several runs. ``objects``: the broker's object storage as this
    machine reaches it, when not where the broker says; ``options``: the data source's (``kafka.*``)."""
    from stratalog.spark.broker_source import reachable_objects
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
    groups, skipped = _by_leader(location.bootstrap, location.kafka, manifest, keys)
    prefix = f"{STAGING_PREFIX}compact-{uuid.uuid4().hex}/"
    planned = {leader: _plan_capped(manifest.blocks, group, object_bytes_max) for leader, group in groups.items()}
    outputs: list[CompactionOutput] = []
    for _, runs in planned.values():
        outputs += [CompactionOutput(0, f"{prefix}{len(outputs) + n:06d}.slo", run[0].entry.stream_id, tuple(run))
                    for n, run in enumerate(runs)]
    if not outputs:
        return CompactReport(0, 0, 0, time.monotonic() - started, len(skipped))
    try:
        written = run_tasks(spark, outputs, OUTPUTS_PER_TASK, lambda part: write_compacted(uri, part), progress)
        replaced, done, refusals = _swap_by_leader(location.kafka, planned, outputs, written)
    finally:
        store = open_store(uri)
        try:
            for info in store.list(prefix):  # what the brokers did not move (each deletes what it took)
                store.delete(info.key)
        finally:
            store.close()
    return CompactReport(replaced, len(done), sum(o.size_bytes for o in done), time.monotonic() - started,
                         len(skipped), tuple(refusals))


def _by_leader(bootstrap: str, settings: dict[str, str], manifest: Manifest,
               keys: set[str]) -> tuple[dict[str, set[str]], set[str]]:
    """The candidates by the broker to send them to: all to ``bootstrap`` when Metadata names one broker,
    else each to its partitions' leader (:func:`split_by_leader`)."""
    from stratalog.spark.kafka_client import BrokerView

    view = BrokerView(bootstrap, settings)
    try:
        if len(view.brokers()) <= 1:
            return ({bootstrap: keys} if keys else {}), set()
        partitions = {sid: _partition_of(info.name) for sid, info in manifest.streams.items()}
        known = view.leaders_known(sorted({tp for tp in partitions.values() if tp is not None}))
    finally:
        view.close()
    leader_of = {sid: None if tp is None else known.get(tp) for sid, tp in partitions.items()}
    return split_by_leader(manifest.blocks, keys, leader_of)


def _partition_of(name: str | None) -> tuple[str, int] | None:
    """``(topic, partition)`` of a stream named ``topic/partition``; None for any other stream."""
    topic, _, partition = (name or "").rpartition("/")
    return (topic, int(partition)) if topic and partition.isdigit() else None


def _plan_capped(blocks_by_stream: dict[int, list[BlockRef]], keys: set[str],
                 object_bytes_max: int) -> tuple[set[str], list[list[BlockRef]]]:
    """``(keys, runs)``: the runs of ``keys``, taking fewer keys until they fit in one request."""
    runs = plan_compaction(blocks_by_stream, keys, object_bytes_max)
    while len(runs) > STAGED_OBJECTS_MAX:  # the most one request may swap in: this run takes fewer objects
        keys = set(sorted(keys)[:len(keys) // 2])
        runs = plan_compaction(blocks_by_stream, keys, object_bytes_max)
    return keys, runs


def _swap_by_leader(settings: dict[str, str], planned: dict[str, tuple[set[str], list[list[BlockRef]]]],
                    outputs: list[CompactionOutput],
                    written: list[NewObject]) -> tuple[int, list[NewObject], list[str]]:
    """Ask each leader to swap its objects for the written ones: (objects replaced, objects swapped in,
    refusals). A refusal is reported, not raised, when other brokers swapped theirs."""
    from stratalog.spark.broker_write import BrokerWriteError, replace_through_broker

    by_key = {o.key: o for o in written}
    replaced, done, refusals = 0, [], []
    at = 0
    for leader, (keys, runs) in planned.items():
        mine = [by_key[o.key] for o in outputs[at:at + len(runs)]]
        at += len(runs)
        try:
            replace_through_broker(leader, settings, sorted(keys), [(o.key, o.size_bytes) for o in mine])
        except BrokerWriteError as e:
            if len(planned) == 1:
                raise
            refusals.append(f"{leader}: {e}")
            continue
        replaced += len(keys)
        done += mine
    return replaced, done, refusals


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
