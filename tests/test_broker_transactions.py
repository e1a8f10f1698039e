"""Transactions through librdkafka (confluent-kafka) against `stratalog serve`: committed records are read
by read_committed consumers and aborted ones are not, an open transaction holds them at its first offset,
offsets sent in a transaction count only once it commits, and a second producer with the same
transactional id fences the first, whose records are never visible."""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode

from brokerkit import BrokerProcess, running_broker
from txnkit import read_to_end

with warnings.catch_warnings():   # kafka-python imports a deprecated importlib API
    warnings.simplefilter("ignore", DeprecationWarning)
    import kafka

pytestmark = pytest.mark.slow

WAIT_S = 60.0


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with running_broker(tmp_path_factory.mktemp("txn") / "data") as process:
        yield process
        assert process.stop() == 0, "".join(process.output)


def new_topic(broker: BrokerProcess, partitions: int = 2) -> str:
    name = f"t-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(name, partitions)])[name].result(WAIT_S)
    return name


def transactional(broker: BrokerProcess, txn_id: str) -> Producer:
    producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": txn_id,
                         "transaction.timeout.ms": 60_000})
    producer.init_transactions(WAIT_S)
    return producer


def test_read_committed_sees_committed_records_only(broker: BrokerProcess) -> None:
    topic = new_topic(broker)
    producer = transactional(broker, f"tx-{uuid.uuid4().hex[:6]}")
    for batch, commit in (("a", True), ("b", False), ("c", True)):
        producer.begin_transaction()
        for i in range(10):
            producer.produce(topic, f"{batch}{i}".encode(), partition=i % 2)
        producer.flush(WAIT_S)
        if commit:
            producer.commit_transaction(WAIT_S)
        else:
            producer.abort_transaction(WAIT_S)
    committed = sorted(read_to_end(broker.bootstrap, topic, "read_committed"))
    assert committed == sorted(f"{b}{i}".encode() for b in "ac" for i in range(10))
    everything = sorted(read_to_end(broker.bootstrap, topic, "read_uncommitted"))
    assert everything == sorted(f"{b}{i}".encode() for b in "abc" for i in range(10))


def test_an_open_transaction_holds_read_committed_consumers_back(broker: BrokerProcess) -> None:
    topic = new_topic(broker, 1)
    plain = Producer({"bootstrap.servers": broker.bootstrap})
    plain.produce(topic, b"before", timestamp=1000)
    plain.flush(WAIT_S)
    producer = transactional(broker, f"tx-{uuid.uuid4().hex[:6]}")
    producer.begin_transaction()
    producer.produce(topic, b"open", timestamp=2000)
    producer.flush(WAIT_S)
    plain.produce(topic, b"after", timestamp=3000)   # behind the open transaction: not stable yet
    plain.flush(WAIT_S)
    assert read_to_end(broker.bootstrap, topic, "read_committed") == [b"before"]
    assert end_offsets(broker, topic) == {"read_committed": 1, "read_uncommitted": 3}, "ListOffsets: the LSO"
    # By time, read_committed finds a record below the LSO or none (Kafka's rule).
    assert offsets_for_time(broker, topic, 500) == {"read_committed": 0, "read_uncommitted": 0}
    assert offsets_for_time(broker, topic, 1500) == {"read_committed": None, "read_uncommitted": 1}
    producer.commit_transaction(WAIT_S)
    assert read_to_end(broker.bootstrap, topic, "read_committed") == [b"before", b"open", b"after"]
    assert end_offsets(broker, topic) == {"read_committed": 4, "read_uncommitted": 4}, "past the marker"
    assert offsets_for_time(broker, topic, 1500) == {"read_committed": 1, "read_uncommitted": 1}


def offsets_for_time(broker: BrokerProcess, topic: str, timestamp_ms: int) -> dict[str, int | None]:
    """Partition 0's first offset at or after ``timestamp_ms`` as ListOffsets answers each isolation level
    (kafka-python's offsets_for_times; None: no such record)."""
    found = {}
    for isolation in ("read_committed", "read_uncommitted"):
        consumer = kafka.KafkaConsumer(bootstrap_servers=broker.bootstrap, isolation_level=isolation)
        try:
            partition = kafka.TopicPartition(topic, 0)
            answer = consumer.offsets_for_times({partition: timestamp_ms})[partition]
            found[isolation] = None if answer is None else answer.offset
        finally:
            consumer.close()
    return found


def end_offsets(broker: BrokerProcess, topic: str) -> dict[str, int]:
    """Partition 0's latest offset as ListOffsets answers each isolation level (kafka-python's end_offsets)."""
    found = {}
    for isolation in ("read_committed", "read_uncommitted"):
        consumer = kafka.KafkaConsumer(bootstrap_servers=broker.bootstrap, isolation_level=isolation)
        try:
            partition = kafka.TopicPartition(topic, 0)
            found[isolation] = consumer.end_offsets([partition])[partition]
        finally:
            consumer.close()
    return found


