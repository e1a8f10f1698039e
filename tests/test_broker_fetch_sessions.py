"""Fetch sessions (KIP-227) through a real broker: kafka-python's consumer fetches incrementally after its first
fetch and reads every record of 50 partitions once; librdkafka (which asks for no session: epoch -1; Fetch v16,
topics by id) and aiokafka read them too; a raw client gets Kafka's session errors; a hostile one cannot grow
the cache past its bounds, nor slow the others down with huge forgotten lists or lying array counts."""

from __future__ import annotations

import asyncio
import datetime
import itertools
import struct
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiokafka
import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode

from brokerkit import BrokerProcess, metrics_address, running_broker, scrape_metrics
from stratalog.kafka.api_keys import ApiKey
from stratalog.kafka.build import build
from stratalog.kafka.client import BrokerConnectionError, KafkaConnection
from stratalog.kafka.codec import FRAME_SIZE, encode_request, load_request_schema
from waiting import wait_until

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaConsumer, TopicPartition

PARTITIONS = 50
RECORDS_PER_PARTITION = 20
TOPIC = "sessions"
_ids = itertools.count()


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(timeout=60)


def produce(bootstrap: str, topic: str, partitions: int, per_partition: int, tag: str = "") -> None:
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for p in range(partitions):
        for i in range(per_partition):
            producer.produce(topic, value=f"{tag}{p}:{i}".encode(), partition=p)
    assert producer.flush(60) == 0


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with running_broker(tmp_path_factory.mktemp("sessions") / "data", "--metrics-listen", "127.0.0.1:0") as b:
        create_topic(b.bootstrap, TOPIC, PARTITIONS)
        produce(b.bootstrap, TOPIC, PARTITIONS, RECORDS_PER_PARTITION)
        yield b


def fetch_counts(broker: BrokerProcess) -> dict[str, float]:
    metrics = scrape_metrics(metrics_address(broker.output))
    counts = {labels[0][1]: value for (name, labels), value in metrics.items()
              if name == "stratalog_fetch_requests_total"}
    counts["sessions"] = metrics[("stratalog_fetch_sessions", ())]
    counts["fetch v16"] = metrics.get(("kafka_network_requestmetrics_requests_total",
                                       (("request", "Fetch"), ("version", "16"))), 0)
    return counts


def assert_exactly_once(got: list[tuple[int, int, bytes]], partitions: int, per_partition: int) -> None:
    """Every (partition, offset) once, each with the value produced there."""
    assert sorted((p, o) for p, o, _ in got) == [(p, o) for p in range(partitions) for o in range(per_partition)]
    assert all(value == f"{p}:{o}".encode() for p, o, value in got)


