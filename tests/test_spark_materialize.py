"""Topics materialized as Parquet and read back with the tail: the same rows as the data source alone."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from brokerkit import BrokerProcess, running_broker
from stratalog.engine import NewRecord, StreamStore
from stratalog.engine.manifest import ManifestError, read_manifest
from stratalog.objects.local import LocalDirStore
from stratalog.objects.uri import LOCAL_DIR_NAME
from stratalog.spark.jobs import export
from stratalog.spark.kafka_client import BrokerView
from stratalog.spark.materialize import load, materialize, read_table_file
from stratalog.spark.tables import read_table_manifest
from test_spark_broker_read import Transactions, broker_config, create_topic, produce, values_of
from waiting import wait_until

pytestmark = pytest.mark.slow

Row = tuple[str, int, Any, bytes | None, bytes]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker for the module's live tests, each on a topic of its own."""
    tmp = tmp_path_factory.mktemp("materialize")
    with running_broker(tmp / "data", "--config", str(broker_config(tmp, 0.3))) as process:
        yield process
        assert process.stop() == 0


def rows_of(df: Any) -> list[Row]:
    return sorted((r.stream, r.offset, r.timestamp, r.key, r.value) for r in df.collect())


def uploaded(broker: BrokerProcess, topic: str) -> int:
    """Offsets of ``topic``'s partitions in the broker's published manifest."""
    try:
        manifest = read_manifest(LocalDirStore(broker.data_dir / LOCAL_DIR_NAME))
    except ManifestError:  # not published yet
        return 0
    return sum(s.end_offset - s.start_offset for s in manifest.streams.values()
               if (s.name or "").startswith(f"{topic}/"))


def test_materialized_files_plus_the_tail_read_as_the_data_source_does(spark: Any, broker: BrokerProcess,
                                                                        tmp_path: Path) -> None:
    address = f"kafka://{broker.bootstrap}"
    create_topic(broker.bootstrap, "clicks", 2)
    produce(broker.bootstrap, "clicks", 2, 0, 4000)
    wait_until(lambda: uploaded(broker, "clicks") >= 4000, "the records to be uploaded")
    first = materialize(spark, address, ["clicks"])
    assert first.rows == uploaded(broker, "clicks") >= 4000 and first.files_written >= 2
    produce(broker.bootstrap, "clicks", 2, 4000, 1500)  # a tail, uploaded or not

    combined = load(spark, address, ["clicks"])
    assert any(f.endswith(".parquet") for f in combined.inputFiles()), "Spark's Parquet reader is used"
    alone = spark.read.format("stratalog").option("path", address).option("topics", "clicks").load()
    assert rows_of(combined) == rows_of(alone)
    assert len(rows_of(combined)) == 5500

    wait_until(lambda: uploaded(broker, "clicks") >= 5500, "the tail to be uploaded")
    again = materialize(spark, address, ["clicks"])
    assert again.rows == 5500 - first.rows, "only what was uploaded since is written"
    objects = LocalDirStore(broker.data_dir / LOCAL_DIR_NAME)
    table = read_table_manifest(objects, "clicks")
    assert table.ends() == {0: 2750, 1: 2750}

    # A trim in the middle of a file: load leaves out what it trimmed; a later run retires files below.
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.delete_records([TopicPartition("clicks", 0, 1000)])[TopicPartition("clicks", 0, 1000)].result(30)
    trimmed = rows_of(load(spark, address, ["clicks"]))
    assert trimmed == rows_of(spark.read.format("stratalog").option("path", address).option("topics", "clicks").load())
    assert min(r[1] for r in trimmed if r[0] == "clicks/0") == 1000

    exported = export(spark, address, str(tmp_path / "export"), streams="clicks/0,clicks/1")  # a live broker too
    assert exported.rows == len(trimmed) == spark.read.parquet(str(tmp_path / "export")).count()


def test_materialize_writes_committed_records_and_stops_at_the_last_stable_offset(spark: Any,
                                                                                 broker: BrokerProcess) -> None:
    """Transactions committed and aborted, then one left open with a plain record after it in each
    partition: a first run writes the committed records below the open transaction; once it commits, a
    second run writes exactly its records and the plain ones after it; load returns each committed record
    once and no aborted one."""
    address = f"kafka://{broker.bootstrap}"
    create_topic(broker.bootstrap, "ledger", 2)
    txns = Transactions(broker.bootstrap, "ledger")
    for commits in ((True, False), (False, True), (False, False)):
        txns.round(commits)
    opener = txns.txn[0]
    opener.begin_transaction()
    for partition in (0, 1):
        txns.send(opener, b"open-%d" % partition, partition)
        txns.send(txns.plain, b"late-%d" % partition, partition)
    view = BrokerView(broker.bootstrap, {})
    partitions = [("ledger", 0), ("ledger", 1)]

    def table_values() -> list[bytes]:
        objects = LocalDirStore(broker.data_dir / LOCAL_DIR_NAME)
        return sorted(v for f in read_table_manifest(objects, "ledger").files
                      for batch in read_table_file(objects, f.key) for v in batch.column("value").to_pylist())

    def table_ends() -> dict[int, int]:
        return read_table_manifest(LocalDirStore(broker.data_dir / LOCAL_DIR_NAME), "ledger").ends()

    highs = {p: e.end for (_, p), e in view.ends(partitions).items()}   # the open transaction's records too
    wait_until(lambda: uploaded(broker, "ledger") >= sum(highs.values()), "the transactions to be uploaded")
    stable = {p: e.end for (_, p), e in view.ends(partitions, committed=True).items()}
    assert all(stable[p] < highs[p] for p in highs), (stable, highs)
    first = materialize(spark, address, ["ledger"])
    assert table_ends() == stable, "never past a partition's last stable offset"
    assert table_values() == sorted(txns.committed) and first.rows == len(txns.committed)
    assert values_of(load(spark, address, ["ledger"])) == sorted(txns.committed)

    opener.commit_transaction(30)
    now_committed = [b"open-0", b"open-1", b"late-0", b"late-1"]
    ends = {p: e.end for (_, p), e in view.ends(partitions).items()}
    wait_until(lambda: uploaded(broker, "ledger") >= sum(ends.values()), "the commit to be uploaded")
    second = materialize(spark, address, ["ledger"])
    assert second.rows == len(now_committed), "exactly the records that committed since"
    assert table_ends() == ends
    everything = sorted([*txns.committed, *now_committed])
    assert table_values() == everything
    assert values_of(load(spark, address, ["ledger"])) == everything, "each committed record once, none aborted"
    with pytest.raises(ValueError, match="committed records only"):
        load(spark, address, ["ledger"], isolationLevel="read_uncommitted")
    view.close()


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
