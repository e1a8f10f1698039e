"""Several `stratalog serve --cluster` brokers for tests: real processes on 127.0.0.1 over one PostgreSQL
database (pgkit.py) and one SeaweedFS bucket prefix (conftest.py), started and stopped by the test, and a
few raw requests to ask each broker what it says (librdkafka hides which broker answered what)."""

from __future__ import annotations

import datetime
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kio.schema.delete_records.v0.request import DeleteRecordsPartition, DeleteRecordsRequest, DeleteRecordsTopic
from kio.schema.fetch.v4.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.find_coordinator.v2.request import FindCoordinatorRequest
from kio.schema.heartbeat.v1.request import HeartbeatRequest
from kio.schema.list_offsets.v1.request import ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic
from kio.schema.metadata.v9.request import MetadataRequest, MetadataRequestTopic
from kio.schema.produce.v3.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.schema.types import BrokerId, GroupId, TopicName
from kio.static.primitive import i16, i32, i32Timedelta, i64

from brokerkit import BrokerProcess, start_broker
from conftest import SeaweedS3, free_ports
from stratalog.kafka.client import KafkaConnection
from stratalog.kafka.records import encode_batch

PRODUCE, FETCH, LIST_OFFSETS, METADATA, FIND_COORDINATOR, HEARTBEAT, DELETE_RECORDS = 0, 1, 2, 3, 10, 12, 21
NONE, LEADER_NOT_AVAILABLE, NOT_LEADER_OR_FOLLOWER, NOT_COORDINATOR = 0, 5, 6, 16
#: Leases and intervals of the test brokers: the defaults (a 3 s lease), reconciles a little more often.
CLUSTER_TOML = """
[cluster]
lease_ms = 3000
renew_interval_ms = 500
reconcile_interval_ms = 300
"""


def object_store_uri(seaweedfs: SeaweedS3) -> str:
    """A fresh prefix of the session's bucket: this test's cluster alone writes there."""
    return (f"s3://{seaweedfs.bucket}/cluster-{secrets.token_hex(4)}?endpoint={seaweedfs.endpoint_url}"
            f"&region={seaweedfs.region}&access_key={seaweedfs.access_key}&secret_key={seaweedfs.secret_key}")


@dataclass(frozen=True, slots=True)
class PartitionView:
    """What one broker's Metadata says of a partition."""

    error_code: int
    leader_id: int
    leader_epoch: int


@dataclass
class BrokerCluster:
    """Brokers 1..n, each on its own fixed port (a restarted broker comes back where it was)."""

    base: Path
    database: str
    objects: str
    ports: dict[int, int]
    #: The brokers' --config file.
    config_toml: str = CLUSTER_TOML
    brokers: dict[int, BrokerProcess] = field(default_factory=dict)
    #: Every process started, so the test's end stops them all, restarted ones included.
    started: list[BrokerProcess] = field(default_factory=list)

    def start(self, broker_id: int) -> BrokerProcess:
        config = self.base / "broker.toml"
        config.write_text(self.config_toml)
        broker = start_broker(self.base / f"broker-{broker_id}", "--cluster", "--broker-id", str(broker_id),
                              "--metadata", self.database, "--object-store", self.objects, "--config", str(config),
                              port=self.ports[broker_id])
        self.brokers[broker_id] = broker
        self.started.append(broker)
        return broker

    def bootstrap(self, *broker_ids: int) -> str:
        return ",".join(self.brokers[i].bootstrap for i in broker_ids or sorted(self.brokers))

    def connect(self, broker_id: int) -> KafkaConnection:
        return KafkaConnection(self.brokers[broker_id].bootstrap, {}, client_id="cluster-test")

    def stop_all(self) -> None:
        for broker in self.started:
            if broker.process.poll() is None:
                broker.process.kill()
                broker.process.wait(timeout=30)
            broker.close_output()


@contextmanager
def running_cluster(base: Path, database: str, seaweedfs: SeaweedS3, count: int,
                    config_toml: str = CLUSTER_TOML) -> Iterator[BrokerCluster]:
    ports = free_ports(count)
    cluster = BrokerCluster(base, database, object_store_uri(seaweedfs),
                            {i + 1: port for i, port in enumerate(ports)}, config_toml)
    try:
        for broker_id in sorted(cluster.ports):
            cluster.start(broker_id)
        yield cluster
    finally:
        cluster.stop_all()


def metadata(connection: KafkaConnection, topic: str) -> tuple[dict[int, tuple[str, int]], dict[int, PartitionView]]:
    """One broker's Metadata of ``topic``: the brokers it names (id -> host, port) and each partition."""
    response = connection.call(METADATA, 9, MetadataRequest(
        topics=(MetadataRequestTopic(name=TopicName(topic)),), allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False, include_topic_authorized_operations=False))
    brokers = {int(b.node_id): (b.host, int(b.port)) for b in response.brokers}
    partitions = {int(p.partition_index): PartitionView(int(p.error_code), int(p.leader_id), int(p.leader_epoch))
                  for t in response.topics for p in t.partitions}
    return brokers, partitions


def list_offsets_error(connection: KafkaConnection, topic: str, partition: int) -> int:
    response = connection.call(LIST_OFFSETS, 1, ListOffsetsRequest(replica_id=BrokerId(-1), topics=(
        ListOffsetsTopic(name=TopicName(topic), partitions=(
            ListOffsetsPartition(partition_index=i32(partition), timestamp=i64(-1)),)),)))
    return int(response.topics[0].partitions[0].error_code)


def produce_error(connection: KafkaConnection, topic: str, partition: int) -> int:
    batch = encode_batch([(None, b"sent to the wrong broker", (), 0)], base_offset=0)
    response = connection.call(PRODUCE, 3, ProduceRequest(
        acks=i16(-1), timeout=i32Timedelta.parse(datetime.timedelta(seconds=10)), topic_data=(
            TopicProduceData(name=TopicName(topic), partition_data=(
                PartitionProduceData(index=i32(partition), records=batch),)),)))
    return int(response.responses[0].partition_responses[0].error_code)


def fetch_error(connection: KafkaConnection, topic: str, partition: int) -> int:
    response = connection.call(FETCH, 4, FetchRequest(
        max_wait=i32Timedelta.parse(datetime.timedelta(0)), min_bytes=i32(0), topics=(
            FetchTopic(topic=TopicName(topic), partitions=(
                FetchPartition(partition=i32(partition), fetch_offset=i64(0), partition_max_bytes=i32(1 << 20)),)),)))
    return int(response.responses[0].partitions[0].error_code)


def delete_records_error(connection: KafkaConnection, topic: str, partition: int) -> int:
    """DeleteRecords up to offset 0 (deletes nothing where it is allowed)."""
    response = connection.call(DELETE_RECORDS, 0, DeleteRecordsRequest(
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=10)), topics=(
            DeleteRecordsTopic(name=TopicName(topic), partitions=(
                DeleteRecordsPartition(partition_index=i32(partition), offset=i64(0)),)),)))
    return int(response.topics[0].partitions[0].error_code)


def find_coordinator(connection: KafkaConnection, group: str) -> tuple[int, int, str, int]:
    """(error code, node id, host, port) of FindCoordinator for a consumer group."""
    response: Any = connection.call(FIND_COORDINATOR, 2, FindCoordinatorRequest(key=group))
    return int(response.error_code), int(response.node_id), response.host, int(response.port)


def heartbeat_error(connection: KafkaConnection, group: str) -> int:
    response = connection.call(HEARTBEAT, 1, HeartbeatRequest(group_id=GroupId(group), generation_id=i32(1),
                                                              member_id="nobody"))
    return int(response.error_code)
