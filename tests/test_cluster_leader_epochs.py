"""Leader epochs across a failover (KIP-320), in a cluster of two brokers over PostgreSQL and SeaweedFS: the
broker that takes a dead one's partition records where its epoch begins; OffsetForLeaderEpoch then answers
where the dead leader's epoch ended, a client still at the old epoch is fenced (and told the new leader),
every batch carries the epoch of the leader that appended it, and consumers that read across the failover
(librdkafka's and kafka-python's, which both validate their positions when the epoch changes) read every
record once."""

from __future__ import annotations

import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode

from brokerkit import metrics_address, scrape_metrics
from clusterkit import produce_batch, running_cluster, tails
from conftest import SeaweedS3
from stratalog.chaos import cluster_probe
from stratalog.chaos.cluster_process import CLUSTER_TOML, BrokerCluster
from stratalog.kafka.api_keys import ApiKey
from stratalog.kafka.build import build
from stratalog.kafka.client import KafkaConnection
from stratalog.kafka.codec import load_request_schema
from stratalog.kafka.records import encode_batch
from waiting import wait_until

pytest_plugins = ["pgkit"]

TOPIC, PARTITIONS, BEFORE, AFTER = "epochs", 2, 5, 4
#: Generous for a loaded machine: the lease (3 s) and a reconcile make a failover here.
FAILOVER_S_MAX = 60.0


def produce(connection: KafkaConnection, partition: int, values: list[bytes]) -> None:
    for value in values:   # a batch each: each carries the epoch it was appended at
        error, _ = produce_batch(connection, TOPIC, partition, encode_batch([(None, value, (), 0)], base_offset=0))
        assert error == 0


def end_offsets(connection: KafkaConnection, partition: int, current: int, asked: int) -> tuple[int, int, int]:
    """OffsetForLeaderEpoch v4 of one partition: (error code, leader epoch, end offset)."""
    response = connection.call(ApiKey.OFFSET_FOR_LEADER_EPOCH, 4, build(
        load_request_schema(ApiKey.OFFSET_FOR_LEADER_EPOCH, 4), {"replica_id": -1, "topics": [
            {"topic": TOPIC, "partitions": [{"partition": partition, "current_leader_epoch": current,
                                             "leader_epoch": asked}]}]}))
    p = response.topics[0].partitions[0]
    return int(p.error_code), int(p.leader_epoch), int(p.end_offset)


def fetched(connection: KafkaConnection, partition: int, current: int) -> Any:
    """Fetch v16 of the whole partition at the client's ``current`` leader epoch: the response."""
    return connection.call(ApiKey.FETCH, 16, build(load_request_schema(ApiKey.FETCH, 16), {
        "max_wait": 0, "min_bytes": 0, "forgotten_topics_data": [], "topics": [
            {"topic_id": topic_id(connection), "partitions": [
                {"partition": partition, "current_leader_epoch": current, "fetch_offset": 0,
                 "partition_max_bytes": 1 << 20}]}]}))


def topic_id(connection: KafkaConnection) -> Any:
    response = connection.call(ApiKey.METADATA, 12, build(load_request_schema(ApiKey.METADATA, 12), {
        "topics": [{"name": TOPIC, "topic_id": None}], "allow_auto_topic_creation": False,
        "include_topic_authorized_operations": False}))
    return response.topics[0].topic_id


def batch_epochs(records: bytes) -> list[int]:
    """The partitionLeaderEpoch of each batch of a Fetch's records."""
    epochs, at = [], 0
    while at < len(records):
        length, epoch = struct.unpack_from(">ii", records, at + 8)
        epochs.append(epoch)
        at += 12 + length
    return epochs


class LibrdkafkaReader:
    """A librdkafka consumer assigned the partition, polling in a thread of its own across the failover."""

    def __init__(self, bootstrap: str, partition: int) -> None:
        self.got: list[tuple[int, bytes]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(bootstrap, partition), daemon=True)
        self._thread.start()

    def _run(self, bootstrap: str, partition: int) -> None:
        consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "unused",
                                             "enable.auto.commit": False, "fetch.wait.max.ms": 100,
                                             "topic.metadata.refresh.interval.ms": 1000})
        consumer.assign([confluent_kafka.TopicPartition(TOPIC, partition, 0)])
        try:
            while not self._stop.is_set():
                self.got += [(m.offset(), m.value()) for m in consumer.consume(10, timeout=0.2) if m.error() is None]
        finally:
            consumer.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


#: kafka-python's consumer, in a process of its own: reconnecting to the killed broker, it drops the
#: sockets of refused attempts unclosed, and their ResourceWarnings would fail the test's process at some
#: later garbage collection. It prints each record as "offset value" and stops once it has read ``count``.
KAFKA_PYTHON_READER = """
import sys, warnings
warnings.simplefilter("ignore")
from kafka import KafkaConsumer, TopicPartition
bootstrap, topic, partition, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
consumer = KafkaConsumer(bootstrap_servers=bootstrap.split(","), enable_auto_commit=False, fetch_max_wait_ms=100,
                         metadata_max_age_ms=1000)
consumer.assign([TopicPartition(topic, partition)])
consumer.seek(TopicPartition(topic, partition), 0)
read = 0
while read < count:
    for records in consumer.poll(timeout_ms=200).values():
        for r in records:
            print(r.offset, r.value.decode(), flush=True)
            read += 1
consumer.close()
"""


