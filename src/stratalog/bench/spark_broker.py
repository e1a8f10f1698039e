"""``stratalog bench spark``, against a live broker: writes, reads (as uploaded, and materialized) and the
latency from a producer's acknowledgement to a streaming query's output.

Run after the at-rest half (bench/spark.py) on the same cached source rows and against the same Parquet
figures of that run:

1. write the rows into a broker topic through the data source (``kafka://``; a ``partition`` column
   spreads them, so Kafka's key hashing is not what is timed);
2. read them back through the data source with the same full scan as Parquet's (everything is in
   objects after a Spark write: the broker commits the staged objects);
3. ``materialize`` the topic, then read it with ``load`` (Parquet files plus an empty tail);
4. latency: a producer sends records at a fixed rate to another topic for a while; a streaming query on
   a 1 s trigger reads it through the broker; each record's latency is the time ``foreachBatch`` sees it
   minus the time its acknowledgement reached the producer (both clocks are this machine's).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from stratalog.bench.spark import ratio, timed, timed_reads
from stratalog.chaos.broker_process import start_broker

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

MATERIALIZED_READ_TARGET = 0.9
READ_TARGET = 0.7
WRITE_TARGET = 0.7
#: Partitions of the bench topic: a few per core, as a Kafka topic read by Spark would have.
PARTITIONS = 8
#: The latency phase: records a second, for this long, on a 1 s trigger.
LATENCY_RATE_PER_S = 2000
LATENCY_SECONDS = 20.0
TRIGGER = "1 second"


def run_broker_bench(spark: SparkSession, source: DataFrame, records: int, work_dir: Path,
                     scan: Callable[[DataFrame], tuple[int, int]], parquet: dict[str, float],
                     phase: Callable[[str], None]) -> dict[str, Any]:
    """The broker half; ``parquet`` holds the same run's ``write_s`` and ``read_s``."""
    from confluent_kafka.admin import AdminClient, NewTopic
    from pyspark.sql import functions as f

    from stratalog.spark.materialize import load, materialize

    broker = start_broker(work_dir / "broker")
    try:
        address = f"kafka://{broker.bootstrap}"
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for future in admin.create_topics([NewTopic("bench", PARTITIONS), NewTopic("latency", 1),
                                           NewTopic("warm", PARTITIONS)]).values():
            future.result(30)
        rows = source.select((f.col("key").cast("string").cast("long") % PARTITIONS).alias("partition"),
                             "key", "value")
        phase("broker: warming up")
        warm = rows.limit(20_000)
        warm.write.format("stratalog").option("path", address).option("topic", "warm").mode("append").save()
        scan(spark.read.format("stratalog").option("path", address).option("topics", "warm").load())

        phase("broker: writing through the data source")
        write_s, _ = timed(lambda: rows.write.format("stratalog").option("path", address).option("topic", "bench")
                            .mode("append").save())
        phase("broker: reading through the data source")
        reader = spark.read.format("stratalog").option("path", address).option("topics", "bench")
        read_s, scanned = timed_reads(lambda: scan(reader.load()))
        phase("broker: materializing, reading Parquet files")
        materialize_s, report = timed(lambda: materialize(spark, address, ["bench"]))
        load_s, loaded = timed_reads(lambda: scan(load(spark, address, ["bench"])))
        if scanned[0] != records or loaded != scanned:
            raise RuntimeError(f"reads disagree: {records} written, data source {scanned}, materialized {loaded}")
        phase("broker: latency of a streaming query")
        latency = _latency(spark, broker.bootstrap, address)
    finally:
        broker.stop()
        broker.close_output()
    return {
        "partitions": PARTITIONS,
        "write": ratio(records, write_s, parquet["write_s"], WRITE_TARGET),
        "read": ratio(records, read_s, parquet["read_s"], READ_TARGET),
        "materialized_read": ratio(records, load_s, parquet["read_s"], MATERIALIZED_READ_TARGET),
        "materialize": {"seconds": materialize_s, "files": report.files_written, "bytes": report.bytes_written,
                        "rows_per_s": records / materialize_s},
        "latency": latency,
    }


def _latency(spark: SparkSession, bootstrap: str, address: str) -> dict[str, Any]:
    from confluent_kafka import Producer

    acked: dict[int, float] = {}
    seen: dict[int, float] = {}

    def on_batch(batch: Any, _: int) -> None:
        now = time.time()
        for row in batch.select("offset").collect():
            seen.setdefault(int(row.offset), now)

    query = (spark.readStream.format("stratalog").option("path", address).option("topics", "latency").load()
             .writeStream.foreachBatch(on_batch).trigger(processingTime=TRIGGER).start())
    try:
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 1})
        pause = threading.Event()  # never set: waits between checks of the query's progress
        while query.lastProgress is None:  # the first trigger ran: the query's start-up is not timed
            pause.wait(0.1)

        def delivered(error: Any, message: Any) -> None:
            if error is None:
                acked[message.offset()] = time.time()

        started = time.monotonic()
        sent = 0
        while time.monotonic() - started < LATENCY_SECONDS:
            due = int((time.monotonic() - started) * LATENCY_RATE_PER_S)
            for _ in range(due - sent):
                producer.produce("latency", value=b"x" * 100, partition=0, on_delivery=delivered)
            sent = max(sent, due)
            producer.poll(0.005)
        producer.flush(30)
        deadline = time.monotonic() + 60
        while len(seen.keys() & acked.keys()) < len(acked) and time.monotonic() < deadline:
            pause.wait(0.2)
    finally:
        query.stop()
    waits_ms = np.array([(seen[o] - acked[o]) * 1000 for o in acked if o in seen])
    return {"records": len(acked), "seen": len(waits_ms), "trigger": TRIGGER,
            "p50_ms": float(np.percentile(waits_ms, 50)) if len(waits_ms) else None,
            "p99_ms": float(np.percentile(waits_ms, 99)) if len(waits_ms) else None,
            "max_ms": float(waits_ms.max()) if len(waits_ms) else None}
