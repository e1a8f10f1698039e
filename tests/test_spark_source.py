"""The stratalog data source in a local[2] Spark: batch reads and writes, streaming reads and writes,
against the local directory store and SeaweedFS; a stopped (or killed) broker's data directory read
read_committed."""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from brokerkit import running_broker
from conftest import SeaweedS3
from enginekit import small_store_config
from stratalog.engine.manifest import ManifestError, read_manifest
from stratalog.engine.sink_markers import SINK_MARKER_PREFIX
from stratalog.engine.staging import STAGING_PREFIX
from stratalog.engine.store import StreamStore
from stratalog.objects.local import LocalDirStore
from stratalog.objects.store import ObjectStore
from stratalog.objects.uri import LOCAL_DIR_NAME
from stratalog.records import NewRecord
from stratalog.spark.aborted import TransactionsUnknownError
from stratalog.spark.kafka_client import BrokerView
from stratalog.spark.materialize import materialize, read_table_file
from stratalog.spark.reader import open_store
from stratalog.spark.source import StratalogReader
from stratalog.spark.stream import StratalogStreamReader
from stratalog.spark.tables import read_table_manifest
from test_spark_broker_read import Transactions, create_topic, values_of
from waiting import wait_until

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Place:
    """A store's data directory and the URI of its object storage."""

    data_dir: Path
    uri: str

    def objects(self) -> ObjectStore:
        return open_store(self.uri)

    def open(self) -> StreamStore:
        return StreamStore.open(self.data_dir, self.objects(), small_store_config())


