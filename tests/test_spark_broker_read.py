"""Spark reads a running broker: uploaded records from objects, the acknowledged tail from the broker."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from brokerkit import BrokerProcess, running_broker
from stratalog.engine.manifest import ManifestError, read_manifest
from stratalog.objects.local import LocalDirStore
from stratalog.objects.uri import LOCAL_DIR_NAME
from stratalog.spark.broker_source import BrokerBatchReader
from stratalog.spark.kafka_client import BrokerView
from stratalog.spark.location import locate
from waiting import wait_until

pytestmark = pytest.mark.slow

Row = tuple[str, int, bytes | None, bytes]


def broker_config(tmp_path: Path, upload_interval_s: float) -> Path:
    path = tmp_path / "broker.toml"
    path.write_text(f"[store]\nupload_interval_s = {upload_interval_s}\n")
    return path


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions)]).values():
        future.result(30)


def produce(bootstrap: str, topic: str, partitions: int, first: int, count: int) -> list[Row]:
    """Produce ``count`` records round-robin over the partitions, acks=all; the acknowledged rows."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "enable.idempotence": True})
    acked: list[Row] = []

    def delivered(error: Any, message: Any) -> None:
        assert error is None, error
        acked.append((f"{topic}/{message.partition()}", message.offset(), message.key(), message.value()))

    for i in range(first, first + count):
        key = None if i % 7 == 0 else b"k%d" % i
        producer.produce(topic, value=b"v%d" % i, key=key, partition=i % partitions, on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(30) == 0
    assert len(acked) == count
    return acked


def uploaded(broker: BrokerProcess) -> int:
    """Records of all streams in the broker's published manifest."""
    try:
        manifest = read_manifest(LocalDirStore(broker.data_dir / LOCAL_DIR_NAME))
    except ManifestError:  # not published yet
        return 0
    return sum(s.end_offset - s.start_offset for s in manifest.streams.values())


def rows_of(df: Any) -> list[Row]:
    return sorted((r.stream, r.offset, r.key, r.value) for r in df.collect())


def test_batch_read_of_a_live_broker_returns_every_acknowledged_record(spark: Any, tmp_path: Path) -> None:
    with running_broker(tmp_path / "data", "--config", str(broker_config(tmp_path, 2.0))) as broker:
        create_topic(broker.bootstrap, "clicks", 3)
        acked = produce(broker.bootstrap, "clicks", 3, 0, 3000)
        wait_until(lambda: uploaded(broker) >= 3000, "the first records to be uploaded")
        acked += produce(broker.bootstrap, "clicks", 3, 3000, 2000)

        view = BrokerView(broker.bootstrap, {})
        assert view.object_store_uri() == (broker.data_dir / LOCAL_DIR_NAME).absolute().as_uri()
        # The uploader may take the new records at any moment; planned right after producing, they are
        # nearly always still in the tail. Produce a little more until a plan shows both kinds of read.
        for attempt in range(20):
            planned = BrokerBatchReader(locate({"path": f"kafka://{broker.bootstrap}"}), {}).partitions()
            if {type(p.value).__name__ for p in planned} == {"ObjectsPartition", "TailPartition"}:
                break
            acked += produce(broker.bootstrap, "clicks", 3, 5000 + 10 * attempt, 10)
        else:
            raise AssertionError("no plan read both from objects and from the broker")
        acked.sort()

        reader = spark.read.format("stratalog").option("path", f"kafka://{broker.bootstrap}")
        assert rows_of(reader.load()) == acked
        assert rows_of(reader.option("coldReads", "broker").load()) == acked, "everything through Kafka Fetch"
        narrowed = reader.load().where("stream = 'clicks/1' AND offset >= 100 AND offset < 1200")
        assert rows_of(narrowed) == [r for r in acked if r[0] == "clicks/1" and 100 <= r[1] < 1200]
        assert reader.load().where("offset >= 1000000").count() == 0, "an empty plan reads nothing"
        assert broker.stop() == 0
