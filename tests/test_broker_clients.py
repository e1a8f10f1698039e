"""`stratalog serve` against real Kafka clients: kafka-python, aiokafka and confluent-kafka (librdkafka).

Each test runs once per library: admin calls, produce with keys, headers and acks=all, group consumption,
rebalancing, resuming from a commit, offsets by time, idempotent produce, and records crossing between the
Kafka clients and the Python API of the same store.
"""

from __future__ import annotations

import gc
import itertools
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from brokerkit import BrokerProcess, running_broker
from kafkaclients import CALL_TIMEOUT_S, CLIENTS, Client, Consumed, Outgoing, consume_until, make_client
from stratalog.engine import StreamStore
from stratalog.kafka.records import check_batch
from stratalog.records import NewRecord, Record
from waiting import wait_until

#: A day before the run, on the hour: a timestamp no client would make up by itself, and well inside the
#: topics' default retention (7 days), so no retention pass deletes the records before a test reads them.
BASE_TIMESTAMP_MS = (int(time.time()) // 3600 - 24) * 3600 * 1000
_names = itertools.count()
#: What the broker logs when a stop closes connections whose requests were still in flight after its 10 s
#: of grace: a stop that took idle connections for busy ones would log it.
IN_FLIGHT_AT_STOP = "still had requests in flight"


def fresh(prefix: str, client: Client) -> str:
    """A topic or group name no other test uses."""
    return f"{prefix}-{client.name}-{next(_names)}"


@pytest.fixture(scope="module")
def config_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("broker-config") / "broker.toml"
    # Groups form at once: no waiting for more members before the first rebalance.
    path.write_text("[groups]\ngroup_initial_rebalance_delay_ms = 0\n")
    return path


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, config_path: Path) -> Iterator[BrokerProcess]:
    """One broker for the module's tests; each test uses topics and groups of its own."""
    with running_broker(tmp_path_factory.mktemp("broker") / "data", "--config", str(config_path)) as process:
        yield process
        assert process.stop() == 0, "".join(process.output)


@pytest.fixture(scope="module", params=CLIENTS)
def client(request: pytest.FixtureRequest) -> Iterator[Client]:
    made = make_client(request.param)
    yield made
    made.close()


def outgoing(count: int, partitions: int, tag: str = "") -> list[Outgoing]:
    """``count`` records spread over ``partitions`` in turn, each with a key (one without), headers and a
    timestamp of its own."""
    return [Outgoing(partition=i % partitions, key=None if i == 1 else f"key-{tag}{i}".encode(),
                     value=f"value-{tag}{i}".encode() * (1 + i % 3),
                     headers=(("n", str(i).encode()), ("tag", tag.encode()), ("n", b"again")),
                     timestamp_ms=BASE_TIMESTAMP_MS + 1000 * i)
            for i in range(count)]


def check_consumed(got: list[Consumed], sent: list[Outgoing], topic: str, first_offsets: dict[int, int]) -> None:
    """``got`` holds exactly ``sent``: each record whole, in order within its partition, at dense offsets
    from ``first_offsets``."""
    assert len(got) == len(sent)
    for partition in {r.partition for r in sent}:
        mine = [r for r in got if r.partition == partition]
        expected = [r for r in sent if r.partition == partition]
        first = first_offsets.get(partition, 0)
        assert [r.offset for r in mine] == list(range(first, first + len(expected)))
        assert [(r.topic, r.key, r.value, r.headers, r.timestamp_ms) for r in mine] == \
            [(topic, r.key, r.value, r.headers, r.timestamp_ms) for r in expected]


