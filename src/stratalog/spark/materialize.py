"""Topics as Parquet, read at Spark's own speed: ``materialize`` writes them, ``load`` reads them plus the rest.

``materialize(spark, path)`` writes every uploaded offset not yet materialized to Parquet files in the
store's object storage (spark/tables.py: one file per run of offsets of one partition, under its topic,
partition and day), then publishes the table manifest that lists them. Run it again and it writes only
what was uploaded since; run it after a crash and it writes the same files again under the same names
(a file's name is its offsets) and publishes them once. Files that retention left wholly below their
partition's start leave the manifest, and are deleted once queries planned before can no longer need them.

Tables hold committed records only, as a read_committed consumer reads them: through a live broker, each
partition is written up to its last stable offset (ListOffsets read_committed), never past it, so a
transaction open now is written by a later run once it ends, and the records of aborted transactions are
left out with the ranges its leader gives (the data source's own, spark/txn_ranges.py); at rest, from
what the data directory keeps of them (spark/rest_txns.py). A file covers its offsets whatever it holds:
markers and aborted records take offsets and give no row.

``load(spark, path)`` is the read a user calls instead of ``spark.read.format("stratalog")...load()``:
the materialized files through Spark's vectorized Parquet reader, unioned with every later offset through
the data source (objects, and a live broker's tail), with the same columns and the same rows as the data
source alone gives. Offsets below a partition's start (trimmed since a file was written) are filtered out.

Spark must reach the object storage for the Parquet part: a local directory always; S3 through Hadoop's
S3A connector (``s3a://`` URIs; the hadoop-aws package and its credentials configured in the session).
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from stratalog.broker.topics import parse_stream_name
from stratalog.engine.manifest import BlockRef, Manifest, read_manifest
from stratalog.kafka.aborted_ranges import AbortedTxn
from stratalog.objects.store import ObjectStore
from stratalog.spark.aborted import StreamTxns, ranges_for
from stratalog.spark.broker_source import BrokerRead, isolation_level
from stratalog.spark.columns import HEADERS_DDL, SCHEMA_DDL, arrow_schema
from stratalog.spark.jobs import Progress, no_progress, run_tasks
from stratalog.spark.kafka_client import READ_COMMITTED, BrokerView
from stratalog.spark.location import Location, locate
from stratalog.spark.plan import ReadPartition, StreamSlice, plan_partitions
from stratalog.spark.reader import open_store, read_partition, shared_store
from stratalog.spark.rest_txns import rest_transactions
from stratalog.spark.tables import (
    TableFile,
    TableManifest,
    after_trims,
    expired,
    file_key,
    read_table_manifest,
    write_table_manifest,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: A file holds at most this many records...
FILE_ROWS_MAX = 4_000_000
#: ... and about this many bytes of the store's blocks. A task holds the file as written (compressed) in
#: memory; the fewer the files, the less Spark's reader pays per file (at 8 MB files it lost a third).
FILE_BYTES_MAX = 512 << 20
#: Rows per Parquet row group, at most: Spark's reader parallelizes and skips by row group...
ROW_GROUP_ROWS = 1_000_000
#: ... and bytes of records per row group, at most (Spark writes 128 MB ones): what a task holds at once.
ROW_GROUP_BYTES = 128 << 20


@dataclass(frozen=True, slots=True)
class MaterializeReport:
    files_written: int
    rows: int
    bytes_written: int
    files_retired: int
    seconds: float


@dataclass(frozen=True, slots=True)
class _FileTask:
    """One file to write: ``part`` (offsets of one partition), without its ``aborted`` transactions;
    ``unknown``: why they cannot be known (a transactional batch then fails the task)."""

    topic: str
    partition: int
    part: ReadPartition
    aborted: StreamTxns = ()
    unknown: str | None = None


@dataclass(frozen=True, slots=True)
class _Plan:
    """What a run writes: the store's state when planned, and the files."""

    uri: str
    manifest: Manifest
    by_topic: dict[str, dict[int, int]]
    tables: dict[str, TableManifest]
    tasks: list[_FileTask]


