"""``stratalog bench spark``: the data source against Spark's own Parquet, measured in the same run.

One source DataFrame of N records (``stream``, ``key``, ``value`` of a fixed size, over S streams) is
cached in Spark's memory, then, in order:

0. warm up: a small write and read of each kind, so worker start-up is not timed;
1. write it to Parquet, and write it through the data source (``mode("append")`` into a fresh store);
2. read both back with the same full scan (sum of value lengths and max offset, so Parquet must decode
   every value too; a bare count would let Parquet answer from its footers);
3. compact the store the write produced (its objects hold many streams each) and report MB/s.

Targets: reads >= 0.7x Parquet's rows/s, writes >= 0.5x Parquet's rows/s.
"""

from __future__ import annotations

import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stratalog.engine.config import StoreConfig
from stratalog.engine.store import StreamStore
from stratalog.wal.config import WALConfig

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

READ_RATIO_TARGET = 0.7
WRITE_RATIO_TARGET = 0.5
#: Each full scan is timed this many times; the median counts. Writes are timed once.
READ_REPEATS = 3
#: Rows of the warm-up round that runs every kind of job once before the timed ones.
WARM_UP_RECORDS = 20_000
#: The bench store's WAL: writes through Spark bypass it, so it only needs to open.
BENCH_WAL_BYTES = 64 << 20


@dataclass(frozen=True, slots=True)
class SparkBenchPlan:
    records: int
    streams: int
    value_bytes: int
    master: str
    #: Also write, read, materialize and stream through a live broker (bench/spark_broker.py).
    broker: bool = True
    #: Write, read and compact a store at rest (its data directory) through the data source.
    at_rest: bool = True