def read_with_kafka_python(bootstrap: str, partitions: int, per_partition: int
                           ) -> tuple[list[tuple[int, int, bytes]], list[Any]]:
    """Every record of TOPIC's first ``partitions`` through kafka-python's consumer, then five polls more
    (fetches with nothing new): (partition, offset, value) of each, and what the five polls got."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=100,
                             auto_offset_reset="earliest")
    consumer.assign([TopicPartition(TOPIC, p) for p in range(partitions)])
    got: list[tuple[int, int, bytes]] = []
    try:
        def read_all() -> bool:
            for records in consumer.poll(timeout_ms=500).values():
                got.extend((r.partition, r.offset, r.value) for r in records)
            return len(got) >= partitions * per_partition
        wait_until(read_all, lambda: f"every record read (got {len(got)})", poll_s=0)
        return got, [consumer.poll(timeout_ms=300) for _ in range(5)]
    finally:
        consumer.close()


def test_kafka_python_fetches_incrementally_after_its_first_fetch_and_reads_each_record_once(
        broker: BrokerProcess) -> None:
    before = fetch_counts(broker)
    got, polls = read_with_kafka_python(broker.bootstrap, PARTITIONS, RECORDS_PER_PARTITION)
    assert not any(polls), "nothing more to read"
    assert_exactly_once(got, PARTITIONS, RECORDS_PER_PARTITION)
    after = fetch_counts(broker)
    full = after["full"] - before["full"]
    incremental = after["incremental"] - before["incremental"]
    assert 1 <= full <= 3, "one full fetch makes the session (a metadata refresh may start another)"
    assert incremental >= 5 and incremental > 2 * full, (full, incremental)
    assert after["refused"] == before["refused"]


def test_librdkafka_asks_for_no_session_and_reads_each_record_once_with_fetch_v16(broker: BrokerProcess) -> None:
    before = fetch_counts(broker)
    consumer = confluent_kafka.Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "unused",
                                         "enable.auto.commit": False, "fetch.wait.max.ms": 100})
    consumer.assign([confluent_kafka.TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
    got: list[tuple[int, int, bytes]] = []
    try:
        def read_all() -> bool:
            for message in consumer.consume(500, timeout=0.5):
                assert message.error() is None, message.error()
                got.append((message.partition(), message.offset(), message.value()))
            return len(got) >= PARTITIONS * RECORDS_PER_PARTITION
        wait_until(read_all, lambda: f"every record read (got {len(got)})", poll_s=0)
        assert consumer.consume(100, timeout=1.0) == []
    finally:
        consumer.close()
    assert_exactly_once(got, PARTITIONS, RECORDS_PER_PARTITION)
    after = fetch_counts(broker)
    assert after["sessionless"] > before["sessionless"], "librdkafka's fetches carry session epoch -1"
    assert after["fetch v16"] > before["fetch v16"], "librdkafka 2.x asks for v16: topics by id"


def test_aiokafka_reads_each_record_once(broker: BrokerProcess) -> None:
    async def read() -> list[tuple[int, int, bytes]]:
        consumer = aiokafka.AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False,
                                             auto_offset_reset="earliest", fetch_max_wait_ms=100)
        await consumer.start()
        got: list[tuple[int, int, bytes]] = []
        try:
            consumer.assign([aiokafka.TopicPartition(TOPIC, p) for p in range(PARTITIONS)])
            while len(got) < PARTITIONS * RECORDS_PER_PARTITION:
                batches = await asyncio.wait_for(consumer.getmany(timeout_ms=500), 60)
                got += [(r.partition, r.offset, r.value) for records in batches.values() for r in records]
        finally:
            await consumer.stop()
        return got

    assert_exactly_once(asyncio.run(read()), PARTITIONS, RECORDS_PER_PARTITION)


# Raw fetches ----------------------------------------------------------------------------------------


def fetch_body(version: int, topics: dict[str, dict[int, int]], session_id: int = 0, epoch: int = 0,
               forgotten: dict[str, list[int]] | None = None, max_bytes: int = 1 << 19) -> Any:
    """A Fetch request of ``version``: ``topics`` {name: {partition: fetch offset}}, no wait."""
    return build(load_request_schema(ApiKey.FETCH, version), {
        "max_wait": 0, "min_bytes": 0, "max_bytes": max_bytes, "session_id": session_id, "session_epoch": epoch,
        "topics": [{"topic": name, "partitions": [{"partition": p, "fetch_offset": o, "partition_max_bytes": 1 << 16}
                                                  for p, o in partitions.items()]}
                   for name, partitions in topics.items()],
        "forgotten_topics_data": [{"topic": name, "partitions": ps} for name, ps in (forgotten or {}).items()]})


def answered(response: Any) -> dict[tuple[str, int], tuple[int, int, int]]:
    """(topic, partition) -> (error code, high watermark, record bytes) of every partition answered."""
    return {(t.topic, p.partition_index): (p.error_code, p.high_watermark, len(p.records or b""))
            for t in response.responses for p in t.partitions}


def test_a_session_answers_what_changed_and_refuses_wrong_epochs_and_unknown_ids(broker: BrokerProcess) -> None:
    topic = f"raw-{next(_ids)}"
    create_topic(broker.bootstrap, topic, 2)
    produce(broker.bootstrap, topic, 2, 3)
    with KafkaConnection(broker.bootstrap, {}, client_id="raw") as connection:
        first = connection.call(ApiKey.FETCH, 12, fetch_body(12, {topic: {0: 0, 1: 0}}))
        assert first.error_code == 0 and first.session_id != 0
        assert {k: v[:2] for k, v in answered(first).items()} == {(topic, 0): (0, 3), (topic, 1): (0, 3)}
        session_id = first.session_id
        # The consumer moves its offsets to the ends: it names both partitions again, once.
        moved = connection.call(ApiKey.FETCH, 12, fetch_body(12, {topic: {0: 3, 1: 3}}, session_id, 1))
        assert (moved.error_code, moved.session_id, answered(moved)) == (0, session_id, {})
        quiet = connection.call(ApiKey.FETCH, 12, fetch_body(12, {}, session_id, 2))
        assert (quiet.error_code, answered(quiet)) == (0, {}), "nothing changed: nothing answered"
        produce(broker.bootstrap, topic, 1, 1, tag="late ")
        news = connection.call(ApiKey.FETCH, 12, fetch_body(12, {}, session_id, 3))
        ((key, (error, high, size)),) = answered(news).items()
        assert key == (topic, 0) and error == 0 and high == 4 and size > 0, "only the partition with news"
        for epoch in (3, 9):   # the session is at 4: a replay, and a guess
            refused = connection.call(ApiKey.FETCH, 12, fetch_body(12, {}, session_id, epoch))
            assert (refused.error_code, refused.session_id, refused.responses) == (
                ErrorCode.invalid_fetch_session_epoch, 0, ())
        unknown = connection.call(ApiKey.FETCH, 12, fetch_body(12, {}, session_id ^ 1, 1))
        assert (unknown.error_code, unknown.responses) == (ErrorCode.fetch_session_id_not_found, ())
        # Epoch -1 closes the session (and answers as a fetch without one); the id is gone after it.
        closing = connection.call(ApiKey.FETCH, 12, fetch_body(12, {topic: {1: 0}}, session_id, -1))
        assert closing.session_id == 0 and set(answered(closing)) == {(topic, 1)}
    with KafkaConnection(broker.bootstrap, {}, client_id="raw-again") as other:
        gone = other.call(ApiKey.FETCH, 12, fetch_body(12, {}, session_id, 4))
        assert gone.error_code == ErrorCode.fetch_session_id_not_found


def test_a_session_outlives_its_connection(broker: BrokerProcess) -> None:
    """Sessions are kept by id, as Kafka keeps them: a consumer that reconnects goes on with its session."""
    with KafkaConnection(broker.bootstrap, {}) as connection:
        session_id = connection.call(ApiKey.FETCH, 12, fetch_body(12, {TOPIC: {0: 0}})).session_id
    with KafkaConnection(broker.bootstrap, {}) as connection:
        again = connection.call(ApiKey.FETCH, 12, fetch_body(12, {}, session_id, 1))
    assert (again.error_code, again.session_id) == (0, session_id)


# A hostile client ------------------------------------------------------------------------------------

SMALL_CACHE = """\
fetch_sessions_max = 3
fetch_session_partitions_max = 100
fetch_session_cache_partitions_max = 200
"""


@pytest.fixture(scope="module")
def small_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    root = tmp_path_factory.mktemp("small-cache")
    (root / "broker.toml").write_text(SMALL_CACHE)
    with running_broker(root / "data", "--config", str(root / "broker.toml"), "--metrics-listen", "127.0.0.1:0") as b:
        create_topic(b.bootstrap, TOPIC, 4)
        produce(b.bootstrap, TOPIC, 4, RECORDS_PER_PARTITION)
        yield b


def test_the_cache_stays_bounded_and_a_consumer_still_reads_everything(small_cache: BrokerProcess) -> None:
    everything = {p: 0 for p in range(4)}
    made = []
    with KafkaConnection(small_cache.bootstrap, {}) as hostile:
        try:
            for _ in range(10):
                response = hostile.call(ApiKey.FETCH, 12, fetch_body(12, {TOPIC: everything}))
                assert all(error == 0 and size > 0 for error, _, size in answered(response).values())
                made.append(response.session_id)
            too_many = hostile.call(ApiKey.FETCH, 12, fetch_body(12, {f"t{i}": {0: 0} for i in range(101)}))
            assert too_many.session_id == 0 and len(answered(too_many)) == 101, "past the partitions a session keeps"
            assert len([m for m in made if m]) == 3 and made[3:] == [0] * 7, "three sessions fit; no room for more"
            assert fetch_counts(small_cache)["sessions"] == 3
            read_everything(small_cache)
        finally:
            close_sessions(hostile, made)


def close_sessions(connection: KafkaConnection, session_ids: list[int]) -> None:
    for session_id in session_ids:
        if session_id:
            connection.call(ApiKey.FETCH, 12, fetch_body(12, {}, session_id, -1))


def read_everything(small_cache: BrokerProcess) -> None:
    """A consumer that finds the cache full reads everything all the same, without a session."""
    got, _ = read_with_kafka_python(small_cache.bootstrap, 4, RECORDS_PER_PARTITION)
    assert_exactly_once(got, 4, RECORDS_PER_PARTITION)


def test_a_huge_forgotten_list_is_answered_and_slows_no_one(small_cache: BrokerProcess) -> None:
    huge = {f"gone-{i}": list(range(1000)) for i in range(300)}   # 300,000 partitions, about 1.3 MB
    with KafkaConnection(small_cache.bootstrap, {}) as hostile, KafkaConnection(small_cache.bootstrap, {}) as other:
        session_id = hostile.call(ApiKey.FETCH, 12, fetch_body(12, {TOPIC: {0: 0, 1: 0}})).session_id
        assert session_id != 0
        try:
            response = hostile.call(ApiKey.FETCH, 12, fetch_body(12, {}, session_id, 1, forgotten=huge))
            assert (response.error_code, response.session_id) == (0, session_id)
            again = hostile.call(ApiKey.FETCH, 12, fetch_body(12, {}, session_id, 2, forgotten={TOPIC: [0, 1], **huge}))
            assert again.session_id == 0, "every partition forgotten: the session is closed"
            fine = other.call(ApiKey.FETCH, 12, fetch_body(12, {TOPIC: {2: 0}}, 0, -1))
            assert answered(fine)[(TOPIC, 2)][0] == 0
        finally:
            close_sessions(hostile, [session_id])


def test_a_forgotten_list_that_lies_about_its_length_closes_only_its_connection(small_cache: BrokerProcess) -> None:
    marker = 0x0A0B0C0D
    body = fetch_body(7, {TOPIC: {0: 0}}, 0, 0, forgotten={"x": [marker]})
    frame = encode_request(ApiKey.FETCH, 7, 1, "liar", body)
    honest = struct.pack(">ii", 1, marker)
    assert frame.count(honest) == 1
    lying = frame.replace(honest, struct.pack(">ii", 1 << 30, marker))   # a billion partitions in 4 bytes
    with KafkaConnection(small_cache.bootstrap, {}) as liar, pytest.raises(BrokerConnectionError, match="closed"):
        liar.exchange(FRAME_SIZE.pack(len(lying)) + lying)
    with KafkaConnection(small_cache.bootstrap, {}) as other:
        assert answered(other.call(ApiKey.FETCH, 7, fetch_body(7, {TOPIC: {3: 0}})))[(TOPIC, 3)][0] == 0


def test_the_session_bounds_are_checked_at_start(tmp_path: Path) -> None:
    (tmp_path / "broker.toml").write_text("fetch_session_partitions_max = 10\nfetch_session_cache_partitions_max = 5\n")
    with pytest.raises(RuntimeError, match="fetch_session_partitions_max"), \
            running_broker(tmp_path / "data", "--config", str(tmp_path / "broker.toml")):
        pass


def test_session_errors_are_kafkas(broker: BrokerProcess) -> None:
    """The top-level error and session id of a refused fetch, as Kafka's SessionErrorContext answers them."""
    with KafkaConnection(broker.bootstrap, {}) as connection:
        response = connection.call(ApiKey.FETCH, 7, fetch_body(7, {TOPIC: {0: 0}}, 7, 3))
    assert (response.error_code, response.session_id, response.throttle_time) == (
        ErrorCode.fetch_session_id_not_found, 0, datetime.timedelta(0))
