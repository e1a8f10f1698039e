"""A broker's configs as DescribeConfigs shows them (broker_configs.py), from its BrokerConfig alone: the
listeners under Kafka's ``listeners`` and ``advertised.listeners``. test_broker_alter_configs.py shows
them to Kafka clients from a running broker."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from stratalog.broker.broker_configs import broker_configs
from stratalog.broker.config import BrokerConfig
from stratalog.broker.listeners import Listener, SecurityProtocol

if TYPE_CHECKING:
    from stratalog.broker.broker import Broker


@dataclass
class _BrokerStandIn:
    """What broker_configs reads of a Broker."""

    config: BrokerConfig
    object_store_uri: str = "file:///data/objects"


def configs_of(config: BrokerConfig) -> dict[str, str]:
    return {e.name: e.value for e in broker_configs(cast("Broker", _BrokerStandIn(config)))}


def test_advertised_listeners_are_what_metadata_tells_clients() -> None:
    listeners = (Listener(SecurityProtocol.PLAINTEXT, "127.0.0.1", 9092),
                 Listener(SecurityProtocol.SASL_SSL, "0.0.0.0", 9093, advertised_host="broker.example",
                          advertised_port=19093))
    configs = configs_of(BrokerConfig(listeners=listeners))
    assert configs["listeners"] == "PLAINTEXT://127.0.0.1:9092,SASL_SSL://0.0.0.0:9093"
    assert configs["advertised.listeners"] == "PLAINTEXT://127.0.0.1:9092,SASL_SSL://broker.example:19093"


def test_an_ipv6_listener_is_written_in_brackets_as_kafka_writes_it() -> None:
    configs = configs_of(BrokerConfig(listeners=(Listener(SecurityProtocol.SSL, "::1", 9094),)))
    assert configs["listeners"] == configs["advertised.listeners"] == "SSL://[::1]:9094"


def test_the_configs_are_in_name_order_each_once() -> None:
    names = [e.name for e in broker_configs(cast("Broker", _BrokerStandIn(BrokerConfig())))]
    assert names == sorted(set(names))
    assert {"listeners", "advertised.listeners", "log.retention.ms", "message.max.bytes"} <= set(names)