def _options(path: str, options: dict[str, str]) -> dict[str, str]:
    opts = {"path": path, **{k.lower(): str(v) for k, v in options.items()}}
    if isolation_level(opts, locate(opts).kafka) != READ_COMMITTED:
        raise ValueError("materialized tables hold committed records only: to read every record, aborted "
                         "transactions' too, read the data source with isolationLevel=read_uncommitted")
    return opts


def _partitions(manifest: Manifest, topics: list[str] | None) -> dict[str, dict[int, int]]:
    """topic -> partition -> stream id, for streams named topic/partition (of ``topics``, or all)."""
    out: dict[str, dict[int, int]] = {}
    for info in manifest.streams.values():
        parsed = parse_stream_name(info.name or "")
        if parsed is not None and (topics is None or parsed[0] in topics):
            out.setdefault(parsed[0], {})[parsed[1]] = info.stream_id
    missing = sorted(set(topics or ()) - out.keys())
    if missing:
        raise ValueError(f"the store has no topic {', '.join(map(repr, missing))} (streams named topic/partition)")
    return out


def _snapshot(uri: str, topics: list[str] | None) -> tuple[Manifest, dict[str, dict[int, int]],
                                                             dict[str, TableManifest]]:
    """The store's manifest, its topics' partitions (stream ids), and each topic's table manifest."""
    store = open_store(uri)
    try:
        manifest = read_manifest(store)
        by_topic = _partitions(manifest, topics)
        return manifest, by_topic, {topic: read_table_manifest(store, topic) for topic in by_topic}
    finally:
        store.close()


def materialize(spark: SparkSession, path: str, topics: list[str] | None = None, *,
                options: dict[str, str] | None = None, file_rows_max: int = FILE_ROWS_MAX,
                file_bytes_max: int = FILE_BYTES_MAX, progress: Progress = no_progress,
                now_ms: int | None = None) -> MaterializeReport:
    """Write uploaded offsets of ``topics`` (all when None) not yet in their tables as Parquet, and publish
    each table's manifest. ``path`` names the store as the data source's option does (a broker address, an
    object store URI, a data directory); one run at a time per store."""
    began = time.monotonic()
    opts = _options(path, options or {})
    location = locate(opts)
    if location.broker:
        plan = _plan_broker(location, opts, topics, file_rows_max, file_bytes_max)
    else:
        plan = _plan_at_rest(location, topics, file_rows_max, file_bytes_max)
    uri, manifest, by_topic, tables = plan.uri, plan.manifest, plan.by_topic, plan.tables
    results: list[tuple[TableFile, int]] = run_tasks(spark, plan.tasks, 1, _writer(uri), progress)
    written = [f for f, _ in results]
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    retired = 0
    store = open_store(uri)
    try:
        for topic, partitions in sorted(by_topic.items()):
            starts = {p: manifest.streams[sid].start_offset for p, sid in partitions.items()}
            old = tables[topic]
            new = [f for f in written if f.key.startswith(f"tables/{topic}/")]
            table = after_trims(old, starts, now_ms)
            retired += len(table.retired) - len(old.retired)
            table.files = sorted([*table.files, *new], key=lambda f: (f.partition, f.start))
            gone, table = expired(table, now_ms)
            if new or gone or table.retired != old.retired:
                table.seq = old.seq + 1
                write_table_manifest(store, table)
            for key in gone:
                store.delete(key)  # out of the manifest first, then deleted
    finally:
        store.close()
    return MaterializeReport(len(written), sum(records for _, records in results), sum(f.bytes for f in written),
                             retired, time.monotonic() - began)


def _plan_broker(location: Location, opts: dict[str, str], topics: list[str] | None, rows_max: int,
                 bytes_max: int) -> _Plan:
    """The files of uploaded offsets below each partition's last stable offset, not yet in their tables,
    and the aborted transactions over them, from the partitions' leaders."""
    source = BrokerRead(location, {**opts, "coldreads": "objects"})
    view = source.view()
    try:
        source.resolve_objects(view)
        assert source.objects is not None
        manifest, by_topic, tables = _snapshot(source.objects, topics)
        # The stable offsets before the ranges: every transaction ended below them has its range by then.
        stable = view.ends([(t, p) for t, ps in by_topic.items() for p in ps], committed=True)
        ends = {by_topic[t][p]: e.end for (t, p), e in stable.items()}
        parts = _parts(manifest, by_topic, tables, ends, rows_max, bytes_max)
        aborted = source.aborted(view, [part for _, _, part in parts])
    finally:
        view.close()
    return _Plan(source.objects, manifest, by_topic, tables, _tasks(parts, aborted, None))


