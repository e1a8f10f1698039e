"""What Kafka clients expect of a broker and outside clients found wrong: a connection's requests take
effect in the order they arrived (a pipelined commit never lands before an older one), and a Fetch
response holds no more record bytes than the request allows (only the first batch of the first partition
that has one may go over, so a consumer always progresses)."""

from __future__ import annotations

import asyncio
import datetime
import itertools
import random
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.fetch.v4.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.offset_commit.v8.request import (
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
)
from kio.schema.offset_fetch.v8.request import OffsetFetchRequest, OffsetFetchRequestGroup, OffsetFetchRequestTopics
from kio.schema.produce.v3.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.schema.types import GroupId, TopicName
from kio.static.primitive import i16, i32, i32Timedelta, i64

from brokerkit import BrokerProcess, running_broker
from clusterkit import BrokerCluster, find_coordinator, running_cluster
from conftest import SeaweedS3
from kafkaclients import CLIENTS, FetchBounds, consume_until, make_client
from stratalog.broker.server import write_response
from stratalog.chaos.cluster_probe import metadata
from stratalog.kafka.client import KafkaConnection
from stratalog.kafka.records import Compression, encode_batch
from waiting import wait_until

pytest_plugins = ["pgkit"]

PRODUCE, FETCH, OFFSET_COMMIT, OFFSET_FETCH = 0, 1, 8, 9
MESSAGE_TOO_LARGE = 10
COMMIT_TOPIC, COMMIT_PARTITIONS = "committed", 2


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(timeout=60)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with running_broker(tmp_path_factory.mktemp("conformance") / "data") as b:
        create_topic(b.bootstrap, COMMIT_TOPIC, COMMIT_PARTITIONS)
        yield b


# A connection's requests take effect in order ------------------------------------------------------------

def commit_request(group: str, partition: int, offset: int) -> OffsetCommitRequest:
    return OffsetCommitRequest(group_id=GroupId(group), member_id="", topics=(OffsetCommitRequestTopic(
        name=TopicName(COMMIT_TOPIC), partitions=(OffsetCommitRequestPartition(
            partition_index=i32(partition), committed_offset=i64(offset), committed_metadata=f"#{offset}"),)),))


def fetch_request(group: str) -> OffsetFetchRequest:
    return OffsetFetchRequest(groups=(OffsetFetchRequestGroup(group_id=GroupId(group), topics=(
        OffsetFetchRequestTopics(name=TopicName(COMMIT_TOPIC),
                                 partition_indexes=tuple(i32(p) for p in range(COMMIT_PARTITIONS))),)),))


def fetched_offsets(response: Any) -> tuple[int, dict[int, int]]:
    (answer,) = response.groups
    return int(answer.error_code), {p.partition_index: p.committed_offset for t in answer.topics for p in t.partitions}


def offset_fetch(connection: KafkaConnection, group: str) -> tuple[int, dict[int, int]]:
    """OffsetFetch's error code and the group's committed offset per partition of COMMIT_TOPIC."""
    return fetched_offsets(connection.call(OFFSET_FETCH, 8, fetch_request(group)))


def committed(connection: KafkaConnection, group: str) -> dict[int, int]:
    error, offsets = offset_fetch(connection, group)
    assert error == 0
    return offsets


def pipelined_commits_land_in_order(bootstrap: str, group: str, commits: list[tuple[int, int]]) -> None:
    """Send every commit on one connection, and an OffsetFetch after them, before reading an answer; then
    ask on another connection too: the group has the last acknowledged commit of each partition, whatever
    the order of offsets."""
    with KafkaConnection(bootstrap, {}, client_id="pipelining") as connection:
        *responses, fetched = connection.call_pipelined(
            [(OFFSET_COMMIT, 8, commit_request(group, partition, offset)) for partition, offset in commits]
            + [(OFFSET_FETCH, 8, fetch_request(group))])
    assert [p.error_code for r in responses for t in r.topics for p in t.partitions] == [0] * len(commits)
    error, also_pipelined = fetched_offsets(fetched)
    assert error == 0
    expected = {partition: -1 for partition in range(COMMIT_PARTITIONS)}
    for partition, offset in commits:
        expected[partition] = offset
    with KafkaConnection(bootstrap, {}, client_id="reader") as connection:
        assert committed(connection, group) == expected
    assert also_pipelined == expected


