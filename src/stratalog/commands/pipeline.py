"""``stratalog pipeline compact|retention|export|materialize``: the store's bulk jobs on Spark."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: The bar redraws on its own thread; a few times a second is plenty for jobs that run minutes.
PROGRESS_REFRESH_PER_S = 4

_master = click.option("--master", default="local[*]", show_default=True,
                       help="Spark master: local[N] or a cluster URL (spark://host:7077).")
_objects = click.option("--objects", "objects_uri", default=None, metavar="URI",
                        help="The store's object storage, when not DATA_DIR/objects: a directory, "
                             "file:///path or s3://bucket/prefix?endpoint=URL.")


@click.group()
def pipeline() -> None:
    """Bulk jobs on Spark: compaction, retention, export, materialization. Each is safe to re-run after a
    crash."""


@contextmanager
def _session(master: str) -> Iterator[SparkSession]:
    from stratalog.spark import local_session

    spark = local_session(master, app_name="stratalog-pipeline")
    spark.sparkContext.setLogLevel("ERROR")
    try:
        yield spark
    finally:
        spark.stop()


@contextmanager
def _bar(console: Console, what: str) -> Iterator[Callable[[int, int], None]]:
    columns = (TextColumn(what), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True, refresh_per_second=PROGRESS_REFRESH_PER_S) as bar:
        task = bar.add_task(what, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update


def _uri(data_dir: Path, objects_uri: str | None) -> str:
    return objects_uri or str(data_dir / "objects")


@pipeline.command()
@click.argument("store")
@_objects
@_master
@click.option("--object-mib", default=64, show_default=True, type=click.IntRange(1, 4096),
              help="Largest per-stream object compaction writes.")
def compact(store: str, objects_uri: str | None, master: str, object_mib: int) -> None:
    """Merge multi-stream objects into per-stream objects and swap them in atomically.

    STORE is a running broker or cluster (kafka://HOST:PORT[,HOST:PORT...]: each broker swaps in the
    objects of the partitions it leads if the ones they replace still hold the same records, and needs
    Alter on the cluster when it checks ACLs) or a data directory (the store must not be open elsewhere).
    Replaced objects are deleted after the grace period.
    """
    from stratalog.spark.jobs import compact as run
    from stratalog.spark.jobs import compact_live

    console = Console()
    with _session(master) as spark, _bar(console, "compacting: objects written") as progress:
        if store.startswith("kafka://"):
            report = compact_live(spark, store, objects=objects_uri, object_bytes_max=object_mib << 20,
                                  progress=progress)
        else:
            data_dir = Path(store)
            if not data_dir.is_dir():
                raise click.BadParameter(f"{store} is neither kafka://HOST:PORT nor a data directory",
                                         param_hint="STORE")
            report = run(spark, data_dir, _uri(data_dir, objects_uri), object_bytes_max=object_mib << 20,
                         progress=progress)
    console.print(f"replaced {report.objects_replaced} objects with {report.objects_written} per-stream objects "
                  f"({report.bytes_written / 1e6:.1f} MB) in {report.seconds:.1f} s: {report.mb_per_s:.1f} MB/s")
    if report.objects_skipped:
        console.print(f"left {report.objects_skipped} objects for a later run: each holds partitions that "
                      "different brokers lead now (or none, during a failover), and one broker swaps only its own")
    for refusal in report.refusals:
        console.print(f"[yellow]not swapped, planned again by a later run:[/] {refusal}")


@pipeline.command()
@click.argument("data_dir", metavar="DATA_DIR")
@_objects
@_master
@click.option("--clean-staging", is_flag=True,
              help="Also delete objects Spark writes staged and left (a driver that died mid-write). Only "
                   "while no Spark write to this store runs.")
def retention(data_dir: str, objects_uri: str | None, master: str, clean_staging: bool) -> None:
    """Apply every stream's time and byte retention; delete objects unreferenced past the grace period.

    DATA_DIR is a store at rest. A running broker applies retention itself (topic configs retention.ms
    and retention.bytes, and DeleteRecords), so there is nothing to run against one.
    """
    from stratalog.spark.jobs import retention as run

    if data_dir.startswith("kafka://"):
        raise click.UsageError("a running broker applies retention itself: set the topic configs retention.ms "
                               "and retention.bytes (kafka-configs, or IncrementalAlterConfigs), or delete "
                               "records with DeleteRecords")
    if not Path(data_dir).is_dir():
        raise click.BadParameter(f"{data_dir} is not a store's data directory", param_hint="DATA_DIR")

    console = Console()
    with _session(master) as spark, _bar(console, "retention: objects deleted") as progress:
        report = run(spark, Path(data_dir), _uri(Path(data_dir), objects_uri), clean_staging=clean_staging,
                     progress=progress)
    console.print(f"trimmed {report.streams_trimmed} streams, deleted {report.objects_deleted} objects "
                  f"and {report.staged_objects_deleted} staged objects in {report.seconds:.1f} s")


@pipeline.command()
@click.argument("objects_uri", metavar="OBJECTS")
@click.argument("out")
@click.option("--streams", default=None, help="Comma list of stream names or ids (default: all).")
@click.option("--queues", default=None,
              help="Export a queue store's queues instead: '*' for all, or a comma list of queue names.")
@_master
def export(objects_uri: str, out: str, streams: str | None, queues: str | None, master: str) -> None:
    """Write streams from the store at OBJECTS to Parquet under OUT, partitioned by stream.

    OBJECTS is a running broker (kafka://HOST:PORT: everything acknowledged when the export starts) or a
    store's object storage (DATA_DIR/objects, file:///path or s3://...; the store may be running). OUT is
    replaced as a whole. With --queues, OBJECTS is a queue store's object storage and each queue is written
    as a stream (null timestamp and key).
    """
    from stratalog.spark.jobs import export as run

    console = Console()
    with _session(master) as spark, _bar(console, "exporting: rows") as progress:
        report = run(spark, objects_uri, out, streams=streams, queues=queues, progress=progress)
    console.print(f"exported {report.rows} rows to {out} in {report.seconds:.1f} s")


@pipeline.command()
@click.argument("store")
@click.option("--topics", default=None, help="Comma list of topics (default: every topic).")
@click.option("--file-mib", default=512, show_default=True, type=click.IntRange(1, 4096),
              help="About this much of the store's data per Parquet file (a task holds one, compressed, in memory).")
@click.option("--every", "every_s", type=click.FloatRange(min=1.0), default=None, metavar="SECONDS",
              help="Run again this long after each run ends, until interrupted: a table that keeps up.")
@_master
def materialize(store: str, topics: str | None, file_mib: int, every_s: float | None, master: str) -> None:
    """Write topics as Parquet files in the store's object storage, for reads at Spark's own speed.

    STORE is a running broker (kafka://HOST:PORT), an object store URI or a data directory. Each run
    writes the offsets uploaded since the last one, one file per run of offsets of a partition, under
    tables/<topic>/<partition>/<day>/, and publishes the table manifest listing them; files that retention
    left behind leave it. Read them with stratalog.spark.materialize.load, which adds every later record.
    Run one at a time per store; it is safe to re-run after a crash.
    """
    from stratalog.spark.materialize import materialize as run

    wanted = None if topics is None else [t.strip() for t in topics.split(",") if t.strip()]
    console = Console()
    with _session(master) as spark:
        while True:
            with _bar(console, "materializing: files written") as progress:
                report = run(spark, store, wanted, file_bytes_max=file_mib << 20, progress=progress)
            console.print(f"wrote {report.files_written} files ({report.rows} records, "
                          f"{report.bytes_written / 1e6:.1f} MB), retired {report.files_retired} in "
                          f"{report.seconds:.1f} s")
            if every_s is None:
                return
            time.sleep(every_s)
