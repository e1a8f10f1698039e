"""Fetch v13 to v18 through a real broker: topics named by id (KIP-516), sessions that keep to one way of
naming them, and UNKNOWN_TOPIC_ID for an id the broker does not know. (librdkafka's consumer, on v16, reads
50 partitions in test_broker_fetch_sessions.py.)"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode

from brokerkit import BrokerProcess, running_broker
from stratalog.broker.api_fetch import APIS
from stratalog.kafka.api_keys import ApiKey
from stratalog.kafka.build import build
from stratalog.kafka.client import KafkaConnection
from stratalog.kafka.codec import load_request_schema

TOPIC = "by-id"
PARTITIONS = 8
RECORDS_PER_PARTITION = 10
VERSIONS = range(13, 19)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with running_broker(tmp_path_factory.mktemp("versions") / "data") as b:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(timeout=60)
        producer = confluent_kafka.Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 5})
        for p in range(PARTITIONS):
            for i in range(RECORDS_PER_PARTITION):
                producer.produce(TOPIC, value=f"{p}:{i}".encode(), partition=p)
        assert producer.flush(60) == 0
        yield b


def topic_id(connection: KafkaConnection, name: str) -> uuid.UUID:
    response = connection.call(ApiKey.METADATA, 12, build(load_request_schema(ApiKey.METADATA, 12), {
        "topics": [{"name": name, "topic_id": uuid.UUID(int=0)}], "allow_auto_topic_creation": False,
        "include_topic_authorized_operations": False}))
    (topic,) = response.topics
    assert topic.error_code == 0
    return topic.topic_id


def fetch_body(version: int, topics: dict[uuid.UUID, dict[int, int]], session_id: int = 0, epoch: int = -1,
               forgotten: dict[uuid.UUID, list[int]] | None = None) -> Any:
    """A Fetch of ``version`` (13+): ``topics`` {topic id: {partition: fetch offset}}, no wait."""
    name = "topic_id" if version >= 13 else "topic"
    return build(load_request_schema(ApiKey.FETCH, version), {
        "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 19, "session_id": session_id, "session_epoch": epoch,
        "topics": [{name: t, "partitions": [{"partition": p, "fetch_offset": o, "partition_max_bytes": 1 << 16}
                                            for p, o in partitions.items()]} for t, partitions in topics.items()],
        "forgotten_topics_data": [{name: t, "partitions": ps} for t, ps in (forgotten or {}).items()]})


def answered(response: Any) -> dict[tuple[uuid.UUID, int], tuple[int, int, int]]:
    """(topic id, partition) -> (error code, high watermark, record bytes) of every partition answered."""
    return {(t.topic_id, p.partition_index): (p.error_code, p.high_watermark, len(p.records or b""))
            for t in response.responses for p in t.partitions}


def test_fetch_is_served_up_to_v18() -> None:
    (fetch,) = APIS
    assert (fetch.min_version, fetch.max_version) == (4, 18)


@pytest.mark.parametrize("version", VERSIONS)
def test_topics_are_named_by_id_and_an_unknown_id_is_answered_unknown_topic_id(broker: BrokerProcess,
                                                                                version: int) -> None:
    unknown, zero = uuid.uuid4(), uuid.UUID(int=0)
    with KafkaConnection(broker.bootstrap, {}) as connection:
        known = topic_id(connection, TOPIC)
        response = connection.call(ApiKey.FETCH, version, fetch_body(
            version, {known: {0: 0, 7: 4}, unknown: {0: 0}, zero: {1: 0}}))
    got = answered(response)
    assert got[(known, 0)][:2] == (0, RECORDS_PER_PARTITION) and got[(known, 0)][2] > 0
    assert got[(known, 7)][:2] == (0, RECORDS_PER_PARTITION) and got[(known, 7)][2] > 0
    assert got[(unknown, 0)] == (ErrorCode.unknown_topic_id, -1, 0)
    assert got[(None, 1)] == (ErrorCode.unknown_topic_id, -1, 0), "the zero id (kio reads it as None)"
    assert [t.topic_id for t in response.responses] == [known, unknown, None]


def test_a_session_by_id_keeps_to_ids(broker: BrokerProcess) -> None:
    with KafkaConnection(broker.bootstrap, {}) as connection:
        known = topic_id(connection, TOPIC)
        first = connection.call(ApiKey.FETCH, 16, fetch_body(16, {known: {1: 0, 2: 0}}, epoch=0))
        session_id = first.session_id
        assert session_id != 0 and set(answered(first)) == {(known, 1), (known, 2)}
        moved = connection.call(ApiKey.FETCH, 16, fetch_body(16, {known: {1: RECORDS_PER_PARTITION}}, session_id, 1,
                                                              forgotten={known: [2]}))
        assert (moved.error_code, answered(moved)) == (0, {})
        by_name = connection.call(ApiKey.FETCH, 12, build(load_request_schema(ApiKey.FETCH, 12), {
            "max_wait": 0, "min_bytes": 0, "session_id": session_id, "session_epoch": 2, "topics": [],
            "forgotten_topics_data": []}))
        assert (by_name.error_code, by_name.session_id) == (ErrorCode.fetch_session_topic_id_error, 0)
        again = connection.call(ApiKey.FETCH, 17, fetch_body(17, {known: {3: 0}}, session_id, 2))
        assert set(answered(again)) == {(known, 3)}, "2 forgotten; 1 unchanged; 3 added"
        connection.call(ApiKey.FETCH, 17, fetch_body(17, {}, session_id, -1))