#: A new group for each example: what an earlier one committed must not count.
GROUP_NUMBERS = itertools.count()
COMMITS = st.lists(st.tuples(st.integers(0, COMMIT_PARTITIONS - 1), st.integers(0, 1 << 40)),
                   min_size=2, max_size=40)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(commits=COMMITS)
def test_pipelined_commits_take_effect_in_the_order_they_arrived(
        broker: BrokerProcess, commits: list[tuple[int, int]]) -> None:
    pipelined_commits_land_in_order(broker.bootstrap, f"pipelined-{next(GROUP_NUMBERS)}", commits)


def test_a_long_run_of_falling_commits_ends_at_the_last(broker: BrokerProcess) -> None:
    # The case: offsets that go down as they are committed (50, then 45 read back) show any
    # reordering at once.
    pipelined_commits_land_in_order(broker.bootstrap, "falling", [(0, offset) for offset in range(200, 0, -1)])


def test_pipelined_commits_take_effect_in_order_in_a_cluster(
        tmp_path: Path, pg_database: str, seaweedfs: SeaweedS3) -> None:
    # Offsets in PostgreSQL: each commit is a round trip, so commits run in parallel would overtake.
    with running_cluster(tmp_path, pg_database, seaweedfs, 2) as cluster:
        create_topic(cluster.bootstrap(1), COMMIT_TOPIC, COMMIT_PARTITIONS)

        @settings(max_examples=15, deadline=None)
        @given(commits=COMMITS)
        def commits_land_in_order(commits: list[tuple[int, int]]) -> None:
            group = f"clustered-{next(GROUP_NUMBERS)}"
            pipelined_commits_land_in_order(coordinator(cluster, group), group, commits)

        commits_land_in_order()
        pipelined_commits_land_in_order(coordinator(cluster, "falling"), "falling",
                                        [(0, o) for o in range(100, 0, -1)])


def coordinator(cluster: BrokerCluster, group: str) -> str:
    """The address of the group's coordinator, once it says it is (a new group's lease is taken first)."""
    def ready() -> str | None:
        with cluster.connect(1) as connection:
            error, _, host, port = find_coordinator(connection, group)
        if error:
            return None
        with KafkaConnection(f"{host}:{port}", {}) as connection:
            return f"{host}:{port}" if offset_fetch(connection, group)[0] == 0 else None
    return wait_until(ready, f"a coordinator of group {group} that answers for it")


# A Fetch holds no more than max_bytes -----------------------------------------------------------------

FETCH_TOPIC, FETCH_PARTITIONS = "bounded", 12
#: Value bytes of a record: batches from under a hundred bytes to well over the bounds fetched with.
VALUE_SIZES = (40, 900, 7_000, 60_000, 150_000)


@dataclass(frozen=True)
class Batch:
    base_offset: int
    count: int
    size_bytes: int  # as Kafka sends it: its log overhead (offset, length) and all


@pytest.fixture(scope="module")
def batches(broker: BrokerProcess) -> dict[int, list[Batch]]:
    """FETCH_TOPIC's batches per partition, 2 to 8 a partition of 1 to 3 records of mixed sizes."""
    create_topic(broker.bootstrap, FETCH_TOPIC, FETCH_PARTITIONS)
    rng = random.Random(11)
    now_ms = int(time.time() * 1000)
    layout: dict[int, list[Batch]] = {}
    with KafkaConnection(broker.bootstrap, {}) as connection:
        for partition in range(FETCH_PARTITIONS):
            layout[partition], offset = [], 0
            for _ in range(rng.randint(2, 8)):
                size = rng.choice(VALUE_SIZES)
                records = [(None, bytes([65 + offset % 26]) * size, (), now_ms) for _ in range(rng.randint(1, 3))]
                batch = encode_batch(records, base_offset=0)
                response = connection.call(PRODUCE, 3, ProduceRequest(
                    acks=i16(-1), timeout=i32Timedelta.parse(datetime.timedelta(seconds=60)), topic_data=(
                        TopicProduceData(name=TopicName(FETCH_TOPIC), partition_data=(
                            PartitionProduceData(index=i32(partition), records=batch),)),)))
                (answer,) = response.responses[0].partition_responses
                assert (answer.error_code, answer.base_offset) == (0, offset)
                layout[partition].append(Batch(offset, len(records), len(batch)))
                offset += len(records)
    return layout


