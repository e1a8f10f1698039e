"""Several `stratalog serve --cluster` brokers for tests (``stratalog.chaos.cluster_process``): real
processes on 127.0.0.1 over one PostgreSQL database (pgkit.py) and one SeaweedFS bucket prefix
(conftest.py), started and stopped by the test, and a few raw requests to ask each broker what it says
(librdkafka hides which broker answered what)."""

from __future__ import annotations

import datetime
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kio.schema.delete_records.v0.request import DeleteRecordsPartition, DeleteRecordsRequest, DeleteRecordsTopic
from kio.schema.fetch.v4.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.find_coordinator.v2.request import FindCoordinatorRequest
from kio.schema.heartbeat.v1.request import HeartbeatRequest
from kio.schema.init_producer_id.v0.request import InitProducerIdRequest
from kio.schema.produce.v3.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.schema.types import GroupId, TopicName
from kio.static.primitive import i16, i32, i32Timedelta, i64

from conftest import SeaweedS3
from stratalog.chaos import cluster_process
from stratalog.chaos.cluster_probe import NONE, PartitionView, list_offsets_error, metadata
from stratalog.chaos.cluster_process import CLUSTER_TOML, BrokerCluster, S3Endpoint
from stratalog.kafka.api_keys import ApiKey
from stratalog.kafka.client import KafkaConnection
from stratalog.kafka.records import HEADER, LOG_OVERHEAD_BYTES, decode_records, encode_batch, split_batches

PRODUCE, FETCH, FIND_COORDINATOR, HEARTBEAT, DELETE_RECORDS = (ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.FIND_COORDINATOR,
                                                      ApiKey.HEARTBEAT, ApiKey.DELETE_RECORDS)
INIT_PRODUCER_ID = ApiKey.INIT_PRODUCER_ID
LEADER_NOT_AVAILABLE, NOT_LEADER_OR_FOLLOWER, NOT_COORDINATOR = 5, 6, 16


def object_store_uri(seaweedfs: SeaweedS3) -> str:
    """A fresh prefix of the session's bucket: this test's cluster alone writes there."""
    return S3Endpoint(seaweedfs.endpoint_url, seaweedfs.access_key, seaweedfs.secret_key, seaweedfs.region,
                      seaweedfs.bucket).uri(f"cluster-{secrets.token_hex(4)}")


@contextmanager
def running_cluster(base: Path, database: str, seaweedfs: SeaweedS3, count: int,
                    config_toml: str = CLUSTER_TOML, *, verbose: bool = False) -> Iterator[BrokerCluster]:
    """``verbose``: the brokers log at info level (gains, handoffs, replays: for a failure's message)."""
    with cluster_process.running_cluster(base, database, object_store_uri(seaweedfs), count, config_toml,
                                         verbose=verbose) as cluster:
        yield cluster


#: The Spark tests' brokers upload every 0.2 s: records reach objects (and the manifest) soon after they are
#: acknowledged, so reads plan them from objects.
SPARK_CLUSTER_TOML = "[store]\nupload_interval_s = 0.2\n" + CLUSTER_TOML


def spark_options(cluster: BrokerCluster, seaweedfs: SeaweedS3) -> dict[str, str]:
    """The Spark data source's options for a cluster: every broker, and S3 credentials (the brokers advertise
    their store without them)."""
    return {"path": f"kafka://{cluster.bootstrap()}", "s3.accessKey": seaweedfs.access_key,
            "s3.secretKey": seaweedfs.secret_key}


def tails(cluster: BrokerCluster, lines: int = 40) -> str:
    """The last lines every broker process printed, restarted ones included (for a failure's message)."""
    return "\n".join(f"--- {b.bootstrap} ({b.process.poll()}):\n" + "".join(b.output[-lines:]) for b in cluster.started)


def stacks(cluster: BrokerCluster) -> str:
    """What every thread and task of each running broker is doing (for a failure's message)."""
    return "\n".join(f"--- stacks of {b.bootstrap}:\n{b.stacks()}" for b in cluster.started
                     if b.process.poll() is None)


def produce_error(connection: KafkaConnection, topic: str, partition: int,
                  value: bytes = b"sent to the wrong broker") -> int:
    """The error code of a Produce (acks=all) of one record holding ``value``."""
    return produce_batch(connection, topic, partition, encode_batch([(None, value, (), 0)], base_offset=0))[0]


