"""Leader epochs (KIP-320) of a broker alone, through a real broker: one epoch, 0, from offset 0.
OffsetForLeaderEpoch answers where it ends, Fetch, ListOffsets and OffsetForLeaderEpoch check the client's
current leader epoch, every batch is stored at epoch 0 whatever its producer wrote, and consumers that
resume from committed offsets (which carry the epoch) read on without a loss or a repeat.
(Epochs across failovers: test_cluster_leader_epochs.py.)"""

from __future__ import annotations

import asyncio
import itertools
import struct
import warnings
from collections.abc import Iterator
from typing import Any

import aiokafka
import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode

from brokerkit import BrokerProcess, running_broker
from stratalog.kafka.api_keys import ApiKey
from stratalog.kafka.build import build
from stratalog.kafka.client import KafkaConnection
from stratalog.kafka.codec import load_request_schema
from stratalog.kafka.records import encode_batch
from waiting import wait_until

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaConsumer

TOPIC, PARTITIONS, RECORDS = "epochs", 3, 60
_groups = itertools.count()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with running_broker(tmp_path_factory.mktemp("epochs") / "data") as b:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(timeout=60)
        producer = confluent_kafka.Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 5})
        for i in range(RECORDS):
            producer.produce(TOPIC, value=b"%d" % i, partition=i % PARTITIONS)
        assert producer.flush(60) == 0
        yield b


def epochs_request(version: int, topic: str, partitions: dict[int, tuple[int, int]]) -> Any:
    """OffsetForLeaderEpoch: {partition: (current leader epoch, leader epoch asked)}."""
    return build(load_request_schema(ApiKey.OFFSET_FOR_LEADER_EPOCH, version), {
        "replica_id": -1, "topics": [{"topic": topic, "partitions": [
            {"partition": p, "current_leader_epoch": current, "leader_epoch": asked}
            for p, (current, asked) in partitions.items()]}]})


def end_offsets(connection: KafkaConnection, version: int, topic: str,
                partitions: dict[int, tuple[int, int]]) -> dict[int, tuple[int, int, int]]:
    """{partition: (error code, leader epoch, end offset)}."""
    response = connection.call(ApiKey.OFFSET_FOR_LEADER_EPOCH, version, epochs_request(version, topic, partitions))
    return {p.partition: (p.error_code, p.leader_epoch, p.end_offset) for t in response.topics for p in t.partitions}


@pytest.mark.parametrize("version", [2, 3, 4])
def test_offset_for_leader_epoch_answers_epoch_zero_to_the_log_end(broker: BrokerProcess, version: int) -> None:
    end = RECORDS // PARTITIONS
    with KafkaConnection(broker.bootstrap, {}) as connection:
        assert end_offsets(connection, version, TOPIC, {0: (0, 0), 1: (-1, 0), 2: (0, 5)}) == {
            0: (0, 0, end), 1: (0, 0, end), 2: (0, -1, -1)}, "epoch 5 is past every epoch: no end"
        assert end_offsets(connection, version, TOPIC, {0: (1, 0), 7: (0, 0)}) == {
            0: (ErrorCode.unknown_leader_epoch, -1, -1), 7: (ErrorCode.unknown_topic_or_partition, -1, -1)}
        assert end_offsets(connection, version, "no-such-topic", {0: (0, 0)}) == {
            0: (ErrorCode.unknown_topic_or_partition, -1, -1)}


def test_fetch_and_list_offsets_check_the_current_leader_epoch(broker: BrokerProcess) -> None:
    def fetch(current: int) -> int:
        response = connection.call(ApiKey.FETCH, 12, build(load_request_schema(ApiKey.FETCH, 12), {
            "max_wait": 0, "min_bytes": 0, "forgotten_topics_data": [], "topics": [{"topic": TOPIC, "partitions": [
                {"partition": 0, "current_leader_epoch": current, "fetch_offset": 0,
                 "partition_max_bytes": 1 << 16}]}]}))
        return int(response.responses[0].partitions[0].error_code)

    def list_offsets(current: int) -> int:
        response = connection.call(ApiKey.LIST_OFFSETS, 7, build(load_request_schema(ApiKey.LIST_OFFSETS, 7), {
            "replica_id": -1, "isolation_level": 0, "topics": [{"name": TOPIC, "partitions": [
                {"partition_index": 0, "current_leader_epoch": current, "timestamp": -1}]}]}))
        return int(response.topics[0].partitions[0].error_code)

    with KafkaConnection(broker.bootstrap, {}) as connection:
        assert [fetch(e) for e in (-1, 0, 1)] == [0, 0, ErrorCode.unknown_leader_epoch]
        assert [list_offsets(e) for e in (-1, 0, 3)] == [0, 0, ErrorCode.unknown_leader_epoch]