def test_offsets_sent_in_a_transaction_count_once_it_commits(broker: BrokerProcess) -> None:
    source, sink = new_topic(broker, 1), new_topic(broker, 1)
    group = f"g-{uuid.uuid4().hex[:6]}"
    plain = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(5):
        plain.produce(source, f"in{i}".encode())
    plain.flush(WAIT_S)
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    consumer.subscribe([source])
    producer = transactional(broker, f"tx-{uuid.uuid4().hex[:6]}")
    try:
        taken = []
        while len(taken) < 5:
            message = consumer.poll(WAIT_S)
            assert message is not None and not message.error()
            taken.append(message)
        for abort in (True, False):
            producer.begin_transaction()
            for m in taken:
                producer.produce(sink, m.value().replace(b"in", b"out"))
            producer.send_offsets_to_transaction([TopicPartition(source, 0, taken[-1].offset() + 1)],
                                                 consumer.consumer_group_metadata(), WAIT_S)
            if abort:
                producer.abort_transaction(WAIT_S)
                assert consumer.committed([TopicPartition(source, 0)], WAIT_S)[0].offset < 0, "not until commit"
            else:
                producer.commit_transaction(WAIT_S)
        assert consumer.committed([TopicPartition(source, 0)], WAIT_S)[0].offset == 5
    finally:
        consumer.close()
    assert read_to_end(broker.bootstrap, sink, "read_committed") == [f"out{i}".encode() for i in range(5)]


def offset_fetch(broker: BrokerProcess, version: int, group: str, topic: str, partitions: list[int],
                 require_stable: bool) -> dict[int, tuple[int, int]]:
    """OffsetFetch v7 (one group) or v8 (groups) as sent on the wire: each partition's error and offset."""
    from kio.schema.offset_fetch.v7.request import OffsetFetchRequest, OffsetFetchRequestTopic
    from kio.schema.offset_fetch.v8.request import OffsetFetchRequest as GroupsRequest
    from kio.schema.offset_fetch.v8.request import OffsetFetchRequestGroup, OffsetFetchRequestTopics
    from kio.schema.types import GroupId, TopicName
    from kio.static.primitive import i32

    from stratalog.kafka.api_keys import ApiKey
    from stratalog.kafka.client import KafkaConnection

    indexes = tuple(i32(p) for p in partitions)
    with KafkaConnection(broker.bootstrap, {}) as connection:
        if version == 7:
            answer = connection.call(ApiKey.OFFSET_FETCH, 7, OffsetFetchRequest(
                group_id=GroupId(group), require_stable=require_stable,
                topics=(OffsetFetchRequestTopic(name=TopicName(topic), partition_indexes=indexes),)))
            found = answer.topics[0].partitions
        else:
            answer = connection.call(ApiKey.OFFSET_FETCH, 8, GroupsRequest(require_stable=require_stable, groups=(
                OffsetFetchRequestGroup(group_id=GroupId(group), topics=(
                    OffsetFetchRequestTopics(name=TopicName(topic), partition_indexes=indexes),)),)))
            found = answer.groups[0].topics[0].partitions
    return {p.partition_index: (p.error_code, p.committed_offset) for p in found}


def test_offsets_of_a_transaction_under_way_are_unstable_to_a_read_committed_consumer(broker: BrokerProcess) -> None:
    """KIP-447: until a transaction that took a group's offsets ends, OffsetFetch with require_stable (what
    read_committed consumers send when they are given partitions) answers UNSTABLE_OFFSET_COMMIT for those
    partitions, and the client asks again; a new member never starts from the offsets the commit replaces
    and copies their inputs a second time. Without require_stable, and once the transaction ends, the
    committed offsets."""
    source, sink = new_topic(broker, 2), new_topic(broker, 1)
    group = f"g-{uuid.uuid4().hex[:6]}"
    member = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False})
    member.commit(offsets=[TopicPartition(source, 0, 2), TopicPartition(source, 1, 3)], asynchronous=False)
    reader = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False,
                       "isolation.level": "read_committed"})
    producer = transactional(broker, f"tx-{uuid.uuid4().hex[:6]}")
    try:
        for commit in (False, True):
            producer.begin_transaction()
            producer.produce(sink, b"out")
            producer.send_offsets_to_transaction([TopicPartition(source, 0, 7)], member.consumer_group_metadata(),
                                                 WAIT_S)
            for version in (7, 8):
                assert offset_fetch(broker, version, group, source, [0, 1], require_stable=True) == {
                    0: (ErrorCode.unstable_offset_commit, -1), 1: (ErrorCode.none, 3)}
                assert offset_fetch(broker, version, group, source, [0, 1], require_stable=False) == {
                    0: (ErrorCode.none, 2), 1: (ErrorCode.none, 3)}
            # librdkafka asks again while the answer is unstable: its call runs out of time, never answers 2.
            with pytest.raises(KafkaException) as waited:
                reader.committed([TopicPartition(source, 0)], 3)
            assert waited.value.args[0].code() == KafkaError._TIMED_OUT, waited.value
            (producer.commit_transaction if commit else producer.abort_transaction)(WAIT_S)
            ended = {0: (ErrorCode.none, 7 if commit else 2), 1: (ErrorCode.none, 3)}
            assert offset_fetch(broker, 8, group, source, [0, 1], require_stable=True) == ended
            assert reader.committed([TopicPartition(source, 0)], WAIT_S)[0].offset == ended[0][1]
    finally:
        member.close()
        reader.close()

