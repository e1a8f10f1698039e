"""AlterConfigs (API 33) as kafka-python's and librdkafka's alter_configs send it: the configs given become
a topic's whole set, those left out return to their defaults; a broker's configs are shown by DescribeConfigs
under Kafka's names and are refused to an alter (they are static)."""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from brokerkit import BrokerProcess, running_broker

with warnings.catch_warnings():   # kafka-python imports a deprecated importlib API
    warnings.simplefilter("ignore", DeprecationWarning)
    import kafka.admin

pytestmark = pytest.mark.slow



@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with running_broker(tmp_path_factory.mktemp("alter") / "data") as process:
        yield process
        assert process.stop() == 0, "".join(process.output)


def alter(client: kafka.admin.KafkaAdminClient, resource_type: str, name: str, configs: dict[str, str]) -> str:
    """One AlterConfigs (not the incremental API kafka-python prefers): "OK" or the error it reports."""
    result = client.alter_configs([kafka.admin.ConfigResource(resource_type, name, configs)], incremental=False,
                                  raise_on_unknown=False)
    return str(result[resource_type.lower()][name])


def topic_configs(admin: AdminClient, topic: str) -> dict[str, tuple[str, bool]]:
    resource = ConfigResource(ResourceType.TOPIC, topic)
    entries = admin.describe_configs([resource])[resource].result(30)
    return {name: (entry.value, entry.is_default) for name, entry in entries.items()}


def test_alter_configs_replaces_a_topics_whole_set(broker: BrokerProcess) -> None:
    topic = f"altered-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, config={"retention.bytes": "1048576"})])[topic].result(30)
    client = kafka.admin.KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        # kafka-python sends the topic's other set configs along (it reads them first): so do they stay.
        assert alter(client, "TOPIC", topic, {"retention.ms": "60000"}) == "OK"
        assert topic_configs(admin, topic)["retention.bytes"] == ("1048576", False)
        # librdkafka sends what it is given: what it leaves out returns to its default.
        resource = ConfigResource(ResourceType.TOPIC, topic, set_config={"retention.ms": "120000"})
        with warnings.catch_warnings():   # librdkafka calls its AlterConfigs deprecated: it is what is tested
            warnings.simplefilter("ignore", DeprecationWarning)
            future = admin.alter_configs([resource])[resource]
        future.result(30)
        configs = topic_configs(admin, topic)
        assert configs["retention.ms"] == ("120000", False)
        assert configs["retention.bytes"] == ("-1", True), "left out of the set: back to its default"
        refused = alter(client, "TOPIC", topic, {"retention.ms": "soon"})
        assert refused.startswith("[Error 40] InvalidConfigurationError") and "retention.ms" in refused
        assert topic_configs(admin, topic)["retention.ms"] == ("120000", False), "a refused alter changes nothing"
    finally:
        client.close()


def test_a_brokers_configs_show_under_kafkas_names_and_are_not_altered(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    resource = ConfigResource(ResourceType.BROKER, "0")
    entries = admin.describe_configs([resource])[resource].result(30)
    assert entries["auto.create.topics.enable"].value == "true"
    assert entries["num.partitions"].value == "1" and entries["default.replication.factor"].value == "1"
    assert entries["log.retention.ms"].value == "604800000"
    assert entries["max.incremental.fetch.session.cache.slots"].value == "1000"
    assert entries["stratalog.object.store.uri"].value.startswith("file://")
    # The port as bound (the broker listens on port 0): what Metadata gives clients.
    assert entries["listeners"].value == entries["advertised.listeners"].value == f"PLAINTEXT://{broker.bootstrap}"
    assert all(e.is_read_only for e in entries.values())
    client = kafka.admin.KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        refused = alter(client, "BROKER", "0", {"num.partitions": "3"})
        assert refused.startswith("[Error 42] InvalidRequestError") and "static" in refused
    finally:
        client.close()
    assert admin.describe_configs([resource])[resource].result(30)["num.partitions"].value == "1"