def batches_in(records: bytes | None) -> list[int]:
    """The base offset of each batch in a partition's records (a whole batch each: the broker never cuts one)."""
    found, at = [], 0
    data = records or b""
    while at < len(data):
        base_offset, length = struct.unpack_from(">qi", data, at)
        found.append(base_offset)
        at += 12 + length
    assert at == len(data)
    return found


def kafka_fetch_model(layout: dict[int, list[Batch]], starts: dict[int, int], max_bytes: int,
                      partition_max_bytes: int) -> dict[int, list[int]]:
    """What Kafka returns: partitions in request order, each its longest run of whole batches from the one
    holding its start that fits min(partition_max_bytes, what max_bytes leaves); the first batch of the
    first partition that has one goes whole whatever its size."""
    expected: dict[int, list[int]] = {}
    total = 0
    for partition, start in starts.items():
        run = [b for b in layout[partition] if b.base_offset + b.count > start]
        budget = min(partition_max_bytes, max_bytes - total)
        taken: list[int] = []
        used = 0
        for batch in run:
            if used + batch.size_bytes > budget and (taken or total):
                break
            taken.append(batch.base_offset)
            used += batch.size_bytes
        expected[partition] = taken
        total += used
    return expected


def test_a_fetch_fits_max_bytes_and_partition_max_bytes_but_for_the_first_batch(
        broker: BrokerProcess, batches: dict[int, list[Batch]]) -> None:
    with KafkaConnection(broker.bootstrap, {}) as connection:

        @settings(max_examples=150, deadline=None)
        @given(data=st.data(), max_bytes=st.integers(0, 400_000), partition_max_bytes=st.integers(0, 200_000))
        def as_kafka_does(data: st.DataObject, max_bytes: int, partition_max_bytes: int) -> None:
            order = data.draw(st.permutations(range(FETCH_PARTITIONS)))
            ends = {p: batches[p][-1].base_offset + batches[p][-1].count for p in order}
            starts = {p: data.draw(st.integers(0, ends[p])) for p in order}
            response = connection.call(FETCH, 4, FetchRequest(
                max_wait=i32Timedelta.parse(datetime.timedelta(0)), min_bytes=i32(0), max_bytes=i32(max_bytes),
                topics=(FetchTopic(topic=TopicName(FETCH_TOPIC), partitions=tuple(
                    FetchPartition(partition=i32(p), fetch_offset=i64(starts[p]),
                                   partition_max_bytes=i32(partition_max_bytes)) for p in order)),)))
            (topic,) = response.responses
            assert [p.error_code for p in topic.partitions] == [0] * FETCH_PARTITIONS
            got = {int(p.partition_index): batches_in(p.records) for p in topic.partitions}
            assert got == kafka_fetch_model(batches, starts, max_bytes, partition_max_bytes)
            sent = sum(len(p.records or b"") for p in topic.partitions)
            assert sent <= max_bytes or sum(map(len, got.values())) == 1

        as_kafka_does()