@contextmanager
def kafka_python_reader(bootstrap: str, partition: int, count: int) -> Iterator[list[tuple[int, bytes]]]:
    """The records (offset, value) kafka-python's consumer read so far, growing as it reads."""
    reader = subprocess.Popen([sys.executable, "-c", KAFKA_PYTHON_READER, bootstrap, TOPIC, str(partition),
                               str(count)], stdout=subprocess.PIPE, text=True)
    got: list[tuple[int, bytes]] = []

    def pump() -> None:
        assert reader.stdout is not None
        for line in reader.stdout:
            offset, value = line.rstrip("\n").split(" ", 1)
            got.append((int(offset), value.encode()))

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    try:
        yield got
    finally:
        if reader.poll() is None:
            reader.kill()
        reader.wait(timeout=60)
        thread.join(timeout=60)
        assert reader.stdout is not None
        reader.stdout.close()


def epoch_requests(cluster: BrokerCluster, broker_id: int) -> float:
    metrics = scrape_metrics(metrics_address(cluster.brokers[broker_id].output))
    return sum(v for (name, labels), v in metrics.items() if name == "kafka_network_requestmetrics_requests_total"
               and ("request", "OffsetForLeaderEpoch") in labels)


@pytest.mark.slow
def test_after_a_failover_the_old_epoch_ends_where_the_new_one_began(tmp_path: Path, pg_database: str,
                                                                      seaweedfs: SeaweedS3) -> None:
    config = 'metrics_listen = "127.0.0.1:0"\n' + CLUSTER_TOML
    with running_cluster(tmp_path, pg_database, seaweedfs, 2, config, verbose=True) as cluster:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap(1)})
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(timeout=60)
        before = wait_until(lambda: cluster_probe.served_without(cluster, 1, TOPIC, PARTITIONS), "partitions served")
        partition = min(before)
        victim = before[partition].leader_id
        survivor = next(i for i in cluster.brokers if i != victim)
        old = before[partition].leader_epoch
        values = [b"before %d" % i for i in range(BEFORE)] + [b"after %d" % i for i in range(AFTER)]
        with cluster.connect(victim) as connection:
            produce(connection, partition, values[:BEFORE])
            assert end_offsets(connection, partition, old, old) == (0, old, BEFORE)
        librdkafka = LibrdkafkaReader(cluster.bootstrap(), partition)
        try:
            with kafka_python_reader(cluster.bootstrap(), partition, len(values)) as kafka_python:
                wait_until(lambda: len(librdkafka.got) >= BEFORE and len(kafka_python) >= BEFORE,
                           "both read the first part from the first leader")
                asked_before = epoch_requests(cluster, survivor)
                cluster.brokers[victim].kill9()
                after = wait_until(lambda: cluster_probe.served_without(cluster, survivor, TOPIC, PARTITIONS,
                                                                        frozenset({victim})),
                                   lambda: f"the failover\n{tails(cluster)}", timeout_s=FAILOVER_S_MAX)
                new = after[partition].leader_epoch
                assert after[partition].leader_id == survivor and new > old
                with cluster.connect(survivor) as connection:
                    produce(connection, partition, values[BEFORE:])
                    end = BEFORE + AFTER
                    assert end_offsets(connection, partition, new, old) == (0, old, BEFORE), "the old epoch's end"
                    assert end_offsets(connection, partition, new, new) == (0, new, end)
                    assert end_offsets(connection, partition, -1, old - 1)[2] <= BEFORE
                    assert end_offsets(connection, partition, old, old)[0] == ErrorCode.fenced_leader_epoch
                    assert end_offsets(connection, partition, new + 1, new)[0] == ErrorCode.unknown_leader_epoch
                    fenced = fetched(connection, partition, old)
                    ((answer,),) = [t.partitions for t in fenced.responses]
                    assert answer.error_code == ErrorCode.fenced_leader_epoch
                    assert (answer.current_leader.leader_id, answer.current_leader.leader_epoch) == (survivor, new)
                    assert [e.node_id for e in fenced.node_endpoints] == [survivor], "where the leader listens"
                    ((now,),) = [t.partitions for t in fetched(connection, partition, new).responses]
                    assert now.error_code == 0
                    assert batch_epochs(bytes(now.records)) == [old] * BEFORE + [new] * AFTER
                wait_until(lambda: len(librdkafka.got) >= end and len(kafka_python) >= end,
                           lambda: f"both read across the failover: {librdkafka.got}, {kafka_python}",
                           timeout_s=FAILOVER_S_MAX)
        finally:
            librdkafka.stop()
        assert librdkafka.got == list(enumerate(values)), "librdkafka read every record once, in order"
        assert kafka_python == list(enumerate(values)), "kafka-python read every record once, in order"
        assert epoch_requests(cluster, survivor) > asked_before, "the consumers validated their positions"
