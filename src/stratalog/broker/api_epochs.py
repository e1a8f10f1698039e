"""OffsetForLeaderEpoch (API 23, v2-v4): where a leader epoch of a partition's log ends (KIP-320).

A consumer asks it after its partition's leader changed, with the epoch of the last batch it read: the
answer is the largest epoch at or below it and the offset that epoch ends at (the current one: the log's
end), and a consumer whose position is past that end truncates it. The answers come from the partition's
epoch history (leader_epochs.py): one epoch, 0, alone; the epochs recorded at each gain of the partition
in a cluster. The client's current leader epoch is checked first, as Fetch and ListOffsets check it.

Kafka allows it with ClusterAction on the cluster (its followers ask it) or Describe on the topic (consumers).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from stratalog.broker.acls import Operation
from stratalog.broker.apis import Api
from stratalog.broker.leader_epochs import end_offset_for, leader_stream
from stratalog.broker.session import Session
from stratalog.kafka.api_keys import ApiKey
from stratalog.kafka.codec import Request

if TYPE_CHECKING:
    from stratalog.broker.broker import Broker

#: The versions served: v2 brought the current leader epoch (fencing), v4 is flexible; v0-v1 are Kafka's
#: deprecated ones, which no client of this broker sends (librdkafka asks v2, Kafka's Java client v4).
VERSION_MIN, VERSION_MAX = 2, 4


async def offset_for_leader_epoch(broker: Broker, request: Request, session: Session) -> dict[str, Any]:
    any_topic = session.may_cluster(Operation.CLUSTER_ACTION)
    topics = []
    for t in request.body.topics:
        allowed = any_topic or session.may_topic(Operation.DESCRIBE, t.topic)
        partitions = []
        for p in t.partitions:
            entry: dict[str, Any] = {"partition": p.partition, "error_code": ErrorCode.none, "leader_epoch": -1,
                                     "end_offset": -1}
            partitions.append(entry)
            if not allowed:
                entry["error_code"] = ErrorCode.topic_authorization_failed
                continue
            stream, history, refused = leader_stream(broker, t.topic, p.partition, p.current_leader_epoch)
            if stream is None:
                entry["error_code"] = refused
                continue
            entry["leader_epoch"], entry["end_offset"] = end_offset_for(history, p.leader_epoch, stream.end_offset)
        topics.append({"topic": t.topic, "partitions": partitions})
    if not broker.ownership.may_acknowledge():   # an end offset past what a replay of its log would find
        for topic in topics:
            for entry in topic["partitions"]:
                if entry["error_code"] == ErrorCode.none:
                    entry.update(error_code=ErrorCode.not_leader_or_follower, leader_epoch=-1, end_offset=-1)
    return {"throttle_time": 0, "topics": topics}


APIS = (
    Api(ApiKey.OFFSET_FOR_LEADER_EPOCH, "OffsetForLeaderEpoch", VERSION_MIN, VERSION_MAX, offset_for_leader_epoch),
)