def test_every_batch_is_stored_at_the_leaders_epoch_whatever_its_producer_wrote(broker: BrokerProcess) -> None:
    topic = f"stamped-{next(_groups)}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(60)
    with KafkaConnection(broker.bootstrap, {}) as connection:
        for written in (-1, 0, 9):
            batch = encode_batch([(None, b"x", (), 1_000)], base_offset=0, partition_leader_epoch=written)
            response = connection.call(ApiKey.PRODUCE, 9, build(load_request_schema(ApiKey.PRODUCE, 9), {
                "transactional_id": None, "acks": -1, "timeout": 10_000, "topic_data": [
                    {"name": topic, "partition_data": [{"index": 0, "records": batch}]}]}))
            assert response.responses[0].partition_responses[0].error_code == 0
        fetched = connection.call(ApiKey.FETCH, 4, build(load_request_schema(ApiKey.FETCH, 4), {
            "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0,
            "topics": [{"topic": topic, "partitions": [{"partition": 0, "fetch_offset": 0,
                                                         "partition_max_bytes": 1 << 20}]}]}))
    records = bytes(fetched.responses[0].partitions[0].records)
    epochs, at = [], 0
    while at < len(records):
        length, epoch = struct.unpack_from(">ii", records, at + 8)
        epochs.append(epoch)
        at += 12 + length
    assert epochs == [0, 0, 0]


def read_half_then_resume(broker: BrokerProcess, read: Any) -> None:
    """``read(group, count)`` reads ``count`` records in a new consumer of ``group`` and commits where it
    stopped (with the epoch of the batch it read last, 0): the second consumer of the group reads exactly
    the other half. (Clients validate a position with OffsetForLeaderEpoch when the leader epoch changes,
    which it never does alone: test_cluster_leader_epochs.py has them do it.)"""
    group = f"resume-{next(_groups)}"
    first = read(group, RECORDS // 2)
    second = read(group, RECORDS - len(first))
    assert sorted(first + second) == sorted(b"%d" % i for i in range(RECORDS))


def test_librdkafka_and_kafka_python_resume_from_committed_positions(broker: BrokerProcess) -> None:
    def with_librdkafka(group: str, count: int) -> list[bytes]:
        consumer = confluent_kafka.Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group,
                                             "auto.offset.reset": "earliest", "enable.auto.commit": False,
                                             "fetch.wait.max.ms": 100, "max.poll.interval.ms": 60_000})
        consumer.subscribe([TOPIC])
        got: list[Any] = []
        try:
            wait_until(lambda: got.extend(m for m in consumer.consume(count - len(got), timeout=0.5)
                                          if m.error() is None) or len(got) >= count, "records", poll_s=0)
            assert len(got) == count
            consumer.commit(asynchronous=False)
        finally:
            consumer.close()
        return [m.value() for m in got]

    def with_kafka_python(group: str, count: int) -> list[bytes]:
        consumer = KafkaConsumer(TOPIC, bootstrap_servers=broker.bootstrap, group_id=group, enable_auto_commit=False,
                                 auto_offset_reset="earliest", max_poll_records=1, fetch_max_wait_ms=100)
        got: list[bytes] = []
        try:
            while len(got) < count:
                got += [r.value for records in consumer.poll(timeout_ms=500).values() for r in records]
            consumer.commit()
        finally:
            consumer.close()
        return got

    read_half_then_resume(broker, with_librdkafka)
    read_half_then_resume(broker, with_kafka_python)


def test_aiokafka_resumes_from_committed_positions(broker: BrokerProcess) -> None:
    def with_aiokafka(group: str, count: int) -> list[bytes]:
        async def run() -> list[bytes]:
            consumer = aiokafka.AIOKafkaConsumer(TOPIC, bootstrap_servers=broker.bootstrap, group_id=group,
                                                 enable_auto_commit=False, auto_offset_reset="earliest")
            await consumer.start()
            got: list[bytes] = []
            try:
                while len(got) < count:
                    batches = await asyncio.wait_for(consumer.getmany(timeout_ms=500, max_records=count - len(got)),
                                                     60)
                    got += [r.value for records in batches.values() for r in records]
                await consumer.commit()
            finally:
                await consumer.stop()
            return got
        return asyncio.run(run())

    read_half_then_resume(broker, with_aiokafka)
