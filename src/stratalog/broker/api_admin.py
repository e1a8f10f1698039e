"""The admin APIs: CreateTopics, DeleteTopics, CreatePartitions, DescribeConfigs, IncrementalAlterConfigs."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from stratalog.broker.acls import Operation
from stratalog.broker.apis import Api
from stratalog.broker.broker_configs import broker_configs
from stratalog.broker.session import Session
from stratalog.broker.topic_configs import (
    SPECS,
    TYPE_LIST,
    InvalidConfigError,
    check_configs,
    effective,
)
from stratalog.broker.topics import InvalidTopicError, Topic, TopicExistsError, UnknownTopicError, check_topic_name
from stratalog.kafka.api_keys import ApiKey
from stratalog.kafka.codec import Request

if TYPE_CHECKING:
    from stratalog.broker.broker import Broker

#: CreateTopics: -1 asks for the broker's default partition count or replication factor.
DEFAULT_COUNT = -1
REPLICATION_FACTOR_ONE = ("one replica a partition: the replication factor is 1 (the WAL and object storage make "
                          "data durable)")
#: DescribeConfigs / IncrementalAlterConfigs resource types.
RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
#: IncrementalAlterConfigs operations.
OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3
#: DescribeConfigs config sources.
SOURCE_TOPIC = 1
SOURCE_STATIC_BROKER = 4
SOURCE_DEFAULT = 5


async def create_topics(broker: Broker, request: Request, session: Session) -> dict[str, Any]:
    body = request.body
    results = []
    for t in body.topics:
        partitions = broker.config.default_partitions if t.num_partitions == DEFAULT_COUNT else t.num_partitions
        result: dict[str, Any] = {"name": t.name, "topic_id": None, "error_code": ErrorCode.none,
                                  "error_message": None, "num_partitions": partitions, "replication_factor": 1,
                                  "configs": []}
        results.append(result)
        configs = {c.name: c.value for c in t.configs}
        if not session.may_create_topic(t.name):
            result["error_code"] = ErrorCode.topic_authorization_failed
            result["error_message"] = f"{session.principal} is not authorized to create topic {t.name}"
            continue
        try:
            if t.assignments:
                refused = _assignment_refused(broker, t)
                if refused is not None:
                    result["error_code"], result["error_message"] = refused
                    continue
                partitions = result["num_partitions"] = len(t.assignments)
            elif t.replication_factor not in (DEFAULT_COUNT, 1):
                result["error_code"] = ErrorCode.invalid_replication_factor
                result["error_message"] = REPLICATION_FACTOR_ONE
                continue
            if body.validate_only:
                check_topic_name(t.name)
                check_configs(configs)
                if broker.topics.get(t.name) is not None:
                    raise TopicExistsError(f"topic {t.name!r} already exists")
                if not 0 < partitions <= broker.config.partitions_per_topic_max:
                    raise ValueError(f"a topic has 1 to {broker.config.partitions_per_topic_max} partitions")
                continue
            topic = await asyncio.to_thread(broker.create_topic, t.name, partitions, configs)
            result["topic_id"] = topic.topic_id
            result["configs"] = [{"name": name, "value": value, "read_only": False,
                                  "config_source": SOURCE_TOPIC if name in topic.configs else SOURCE_DEFAULT,
                                  "is_sensitive": False} for name, value in effective(topic.configs).items()]
        except InvalidTopicError as e:
            result["error_code"], result["error_message"] = ErrorCode.invalid_topic_exception, str(e)
        except TopicExistsError as e:
            result["error_code"], result["error_message"] = ErrorCode.topic_already_exists, str(e)
        except InvalidConfigError as e:
            result["error_code"], result["error_message"] = ErrorCode.invalid_config, str(e)
        except ValueError as e:
            result["error_code"], result["error_message"] = ErrorCode.invalid_partitions, str(e)
    return {"throttle_time": 0, "topics": results}


def _assignment_refused(broker: Broker, topic: Any) -> tuple[ErrorCode, str] | None:
    """Why a CreateTopics replica assignment cannot be honoured (Kafka's error and a message), or None:
    Kafka's rules first, then where this broker can place the partitions."""
    return _assignment_malformed(broker, topic) or _placement_refused(broker, {a.broker_ids[0] for a in
                                                                               topic.assignments})


def _assignment_malformed(broker: Broker, topic: Any) -> tuple[ErrorCode, str] | None:
    """Kafka's rules: numPartitions and replicationFactor -1 beside an assignment, partitions numbered 0 to
    n-1; and this broker's: one replica a partition."""
    if topic.num_partitions != DEFAULT_COUNT or topic.replication_factor != DEFAULT_COUNT:
        return (ErrorCode.invalid_request, "Both numPartitions or replicationFactor and replicasAssignments were "
                "set. Both cannot be used at the same time.")
    indexes = sorted(a.partition_index for a in topic.assignments)
    if indexes != list(range(len(indexes))):
        return ErrorCode.invalid_replica_assignment, "partitions must be numbered 0 to n-1, each once"
    if len(indexes) > broker.config.partitions_per_topic_max:
        return ErrorCode.invalid_partitions, f"a topic has 1 to {broker.config.partitions_per_topic_max} partitions"
    if any(len(a.broker_ids) != 1 for a in topic.assignments):
        return ErrorCode.invalid_replication_factor, REPLICATION_FACTOR_ONE
    return None


def _placement_refused(broker: Broker, named: set[int]) -> tuple[ErrorCode, str] | None:
    """Standalone, every partition is this broker's. In a cluster, partitions go where the cluster's balance
    puts them: an assignment that names a broker is refused rather than silently not followed."""
    why = broker.ownership.assignment_refused(named)
    return None if why is None else (ErrorCode.invalid_replica_assignment, why)


#: DeleteTopics names topics by name or id (KIP-516) from this version on, by name alone before.
_TOPIC_IDS_FROM_VERSION = 6


async def delete_topics(broker: Broker, request: Request, session: Session) -> dict[str, Any]:
    body = request.body
    names: list[tuple[str | None, Any]]
    if request.api_version >= _TOPIC_IDS_FROM_VERSION:
        names = [(t.name, t.topic_id) for t in body.topics]
    else:
        names = [(name, None) for name in body.topic_names]
    results = []
    for given, topic_id in names:
        name = given
        if name is None and topic_id is not None:
            by_id = broker.topics.by_id(topic_id)
            name = by_id.name if by_id is not None else None
        result: dict[str, Any] = {"name": name, "topic_id": topic_id, "error_code": ErrorCode.none,
                                  "error_message": None}
        results.append(result)
        if name is None:
            result["error_code"] = ErrorCode.unknown_topic_id
            continue
        if not session.may_topic(Operation.DELETE, name):
            result["error_code"] = ErrorCode.topic_authorization_failed
            continue
        try:
            topic = broker.delete_topic(name)
            result["topic_id"] = topic.topic_id
        except UnknownTopicError as e:
            result["error_code"], result["error_message"] = ErrorCode.unknown_topic_or_partition, str(e)
    return {"throttle_time": 0, "responses": results}


async def create_partitions(broker: Broker, request: Request, session: Session) -> dict[str, Any]:
    body = request.body
    results = []
    for t in body.topics:
        result: dict[str, Any] = {"name": t.name, "error_code": ErrorCode.none, "error_message": None}
        results.append(result)
        topic = broker.topics.get(t.name)
        if not session.may_topic(Operation.ALTER, t.name):
            result["error_code"] = ErrorCode.topic_authorization_failed
        elif topic is None:
            result["error_code"] = ErrorCode.unknown_topic_or_partition
        elif t.count <= topic.partitions or t.count > broker.config.partitions_per_topic_max:
            result["error_code"] = ErrorCode.invalid_partitions
            result["error_message"] = (f"topic {t.name} has {topic.partitions} partitions; a new count must be "
                                       f"larger and at most {broker.config.partitions_per_topic_max}")
        elif t.assignments is not None and not _on_this_node(broker, t.assignments, t.count - topic.partitions):
            result["error_code"] = ErrorCode.invalid_replica_assignment
            result["error_message"] = (f"one assignment per new partition, each naming only broker "
                                       f"{broker.config.node_id} (the one broker)")
        elif not body.validate_only:
            broker.add_partitions(t.name, t.count)
    return {"throttle_time": 0, "results": results}


def _on_this_node(broker: Broker, assignments: Any, new_partitions: int) -> bool:
    """Whether CreatePartitions' assignments are what the broker does anyway: every new partition on
    this node (admin clients name the broker they found in Metadata)."""
    node = broker.config.node_id
    return len(assignments) == new_partitions and all(list(a.broker_ids) == [node] for a in assignments)


async def describe_configs(broker: Broker, request: Request, session: Session) -> dict[str, Any]:
    body = request.body
    documented = getattr(body, "include_documentation", False)
    results = []
    for r in body.resources:
        result: dict[str, Any] = {"error_code": ErrorCode.none, "error_message": None,
                                  "resource_type": r.resource_type, "resource_name": r.resource_name, "configs": []}
        results.append(result)
        if r.resource_type == RESOURCE_BROKER:
            if not session.may_cluster(Operation.DESCRIBE_CONFIGS):
                result["error_code"] = ErrorCode.cluster_authorization_failed
            elif r.resource_name not in ("", str(broker.config.node_id)):
                result["error_code"] = ErrorCode.invalid_request
                result["error_message"] = f"this is broker {broker.config.node_id}, not {r.resource_name!r}"
            else:
                keys = set(r.configuration_keys) if r.configuration_keys is not None else None
                result["configs"] = [
                    {"name": e.name, "value": e.value, "read_only": True, "config_source": SOURCE_STATIC_BROKER,
                     "is_default": False, "is_sensitive": False, "synonyms": [], "config_type": e.config_type,
                     "documentation": e.doc if documented else None}
                    for e in broker_configs(broker) if keys is None or e.name in keys]
            continue
        if r.resource_type != RESOURCE_TOPIC:
            result["error_code"] = ErrorCode.invalid_request
            result["error_message"] = f"resource type {r.resource_type} is not supported"
            continue
        topic = broker.topics.get(r.resource_name)
        if not session.may_topic(Operation.DESCRIBE_CONFIGS, r.resource_name):
            result["error_code"] = ErrorCode.topic_authorization_failed
            continue
        if topic is None:
            result["error_code"] = ErrorCode.unknown_topic_or_partition
            continue
        keys = set(r.configuration_keys) if r.configuration_keys is not None else None
        result["configs"] = [
            {"name": name, "value": value, "read_only": False,
             "config_source": SOURCE_TOPIC if name in topic.configs else SOURCE_DEFAULT,
             "is_default": name not in topic.configs, "is_sensitive": False, "synonyms": [],
             "config_type": SPECS[name].config_type, "documentation": SPECS[name].doc if documented else None}
            for name, value in effective(topic.configs).items() if keys is None or name in keys]
    return {"throttle_time": 0, "results": results}


def _topic_to_alter(broker: Broker, session: Session, resource: Any, result: dict[str, Any]) -> Topic | None:
    """The topic an alter of ``resource`` changes, or None with ``result``'s error set: a broker's configs
    are static (its --config file), another type is not served, the principal may not, the topic is unknown."""
    if resource.resource_type == RESOURCE_BROKER:
        result["error_code"] = ErrorCode.invalid_request
        result["error_message"] = ("a broker's configs are static: set them in its --config file and restart it "
                                   "(DescribeConfigs shows them)")
        return None
    if resource.resource_type != RESOURCE_TOPIC:
        result["error_code"] = ErrorCode.invalid_request
        result["error_message"] = f"resource type {resource.resource_type} is not supported"
        return None
    if not session.may_topic(Operation.ALTER_CONFIGS, resource.resource_name):
        result["error_code"] = ErrorCode.topic_authorization_failed
        return None
    topic = broker.topics.get(resource.resource_name)
    if topic is None:
        result["error_code"] = ErrorCode.unknown_topic_or_partition
    return topic


async def alter_configs(broker: Broker, request: Request, session: Session) -> dict[str, Any]:
    """AlterConfigs (KafkaJS's alterConfigs, kafka-python's alter_configs): the configs given become the
    topic's whole set; those left out return to their defaults (IncrementalAlterConfigs changes one)."""
    return _alter_each(broker, request, session,
                       lambda _topic, r: {c.name: c.value for c in r.configs if c.value is not None})


async def incremental_alter_configs(broker: Broker, request: Request, session: Session) -> dict[str, Any]:
    return _alter_each(broker, request, session, _incremented)


def _alter_each(broker: Broker, request: Request, session: Session,
                configs_of: Callable[[Topic, Any], dict[str, str]]) -> dict[str, Any]:
    """Each resource's topic set to ``configs_of(topic, resource)``, checked (INVALID_CONFIG for a bad
    one), unless the request only validates."""
    body = request.body
    responses = []
    for r in body.resources:
        result: dict[str, Any] = {"error_code": ErrorCode.none, "error_message": None,
                                  "resource_type": r.resource_type, "resource_name": r.resource_name}
        responses.append(result)
        topic = _topic_to_alter(broker, session, r, result)
        if topic is None:
            continue
        try:
            checked = check_configs(configs_of(topic, r))
        except InvalidConfigError as e:
            result["error_code"], result["error_message"] = ErrorCode.invalid_config, str(e)
            continue
        if not body.validate_only:
            broker.set_topic_configs(topic.name, checked)
    return {"throttle_time": 0, "responses": responses}


def _incremented(topic: Topic, resource: Any) -> dict[str, str]:
    """IncrementalAlterConfigs: the topic's configs with each operation of ``resource`` applied."""
    configs = dict(topic.configs)
    for c in resource.configs:
        if c.config_operation == OP_SET:
            configs[c.name] = c.value
        elif c.config_operation == OP_DELETE:
            configs.pop(c.name, None)
        elif c.config_operation in (OP_APPEND, OP_SUBTRACT):
            configs[c.name] = _altered_list(configs, c.name, c.value, append=c.config_operation == OP_APPEND)
        else:
            raise InvalidConfigError(f"{c.name}: no config operation {c.config_operation}")
    return configs


def _altered_list(configs: dict[str, str], name: str, value: str | None, *, append: bool) -> str:
    """A list config (Kafka's type LIST) with ``value``'s items appended (those not in it yet) or taken
    away, from the topic's value or the default. Kafka refuses either on a config of another type."""
    spec = SPECS.get(name)
    if spec is None or spec.config_type != TYPE_LIST:
        raise InvalidConfigError(f"Config value {'append' if append else 'subtract'} is not allowed for config "
                                 f"key: {name}")
    items = [v.strip() for v in configs.get(name, spec.default).split(",") if v.strip()]
    given = [v.strip() for v in (value or "").split(",") if v.strip()]
    items = items + [v for v in given if v not in items] if append else [v for v in items if v not in given]
    return ",".join(items)


APIS = (
    Api(ApiKey.CREATE_TOPICS, "CreateTopics", 2, 7, create_topics, ordered=True),
    Api(ApiKey.DELETE_TOPICS, "DeleteTopics", 1, 6, delete_topics, ordered=True),
    Api(ApiKey.CREATE_PARTITIONS, "CreatePartitions", 0, 3, create_partitions, ordered=True),
    Api(ApiKey.DESCRIBE_CONFIGS, "DescribeConfigs", 1, 4, describe_configs),
    Api(ApiKey.ALTER_CONFIGS, "AlterConfigs", 0, 2, alter_configs, ordered=True),
    Api(ApiKey.INCREMENTAL_ALTER_CONFIGS, "IncrementalAlterConfigs", 0, 1, incremental_alter_configs, ordered=True),
)