def produce_batch(connection: KafkaConnection, topic: str, partition: int, batch: bytes) -> tuple[int, int]:
    """(error code, base offset) of a Produce (acks=all) of one record batch, as a client sends it (an
    idempotent producer's carries its producer id, epoch and base sequence)."""
    response = connection.call(PRODUCE, 3, ProduceRequest(
        acks=i16(-1), timeout=i32Timedelta.parse(datetime.timedelta(seconds=10)), topic_data=(
            TopicProduceData(name=TopicName(topic), partition_data=(
                PartitionProduceData(index=i32(partition), records=batch),)),)))
    answer = response.responses[0].partition_responses[0]
    return int(answer.error_code), int(answer.base_offset)


def init_producer_id(connection: KafkaConnection) -> tuple[int, int]:
    """(producer id, epoch) of a new idempotent producer."""
    response = connection.call(INIT_PRODUCER_ID, 0, InitProducerIdRequest(
        transactional_id=None, transaction_timeout=i32Timedelta.parse(datetime.timedelta(seconds=60))))
    assert int(response.error_code) == NONE, response
    return int(response.producer_id), int(response.producer_epoch)


def partition_log(connection: KafkaConnection, topic: str, partition: int) -> list[tuple[int, str, bytes]]:
    """Every record of a partition the broker leads, read with Fetch from offset 0 to its end: (offset,
    its batch's producer fields as ``"id/epoch/sequence"`` of the record, value). Offsets must follow each
    other: a gap or a repeat raises AssertionError."""
    out: list[tuple[int, str, bytes]] = []
    while True:
        response = connection.call(FETCH, 4, FetchRequest(
            max_wait=i32Timedelta.parse(datetime.timedelta(0)), min_bytes=i32(0), topics=(
                FetchTopic(topic=TopicName(topic), partitions=(
                    FetchPartition(partition=i32(partition), fetch_offset=i64(len(out)),
                                   partition_max_bytes=i32(1 << 20)),)),)))
        answer = response.responses[0].partitions[0]
        assert int(answer.error_code) == NONE, answer
        records = bytes(answer.records or b"")
        before = len(out)
        for position, header in split_batches(records, batch_bytes_max=len(records)) if records else ():
            batch = records[position:position + header.batch_length + LOG_OVERHEAD_BYTES]
            for i, record in enumerate(decode_records(batch, decompressed_bytes_max=1 << 20)):
                if record.offset < len(out):
                    continue   # a whole batch is sent; the fetch asked from within it
                assert record.offset == len(out), f"offset {record.offset} read where {len(out)} was next"
                producer = f"{header.producer_id}/{header.producer_epoch}/{header.base_sequence + i}"
                out.append((record.offset, producer, record.value))
        if len(out) >= int(answer.high_watermark) or len(out) == before:
            assert len(out) == int(answer.high_watermark), "a fetch below the end gave nothing"
            return out


def fetch_error(connection: KafkaConnection, topic: str, partition: int) -> int:
    response = connection.call(FETCH, 4, FetchRequest(
        max_wait=i32Timedelta.parse(datetime.timedelta(0)), min_bytes=i32(0), topics=(
            FetchTopic(topic=TopicName(topic), partitions=(
                FetchPartition(partition=i32(partition), fetch_offset=i64(0), partition_max_bytes=i32(1 << 20)),)),)))
    return int(response.responses[0].partitions[0].error_code)


def batch_header_at(connection: KafkaConnection, topic: str, partition: int, offset: int) -> str:
    """The producer fields of the batch holding ``offset`` (which producer incarnation wrote it, and with
    what sequence): two copies of a record with the same fields got past the broker's check of
    duplicates, with different ones the client sent the record twice."""
    response = connection.call(FETCH, 4, FetchRequest(
        max_wait=i32Timedelta.parse(datetime.timedelta(0)), min_bytes=i32(0), topics=(
            FetchTopic(topic=TopicName(topic), partitions=(
                FetchPartition(partition=i32(partition), fetch_offset=i64(offset),
                               partition_max_bytes=i32(1 << 16)),)),)))
    records = memoryview(response.responses[0].partitions[0].records or b"")
    at = 0
    while at + HEADER.size <= len(records):
        (base, length, _, _, _, _, last_delta, _, _, producer_id, epoch, sequence,
         count) = HEADER.unpack_from(records, at)
        if base <= offset <= base + last_delta:
            return (f"batch at {base} ({count} records): producer id {producer_id}, epoch {epoch}, "
                    f"base sequence {sequence}")
        at += 12 + length
    return f"no batch holds offset {offset}"


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


__all__ = ["CLUSTER_TOML", "NONE", "BrokerCluster", "PartitionView", "list_offsets_error", "metadata",
           "object_store_uri", "running_cluster"]
