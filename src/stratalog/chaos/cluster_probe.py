"""Raw requests that ask one broker of a cluster what it says (librdkafka hides which broker answered
what): its Metadata of a topic, and whether a partition's leader answers for it. A failover is over when
every partition has a live leader that answers ListOffsets for it."""

from __future__ import annotations

from dataclasses import dataclass

from kio.schema.list_offsets.v1.request import ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic
from kio.schema.metadata.v9.request import MetadataRequest, MetadataRequestTopic
from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import i32, i64

from stratalog.chaos.cluster_process import BrokerCluster
from stratalog.kafka.client import BrokerConnectionError, KafkaConnection

LIST_OFFSETS, METADATA = 2, 3
NONE = 0


@dataclass(frozen=True, slots=True)
class PartitionView:
    """What one broker's Metadata says of a partition."""

    error_code: int
    leader_id: int
    leader_epoch: int


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


def served_without(cluster: BrokerCluster, via: int, topic: str, partitions: int,
                   dead: frozenset[int] = frozenset()) -> dict[int, PartitionView] | None:
    """Each partition's leader, once every partition has a live one (none of ``dead``) that answers for
    it; None before (a broker that does not answer yet counts as not serving)."""
    try:
        with cluster.connect(via) as connection:
            view = metadata(connection, topic)[1]
        if len(view) != partitions or any(v.error_code or v.leader_id == -1 or v.leader_id in dead
                                          for v in view.values()):
            return None
        for partition, v in view.items():
            with cluster.connect(v.leader_id) as connection:
                if list_offsets_error(connection, topic, partition) != NONE:
                    return None
    except (OSError, BrokerConnectionError, KeyError):
        return None
    return view
