"""The broker's settings as DescribeConfigs shows them for a BROKER resource: under Kafka's broker config
names where Kafka has the setting (so `kafka-configs --describe --entity-type brokers`, admin UIs and
Kafka Connect's checks find them), and under ``stratalog.*`` names for the broker's own. All are static:
set in the ``--config`` file or by ``serve``'s flags, read only here (AlterConfigs on a broker is refused).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from stratalog.broker.listeners import Listener
from stratalog.broker.topic_configs import SPECS, TYPE_INT, TYPE_LONG, TYPE_STRING
from stratalog.objects.uri import OBJECT_STORE_CONFIG

if TYPE_CHECKING:
    from stratalog.broker.broker import Broker

#: Kafka's ConfigDef.Type numbers not in topic_configs (the wire's config_type, DescribeConfigs v3+).
TYPE_BOOLEAN = 1
#: Kafka's own answer for an unlimited int setting (max.connections.per.ip's default).
INT_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class BrokerConfigEntry:
    name: str
    value: str
    config_type: int
    doc: str


def broker_configs(broker: Broker) -> list[BrokerConfigEntry]:
    """Every setting shown, in name order."""
    c, groups = broker.config, broker.config.groups
    per_address = c.connections_per_address_max
    entries = [
        BrokerConfigEntry("broker.id", str(c.node_id), TYPE_INT, "This broker's id (Metadata's node id)."),
        BrokerConfigEntry("node.id", str(c.node_id), TYPE_INT, "This broker's id (Metadata's node id)."),
        BrokerConfigEntry("listeners", listeners_value(c.listeners), TYPE_STRING,
                          "Where the broker accepts connections, each with its security protocol (--listen)."),
        BrokerConfigEntry("advertised.listeners", advertised_listeners(c.listeners), TYPE_STRING,
                          "What Metadata tells clients to connect to on each listener (--advertise)."),
        BrokerConfigEntry("auto.create.topics.enable", str(c.auto_create_topics).lower(), TYPE_BOOLEAN,
                          "Whether a produce or metadata request for an unknown topic creates it."),
        BrokerConfigEntry("num.partitions", str(c.default_partitions), TYPE_INT,
                          "Partitions of a topic created without a count."),
        BrokerConfigEntry("default.replication.factor", "1", TYPE_INT,
                          "One replica a partition: the WAL and object storage make the data durable."),
        BrokerConfigEntry("message.max.bytes", str(c.message_bytes_max), TYPE_INT,
                          "The largest record batch a produce may send."),
        BrokerConfigEntry("socket.request.max.bytes", str(c.request_bytes_max), TYPE_INT,
                          "The largest request the broker reads."),
        BrokerConfigEntry("fetch.max.bytes", str(c.fetch_response_bytes_max), TYPE_INT,
                          "The most record bytes one fetch response carries."),
        BrokerConfigEntry("max.incremental.fetch.session.cache.slots", str(c.fetch_sessions_max), TYPE_INT,
                          "Fetch sessions (KIP-227) kept at most."),
        BrokerConfigEntry("connections.max.idle.ms", str(c.idle_timeout_ms), TYPE_LONG,
                          "A connection idle this long is closed."),
        BrokerConfigEntry("max.connections", str(c.connections_max), TYPE_INT, "Client connections at most."),
        BrokerConfigEntry("max.connections.per.ip", str(per_address if per_address is not None else INT_MAX),
                          TYPE_INT, "Client connections from one address at most."),
        BrokerConfigEntry("group.min.session.timeout.ms", str(groups.group_min_session_timeout_ms), TYPE_INT,
                          "The shortest session a consumer group member may ask for."),
        BrokerConfigEntry("group.max.session.timeout.ms", str(groups.group_max_session_timeout_ms), TYPE_INT,
                          "The longest session a consumer group member may ask for."),
        BrokerConfigEntry("group.initial.rebalance.delay.ms", str(groups.group_initial_rebalance_delay_ms),
                          TYPE_INT, "How long a new group waits for more members before its first assignment."),
        BrokerConfigEntry("group.max.size", str(groups.group_max_size), TYPE_INT, "Members of a group at most."),
        BrokerConfigEntry("offsets.retention.minutes", str(groups.offsets_retention_ms // 60_000), TYPE_INT,
                          "How long an empty group's committed offsets are kept."),
        BrokerConfigEntry("log.retention.ms", SPECS["retention.ms"].default, TYPE_LONG,
                          "A topic's retention.ms when it sets none."),
        BrokerConfigEntry("log.retention.bytes", SPECS["retention.bytes"].default, TYPE_LONG,
                          "A topic's retention.bytes when it sets none."),
        BrokerConfigEntry(OBJECT_STORE_CONFIG, broker.object_store_uri, TYPE_STRING,
                          "Where this broker keeps its objects (no credentials)."),
        BrokerConfigEntry("stratalog.requests.queued.max", str(c.requests_queued_max), TYPE_INT,
                          "Requests read and not yet started, across connections."),
        BrokerConfigEntry("stratalog.store.upload.interval.ms", str(int(c.store.upload_interval_s * 1000)),
                          TYPE_LONG, "How long appended bytes wait in memory before an upload takes them."),
        BrokerConfigEntry("stratalog.wal.fsync", c.store.wal.fsync.value, TYPE_STRING,
                          "When a WAL write is durable before a produce is acknowledged."),
    ]
    return sorted(entries, key=lambda e: e.name)


def listeners_value(listeners: Sequence[Listener]) -> str:
    """Kafka's ``listeners``: each listener as ``PROTOCOL://HOST:PORT``, the port as bound."""
    return ",".join(_kafka_listener(listener.protocol.value, listener.host, listener.port) for listener in listeners)


def advertised_listeners(listeners: Sequence[Listener]) -> str:
    """Kafka's ``advertised.listeners``: what clients are told on each listener (its --advertise, else the
    address it listens on, its port as bound)."""
    return ",".join(_kafka_listener(listener.protocol.value, *listener.endpoint) for listener in listeners)


def _kafka_listener(protocol: str, host: str, port: int) -> str:
    """``PROTOCOL://HOST:PORT`` as Kafka writes a listener, an IPv6 address in brackets."""
    return f"{protocol}://[{host}]:{port}" if ":" in host else f"{protocol}://{host}:{port}"