@pytest.mark.parametrize("client_name", CLIENTS)
def test_each_client_reads_every_batch_under_tight_fetch_bounds(
        broker: BrokerProcess, batches: dict[int, list[Batch]], client_name: str) -> None:
    # Bounds under the largest batches: only the first-batch rule lets those through, and librdkafka
    # drops a whole response that goes over its frame bound (and stalls) rather than read it.
    largest = max(b.size_bytes for bs in batches.values() for b in bs)
    bounds = FetchBounds(response_bytes=largest + 1000, partition_bytes=largest // 4)
    client = make_client(client_name)
    consumer = client.consumer(broker.bootstrap, f"bounded-{client_name}", [FETCH_TOPIC], bounds)
    try:
        count = sum(b.count for bs in batches.values() for b in bs)
        (got,) = consume_until([consumer], count, timeout_s=120)
    finally:
        consumer.close()
        client.close()
    every = {(p, b.base_offset + i) for p, bs in batches.items() for b in bs for i in range(b.count)}
    assert sorted((r.partition, r.offset) for r in got) == sorted(every)


def test_the_banner_names_the_compiled_core(broker: BrokerProcess) -> None:
    # make test builds the compiled core and requires it: a broker that fell back to the Python twins
    # would pass every other test, slowly.
    assert "stratalog core: native (C)\n" in broker.output


class _LostAfterFirstWrite(asyncio.Transport):
    """A transport whose peer is gone once the first piece is written (its send failed)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes_after_loss = 0
        self.lost = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.lost:
            self.writes_after_loss += 1  # asyncio logs "socket.send() raised exception." from the fifth on
        self.lost = True

    def is_closing(self) -> bool:
        return self.lost


def test_a_response_stops_being_written_once_its_connection_is_lost() -> None:
    transport = _LostAfterFirstWrite()
    write_response(transport, [b"piece"] * 50)  # a Fetch response: one piece per batch
    assert transport.writes_after_loss == 0


# CreateTopics with a replica assignment -------------------------------------------------------------

CREATE_TOPICS = 19


def create_with_assignment(bootstrap: str, name: str, assignment: list[list[int]], partitions: int = -1,
                           replication_factor: int = -1) -> tuple[int, str | None, int]:
    """CreateTopics v5 of one topic placed by ``assignment`` (partition i on the brokers of its list):
    the error code, its message, and the partition count answered."""
    from kio.schema.create_topics.v5.request import (
        CreatableReplicaAssignment,
        CreatableTopic,
        CreateTopicsRequest,
    )
    from kio.schema.types import BrokerId
    from kio.static.primitive import i16

    request = CreateTopicsRequest(topics=(CreatableTopic(
        name=TopicName(name), num_partitions=i32(partitions), replication_factor=i16(replication_factor),
        assignments=tuple(CreatableReplicaAssignment(partition_index=i32(i), broker_ids=tuple(BrokerId(b) for b in ids))
                          for i, ids in enumerate(assignment)), configs=()),),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)))
    with KafkaConnection(bootstrap, {}) as connection:
        (topic,) = connection.call(CREATE_TOPICS, 5, request).topics
    return int(topic.error_code), topic.error_message, int(topic.num_partitions)


INVALID_REQUEST, INVALID_REPLICATION_FACTOR, INVALID_REPLICA_ASSIGNMENT = 42, 38, 39


@pytest.mark.parametrize(("assignment", "partitions", "replication_factor", "error"), [
    ([[0]], -1, -1, 0),
    ([[0], [0], [0]], -1, -1, 0),
    ([[1]], -1, -1, INVALID_REPLICA_ASSIGNMENT),           # no broker 1
    ([[0], [7]], -1, -1, INVALID_REPLICA_ASSIGNMENT),
    ([[0, 0]], -1, -1, INVALID_REPLICATION_FACTOR),        # two replicas: one broker holds a partition
    ([[]], -1, -1, INVALID_REPLICATION_FACTOR),
    ([[0]], 1, -1, INVALID_REQUEST),                       # Kafka: a count beside an assignment
    ([[0]], -1, 1, INVALID_REQUEST),
], ids=["one", "three", "other-broker", "one-unknown", "two-replicas", "no-replica", "with-count", "with-factor"])
def test_a_replica_assignment_is_taken_where_this_broker_can_honour_it(
        broker: BrokerProcess, assignment: list[list[int]], partitions: int, replication_factor: int,
        error: int) -> None:
    name = f"assigned-{next(GROUP_NUMBERS)}"
    code, message, count = create_with_assignment(broker.bootstrap, name, assignment, partitions, replication_factor)
    assert code == error, message
    if not error:
        assert count == len(assignment)
        with KafkaConnection(broker.bootstrap, {}) as connection:
            _, view = metadata(connection, name)
        assert sorted(view) == list(range(len(assignment)))
        assert {v.leader_id for v in view.values()} == {0}


def test_a_gap_in_the_assigned_partitions_is_refused(broker: BrokerProcess) -> None:
    from kio.schema.create_topics.v5.request import CreatableReplicaAssignment, CreatableTopic, CreateTopicsRequest
    from kio.schema.types import BrokerId
    from kio.static.primitive import i16

    request = CreateTopicsRequest(topics=(CreatableTopic(
        name=TopicName("gap"), num_partitions=i32(-1), replication_factor=i16(-1), assignments=(
            CreatableReplicaAssignment(partition_index=i32(0), broker_ids=(BrokerId(0),)),
            CreatableReplicaAssignment(partition_index=i32(2), broker_ids=(BrokerId(0),))), configs=()),),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)))
    with KafkaConnection(broker.bootstrap, {}) as connection:
        (topic,) = connection.call(CREATE_TOPICS, 5, request).topics
    assert topic.error_code == INVALID_REPLICA_ASSIGNMENT


def test_admin_clients_place_partitions_on_this_broker(broker: BrokerProcess) -> None:
    import aiokafka.admin
    import kafka.admin
    from confluent_kafka.admin import NewTopic as ConfluentTopic

    confluent = AdminClient({"bootstrap.servers": broker.bootstrap})
    confluent.create_topics([ConfluentTopic("placed-confluent", 2, replica_assignment=[[0], [0]])])[
        "placed-confluent"].result(timeout=60)
    admin = kafka.admin.KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        admin.create_topics([kafka.admin.NewTopic("placed-kafka-python", num_partitions=-1, replication_factor=-1,
                                                  replica_assignments={0: [0], 1: [0]})])
    finally:
        admin.close()

    async def with_aiokafka() -> None:
        client = aiokafka.admin.AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
        await client.start()
        try:
            await client.create_topics([aiokafka.admin.NewTopic(
                "placed-aiokafka", num_partitions=-1, replication_factor=-1, replica_assignments={0: [0], 1: [0]})])
        finally:
            await client.close()

    asyncio.run(with_aiokafka())
    with KafkaConnection(broker.bootstrap, {}) as connection:
        for name in ("placed-confluent", "placed-kafka-python", "placed-aiokafka"):
            _, view = metadata(connection, name)
            assert sorted(view) == [0, 1], name


# IncrementalAlterConfigs on list configs -----------------------------------------------------------


def alter(bootstrap: str, topic: str, name: str, value: str | None, op: str) -> str | None:
    """One IncrementalAlterConfigs of ``topic`` through librdkafka: None, or the error it reported."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry(name, value, incremental_operation=getattr(AlterConfigOpType, op))])
    try:
        admin.incremental_alter_configs([resource])[resource].result(timeout=60)
    except Exception as e:
        return str(e)
    return None


def cleanup_policy(bootstrap: str, topic: str) -> str:
    from confluent_kafka.admin import ConfigResource

    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    return str(admin.describe_configs([resource])[resource].result(timeout=60)["cleanup.policy"].value)


def test_cleanup_policy_is_a_list_to_append_to_and_subtract_from(broker: BrokerProcess) -> None:
    topic = f"policies-{next(GROUP_NUMBERS)}"
    create_topic(broker.bootstrap, topic, 1)
    assert alter(broker.bootstrap, topic, "cleanup.policy", "delete", "APPEND") is None   # already there
    assert cleanup_policy(broker.bootstrap, topic) == "delete"
    assert alter(broker.bootstrap, topic, "cleanup.policy", "compact", "APPEND") is None
    assert cleanup_policy(broker.bootstrap, topic) == "delete,compact"
    assert alter(broker.bootstrap, topic, "cleanup.policy", "delete", "SUBTRACT") is None
    assert cleanup_policy(broker.bootstrap, topic) == "compact"
    emptied = alter(broker.bootstrap, topic, "cleanup.policy", "compact", "SUBTRACT")
    assert emptied is not None and "INVALID_CONFIG" in emptied and "delete, compact, or both" in emptied
    not_a_list = alter(broker.bootstrap, topic, "retention.ms", "5", "APPEND")
    assert not_a_list is not None and "Config value append is not allowed for config key: retention.ms" in not_a_list
    assert alter(broker.bootstrap, topic, "cleanup.policy", "delete", "SUBTRACT") is None  # not there: no change
    assert cleanup_policy(broker.bootstrap, topic) == "compact"


# Transactions: each client's transactional producer commits ---------------------------------------------

TRANSACTIONS_TIMEOUT_S = 60  # each client's own bound on a call


def commit_one_transaction(client_name: str, bootstrap: str, topic: str) -> None:
    """Initialize the client's transactional producer, and send one record in a committed transaction."""
    value = client_name.encode()
    if client_name == "confluent-kafka":
        import confluent_kafka

        producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "transactional.id": "txn-confluent"})
        producer.init_transactions(TRANSACTIONS_TIMEOUT_S)
        producer.begin_transaction()
        producer.produce(topic, value)
        producer.commit_transaction(TRANSACTIONS_TIMEOUT_S)
        return
    if client_name == "kafka-python":
        import kafka

        producer = kafka.KafkaProducer(bootstrap_servers=bootstrap, transactional_id="txn-kafka-python",
                                       max_block_ms=TRANSACTIONS_TIMEOUT_S * 1000)
        try:
            producer.init_transactions()
            producer.begin_transaction()
            producer.send(topic, value)
            producer.commit_transaction()
        finally:
            producer.close(timeout=TRANSACTIONS_TIMEOUT_S)
        return
    import aiokafka

    async def send() -> None:
        producer = aiokafka.AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id="txn-aiokafka")
        await asyncio.wait_for(producer.start(), TRANSACTIONS_TIMEOUT_S)
        try:
            async with producer.transaction():
                await producer.send_and_wait(topic, value)
        finally:
            await producer.stop()

    asyncio.run(send())


