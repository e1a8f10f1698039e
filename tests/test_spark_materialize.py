"""Topics materialized as Parquet and read back with the tail: the same rows as the data source alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from brokerkit import running_broker
from stratalog.engine import NewRecord, StreamStore
from stratalog.objects.local import LocalDirStore
from stratalog.objects.uri import LOCAL_DIR_NAME
from stratalog.spark.jobs import export
from stratalog.spark.materialize import load, materialize
from stratalog.spark.tables import read_table_manifest
from test_spark_broker_read import broker_config, create_topic, produce, uploaded
from waiting import wait_until

pytestmark = pytest.mark.slow

Row = tuple[str, int, Any, bytes | None, bytes]


def rows_of(df: Any) -> list[Row]:
    return sorted((r.stream, r.offset, r.timestamp, r.key, r.value) for r in df.collect())


def test_materialized_files_plus_the_tail_read_as_the_data_source_does(spark: Any, tmp_path: Path) -> None:
    with running_broker(tmp_path / "data", "--config", str(broker_config(tmp_path, 0.3))) as broker:
        address = f"kafka://{broker.bootstrap}"
        create_topic(broker.bootstrap, "clicks", 2)
        produce(broker.bootstrap, "clicks", 2, 0, 4000)
        wait_until(lambda: uploaded(broker) >= 4000, "the records to be uploaded")
        first = materialize(spark, address)
        assert first.rows == uploaded(broker) >= 4000 and first.files_written >= 2
        produce(broker.bootstrap, "clicks", 2, 4000, 1500)  # a tail, uploaded or not

        combined = load(spark, address)
        assert any(f.endswith(".parquet") for f in combined.inputFiles()), "Spark's Parquet reader is used"
        alone = spark.read.format("stratalog").option("path", address).load()
        assert rows_of(combined) == rows_of(alone)
        assert len(rows_of(combined)) == 5500

        wait_until(lambda: uploaded(broker) >= 5500, "the tail to be uploaded")
        again = materialize(spark, address)
        assert again.rows == 5500 - first.rows, "only what was uploaded since is written"
        objects = LocalDirStore(broker.data_dir / LOCAL_DIR_NAME)
        table = read_table_manifest(objects, "clicks")
        assert table.ends() == {0: 2750, 1: 2750}

        # A trim in the middle of a file: load leaves out what it trimmed; a later run retires files below.
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.delete_records([TopicPartition("clicks", 0, 1000)])[TopicPartition("clicks", 0, 1000)].result(30)
        trimmed = rows_of(load(spark, address))
        assert trimmed == rows_of(spark.read.format("stratalog").option("path", address).load())
        assert min(r[1] for r in trimmed if r[0] == "clicks/0") == 1000

        exported = export(spark, address, str(tmp_path / "export"))  # the export job reads a live broker too
        assert exported.rows == len(trimmed) == spark.read.parquet(str(tmp_path / "export")).count()
        assert broker.stop() == 0


def test_a_store_at_rest_is_materialized_from_its_data_directory(spark: Any, tmp_path: Path) -> None:
    store = StreamStore.open(tmp_path / "d")
    for p in range(3):
        store.create_stream(f"t/{p}").append([NewRecord(b"v%d-%d" % (p, i), key=b"k") for i in range(700)]).result()
    store.flush()
    store.close()
    path = str(tmp_path / "d")
    report = materialize(spark, path, ["t"], file_rows_max=300)
    assert (report.files_written, report.rows) == (3, 2100)  # files split only at block boundaries
    combined = load(spark, path, ["t"], includeHeaders="true")
    assert combined.columns == ["stream", "offset", "timestamp", "key", "value", "headers"]
    alone = spark.read.format("stratalog").option("path", path).option("includeHeaders", "true").load()
    assert sorted(combined.collect()) == sorted(alone.collect())
    assert alone.where("offset > 100000").count() == 0, "a read whose filters leave nothing to read"
    assert materialize(spark, path, ["t"]).files_written == 0, "nothing new, nothing written"