def _plan_at_rest(location: Location, topics: list[str] | None, rows_max: int, bytes_max: int) -> _Plan:
    """The files of offsets not yet in their tables, up to each stream's stable end at rest, and the aborted
    transactions over them, from what the data directory keeps (spark/rest_txns.py)."""
    assert location.objects is not None
    manifest, by_topic, tables = _snapshot(location.objects, topics)
    store = open_store(location.objects)
    try:
        txns = rest_transactions(location.data_dir, store, manifest,
                                 [sid for ps in by_topic.values() for sid in ps.values()])
    finally:
        store.close()
    parts = _parts(manifest, by_topic, tables, txns.stable_ends, rows_max, bytes_max)
    return _Plan(location.objects, manifest, by_topic, tables, _tasks(parts, txns.aborted, txns.unknown))


def _parts(manifest: Manifest, by_topic: dict[str, dict[int, int]], tables: dict[str, TableManifest],
           ends: dict[int, int], rows_max: int, bytes_max: int) -> list[tuple[str, int, ReadPartition]]:
    """(topic, partition, offsets) of each file: from where each partition's table ends to its end in
    ``ends`` (by stream id) or, when it is further, in the manifest."""
    out = []
    for topic, partitions in sorted(by_topic.items()):
        done = tables[topic].ends()
        for partition, stream_id in sorted(partitions.items()):
            info = manifest.streams[stream_id]
            first = max(done.get(partition, 0), info.start_offset)
            end = min(info.end_offset, ends.get(stream_id, info.end_offset))
            if first < end:
                for part in plan_partitions(manifest, [stream_id], rows_max=rows_max, bytes_max=bytes_max,
                                            starts={stream_id: first}, ends={stream_id: end}):
                    out.append((topic, partition, part))
    return out


def _tasks(parts: list[tuple[str, int, ReadPartition]], aborted: dict[int, list[AbortedTxn]],
           unknown: str | None) -> list[_FileTask]:
    return [_FileTask(topic, partition, part, ranges_for(part, aborted), unknown) for topic, partition, part in parts]


def _writer(uri: str) -> Callable[[list[_FileTask]], Iterator[tuple[TableFile, int]]]:
    def write(tasks: list[_FileTask]) -> Iterator[tuple[TableFile, int]]:
        for task in tasks:
            yield write_file(uri, task.topic, task.partition, task.part, task.aborted, task.unknown)

    return write