def test_a_second_producer_with_the_same_id_fences_the_first(broker: BrokerProcess) -> None:
    topic = new_topic(broker, 1)
    txn_id = f"tx-{uuid.uuid4().hex[:6]}"
    zombie = transactional(broker, txn_id)
    zombie.begin_transaction()
    zombie.produce(topic, b"zombie-1")
    zombie.flush(WAIT_S)
    fresh = transactional(broker, txn_id)   # aborts the zombie's transaction and bumps the epoch
    fresh.begin_transaction()
    fresh.produce(topic, b"fresh")
    fresh.commit_transaction(WAIT_S)
    zombie.produce(topic, b"zombie-2")
    with pytest.raises(KafkaException) as fenced:
        zombie.commit_transaction(WAIT_S)
    assert fenced.value.args[0].fatal(), fenced.value
    assert read_to_end(broker.bootstrap, topic, "read_committed") == [b"fresh"]


def test_admin_apis_show_an_open_transaction_and_its_producer(broker: BrokerProcess) -> None:
    from kio.schema.describe_producers.v0.request import DescribeProducersRequest, TopicRequest
    from kio.schema.describe_transactions.v0.request import DescribeTransactionsRequest
    from kio.schema.list_transactions.v1.request import ListTransactionsRequest
    from kio.schema.types import TopicName, TransactionalId
    from kio.static.primitive import i32, i64

    from stratalog.kafka.api_keys import ApiKey
    from stratalog.kafka.client import KafkaConnection

    topic = new_topic(broker, 1)
    plain = Producer({"bootstrap.servers": broker.bootstrap})
    plain.produce(topic, b"before")
    plain.flush(WAIT_S)
    txn_id = f"tx-{uuid.uuid4().hex[:6]}"
    producer = transactional(broker, txn_id)
    producer.begin_transaction()
    producer.produce(topic, b"open")
    producer.flush(WAIT_S)

    def look() -> tuple[Any, Any, Any]:
        with KafkaConnection(broker.bootstrap, {}) as connection:
            described = connection.call(ApiKey.DESCRIBE_TRANSACTIONS, 0, DescribeTransactionsRequest(
                transactional_ids=(TransactionalId(txn_id), TransactionalId("nobody"))))
            listed = connection.call(ApiKey.LIST_TRANSACTIONS, 1, ListTransactionsRequest(
                state_filters=("Ongoing", "Bogus"), producer_id_filters=(), duration_filter=i64(-1)))
            producers = connection.call(ApiKey.DESCRIBE_PRODUCERS, 0, DescribeProducersRequest(
                topics=(TopicRequest(name=TopicName(topic), partition_indexes=(i32(0),)),)))
        return described, listed, producers

    described, listed, producers = look()
    mine, nobody = described.transaction_states
    assert (mine.error_code, mine.transaction_state) == (ErrorCode.none, "Ongoing")
    assert [(t.topic, list(t.partitions)) for t in mine.topics] == [(topic, [0])]
    assert nobody.error_code == ErrorCode.transactional_id_not_found
    assert txn_id in [s.transactional_id for s in listed.transaction_states]
    assert list(listed.unknown_state_filters) == ["Bogus"]
    [partition] = producers.topics[0].partitions
    [active] = [p for p in partition.active_producers if p.producer_id == mine.producer_id]
    assert active.current_txn_start_offset == 1, "where the open transaction starts: after b'before'"
    producer.commit_transaction(WAIT_S)
    described, listed, producers = look()
    assert described.transaction_states[0].transaction_state == "CompleteCommit"
    assert txn_id not in [s.transactional_id for s in listed.transaction_states]
    [active] = [p for p in producers.topics[0].partitions[0].active_producers if p.producer_id == mine.producer_id]
    assert active.current_txn_start_offset == -1