def timed(step: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    result = step()
    return time.perf_counter() - started, result


def timed_reads(step: Callable[[], Any]) -> tuple[float, Any]:
    """The median of READ_REPEATS runs of a read (a full scan takes one to a few seconds, where one run
    on a shared machine varies by a third)."""
    runs = [timed(step) for _ in range(READ_REPEATS)]
    results = {repr(r) for _, r in runs}
    if len(results) != 1:
        raise RuntimeError(f"the same read returned different answers: {sorted(results)}")
    return statistics.median(s for s, _ in runs), runs[0][1]


def bench_config() -> StoreConfig:
    return StoreConfig(wal_capacity_bytes=BENCH_WAL_BYTES,
                       wal=WALConfig(record_bytes_max=4 << 20, window_bytes_max=16 << 20,
                                     buffered_bytes_max=16 << 20))


def run_spark_bench(spark: SparkSession, plan: SparkBenchPlan, work_dir: Path,
                    phase: Callable[[str], None]) -> dict[str, Any]:
    """Run the three comparisons in ``work_dir``; return the figures as a JSON-ready document."""
    from pyspark.sql import functions as f

    from stratalog.spark import jobs

    data_dir, parquet_dir = work_dir / "store", work_dir / "parquet"
    uri = str(data_dir / "objects")
    StreamStore.open(data_dir, None, bench_config()).close()
    shutil.rmtree(parquet_dir, ignore_errors=True)

    phase("generating the source rows; warming up both paths")
    pad = "x" * max(plan.value_bytes - 20, 0)

    def rows(count: int) -> Any:
        return (spark.range(count, numPartitions=max(spark.sparkContext.defaultParallelism, 1))
                .select(f.concat(f.lit("s"), (f.col("id") % plan.streams).cast("string")).alias("stream"),
                        f.col("id").cast("string").cast("binary").alias("key"),
                        f.concat(f.lpad(f.col("id").cast("string"), 20, "0"), f.lit(pad)).cast("binary")
                        .alias("value")))

    source = rows(plan.records).cache()
    source.count()
    # The first job of each kind starts Python workers and loads classes: do that outside the timings.
    warm_dir = work_dir / "warm"
    StreamStore.open(warm_dir, None, bench_config()).close()
    warm = rows(WARM_UP_RECORDS)
    warm.write.mode("overwrite").parquet(str(work_dir / "warm.parquet"))
    warm.write.format("stratalog").option("path", str(warm_dir / "objects")).option("data_dir", str(warm_dir)) \
        .mode("append").save()
    spark.read.parquet(str(work_dir / "warm.parquet")).select(f.sum(f.length("value"))).collect()
    spark.read.format("stratalog").option("path", str(warm_dir / "objects")).load() \
        .select(f.sum(f.length("value"))).collect()

    phase("writing Parquet")
    parquet_write_s, _ = timed(lambda: source.write.mode("overwrite").parquet(str(parquet_dir)))

    def scan(df: Any) -> tuple[int, int]:
        row = df.select(f.sum(f.length("value")).alias("bytes"), f.count(f.lit(1)).alias("rows")).collect()[0]
        return int(row["rows"]), int(row["bytes"])

    phase("reading Parquet")
    parquet_read_s, parquet_scan = timed_reads(lambda: scan(spark.read.parquet(str(parquet_dir))))
    if parquet_scan[0] != plan.records:
        raise RuntimeError(f"Parquet read {parquet_scan[0]} of {plan.records} records")
    phase("timing a Python source that does nothing (the ceiling)")
    ceiling = _ceiling(spark, source, plan, scan, parquet_read_s, parquet_write_s)
    at_rest: dict[str, Any] = {}
    if plan.at_rest:
        phase("writing through the data source")
        write_s, _ = timed(lambda: source.write.format("stratalog").option("path", uri)
                            .option("data_dir", str(data_dir)).mode("append").save())
        phase("reading through the data source")
        read_s, source_scan = timed_reads(lambda: scan(spark.read.format("stratalog").option("path", uri).load()))
        if parquet_scan != source_scan:
            raise RuntimeError(f"the two reads disagree: Parquet {parquet_scan}, stratalog {source_scan}")
        at_rest = {"write": ratio(plan.records, write_s, parquet_write_s, WRITE_RATIO_TARGET),
                   "read": ratio(plan.records, read_s, parquet_read_s, READ_RATIO_TARGET)}

    broker = None
    if plan.broker:
        from stratalog.bench.spark_broker import run_broker_bench

        broker = run_broker_bench(spark, source, plan.records, work_dir, scan,
                                  {"write_s": parquet_write_s, "read_s": parquet_read_s}, phase)
    source.unpersist()

    if plan.at_rest:
        phase("compacting")
        report = jobs.compact(spark, data_dir, uri, config=bench_config())
        at_rest["compact"] = {"objects_replaced": report.objects_replaced, "objects_written": report.objects_written,
                              "bytes_written": report.bytes_written, "seconds": report.seconds,
                              "mb_per_s": report.mb_per_s}
    return {
        "ceiling": ceiling,
        "broker": broker,
        "plan": {"records": plan.records, "streams": plan.streams, "value_bytes": plan.value_bytes,
                 "master": plan.master, "data_bytes": parquet_scan[1]},
        **at_rest,
    }


def _ceiling(spark: SparkSession, source: Any, plan: SparkBenchPlan, scan: Callable[[Any], tuple[int, int]],
             parquet_read_s: float, parquet_write_s: float) -> dict[str, Any]:
    """The rows/s of a Python source that does nothing, reading the same rows and writing the source's
    (bench/spark_ceiling.py): what Spark's Python data source API allows on this machine."""
    from stratalog.bench.spark_ceiling import register

    register(spark)
    reader = (spark.read.format("stratalog-ceiling").option("rows", str(plan.records))
              .option("partitions", str(max(spark.sparkContext.defaultParallelism, 1)))
              .option("value_bytes", str(plan.value_bytes)))
    scan(reader.load())  # its first run starts the workers
    read_s, (rows, _) = timed_reads(lambda: scan(reader.load()))
    if rows != plan.records:
        raise RuntimeError(f"the ceiling source read {rows} of {plan.records} rows")
    source.write.format("stratalog-ceiling").mode("append").save()
    write_s, _ = timed(lambda: source.write.format("stratalog-ceiling").mode("append").save())
    return {"read": {"seconds": read_s, "rows_per_s": plan.records / read_s, "over_parquet": parquet_read_s / read_s},
            "write": {"seconds": write_s, "rows_per_s": plan.records / write_s,
                      "over_parquet": parquet_write_s / write_s}}


def ratio(records: int, seconds: float, parquet_seconds: float, target: float) -> dict[str, Any]:
    rows_per_s, parquet_rows_per_s = records / seconds, records / parquet_seconds
    ratio = rows_per_s / parquet_rows_per_s
    return {"seconds": seconds, "rows_per_s": rows_per_s, "parquet_seconds": parquet_seconds,
            "parquet_rows_per_s": parquet_rows_per_s, "ratio": ratio,
            "target": {"name": "ratio", "bound": target, "at_least": True, "met": ratio >= target}}