@pytest.fixture(params=["local", "s3"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Place]:
    if request.param == "local":
        yield Place(tmp_path / "d", str(tmp_path / "objects"))
        return
    server: SeaweedS3 = request.getfixturevalue("seaweedfs")
    query = urlencode({"endpoint": server.endpoint_url, "region": server.region,
                       "access_key": server.access_key, "secret_key": server.secret_key})
    yield Place(tmp_path / "d", f"s3://{server.bucket}/spark-{secrets.token_hex(6)}?{query}")


def fill(store: StreamStore, streams: int = 3, records: int = 400) -> None:
    for n in range(streams):
        s = store.create_stream(f"s{n}")
        for i in range(0, records, 50):
            s.append([NewRecord(b"v%d-%d" % (n, j), key=None if j % 4 == 0 else b"k%d" % j,
                                timestamp_ms=1_700_000_000_000 + j) for j in range(i, i + 50)]).result()
    store.flush()


def reader(spark: Any, place: Place, **options: str) -> Any:
    r = spark.read.format("stratalog").option("path", place.uri)
    for name, value in options.items():
        r = r.option(name, value)
    return r.load()


def test_batch_read_returns_every_committed_record(spark: Any, place: Place) -> None:
    store = place.open()
    fill(store)
    expected = {(f"s{n}", r.offset, r.key, r.value) for n in range(3)
                for r in store.open_stream(f"s{n}").fetch(0, max_bytes=1 << 30)}
    store.close()
    df = reader(spark, place, rowsPerPartition="250")
    assert df.rdd.getNumPartitions() == 3  # each stream is one 400-row block: blocks are the split unit
    rows = df.collect()
    assert {(r.stream, r.offset, r.key, r.value) for r in rows} == expected
    assert len(rows) == 1200
    assert min(r.timestamp.timestamp() for r in rows) == 1_700_000_000.0


def test_filters_on_stream_and_offset_narrow_the_read(spark: Any, place: Place) -> None:
    store = place.open()
    fill(store)
    store.close()
    df = reader(spark, place).where("stream in ('s0', 's2') and offset >= 100 and offset < 110")
    assert sorted((r.stream, r.offset) for r in df.collect()) == [
        (s, o) for s in ("s0", "s2") for o in range(100, 110)]
    plan = df._jdf.queryExecution().executedPlan().toString()
    assert not re.search(r"(^|[\s)])Filter ", plan), plan  # applied exactly by the source, not again by Spark
    assert reader(spark, place, streams="s1").count() == 400


def test_a_timestamp_filter_skips_older_blocks_and_returns_exactly_the_newer_rows(spark: Any,
                                                                                      tmp_path: Path) -> None:
    place = Place(tmp_path / "d", str(tmp_path / "objects"))
    store = place.open()
    s = store.create_stream("t")
    base_ms = 1_700_000_000_000
    for block in range(4):  # four blocks, each 100 records a second newer than the last
        s.append([NewRecord(b"v", timestamp_ms=base_ms + 1000 * block + j) for j in range(100)]).result()
        store.flush()
    store.close()
    df = reader(spark, place, rowsPerPartition="100")
    assert df.rdd.getNumPartitions() == 4
    newer = df.where(f"timestamp >= timestamp_millis({base_ms + 2050})")
    assert newer.rdd.getNumPartitions() == 2, "blocks older than the bound were planned"
    assert sorted(r.offset for r in newer.collect()) == list(range(250, 400))


def test_batch_write_appends_with_dense_offsets(spark: Any, place: Place) -> None:
    store = place.open()
    fill(store, streams=1, records=100)
    store.close()
    rows = [(f"s{i % 3}", b"w%d" % i, b"key" if i % 2 else None) for i in range(900)]
    df = spark.createDataFrame(rows, "stream string, value binary, key binary").repartition(3)
    df.write.format("stratalog").option("path", place.uri).option("data_dir", str(place.data_dir)) \
        .mode("append").save()
    back = reader(spark, place).collect()
    by_stream: dict[str, list[Any]] = {}
    for r in back:
        by_stream.setdefault(r.stream, []).append(r)
    assert sorted(r.offset for r in by_stream["s0"]) == list(range(400))
    assert sorted(r.offset for r in by_stream["s1"]) == list(range(300))
    assert sorted(r.offset for r in by_stream["s2"]) == list(range(300))
    written = sorted((r.stream, r.value, r.key) for r in back if r.value.startswith(b"w"))
    assert written == sorted(rows)
    assert not list(place.objects().list(STAGING_PREFIX))
    store = place.open()  # the store of record agrees after a reopen
    assert store.open_stream("s0").end_offset == 400
    assert len(store.open_stream("s2").fetch(0, max_bytes=1 << 30)) == 300
    store.close()


def test_failed_write_commits_nothing_and_leaves_no_staged_objects(spark: Any, place: Place) -> None:
    from pyspark.sql.functions import udf

    store = place.open()
    fill(store, streams=1, records=50)
    store.close()

    @udf("binary", useArrow=False)
    def boom(value: bytes) -> bytes:
        if value == b"bad":
            raise ValueError("this row fails its task")
        return value

    rows = [("s0", b"ok%d" % i) for i in range(100)] + [("s0", b"bad")]
    df = spark.createDataFrame(rows, "stream string, value binary").repartition(4)
    with pytest.raises(Exception, match="this row fails its task"):
        df.select("stream", boom("value").alias("value")).write.format("stratalog") \
            .option("path", place.uri).option("data_dir", str(place.data_dir)).mode("append").save()
    assert not list(place.objects().list(STAGING_PREFIX))
    assert reader(spark, place).count() == 50


def test_streaming_read_restarts_from_its_checkpoint(spark: Any, place: Place, tmp_path: Path) -> None:
    store = place.open()
    fill(store, streams=3, records=100)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def run() -> int:
        query = (spark.readStream.format("stratalog").option("path", place.uri)
                 .option("maxRowsPerTrigger", "120").load()
                 .writeStream.format("parquet").option("path", str(out))
                 .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
        query.awaitTermination()
        return len([p for p in (checkpoint / "commits").iterdir() if not p.name.startswith(".")])

    assert run() == 3  # 300 rows at 120 per trigger
    for n in range(3):
        store.open_stream(f"s{n}").append([b"new-%d" % n] * 7).result()
    store.flush()
    assert run() == 4
    store.close()
    rows = spark.read.parquet(str(out)).collect()
    assert len(rows) == 321
    assert len({(r.stream, r.offset) for r in rows}) == 321
    assert sorted(r.value for r in rows if r.value.startswith(b"new")) == sorted(
        [b"new-0"] * 7 + [b"new-1"] * 7 + [b"new-2"] * 7)


def test_streaming_write_skips_a_replayed_batch(spark: Any, place: Place, tmp_path: Path) -> None:
    store = place.open()
    store.create_stream("events")
    store.close()
    source, checkpoint = tmp_path / "source", tmp_path / "checkpoint"
    for i in range(3):
        spark.createDataFrame([("events", b"f%d-%d" % (i, j)) for j in range(10)], "stream string, value binary") \
            .coalesce(1).write.mode("append").parquet(str(source))

    def run() -> None:
        query = (spark.readStream.schema("stream string, value binary").option("maxFilesPerTrigger", "1")
                 .parquet(str(source)).writeStream.format("stratalog").option("path", place.uri)
                 .option("data_dir", str(place.data_dir)).option("sinkId", "copy")
                 .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
        query.awaitTermination()

    run()
    assert reader(spark, place).count() == 30
    # Forget that the last batch committed: Spark replays it on restart, and the sink must skip it.
    last = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    (checkpoint / "commits" / str(last)).unlink()
    (checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)
    run()
    assert (checkpoint / "commits" / str(last)).exists()
    assert reader(spark, place).count() == 30
    store = place.open()
    assert store.metadata.get_meta(SINK_MARKER_PREFIX + "copy") == last
    assert store.open_stream("events").end_offset == 30
    store.close()


def test_headers_read_and_write_back(spark: Any, tmp_path: Path) -> None:
    from pyspark.sql.functions import lit

    place = Place(tmp_path / "d", str(tmp_path / "objects"))
    store = place.open()
    s = store.create_stream("in")
    s.append([NewRecord(b"v%d" % i, headers=[("trace", b"t%d" % i), ("none", None)] if i % 2 else ())
              for i in range(10)]).result()
    store.flush()
    store.close()
    df = reader(spark, place, includeHeaders="true")
    assert [f.name for f in df.schema.fields][-1] == "headers"
    df.withColumn("stream", lit("copy")).write.format("stratalog").option("path", place.uri) \
        .option("data_dir", str(place.data_dir)).mode("append").save()
    back = {r.offset: [(h.key, h.value) for h in r.headers]
            for r in reader(spark, place, includeHeaders="true", streams="copy").collect()}
    assert back == {i: [("trace", b"t%d" % i), ("none", None)] if i % 2 else [] for i in range(10)}


# Transactions: a broker's data directory at rest (spark/rest_txns.py) ---------------------------------

#: Uploads every 0.3 s; the producers' snapshot taken at the stop only, so that after a kill -9 the objects
#: hold what was written after it (the replay's case).
BROKER_TOML = ("producer_snapshot_interval_ms = 3600000\n"
               "[store]\nupload_interval_s = 0.3\nfree_bytes_min = 0\nfree_percent_min = 0.0\n")


def uploaded_all(data_dir: Path, bootstrap: str, topic: str) -> bool:
    """Whether the objects hold every offset of ``topic``'s two partitions."""
    view = BrokerView(bootstrap, {})
    try:
        ends = {f"{t}/{p}": e.end for (t, p), e in view.ends([(topic, 0), (topic, 1)]).items()}
    finally:
        view.close()
    try:
        streams = read_manifest(LocalDirStore(data_dir / LOCAL_DIR_NAME)).streams.values()
    except ManifestError:
        return False
    return {s.name: s.end_offset for s in streams if s.name in ends} == ends


def micro_batch(path: str) -> list[bytes]:
    """A streaming query's first micro-batch at rest, everything available, its tasks run here."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    reader = StratalogStreamReader({"path": path})
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    return sorted(v for part in reader.partitions(start, end) for batch in reader.read(part)
                  for v in batch.column("value").to_pylist())


def test_a_data_directory_at_rest_reads_committed_after_a_stop_and_after_a_kill(spark: Any, tmp_path: Path) -> None:
    """A broker stopped with a transaction open: a read at rest returns the committed records and stops at
    it. Restarted, the open transaction aborted by its producer's return, more transactions, one left open,
    uploaded, and killed: the snapshot is the stop's, and the read replays what follows it from objects."""
    data = tmp_path / "data"
    config = tmp_path / "broker.toml"
    config.write_text(BROKER_TOML)

    def read(path: Path, **options: str) -> list[bytes]:
        return values_of(spark.read.format("stratalog").option("path", str(path)).option("streams", "ledger/0,ledger/1")
                         .options(**options).load())

    with running_broker(data, "--config", str(config)) as broker:
        create_topic(broker.bootstrap, "ledger", 2)
        txns = Transactions(broker.bootstrap, "ledger")
        txns.round((True, False))
        txns.round((False, True))
        txns.txn[0].begin_transaction()
        for partition in (0, 1):
            txns.send(txns.txn[0], b"open-%d" % partition, partition)
            txns.send(txns.plain, b"late-%d" % partition, partition)
        assert broker.stop() == 0
    committed, aborted = list(txns.committed), list(txns.aborted)
    del txns   # its producers: the next broker's transactions are another's
    everything = sorted([*committed, *aborted, b"open-0", b"open-1", b"late-0", b"late-1"])
    assert read(data) == sorted(committed), "the open transaction holds the read back"
    assert read(data, isolationLevel="read_uncommitted") == everything
    assert micro_batch(str(data)) == sorted(committed)
    alone = StratalogReader({"path": str(data / LOCAL_DIR_NAME)})   # its tasks, run here: one fails as Spark's would
    with pytest.raises(TransactionsUnknownError, match="isolationLevel=read_uncommitted"):
        [batch for part in alone.partitions() for batch in alone.read(part)]
    assert read(data / LOCAL_DIR_NAME, isolationLevel="read_uncommitted") == everything

    with running_broker(data, "--config", str(config)) as broker:
        again = Transactions(broker.bootstrap, "ledger")   # the same ids: the open transaction is aborted
        again.round((True, False))
        again.txn[1].begin_transaction()
        for partition in (0, 1):
            again.send(again.txn[1], b"open2-%d" % partition, partition)
            again.send(again.plain, b"late2-%d" % partition, partition)
        wait_until(lambda: uploaded_all(data, broker.bootstrap, "ledger"), "everything to be uploaded")
        broker.kill9()
    committed += [b"late-0", b"late-1", *again.committed]
    assert read(data) == sorted(committed), "transactions after the snapshot: replayed from objects"
    report = materialize(spark, str(data), ["ledger"])
    objects = LocalDirStore(data / LOCAL_DIR_NAME)
    assert sorted(v for f in read_table_manifest(objects, "ledger").files for batch in read_table_file(objects, f.key)
                  for v in batch.column("value").to_pylist()) == sorted(committed)
    assert report.rows == len(committed)