def by_partition_offsets(acked: list[tuple[int, int]]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for partition, offset in acked:
        out.setdefault(partition, []).append(offset)
    return out


def test_topics_are_created_listed_and_deleted_through_the_admin_api(broker: BrokerProcess, client: Client) -> None:
    topic = fresh("admin", client)
    client.create_topic(broker.bootstrap, topic, 3)
    assert topic in client.list_topics(broker.bootstrap)
    client.delete_topic(broker.bootstrap, topic)
    assert topic not in client.list_topics(broker.bootstrap)


def test_produced_records_are_consumed_whole_in_order_at_dense_offsets(broker: BrokerProcess, client: Client) -> None:
    topic = fresh("whole", client)
    client.create_topic(broker.bootstrap, topic, 3)
    sent = outgoing(12, 3)
    producer = client.producer(broker.bootstrap)
    try:
        acked = producer.send_all(sent, topic)
    finally:
        producer.close()
    assert [p for p, _ in acked] == [r.partition for r in sent]
    assert by_partition_offsets(acked) == {p: [0, 1, 2, 3] for p in range(3)}

    consumer = client.consumer(broker.bootstrap, fresh("whole", client), [topic])
    try:
        [got] = consume_until([consumer], len(sent))
        check_consumed(got, sent, topic, {})
        consumer.commit()
        assert consumer.assignment() == {(topic, p) for p in range(3)}
    finally:
        consumer.close()


def test_a_second_consumer_takes_part_of_the_partitions(broker: BrokerProcess, client: Client) -> None:
    topic = fresh("split", client)
    group = fresh("split", client)
    everything = {(topic, p) for p in range(4)}
    client.create_topic(broker.bootstrap, topic, 4)
    first = client.consumer(broker.bootstrap, group, [topic])
    second = None
    try:
        # Each condition polls, which blocks a while itself: no pause between calls.
        wait_until(lambda: not first.poll() and first.assignment() == everything, "the first to own all",
                   CALL_TIMEOUT_S, poll_s=0)
        second = client.consumer(broker.bootstrap, group, [topic])
        both = (first, second)

        def split() -> bool:
            for c in both:
                c.poll(0.05)
            a, b = first.assignment(), second.assignment()
            return bool(a) and bool(b) and not a & b and a | b == everything

        wait_until(split, "the partitions to be split between the two", CALL_TIMEOUT_S, poll_s=0)
        owned = [first.assignment(), second.assignment()]

        sent = outgoing(8, 4, "after-split")
        producer = client.producer(broker.bootstrap)
        try:
            producer.send_all(sent, topic)
        finally:
            producer.close()
        got = consume_until(both, len(sent))
        for records, mine in zip(got, owned, strict=True):
            assert {(r.topic, r.partition) for r in records} <= mine
        check_consumed(got[0] + got[1], sent, topic, {})
    finally:
        first.close()
        if second is not None:
            second.close()


def test_a_restarted_consumer_resumes_after_its_committed_offsets(broker: BrokerProcess, client: Client) -> None:
    topic = fresh("resume", client)
    group = fresh("resume", client)
    client.create_topic(broker.bootstrap, topic, 2)
    producer = client.producer(broker.bootstrap)
    try:
        before = outgoing(6, 2, "before")
        producer.send_all(before, topic)
        consumer = client.consumer(broker.bootstrap, group, [topic])
        try:
            [got] = consume_until([consumer], len(before))
            check_consumed(got, before, topic, {})
            consumer.commit()
        finally:
            consumer.close()

        after = outgoing(4, 2, "after")
        producer.send_all(after, topic)
    finally:
        producer.close()
    consumer = client.consumer(broker.bootstrap, group, [topic])
    try:
        [got] = consume_until([consumer], len(after))
        got += consumer.poll()  # nothing more comes: the records before the commit stay consumed
        check_consumed(got, after, topic, {0: 3, 1: 3})
    finally:
        consumer.close()


def test_offsets_for_times_finds_the_first_offset_at_or_after_a_timestamp(broker: BrokerProcess,
                                                                           client: Client) -> None:
    topic = fresh("times", client)
    client.create_topic(broker.bootstrap, topic, 1)
    sent = outgoing(5, 1)  # timestamps BASE, BASE + 1 s, ... BASE + 4 s at offsets 0 to 4
    producer = client.producer(broker.bootstrap)
    try:
        producer.send_all(sent, topic)
    finally:
        producer.close()
    find = client.offset_for_time
    assert find(broker.bootstrap, topic, 0, BASE_TIMESTAMP_MS - 1) == 0
    assert find(broker.bootstrap, topic, 0, BASE_TIMESTAMP_MS) == 0
    assert find(broker.bootstrap, topic, 0, BASE_TIMESTAMP_MS + 1500) == 2
    assert find(broker.bootstrap, topic, 0, BASE_TIMESTAMP_MS + 4000) == 4
    assert find(broker.bootstrap, topic, 0, BASE_TIMESTAMP_MS + 4001) is None


def test_an_idempotent_producer_stores_each_record_once(tmp_path: Path, config_path: Path, client: Client) -> None:
    topic = fresh("idempotent", client)
    sent = outgoing(20, 2, "idem")
    with running_broker(tmp_path / "data", "--config", str(config_path)) as process:
        client.create_topic(process.bootstrap, topic, 2)
        producer = client.producer(process.bootstrap, idempotent=True)
        try:
            acked = producer.send_all(sent[:10], topic)
            acked += producer.send_all(sent[10:], topic)
        finally:
            producer.close()
        assert by_partition_offsets(acked) == {p: list(range(10)) for p in range(2)}
        consumer = client.consumer(process.bootstrap, fresh("idempotent", client), [topic])
        try:
            [got] = consume_until([consumer], len(sent))
            got += consumer.poll()
            check_consumed(got, sent, topic, {})
        finally:
            consumer.close()
        assert process.stop() == 0, "".join(process.output)

    # The batches were produced idempotently (a client that fell back to plain produce would pass the
    # above): each carries the producer's id, and its sequences follow on from 0 without a gap.
    store = StreamStore.open(tmp_path / "data")
    try:
        for p in range(2):
            headers = [check_batch(memoryview(bytes(b.body)), 0, batch_bytes_max=1 << 20)
                       for b in store.open_stream(f"{topic}/{p}").fetch_batches(0)]
            [producer_id] = {h.producer_id for h in headers}
            assert producer_id >= 0
            sequences = [(h.base_sequence, h.record_count) for h in headers]
            assert [s for s, _ in sequences] == list(itertools.accumulate([0] + [n for _, n in sequences[:-1]]))
            assert sum(n for _, n in sequences) == 10
    finally:
        store.close()


def test_records_cross_between_kafka_clients_and_the_python_api(tmp_path: Path, config_path: Path,
                                                                client: Client) -> None:
    data_dir = tmp_path / "data"
    topic = fresh("cross", client)
    from_kafka = outgoing(4, 2, "kafka")
    with running_broker(data_dir, "--config", str(config_path)) as first:
        client.create_topic(first.bootstrap, topic, 2)
        producer = client.producer(first.bootstrap)
        try:
            producer.send_all(from_kafka, topic)
        finally:
            producer.close()
        assert first.stop() == 0, "".join(first.output)

    from_api = {p: [NewRecord(f"api-{p}-{i}".encode(), key=None if i else f"api-key-{p}".encode(),
                              timestamp_ms=BASE_TIMESTAMP_MS + 10_000 + i,
                              headers=(("source", b"python"), ("i", str(i).encode())))
                    for i in range(3)] for p in range(2)}
    store = StreamStore.open(data_dir)
    try:
        for p in range(2):
            stream = store.open_stream(f"{topic}/{p}")
            mine = [r for r in from_kafka if r.partition == p]
            assert stream.fetch(0) == [Record(i, r.timestamp_ms or 0, r.key, r.value, r.headers)
                                       for i, r in enumerate(mine)]
            assert stream.append(from_api[p]).result(CALL_TIMEOUT_S) == len(mine)
    finally:
        store.close()

    with running_broker(data_dir, "--config", str(config_path)) as second:
        consumer = client.consumer(second.bootstrap, fresh("cross", client), [topic])
        try:
            [got] = consume_until([consumer], len(from_kafka) + 6)
        finally:
            consumer.close()
        assert second.stop() == 0, "".join(second.output)
    as_outgoing = [Outgoing(p, r.key, r.value, tuple(r.headers), r.timestamp_ms)
                   for p in range(2) for r in from_api[p]]
    check_consumed(got, from_kafka + as_outgoing, topic, {})


def test_a_stopping_broker_closes_idle_client_connections_at_once(tmp_path: Path, config_path: Path,
                                                                  client: Client) -> None:
    topic = fresh("idle", client)
    with running_broker(tmp_path / "data", "--config", str(config_path)) as process:
        producer = client.producer(process.bootstrap)
        try:
            producer.send_all(outgoing(2, 1), topic)  # connected, acknowledged, then idle
            assert process.stop() == 0, "".join(process.output)
            process.close_output()  # every line the broker wrote, up to its exit
            # A stop that waited on the idle connections as on requests in flight would say so after its
            # 10 s: asserted by what the broker says, not by a time a loaded machine may exceed.
            assert not any(IN_FLIGHT_AT_STOP in line for line in process.output), "".join(process.output)
        finally:
            producer.close()
            with warnings.catch_warnings():
                # kafka-python, reconnecting to the stopped broker, drops the socket of the refused attempt
                # unclosed; collect it here, where its ResourceWarning is the client's and expected.
                warnings.simplefilter("ignore", ResourceWarning)
                gc.collect()