@pytest.mark.parametrize("client_name", CLIENTS)
def test_a_transactional_producer_of_each_client_commits(broker: BrokerProcess, client_name: str) -> None:
    import confluent_kafka

    topic = f"txn-{client_name}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})   # held until its answer comes
    admin.create_topics([NewTopic(topic, 1)])[topic].result(60)
    commit_one_transaction(client_name, broker.bootstrap, topic)
    consumer = confluent_kafka.Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"g-{topic}",
                                         "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
    try:
        consumer.subscribe([topic])
        message = consumer.poll(TRANSACTIONS_TIMEOUT_S)
        assert message is not None and not message.error(), message
        assert message.value() == client_name.encode()
    finally:
        consumer.close()


# compression.type: batches stored in the topic's codec --------------------------------------------------

#: Each client produces in a codec other than the topic's, so every batch is recompressed on the way in.
PRODUCER_CODECS = {"kafka-python": "gzip", "aiokafka": "lz4", "confluent-kafka": "snappy"}
CODEC_RECORDS = 200


def create_with_configs(client_name: str, bootstrap: str, topic: str, configs: dict[str, str]) -> None:
    """``topic`` (one partition) created with ``configs`` through the client's own admin API."""
    if client_name == "confluent-kafka":
        admin = AdminClient({"bootstrap.servers": bootstrap})  # held until the result: dropped, it fails it
        admin.create_topics([NewTopic(topic, 1, 1, config=configs)])[topic].result(timeout=60)
    elif client_name == "kafka-python":
        import kafka.admin

        admin = kafka.admin.KafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            admin.create_topics([kafka.admin.NewTopic(topic, 1, 1, topic_configs=configs)])
        finally:
            admin.close()
    else:
        import aiokafka.admin

        async def create() -> None:
            admin = aiokafka.admin.AIOKafkaAdminClient(bootstrap_servers=bootstrap)
            await admin.start()
            try:
                await admin.create_topics([aiokafka.admin.NewTopic(topic, 1, 1, topic_configs=configs)])
            finally:
                await admin.close()

        asyncio.run(create())


