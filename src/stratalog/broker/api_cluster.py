"""The cluster APIs: ApiVersions, Metadata, DescribeCluster, FindCoordinator.

Alone, a broker is the whole cluster: it leads every partition and coordinates every group. A broker of
a cluster (``--cluster``) names the live brokers, each partition's leader and leader epoch, and each
group's coordinator, as the cluster's tables say. The broker's ``ownership`` answers either way
(broker/ownership.py).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from stratalog.broker.acls import Operation
from stratalog.broker.api_txn import refusal
from stratalog.broker.apis import TRANSACTIONS_REFUSED, Api
from stratalog.broker.ownership import BrokerEndpoint
from stratalog.broker.session import Session
from stratalog.broker.topics import InvalidTopicError, Topic, check_topic_name
from stratalog.cluster.assignment import Kind
from stratalog.kafka.api_keys import ApiKey
from stratalog.kafka.codec import Request

if TYPE_CHECKING:
    from stratalog.broker.broker import Broker

#: FindCoordinator key types: 0 a consumer group, 1 a transactional id.
KEY_TYPE_GROUP = 0
KEY_TYPE_TRANSACTION = 1
#: The topic id of a topic that has none (an error entry): Metadata v10+ requires the field, all zeros.
NO_TOPIC_ID = uuid.UUID(int=0)

log = logging.getLogger("stratalog.broker")


async def api_versions(broker: Broker, request: Request, session: Session) -> dict[str, Any]:
    return {
        "error_code": ErrorCode.none,
        "api_keys": [{"api_key": api.key, "min_version": api.min_version, "max_version": api.max_version}
                     for api in sorted(broker.apis.values(), key=lambda a: a.key)],
        "throttle_time": 0,
    }


def _topic_metadata(broker: Broker, topic: Topic) -> dict[str, Any]:
    return {
        "error_code": ErrorCode.none, "name": topic.name, "topic_id": topic.topic_id, "is_internal": False,
        "partitions": [_partition_metadata(broker, topic.name, p) for p in range(topic.partitions)],
        "topic_authorized_operations": -2147483648,
    }


def _partition_metadata(broker: Broker, topic: str, partition: int) -> dict[str, Any]:
    led = broker.ownership.leader(topic, partition)
    if led is None:   # between a leader's death and its takeover: clients ask again
        return {"error_code": ErrorCode.leader_not_available, "partition_index": partition, "leader_id": -1,
                "leader_epoch": -1, "replica_nodes": [], "isr_nodes": [], "offline_replicas": []}
    leader, epoch = led
    return {"error_code": ErrorCode.none, "partition_index": partition, "leader_id": leader, "leader_epoch": epoch,
            "replica_nodes": [leader], "isr_nodes": [leader], "offline_replicas": []}


def _brokers(broker: Broker, session: Session) -> list[BrokerEndpoint]:
    """(id, host, port) of every live broker: this one alone, or the cluster's as they registered, each
    at its listener of the protocol this client connected with."""
    return broker.ownership.brokers(session.listener)


async def metadata(broker: Broker, request: Request, session: Session) -> dict[str, Any]:
    body = request.body
    requested = body.topics
    if request.api_version == 0 and not requested:
        requested = None  # v0: an empty list means every topic
    allow_create = getattr(body, "allow_auto_topic_creation", True)
    topics: list[dict[str, Any]] = []
    if requested is None:
        # Every topic: those the principal may not see are left out, as Kafka does.
        topics = [_topic_metadata(broker, t) for t in broker.topics.all()
                  if session.may_topic(Operation.DESCRIBE, t.name)]
    else:
        for wanted in requested:
            name = wanted.name
            topic_id = getattr(wanted, "topic_id", None)
            if name is None and topic_id is not None and topic_id.int != 0:
                by_id = broker.topics.by_id(topic_id)
                if by_id is None:
                    topics.append({"error_code": ErrorCode.unknown_topic_id, "name": None, "topic_id": topic_id,
                                   "is_internal": False, "partitions": []})
                    continue
                name = by_id.name
            try:
                check_topic_name(name)
            except InvalidTopicError:
                topics.append({"error_code": ErrorCode.invalid_topic_exception, "name": name,
                               "topic_id": NO_TOPIC_ID, "is_internal": False, "partitions": []})
                continue
            assert name is not None
            if not session.may_topic(Operation.DESCRIBE, name):
                topics.append({"error_code": ErrorCode.topic_authorization_failed, "name": name,
                               "topic_id": NO_TOPIC_ID, "is_internal": False, "partitions": []})
                continue
            topic = broker.topics.cached(name)
            if topic is None and broker.ownership.topics_shared:
                # Perhaps made by another broker: a round trip to the table, off the event loop.
                topic = await asyncio.to_thread(broker.topics.get, name)
            if topic is None and allow_create and session.may_create_topic(name):
                topic = broker.auto_create(name)
            if topic is None:
                topics.append({"error_code": ErrorCode.unknown_topic_or_partition, "name": name,
                               "topic_id": NO_TOPIC_ID, "is_internal": False, "partitions": []})
            else:
                topics.append(_topic_metadata(broker, topic))
    brokers = _brokers(broker, session)
    return {
        "throttle_time": 0,
        "brokers": [{"node_id": i, "host": host, "port": port, "rack": None} for i, host, port in brokers],
        "cluster_id": broker.config.cluster_id,
        "controller_id": min((i for i, _, _ in brokers), default=-1),
        "topics": topics,
        "cluster_authorized_operations": -2147483648,
    }


async def describe_cluster(broker: Broker, request: Request, session: Session) -> dict[str, Any]:
    brokers = _brokers(broker, session)
    allowed = session.may_cluster(Operation.DESCRIBE)
    return {
        "throttle_time": 0, "error_code": ErrorCode.none if allowed else ErrorCode.cluster_authorization_failed,
        "error_message": None, "endpoint_type": 1,
        "cluster_id": broker.config.cluster_id, "controller_id": min((i for i, _, _ in brokers), default=-1),
        "brokers": [{"broker_id": i, "host": host, "port": port, "rack": None} for i, host, port in brokers],
        "cluster_authorized_operations": -2147483648,
    }


#: FindCoordinator asks for several keys at once (KIP-699) from this version on, one before.
_BATCHED_FROM_VERSION = 4


async def find_coordinator(broker: Broker, request: Request, session: Session) -> dict[str, Any]:
    body = request.body
    host, port = session.listener.endpoint
    key_type = getattr(body, "key_type", KEY_TYPE_GROUP)

    async def answer(key: str) -> tuple[ErrorCode, str | None, int, str, int]:
        if key_type == KEY_TYPE_TRANSACTION:
            # Refused: what every client takes as fatal at once (librdkafka, kafka-python and aiokafka fail
            # init_transactions in milliseconds, with this message); INVALID_REQUEST had librdkafka retry
            # until its own timeout.
            if refusal(broker, session, key, "FindCoordinator", Operation.DESCRIBE) is not None:
                return ErrorCode.transactional_id_authorization_failed, TRANSACTIONS_REFUSED, -1, host, port
            kind = Kind.TRANSACTION
        elif key_type == KEY_TYPE_GROUP:
            if not session.may_group(Operation.DESCRIBE, key):
                return ErrorCode.group_authorization_failed, None, -1, host, port
            kind = Kind.GROUP
        else:
            return ErrorCode.invalid_request, f"unknown coordinator key type {key_type}", -1, host, port
        found = await broker.ownership.coordinator(key, session.listener, kind)
        if found is None:
            return ErrorCode.coordinator_not_available, f"no live broker coordinates the {kind.value} yet", -1, \
                host, port
        return ErrorCode.none, None, *found

    if request.api_version >= _BATCHED_FROM_VERSION:
        coordinators = []
        for key in body.coordinator_keys:
            error, message, node, at_host, at_port = await answer(key)
            coordinators.append({"key": key, "node_id": node, "host": at_host, "port": at_port, "error_code": error,
                                 "error_message": message})
        return {"throttle_time": 0, "coordinators": coordinators}
    error, message, node, at_host, at_port = await answer(body.key)
    return {"throttle_time": 0, "error_code": error, "error_message": message, "node_id": node,
            "host": at_host, "port": at_port}


APIS = (
    Api(ApiKey.API_VERSIONS, "ApiVersions", 0, 3, api_versions),
    Api(ApiKey.METADATA, "Metadata", 0, 12, metadata),
    Api(ApiKey.DESCRIBE_CLUSTER, "DescribeCluster", 0, 1, describe_cluster),
    Api(ApiKey.FIND_COORDINATOR, "FindCoordinator", 0, 4, find_coordinator),
)