def write_file(uri: str, topic: str, partition: int, part: ReadPartition, aborted: StreamTxns = (),
               unknown: str | None = None) -> tuple[TableFile, int]:
    """Read ``part`` (offsets of one partition) from the store's objects and put it as one Parquet file,
    written a row group at a time: a task holds one row group and the compressed file, not the records.
    The file, and the records in it: one per offset, or fewer where log compaction left gaps, markers lie
    or ``aborted`` transactions wrote (none, even: the file then has no rows, and no record to date its
    directory by, so it goes under 1970-01-01). ``unknown``: as read_partition's."""
    store = shared_store(uri)
    (piece,) = part.slices
    out = io.BytesIO()
    writer = pq.ParquetWriter(out, arrow_schema(True), compression="snappy")
    held: list[pa.RecordBatch] = []
    held_bytes = 0
    records = 0
    next_offset = piece.start_offset  # the least offset the next record may have
    first_ms = low = high = None
    for batch in _in_offset_order(store, piece, dict(aborted), unknown):
        if batch.num_rows:
            offsets = batch.column("offset")
            if offsets[0].as_py() < next_offset:
                raise ValueError(f"{topic}/{partition}: offset {offsets[0].as_py()} read after {next_offset - 1}")
            next_offset = offsets[-1].as_py() + 1
            records += batch.num_rows
            stamps = batch.column("timestamp").cast(pa.int64())
            first_ms = stamps[0].as_py() // 1000 if first_ms is None else first_ms
            low = min(pc.min(stamps).as_py(), low if low is not None else 1 << 62)
            high = max(pc.max(stamps).as_py(), high if high is not None else -(1 << 62))
        held.append(batch)
        held_bytes += batch.nbytes
        if held_bytes >= ROW_GROUP_BYTES:
            writer.write_table(pa.Table.from_batches(held), row_group_size=ROW_GROUP_ROWS)
            held, held_bytes = [], 0
    if held:
        writer.write_table(pa.Table.from_batches(held), row_group_size=ROW_GROUP_ROWS)
    writer.close()
    if next_offset > piece.end_offset:
        raise ValueError(f"{topic}/{partition}: read up to {next_offset} of [{piece.start_offset}, {piece.end_offset})")
    key = file_key(topic, partition, piece.start_offset, piece.end_offset, 0 if first_ms is None else first_ms)
    data = out.getvalue()
    store.put(key, data)
    low_ms, high_ms = (-1, -1) if low is None or high is None else (low // 1000, high // 1000)
    return TableFile(key, partition, piece.start_offset, piece.end_offset, len(data), low_ms, high_ms), records


def _in_offset_order(store: ObjectStore, piece: StreamSlice, aborted: dict[int, tuple[AbortedTxn, ...]],
                     unknown: str | None) -> Iterator[pa.RecordBatch]:
    """The records of ``piece`` in offset order. Its blocks (listed in offset order) are read run by run, a
    run being blocks that lie one after another in one object, which a ranged get returns in order; a
    whole partition's fetches would come back in object order (a compacted object holds old offsets under
    a new key)."""
    run: list[BlockRef] = []

    def read(blocks: list[BlockRef]) -> Iterator[pa.RecordBatch]:
        first = max(blocks[0].entry.start_offset, piece.start_offset)
        end = min(blocks[-1].entry.end_offset, piece.end_offset)
        one = ReadPartition((StreamSlice(piece.stream_id, piece.name, first, end, tuple(blocks)),))
        yield from read_partition(store, one, headers=True, aborted=aborted, unknown=unknown)

    for ref in piece.blocks:
        last = run[-1] if run else None
        if last is not None and (ref.key != last.key or ref.entry.position != last.entry.position
                                 + last.entry.size_bytes):
            yield from read(run)
            run = []
        run.append(ref)
    if run:
        yield from read(run)


def spark_path(uri: str, key: str) -> str:
    """The URI Spark reads object ``key`` of the store at ``uri`` from."""
    if uri.startswith("s3://"):
        parts = urlsplit(uri)
        prefix = parts.path.strip("/")
        return f"s3a://{parts.netloc}/{prefix + '/' if prefix else ''}{key}"
    root = Path(unquote(urlsplit(uri).path)) if uri.startswith("file://") else Path(uri)
    return (root.absolute() / key).as_uri()


def load(spark: SparkSession, path: str, topics: list[str] | None = None, **options: Any) -> DataFrame:
    """Every record of ``topics`` (all when None): materialized files through Spark's Parquet reader, the
    rest through the data source. Takes the data source's options (``includeHeaders``, ``kafka.*``, ...)."""
    from pyspark.sql import functions as F  # noqa: N812 - Spark's own spelling

    opts = _options(path, options)
    location = locate(opts)
    headers = opts.get("includeheaders", "false").lower() == "true"
    schema = f"{SCHEMA_DDL}, {HEADERS_DDL}" if headers else SCHEMA_DDL
    view = BrokerRead(location, {**opts, "coldreads": "objects"}) if location.broker else None
    client = view.view() if view is not None else None
    try:  # one client asks the broker where its objects are, then each partition's bounds
        if view is not None and client is not None:
            view.resolve_objects(client)
        uri = view.objects if view is not None else location.objects
        assert uri is not None
        manifest, by_topic, tables = _snapshot(uri, topics)
        bounds = _bounds(client, manifest, by_topic)
    finally:
        if client is not None:
            client.close()
    files: list[str] = []   # object keys of the table files to read
    resume: dict[str, dict[str, int]] = {}
    cut: list[tuple[str, int]] = []
    for topic, partitions in sorted(by_topic.items()):
        done = tables[topic].ends()
        for partition in sorted(partitions):
            start = bounds[(topic, partition)][0]
            resume.setdefault(topic, {})[str(partition)] = max(done.get(partition, 0), start)
            for f in tables[topic].files:
                if f.partition == partition and f.end > start:
                    files.append(f.key)
                    if f.start < start:
                        cut.append((f"{topic}/{partition}", start))
    caught_up = all(resume[t][str(p)] >= bounds[(t, p)][1] for t, ps in by_topic.items() for p in ps)
    materialized = None
    if files:
        materialized = _read_tables(spark, uri, files, (opts.get("tablereader") or "auto").lower())
        for label, start in cut:  # offsets trimmed since their file was written
            materialized = materialized.where(~((F.col("stream") == label) & (F.col("offset") < start)))
        if not headers:
            materialized = materialized.drop("headers")
        if caught_up:
            return materialized
    rest_options = {**opts, "startingoffsets": json.dumps(resume)}
    if location.broker:
        rest_options["topics"] = ",".join(sorted(by_topic))
    else:
        rest_options["streams"] = ",".join(f"{t}/{p}" for t, ps in sorted(by_topic.items()) for p in sorted(ps))
    # The schema given, so Spark need not ask a Python worker for it.
    rest = spark.read.format("stratalog").schema(schema).options(**rest_options).load()
    return rest if materialized is None else materialized.unionByName(rest)


TABLE_READERS = ("auto", "spark", "objects")


def _read_tables(spark: SparkSession, uri: str, keys: list[str], reader: str) -> DataFrame:
    """The table files ``keys``: through Spark's Parquet reader where the session reads the store's URIs
    (a local directory; S3 with the S3A connector, hadoop-aws, on its class path), else through the data
    source's tasks, each reading a file from the object store with pyarrow (option ``tableReader``:
    ``spark`` or ``objects`` to choose; ``auto`` picks)."""
    if reader not in TABLE_READERS:
        raise ValueError(f"option 'tableReader' must be one of {', '.join(TABLE_READERS)}, not {reader!r}")
    full = f"{SCHEMA_DDL}, {HEADERS_DDL}"
    if reader == "spark" or (reader == "auto" and _spark_reads(spark, uri)):
        return spark.read.schema(full).parquet(*(spark_path(uri, key) for key in keys))
    return spark.read.format("stratalog").schema(full).options(
        path=uri, tableFiles=json.dumps(keys), includeHeaders="true").load()


#: The class a Spark session needs to read s3a:// URIs (hadoop-aws, not on PyPI).
S3A_CLASS = "org.apache.hadoop.fs.s3a.S3AFileSystem"


def _spark_reads(spark: SparkSession, uri: str) -> bool:
    if not uri.startswith("s3://"):
        return True
    try:
        spark._jvm.java.lang.Class.forName(S3A_CLASS)  # type: ignore[union-attr]
    except Exception:   # not on the class path (Py4J's error), or no JVM here at all (Spark Connect)
        return False
    return True


def read_table_file(store: ObjectStore, key: str) -> Iterator[pa.RecordBatch]:
    """The record batches of one table file (a task of a ``tableFiles`` read)."""
    yield from pq.read_table(pa.BufferReader(store.get(key))).to_batches()


def _bounds(client: BrokerView | None, manifest: Manifest,
            by_topic: dict[str, dict[int, int]]) -> dict[tuple[str, int], tuple[int, int]]:
    """Each partition's first and next offset now: the broker's log start and high watermark when there is
    a broker, else the manifest's."""
    if client is not None:
        ends = client.ends([(t, p) for t, ps in by_topic.items() for p in ps])
        return {tp: (e.start, e.end) for tp, e in ends.items()}
    return {(t, p): (manifest.streams[sid].start_offset, manifest.streams[sid].end_offset)
            for t, ps in by_topic.items() for p, sid in ps.items()}