def produce_compressed(client_name: str, bootstrap: str, topic: str, values: list[bytes | None]) -> None:
    """``values`` (None: a tombstone) as keyed records, acknowledged, in the client's PRODUCER_CODECS codec."""
    codec = PRODUCER_CODECS[client_name]
    keys = [b"k%d" % i for i in range(len(values))]
    if client_name == "confluent-kafka":
        import confluent_kafka

        producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "compression.type": codec,
                                             "linger.ms": 20, "acks": "all"})
        for key, value in zip(keys, values, strict=True):
            producer.produce(topic, value=value, key=key)
        assert producer.flush(60) == 0
    elif client_name == "kafka-python":
        import kafka

        producer = kafka.KafkaProducer(bootstrap_servers=bootstrap, compression_type=codec, linger_ms=20, acks="all")
        try:
            for future in [producer.send(topic, value=v, key=k) for k, v in zip(keys, values, strict=True)]:
                future.get(timeout=60)
        finally:
            producer.close()
    else:
        import aiokafka

        async def send() -> None:
            producer = aiokafka.AIOKafkaProducer(bootstrap_servers=bootstrap, compression_type=codec,
                                                 linger_ms=20, acks="all")
            await producer.start()
            try:
                sent = [await producer.send(topic, value=v, key=k) for k, v in zip(keys, values, strict=True)]
                await asyncio.gather(*sent)
            finally:
                await producer.stop()

        asyncio.run(send())


