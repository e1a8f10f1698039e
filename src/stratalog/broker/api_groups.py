"""The consumer-group APIs (classic protocol): JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit,
OffsetFetch, DescribeGroups, ListGroups, DeleteGroups. The coordinator (``groups.py``) decides; these
translate requests of every version to its calls and its results to responses."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from stratalog.broker.acls import Operation
from stratalog.broker.apis import Api
from stratalog.broker.group_state import GroupDescription
from stratalog.broker.offsets import OffsetEntry, OffsetsUnavailableError
from stratalog.broker.session import Session
from stratalog.cluster.leases import ClusterError
from stratalog.engine.metadata_backends import MetadataUnavailableError
from stratalog.kafka.api_keys import ApiKey
from stratalog.kafka.codec import Request

if TYPE_CHECKING:
    from stratalog.broker.broker import Broker

#: What DescribeGroups says of authorized operations when nobody asked (no ACLs yet).
OPERATIONS_NOT_ASKED = -2147483648

log = logging.getLogger("stratalog.broker")


def _elsewhere(broker: Broker, group_id: str) -> bool:
    """The group is coordinated by another broker of the cluster: its APIs answer NOT_COORDINATOR here, so
    the client finds the coordinator again (FindCoordinator)."""
    return not broker.ownership.coordinates(group_id)


def _ms(value: Any) -> int:
    return int(value.total_seconds() * 1000)


#: JoinGroup: a new member is told its id and must join again with it (KIP-394) from this version on.
_MEMBER_ID_REQUIRED_FROM_VERSION = 4
#: JoinGroup answers with a protocol name that may be null (KIP-559) from this version on ("" before).
_NULLABLE_NAME_FROM_VERSION = 7
#: LeaveGroup names several members, static ones by instance id (KIP-345), from this version on.
_MEMBERS_FROM_VERSION = 3
#: OffsetFetch asks for several groups at once (KIP-709) from this version on.
_GROUPS_FROM_VERSION = 8


async def join_group(broker: Broker, request: Request, session: Session) -> dict[str, Any]:
    body = request.body
    refused = ErrorCode.group_authorization_failed if not session.may_group(Operation.READ, body.group_id) \
        else ErrorCode.not_coordinator if _elsewhere(broker, body.group_id) else None
    if refused is not None:
        return {"throttle_time": 0, "error_code": refused, "generation_id": -1,
                "protocol_type": None,
                "protocol_name": "" if request.api_version < _NULLABLE_NAME_FROM_VERSION else None,
                "leader": "", "member_id": body.member_id, "members": []}
    session_ms = _ms(body.session_timeout)
    rebalance = getattr(body, "rebalance_timeout", None)
    result = await broker.groups.join(
        body.group_id, body.member_id, getattr(body, "group_instance_id", None), request.client_id or "",
        f"/{session.host}", session_ms, _ms(rebalance) if rebalance is not None else session_ms, body.protocol_type,
        [(p.name, p.metadata) for p in body.protocols], request.api_version >= _MEMBER_ID_REQUIRED_FROM_VERSION)
    protocol_name = result.protocol_name
    if protocol_name is None and request.api_version < _NULLABLE_NAME_FROM_VERSION:
        protocol_name = ""
    return {"throttle_time": 0, "error_code": result.error_code, "generation_id": result.generation_id,
            "protocol_type": result.protocol_type, "protocol_name": protocol_name, "leader": result.leader,
            "skip_assignment": result.skip_assignment, "member_id": result.member_id,
            "members": [{"member_id": m, "group_instance_id": i, "metadata": md} for m, i, md in result.members]}


async def sync_group(broker: Broker, request: Request, session: Session) -> dict[str, Any]:
    body = request.body
    if not session.may_group(Operation.READ, body.group_id):
        return {"throttle_time": 0, "error_code": ErrorCode.group_authorization_failed, "assignment": b""}
    if _elsewhere(broker, body.group_id):
        return {"throttle_time": 0, "error_code": ErrorCode.not_coordinator, "assignment": b""}
    result = await broker.groups.sync(
        body.group_id, body.generation_id, body.member_id, getattr(body, "group_instance_id", None),
        getattr(body, "protocol_type", None), getattr(body, "protocol_name", None),
        {a.member_id: a.assignment for a in body.assignments})
    return {"throttle_time": 0, "error_code": result.error_code, "protocol_type": result.protocol_type,
            "protocol_name": result.protocol_name, "assignment": result.assignment}


async def heartbeat(broker: Broker, request: Request, session: Session) -> dict[str, Any]:
    body = request.body
    if not session.may_group(Operation.READ, body.group_id):
        return {"throttle_time": 0, "error_code": ErrorCode.group_authorization_failed}
    if _elsewhere(broker, body.group_id):
        return {"throttle_time": 0, "error_code": ErrorCode.not_coordinator}
    error = broker.groups.heartbeat(body.group_id, body.generation_id, body.member_id,
                                    getattr(body, "group_instance_id", None))
    return {"throttle_time": 0, "error_code": error}


async def leave_group(broker: Broker, request: Request, session: Session) -> dict[str, Any]:
    body = request.body
    if not session.may_group(Operation.READ, body.group_id):
        return {"throttle_time": 0, "error_code": ErrorCode.group_authorization_failed, "members": []}
    if _elsewhere(broker, body.group_id):
        return {"throttle_time": 0, "error_code": ErrorCode.not_coordinator, "members": []}
    if request.api_version < _MEMBERS_FROM_VERSION:
        error, members = broker.groups.leave(body.group_id, [(body.member_id, None)])
        return {"throttle_time": 0, "error_code": error or (members[0][2] if members else 0)}
    error, members = broker.groups.leave(body.group_id, [(m.member_id, m.group_instance_id) for m in body.members])
    return {"throttle_time": 0, "error_code": error, "members": [
        {"member_id": m, "group_instance_id": i, "error_code": e} for m, i, e in members]}


async def offset_commit(broker: Broker, request: Request, session: Session) -> dict[str, Any]:
    body = request.body
    generation = getattr(body, "generation_id_or_member_epoch", -1)
    error: int
    if _elsewhere(broker, body.group_id) and session.may_group(Operation.READ, body.group_id):
        error = ErrorCode.not_coordinator
    elif session.may_group(Operation.READ, body.group_id):
        error = broker.groups.validate_offset_commit(body.group_id, generation, getattr(body, "member_id", ""),
                                                     getattr(body, "group_instance_id", None))
    else:
        error = ErrorCode.group_authorization_failed
    now_ms = int(time.time() * 1000)
    topics = []
    entries: list[OffsetEntry] = []
    for t in body.topics:
        partitions = []
        known = broker.topics.get(t.name)
        readable = session.may_topic(Operation.READ, t.name)
        for p in t.partitions:
            code = error
            if not code and not readable:
                code = ErrorCode.topic_authorization_failed
            if not code and (known is None or not 0 <= p.partition_index < known.partitions):
                code = ErrorCode.unknown_topic_or_partition
            if not code:
                code = broker.offsets.metadata_error(p.committed_metadata)
            if not code:
                entries.append(OffsetEntry(t.name, p.partition_index, p.committed_offset,
                                           getattr(p, "committed_leader_epoch", -1), p.committed_metadata, now_ms))
            partitions.append({"partition_index": p.partition_index, "error_code": code})
        topics.append({"name": t.name, "partitions": partitions})
    if entries:
        # Durable (SQLite synchronous=FULL, or a PostgreSQL commit) before the response: a commit survives
        # kill -9.
        try:
            await broker.in_offsets_order(broker.offsets.commit, body.group_id, entries)
        except (OffsetsUnavailableError, ClusterError) as e:
            # Nothing stored. The database out of reach: Kafka's answer when the offsets cannot be written;
            # another broker coordinates the group now: NOT_COORDINATOR, and the client finds it.
            log.warning("OffsetCommit of group %s refused: %s", body.group_id, e)
            code = ErrorCode.not_coordinator if isinstance(e, ClusterError) else ErrorCode.coordinator_not_available
            for topic in topics:
                for partition in topic["partitions"]:
                    if partition["error_code"] == ErrorCode.none:
                        partition["error_code"] = code
    return {"throttle_time": 0, "topics": topics}


async def _fetch_group(broker: Broker, session: Session, group_id: str, wanted: Any,
                       require_stable: bool) -> list[dict[str, Any]]:
    """The group's committed offsets of ``wanted`` (None: all). ``require_stable`` (v7+, sent by
    read_committed consumers): a partition that a transaction not ended has offsets for is answered
    UNSTABLE_OFFSET_COMMIT, which the client asks again, instead of the offset that commit may replace."""
    # The read in a worker thread: with the offsets in PostgreSQL it is a round trip, which would hold
    # every connection's requests on the loop meanwhile.
    if wanted is None:
        found = await broker.in_offsets_order(broker.offsets.fetch, group_id, None)
        by_topic: dict[str, list[int]] = {}
        for topic, partition in sorted(found):
            if session.may_topic(Operation.DESCRIBE, topic):  # every topic: the hidden ones left out
                by_topic.setdefault(topic, []).append(partition)
        pairs = [(topic, parts) for topic, parts in by_topic.items()]
    else:
        pairs = [(t.name, list(t.partition_indexes)) for t in wanted]
        found = await broker.in_offsets_order(broker.offsets.fetch, group_id,
                                              [(name, p) for name, parts in pairs for p in parts])
    unstable = await broker.transactions.pending_offsets(group_id) if require_stable else set()
    topics = []
    for name, parts in pairs:
        partitions = []
        if not session.may_topic(Operation.DESCRIBE, name):
            topics.append({"name": name, "partitions": [
                {"partition_index": p, "committed_offset": -1, "committed_leader_epoch": -1, "metadata": "",
                 "error_code": ErrorCode.topic_authorization_failed} for p in parts]})
            continue
        for p in parts:
            if (name, p) in unstable:
                partitions.append({"partition_index": p, "committed_offset": -1, "committed_leader_epoch": -1,
                                   "metadata": "", "error_code": ErrorCode.unstable_offset_commit})
                continue
            entry = found.get((name, p))
            partitions.append({"partition_index": p, "committed_offset": entry.offset if entry else -1,
                               "committed_leader_epoch": entry.leader_epoch if entry else -1,
                               "metadata": entry.metadata if entry else "", "error_code": ErrorCode.none})
        topics.append({"name": name, "partitions": partitions})
    return topics


class _NotCoordinatorError(Exception):
    """Another broker of the cluster coordinates the group."""


async def offset_fetch(broker: Broker, request: Request, session: Session) -> dict[str, Any]:
    body = request.body
    require_stable = bool(getattr(body, "require_stable", False))

    async def answer(group_id: str, wanted: Any) -> dict[str, Any]:
        if not session.may_group(Operation.DESCRIBE, group_id):
            return {"group_id": group_id, "topics": [], "error_code": ErrorCode.group_authorization_failed}
        try:
            if _elsewhere(broker, group_id):
                raise _NotCoordinatorError
            topics = await _fetch_group(broker, session, group_id, wanted, require_stable)
        except (MetadataUnavailableError, _NotCoordinatorError) as e:
            unavailable = ErrorCode.not_coordinator if isinstance(e, _NotCoordinatorError) \
                else ErrorCode.coordinator_not_available
            if unavailable == ErrorCode.coordinator_not_available:
                log.warning("OffsetFetch of group %s refused: %s", group_id, e)
            return {"group_id": group_id, "error_code": unavailable, "topics": [] if wanted is None else [
                {"name": t.name, "partitions": [
                    {"partition_index": p, "committed_offset": -1, "committed_leader_epoch": -1, "metadata": "",
                     "error_code": unavailable} for p in t.partition_indexes]} for t in wanted]}
        return {"group_id": group_id, "topics": topics, "error_code": ErrorCode.none}

    if request.api_version >= _GROUPS_FROM_VERSION:
        return {"throttle_time": 0, "groups": [await answer(g.group_id, g.topics) for g in body.groups]}
    return {"throttle_time": 0, **(await answer(body.group_id, body.topics))}


async def describe_groups(broker: Broker, request: Request, session: Session) -> dict[str, Any]:
    groups: list[dict[str, Any]] = []
    wanted = list(request.body.groups)
    denied = [g for g in wanted if not session.may_group(Operation.DESCRIBE, g)]
    groups.extend({"error_code": ErrorCode.group_authorization_failed, "group_id": g, "group_state": "",
                   "protocol_type": "", "protocol_data": "", "members": []} for g in denied)
    elsewhere = [g for g in wanted if g not in denied and _elsewhere(broker, g)]
    groups.extend({"error_code": ErrorCode.not_coordinator, "group_id": g, "group_state": "",
                   "protocol_type": "", "protocol_data": "", "members": []} for g in elsewhere)
    denied += elsewhere
    try:
        described = broker.groups.describe([g for g in wanted if g not in denied])
    except OffsetsUnavailableError as e:   # a group known by its offsets only could not be looked up
        log.warning("DescribeGroups refused: %s", e)
        described = [GroupDescription(int(ErrorCode.coordinator_not_available), g, "", "", "", [])
                     for g in wanted if g not in denied]
    for d in described:
        groups.append({"error_code": d.error_code, "group_id": d.group_id, "group_state": d.state,
                       "protocol_type": d.protocol_type, "protocol_data": d.protocol_data,
                       "authorized_operations": OPERATIONS_NOT_ASKED, "members": [
                           {"member_id": m.member_id, "group_instance_id": m.group_instance_id,
                            "client_id": m.client_id, "client_host": m.client_host,
                            "member_metadata": m.member_metadata, "member_assignment": m.member_assignment}
                           for m in d.members]})
    return {"throttle_time": 0, "groups": groups}


async def list_groups(broker: Broker, request: Request, session: Session) -> dict[str, Any]:
    states = getattr(request.body, "states_filter", ())
    try:
        listed = broker.groups.list_groups(set(states) if states else None)
    except OffsetsUnavailableError as e:
        log.warning("ListGroups refused: %s", e)
        return {"throttle_time": 0, "error_code": ErrorCode.coordinator_not_available, "groups": []}
    if not session.may_cluster(Operation.DESCRIBE):
        listed = [g for g in listed if session.may_group(Operation.DESCRIBE, g[0])]
    return {"throttle_time": 0, "error_code": ErrorCode.none, "groups": [
        {"group_id": g, "protocol_type": p, "group_state": s} for g, p, s in listed]}


async def delete_groups(broker: Broker, request: Request, session: Session) -> dict[str, Any]:
    names = list(request.body.groups_names)
    denied = [g for g in names if not session.may_group(Operation.DELETE, g)]
    elsewhere = [(g, int(ErrorCode.not_coordinator)) for g in names if g not in denied and _elsewhere(broker, g)]
    names = [g for g in names if g not in {e[0] for e in elsewhere}]
    try:
        results = elsewhere + broker.groups.delete_groups([g for g in names if g not in denied])
    except OffsetsUnavailableError as e:   # a retry finds the groups deleted before it GROUP_ID_NOT_FOUND
        log.warning("DeleteGroups refused: %s", e)
        results = elsewhere + [(g, int(ErrorCode.coordinator_not_available)) for g in names if g not in denied]
    return {"throttle_time": 0, "results": [{"group_id": g, "error_code": ErrorCode.group_authorization_failed}
                                            for g in denied] + [{"group_id": g, "error_code": e} for g, e in results]}


APIS = (
    Api(ApiKey.JOIN_GROUP, "JoinGroup", 0, 7, join_group),
    Api(ApiKey.SYNC_GROUP, "SyncGroup", 0, 5, sync_group),
    Api(ApiKey.HEARTBEAT, "Heartbeat", 0, 4, heartbeat),
    Api(ApiKey.LEAVE_GROUP, "LeaveGroup", 0, 5, leave_group),
    Api(ApiKey.OFFSET_COMMIT, "OffsetCommit", 2, 8, offset_commit, ordered=True),
    Api(ApiKey.OFFSET_FETCH, "OffsetFetch", 1, 8, offset_fetch),
    Api(ApiKey.DESCRIBE_GROUPS, "DescribeGroups", 0, 5, describe_groups),
    Api(ApiKey.LIST_GROUPS, "ListGroups", 0, 4, list_groups),
    Api(ApiKey.DELETE_GROUPS, "DeleteGroups", 0, 2, delete_groups, ordered=True),
)
