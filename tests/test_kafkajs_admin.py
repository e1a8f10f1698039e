"""KafkaJS's admin client (npm's kafkajs, tests/kafkajs/) against a real broker: alterConfigs turns a topic
compacted, describeConfigs reads it back (as confluent-kafka's AdminClient does) and reads the broker's
configs under Kafka's names, refusals carry the error types Kafka gives, and keyed records go through.

KafkaJS speaks AlterConfigs (API 33), not IncrementalAlterConfigs, and reports each error by its Kafka type
(``INVALID_CONFIG``), without the broker's message: the type is what the test holds the broker to.
test_broker_alter_configs.py shows the same APIs through kafka-python and librdkafka.

kafkajs_kit.py installs the node packages (``npm ci`` from tests/kafkajs/package-lock.json, into the pytest
cache, once per lock). The script, tests/kafkajs/admin.js, runs once per module and prints what it saw as one
JSON document; the tests below assert on it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from appkit import refused_requests
from brokerkit import BrokerProcess, running_broker
from kafkajs_kit import installed, run_script

pytestmark = pytest.mark.slow

#: The script takes a few seconds; this only keeps a hang from stalling the run (its consumer gives up at 60 s).
SCRIPT_TIMEOUT_S = 240
#: What admin.js sets with alterConfigs (its TOPIC_CONFIGS).
TOPIC_CONFIGS = {"cleanup.policy": "compact", "retention.ms": "3600000", "min.cleanable.dirty.ratio": "0.25"}
#: What admin.js produces, in order (its RECORDS).
RECORDS = [("k1", "v1"), ("k2", "v2"), ("k1", "v1-again")]
#: DescribeConfigs' resource types and config sources, as KafkaJS reports them.
RESOURCE_TOPIC, RESOURCE_BROKER = 2, 4
SOURCE_TOPIC, SOURCE_STATIC_BROKER, SOURCE_DEFAULT = 1, 4, 5


@pytest.fixture(scope="module")
def kafkajs(pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return installed(pytestconfig, tmp_path_factory)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with running_broker(tmp_path_factory.mktemp("kafkajs") / "data") as process:
        yield process
        assert process.stop() == 0, "".join(process.output)


@pytest.fixture(scope="module")
def topic() -> str:
    return f"kafkajs-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def seen(kafkajs: Path, broker: BrokerProcess, topic: str) -> dict[str, Any]:
    """What admin.js saw: one run of every step, against the module's broker."""
    return run_script(kafkajs, "admin.js", broker, topic, timeout_s=SCRIPT_TIMEOUT_S)


def _only(resources: list[dict[str, Any]]) -> dict[str, Any]:
    assert len(resources) == 1, resources
    assert resources[0]["errorCode"] == 0, resources[0]
    return resources[0]


def test_alter_configs_sets_a_topics_configs_as_describe_configs_reads_them(seen: dict[str, Any],
                                                                            topic: str) -> None:
    assert seen["created"] is True
    assert seen["altered"] == [{"errorCode": 0, "resourceName": topic}]
    described = _only(seen["topicConfigs"])
    assert (described["resourceType"], described["resourceName"]) == (RESOURCE_TOPIC, topic)
    configs = described["configs"]
    for name, value in TOPIC_CONFIGS.items():
        assert configs[name] == {"value": value, "isDefault": False, "readOnly": False,
                                 "configSource": SOURCE_TOPIC}, name
    # AlterConfigs sets the whole set: the rest are the defaults, shown as such.
    assert configs["retention.bytes"] == {"value": "-1", "isDefault": True, "readOnly": False,
                                          "configSource": SOURCE_DEFAULT}
    assert configs["delete.retention.ms"]["value"] == "86400000" and configs["delete.retention.ms"]["isDefault"]


def test_confluent_kafka_reads_the_configs_kafkajs_set(seen: dict[str, Any], broker: BrokerProcess,
                                                       topic: str) -> None:
    assert seen["altered"] == [{"errorCode": 0, "resourceName": topic}]
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    resource = ConfigResource(ResourceType.TOPIC, topic)
    entries = admin.describe_configs([resource])[resource].result(30)
    assert {name: (entries[name].value, entries[name].is_default) for name in TOPIC_CONFIGS} == {
        name: (value, False) for name, value in TOPIC_CONFIGS.items()}
    assert (entries["retention.bytes"].value, entries["retention.bytes"].is_default) == ("-1", True)


def test_describe_configs_of_the_broker_shows_kafkas_names(seen: dict[str, Any]) -> None:
    node_id = seen["cluster"]["brokers"][0]
    assert seen["cluster"] == {"controller": node_id, "brokers": [node_id]}
    described = _only(seen["brokerConfigs"])
    assert (described["resourceType"], described["resourceName"]) == (RESOURCE_BROKER, str(node_id))
    configs = {name: entry["value"] for name, entry in described["configs"].items()}
    assert configs["broker.id"] == str(node_id)
    assert configs["log.retention.ms"] == "604800000"
    assert configs["log.retention.bytes"] == "-1"
    assert int(configs["message.max.bytes"]) > 0
    assert configs["auto.create.topics.enable"] == "true"
    assert configs["num.partitions"] == "1" and configs["default.replication.factor"] == "1"
    assert configs["stratalog.object.store.uri"].startswith("file://")
    assert all(entry["readOnly"] and entry["configSource"] == SOURCE_STATIC_BROKER
               for entry in described["configs"].values()), "a broker's configs are static"


def test_an_invalid_value_and_an_unknown_name_are_invalid_config(seen: dict[str, Any]) -> None:
    # Kafka answers both with INVALID_CONFIG ("Unknown topic config name" for the second); KafkaJS raises
    # its protocol error of that type, and does not retry it.
    invalid_config = {"name": "KafkaJSProtocolError", "type": "INVALID_CONFIG", "code": 40, "retriable": False,
                      "message": "Configuration is invalid"}
    assert seen["invalidValue"] == invalid_config
    assert seen["unknownName"] == invalid_config


def test_an_alter_of_an_unknown_topic_is_unknown_topic_or_partition(seen: dict[str, Any]) -> None:
    assert seen["unknownTopic"]["name"] == "KafkaJSProtocolError"
    assert (seen["unknownTopic"]["type"], seen["unknownTopic"]["code"]) == ("UNKNOWN_TOPIC_OR_PARTITION", 3)


def test_a_refused_alter_changes_nothing(seen: dict[str, Any]) -> None:
    assert _only(seen["topicConfigsAfterRefusals"])["configs"] == _only(seen["topicConfigs"])["configs"]


def test_keyed_records_go_through_the_compacted_topic(seen: dict[str, Any]) -> None:
    assert seen["produced"] == [{"errorCode": 0, "baseOffset": "0"}]
    assert seen["consumed"] == [{"offset": str(offset), "key": key, "value": value}
                                for offset, (key, value) in enumerate(RECORDS)]


def test_kafkajs_asks_for_nothing_the_broker_does_not_serve(seen: dict[str, Any], broker: BrokerProcess) -> None:
    assert "consumed" in seen
    refused = refused_requests(broker)
    assert not refused, f"KafkaJS asked for what the broker does not serve: {refused}"