def stored_batches(bootstrap: str, topic: str) -> list[bytes]:
    """The topic's partition 0 as a Fetch returns it, batch by batch."""
    with KafkaConnection(bootstrap, {}) as connection:
        response = connection.call(FETCH, 4, FetchRequest(
            max_wait=i32Timedelta.parse(datetime.timedelta(0)), min_bytes=i32(0), max_bytes=i32(1 << 24),
            topics=(FetchTopic(topic=TopicName(topic), partitions=(
                FetchPartition(partition=i32(0), fetch_offset=i64(0), partition_max_bytes=i32(1 << 24)),)),)))
    ((partition,),) = [t.partitions for t in response.responses]
    assert partition.error_code == 0
    data, out, at = partition.records or b"", [], 0
    while at < len(data):
        length = struct.unpack_from(">i", data, at + 8)[0]
        out.append(data[at:at + 12 + length])
        at += 12 + length
    return out


@pytest.mark.parametrize("stored", ["zstd", "uncompressed"])
@pytest.mark.parametrize("client_name", CLIENTS)
def test_batches_are_stored_in_the_topics_compression_type(
        broker: BrokerProcess, client_name: str, stored: str) -> None:
    from kafka.record.default_records import DefaultRecordBatch

    topic = f"codec-{stored}-{next(GROUP_NUMBERS)}"
    create_with_configs(client_name, broker.bootstrap, topic, {"compression.type": stored})
    values = [None if i % 7 == 3 else b"value %d " % i * 20 for i in range(CODEC_RECORDS)]
    produce_compressed(client_name, broker.bootstrap, topic, values)
    codec = {"zstd": 4, "uncompressed": 0}[stored]
    read: list[tuple[int, bytes | None, bytes | None]] = []
    for raw in stored_batches(broker.bootstrap, topic):
        batch = DefaultRecordBatch(raw)  # kafka-python's own reader: checks the CRC, keeps null values
        assert batch.validate_crc() and batch.compression_type == codec
        read += [(r.offset, r.key, r.value) for r in batch]
    assert read == [(i, b"k%d" % i, v) for i, v in enumerate(values)]
    client = make_client(client_name)  # and the client itself reads what it sent, decompressing zstd
    consumer = client.consumer(broker.bootstrap, f"codec-{client_name}", [topic])
    try:
        (got,) = consume_until([consumer], CODEC_RECORDS)
    finally:
        consumer.close()
        client.close()
    assert [r.key for r in got] == [b"k%d" % i for i in range(CODEC_RECORDS)]


def test_a_batch_too_large_once_recompressed_is_refused(broker: BrokerProcess) -> None:
    topic = f"codec-small-{next(GROUP_NUMBERS)}"
    create_with_configs("confluent-kafka", broker.bootstrap, topic,
                        {"compression.type": "uncompressed", "max.message.bytes": "20000"})
    batch = encode_batch([(None, b"\0" * 50_000, (), 0)], base_offset=0, compression=Compression.ZSTD)
    assert len(batch) < 20_000
    with KafkaConnection(broker.bootstrap, {}) as connection:
        response = connection.call(PRODUCE, 3, ProduceRequest(
            acks=i16(-1), timeout=i32Timedelta.parse(datetime.timedelta(seconds=60)), topic_data=(
                TopicProduceData(name=TopicName(topic), partition_data=(
                    PartitionProduceData(index=i32(0), records=batch),)),)))
    (answer,) = response.responses[0].partition_responses
    assert answer.error_code == MESSAGE_TOO_LARGE
    assert stored_batches(broker.bootstrap, topic) == []


@pytest.mark.parametrize("value", ["producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"])
def test_every_kafka_compression_type_is_accepted_and_described(broker: BrokerProcess, value: str) -> None:
    from confluent_kafka.admin import ConfigResource

    topic = f"codec-described-{next(GROUP_NUMBERS)}"
    create_with_configs("confluent-kafka", broker.bootstrap, topic, {"compression.type": value})
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    assert admin.describe_configs([resource])[resource].result(timeout=60)["compression.type"].value == value
