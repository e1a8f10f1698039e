"""Spark writes into a running broker: staged objects committed by the broker, beside live producers."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from brokerkit import running_broker
from stratalog.engine.manifest import ManifestError, read_manifest
from stratalog.engine.staging import STAGING_PREFIX
from stratalog.kafka.partitioner import partition_for_key
from stratalog.objects.local import LocalDirStore
from stratalog.objects.uri import LOCAL_DIR_NAME
from stratalog.records import NewRecord
from stratalog.spark.broker_write import BrokerWriteError, commit_through_broker, replace_through_broker
from stratalog.spark.jobs import compact_live
from stratalog.spark.write import StagingWriter
from waiting import wait_until

pytestmark = pytest.mark.slow


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept until the answer: dropping it cancels the call
    admin.create_topics([NewTopic(name, partitions)])[name].result(30)


def test_batch_write_lands_beside_a_live_producer_with_dense_offsets(spark: Any, tmp_path: Path) -> None:
    with running_broker(tmp_path / "data") as broker:
        create_topic(broker.bootstrap, "orders", 3)
        produced: list[tuple[int, bytes]] = []
        producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 2})

        def produce() -> None:
            for i in range(3000):
                producer.produce("orders", value=b"p%d" % i, partition=i % 3,
                                 on_delivery=lambda e, m: produced.append((m.partition(), m.value())))
                if i % 100 == 0:
                    producer.poll(0)
            producer.flush(30)

        thread = threading.Thread(target=produce)
        thread.start()
        rows = [(f"k{i % 50}", f"s{i}") for i in range(5000)]
        spark.createDataFrame(rows, "key string, value string").repartition(4).write.format("stratalog") \
            .option("path", f"kafka://{broker.bootstrap}").option("topic", "orders").mode("append").save()
        thread.join(60)
        assert len(produced) == 3000
        read = spark.read.format("stratalog").option("path", f"kafka://{broker.bootstrap}").load().collect()
        assert broker.stop() == 0
    by_partition: dict[str, list[int]] = {}
    for r in read:
        by_partition.setdefault(r.stream, []).append(r.offset)
    assert {s: sorted(o) for s, o in by_partition.items()} == {s: list(range(len(o))) for s, o in by_partition.items()}
    values = sorted(r.value for r in read)
    assert values == sorted([v for _, v in produced] + [v.encode() for _, v in rows]), "each record once"
    for r in read:
        if r.value.startswith(b"s"):  # keyed rows go where Kafka's default partitioner puts them
            assert r.stream == f"orders/{partition_for_key(r.key, 3)}"


def test_a_micro_batch_is_committed_once_however_often_it_is_sent(tmp_path: Path) -> None:
    with running_broker(tmp_path / "data") as broker:
        create_topic(broker.bootstrap, "t", 1)
        objects = LocalDirStore(broker.data_dir / LOCAL_DIR_NAME)

        def stage(n: int) -> list[tuple[int, Any]]:
            writer = StagingWriter(objects, f"{STAGING_PREFIX}w{n}/000000-")
            writer.add("t/0", [NewRecord(b"x%d" % i) for i in range(10)])
            return [(0, writer.finish())]

        first = commit_through_broker(broker.bootstrap, {}, stage(1), ("sink", 7))
        replay = commit_through_broker(broker.bootstrap, {}, stage(2), ("sink", 7))
        older = commit_through_broker(broker.bootstrap, {}, stage(3), ("sink", 6))
        assert (first.committed, first.records) == (True, 10)
        assert (replay.committed, replay.records, older.committed) == (False, 0, False)
        assert list(objects.list(STAGING_PREFIX)) == [], "staged objects of skipped commits are deleted"
        [(_, [staged])] = stage(4)
        elsewhere = replace(staged, streams=tuple(replace(st, name="t/3") for st in staged.streams))
        with pytest.raises(BrokerWriteError, match="no partition 3 of topic 't'"):
            commit_through_broker(broker.bootstrap, {}, [(0, [elsewhere])], None)
        not_staged = replace(staged, key="manifest/00000000000000000001.snapshot.json")
        with pytest.raises(BrokerWriteError, match="staged objects lie under"):
            commit_through_broker(broker.bootstrap, {}, [(0, [not_staged])], None)
        assert broker.stop() == 0
    # A micro-batch without rows stages nothing: there is nothing to commit, and no broker is asked.
    empty = commit_through_broker("127.0.0.1:1", {}, [(0, []), (1, [])], ("sink", 8))
    assert (empty.committed, empty.records, empty.objects) == (True, 0, 0)


def test_compaction_beside_a_live_broker_swaps_objects_while_producers_write(spark: Any, tmp_path: Path) -> None:
    config = tmp_path / "broker.toml"
    config.write_text("[store]\nupload_interval_s = 0.2\n")
    with running_broker(tmp_path / "data", "--config", str(config)) as broker:
        address = f"kafka://{broker.bootstrap}"
        acked: list[tuple[str, int, bytes]] = []
        producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 2})

        def produce(first: int, count: int) -> None:
            for i in range(first, first + count):
                producer.produce(f"topic-{i % 5}", value=b"v%d" % i, on_delivery=lambda e, m: acked.append(
                    (f"{m.topic()}/{m.partition()}", m.offset(), m.value())))
            producer.flush(30)

        objects = LocalDirStore(broker.data_dir / LOCAL_DIR_NAME)
        for n in range(3):  # three uploads, each an object holding all five topics
            produce(500 * n, 500)
            wait_until(lambda n=n: len(uploaded_objects(objects)) > n, f"upload {n + 1}")
        before = uploaded_objects(objects)
        during = threading.Thread(target=produce, args=(1500, 2000))
        during.start()
        report = compact_live(spark, address)
        during.join(60)
        assert report.objects_replaced >= 3 and report.objects_written >= 5
        read = spark.read.format("stratalog").option("path", address).load().collect()
        assert sorted((r.stream, r.offset, r.value) for r in read) == sorted(acked)
        with pytest.raises(BrokerWriteError, match="no longer in the store"):
            replace_through_broker(broker.bootstrap, {}, sorted(before), [(f"{STAGING_PREFIX}x/0.slo", 10)])
        assert broker.stop() == 0


def uploaded_objects(objects: LocalDirStore) -> set[str]:
    """Keys of the multi-stream objects the store's published manifest names."""
    try:
        manifest = read_manifest(objects)
    except ManifestError:
        return set()
    streams_of: dict[str, set[int]] = {}
    for stream_id, refs in manifest.blocks.items():
        for ref in refs:
            streams_of.setdefault(ref.key, set()).add(stream_id)
    return {key for key, streams in streams_of.items() if len(streams) > 1}
