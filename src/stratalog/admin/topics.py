"""Topics through Kafka's admin APIs: list, describe (partitions, offsets, configs), create, delete, alter.

Each function takes a confluent-kafka AdminClient and returns plain data (dicts and lists, ready for a
table or JSON); a broker's refusal is an AdminError naming the topic and Kafka's error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from stratalog.admin.connect import REQUEST_TIMEOUT_S, AdminError, answer, describe_error

#: A topic's replication factor left to the broker's default (CreateTopics' -1).
REPLICATION_DEFAULT = -1


def _metadata(admin: Any, topic: str | None = None) -> Any:
    try:
        return admin.list_topics(topic=topic, timeout=REQUEST_TIMEOUT_S)
    except Exception as e:
        raise AdminError(f"metadata of {topic or 'the cluster'}: {describe_error(e)}") from None


def topic_metadata(client: Any, name: str) -> Any:
    """A topic's metadata (partitions, leaders) as any confluent-kafka client reads it; AdminError naming
    the topic when it is unknown, refused or has no partition."""
    topic = _metadata(client, name).topics.get(name)
    if topic is None or topic.error is not None or not topic.partitions:
        raise AdminError(f"topic {name}: {topic.error.str() if topic is not None and topic.error else 'unknown'}")
    return topic


def list_topics(admin: Any) -> list[dict[str, Any]]:
    """Every topic: name, partitions, replication factor (of its first partition), sorted by name."""
    rows = []
    for name, topic in sorted(_metadata(admin).topics.items()):
        partitions = topic.partitions
        first = partitions[min(partitions)] if partitions else None
        rows.append({"topic": name, "partitions": len(partitions),
                     "replication_factor": len(first.replicas) if first is not None else 0})
    return rows


def end_offsets(admin: Any, partitions: Sequence[tuple[str, int]], latest: bool = True) -> dict[tuple[str, int], int]:
    """The latest (high watermark) or earliest offset of each (topic, partition)."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import OffsetSpec

    if not partitions:
        return {}
    spec = OffsetSpec.latest() if latest else OffsetSpec.earliest()  # type: ignore[no-untyped-call]
    futures = admin.list_offsets({TopicPartition(t, p): spec for t, p in partitions},
                                 request_timeout=REQUEST_TIMEOUT_S)
    which = "latest" if latest else "earliest"
    return {(tp.topic, tp.partition): answer(admin, f, f"the {which} offset of {tp.topic}/{tp.partition}").offset
            for tp, f in futures.items()}


def offsets_for_time(admin: Any, partitions: Sequence[tuple[str, int]],
                     timestamp_ms: int) -> dict[tuple[str, int], int]:
    """Each partition's first offset whose timestamp is at or after ``timestamp_ms`` (-1 where none is)."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import OffsetSpec

    futures = admin.list_offsets({TopicPartition(t, p): OffsetSpec.for_timestamp(timestamp_ms) for t, p in partitions},
                                 request_timeout=REQUEST_TIMEOUT_S)
    return {(tp.topic, tp.partition):
            answer(admin, f, f"the offset at {timestamp_ms} ms of {tp.topic}/{tp.partition}").offset
            for tp, f in futures.items()}


def describe_topic(admin: Any, name: str, all_configs: bool = False) -> dict[str, Any]:
    """One topic: its partitions (leader, replicas, in-sync replicas, earliest and latest offsets, records
    between them) and its configs (those set on the topic, or every one with ``all_configs``)."""
    topic = topic_metadata(admin, name)
    ids = sorted(topic.partitions)
    keys = [(name, p) for p in ids]
    earliest = end_offsets(admin, keys, latest=False)
    latest = end_offsets(admin, keys, latest=True)
    partitions = []
    for p in ids:
        meta = topic.partitions[p]
        partitions.append({"partition": p, "leader": meta.leader, "replicas": list(meta.replicas),
                           "isr": list(meta.isrs), "earliest": earliest[(name, p)], "latest": latest[(name, p)],
                           "records": latest[(name, p)] - earliest[(name, p)]})
    return {"topic": name, "partitions": partitions, "configs": topic_configs(admin, name, all_configs)}


def topic_configs(admin: Any, name: str, all_configs: bool = False) -> dict[str, str | None]:
    """The topic's configs set on it (or every one), sensitive values hidden."""
    from confluent_kafka.admin import ConfigResource, ResourceType

    resource = ConfigResource(ResourceType.TOPIC, name)
    entries = answer(admin, admin.describe_configs([resource], request_timeout=REQUEST_TIMEOUT_S)[resource],
                     f"the configs of topic {name}")
    return {key: (None if entry.is_sensitive else entry.value) for key, entry in sorted(entries.items())
            if all_configs or not entry.is_default}


def create_topic(admin: Any, name: str, partitions: int, replication_factor: int = REPLICATION_DEFAULT,
                 configs: Mapping[str, str] | None = None, if_not_exists: bool = False) -> bool:
    """Create a topic; False when it existed and ``if_not_exists`` says that is fine."""
    from confluent_kafka.admin import NewTopic

    topic = NewTopic(name, num_partitions=partitions, replication_factor=replication_factor,
                     config=dict(configs or {}))
    future = admin.create_topics([topic], request_timeout=REQUEST_TIMEOUT_S)[name]
    try:
        answer(admin, future, f"create topic {name}")
    except AdminError as e:
        if if_not_exists and "TOPIC_ALREADY_EXISTS" in str(e):
            return False
        raise
    return True


def delete_topics(admin: Any, names: Sequence[str], if_exists: bool = False) -> list[str]:
    """Delete topics; the names deleted (with ``if_exists``, unknown ones are passed over)."""
    futures = admin.delete_topics(list(names), request_timeout=REQUEST_TIMEOUT_S)
    deleted = []
    for name in names:
        try:
            answer(admin, futures[name], f"delete topic {name}")
        except AdminError as e:
            if if_exists and "UNKNOWN_TOPIC" in str(e):
                continue
            raise
        deleted.append(name)
    return deleted


def alter_topic(admin: Any, name: str, set_configs: Mapping[str, str] | None = None,
                delete_configs: Sequence[str] = (), partitions: int | None = None) -> None:
    """Set and delete configs of a topic (IncrementalAlterConfigs), and raise its partition count."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, NewPartitions, ResourceType

    if partitions is not None:
        future = admin.create_partitions([NewPartitions(name, partitions)], request_timeout=REQUEST_TIMEOUT_S)[name]
        answer(admin, future, f"raise topic {name} to {partitions} partitions")
    entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in (set_configs or {}).items()]
    entries += [ConfigEntry(k, None, incremental_operation=AlterConfigOpType.DELETE) for k in delete_configs]
    if entries:
        resource = ConfigResource(ResourceType.TOPIC, name, incremental_configs=entries)
        futures = admin.incremental_alter_configs([resource], request_timeout=REQUEST_TIMEOUT_S)
        answer(admin, next(iter(futures.values())), f"alter the configs of topic {name}")
