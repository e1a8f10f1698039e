"""Consumer groups through Kafka's admin APIs: list, describe with lag per partition, reset offsets, delete.

Lag is Kafka's: the partition's latest offset (high watermark) minus the group's committed offset, for
partitions the group has committed; a partition without a commit shows no lag.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from stratalog.admin.connect import REQUEST_TIMEOUT_S, AdminError, answer
from stratalog.admin.topics import end_offsets, offsets_for_time, topic_metadata

#: Group states in which a group's offsets may be changed from outside (Kafka's reset tool's rule: no member
#: may be consuming while its position moves under it).
RESETTABLE_STATES = ("EMPTY", "DEAD", "UNKNOWN")


def list_groups(admin: Any) -> list[dict[str, Any]]:
    """Every group the brokers know: id, state, and whether it is a simple (assign-only) group."""
    listed = answer(admin, admin.list_consumer_groups(request_timeout=REQUEST_TIMEOUT_S), "list the consumer groups")
    if listed.errors:
        raise AdminError(f"list the consumer groups: {listed.errors[0]}")
    return sorted(({"group": g.group_id, "state": g.state.name, "simple": bool(g.is_simple_consumer_group)}
                   for g in listed.valid), key=lambda row: row["group"])


def committed_offsets(admin: Any, group: str) -> dict[tuple[str, int], int]:
    """The group's committed offset of each partition it has committed."""
    from confluent_kafka import ConsumerGroupTopicPartitions

    futures = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)],
                                                request_timeout=REQUEST_TIMEOUT_S)
    found = answer(admin, futures[group], f"the committed offsets of group {group}")
    return {(tp.topic, tp.partition): tp.offset for tp in found.topic_partitions if tp.offset >= 0}


def describe_group(admin: Any, group: str) -> dict[str, Any]:
    """A group: state, coordinator, assignor, members, and per partition its committed offset, latest
    offset, lag and the member it is assigned to."""
    futures = admin.describe_consumer_groups([group], request_timeout=REQUEST_TIMEOUT_S)
    described = answer(admin, futures[group], f"describe group {group}")
    owners: dict[tuple[str, int], Any] = {}
    members = []
    for member in described.members:
        assigned = sorted((tp.topic, tp.partition) for tp in member.assignment.topic_partitions)
        owners.update({tp: member for tp in assigned})
        members.append({"member": member.member_id, "client_id": member.client_id, "host": member.host,
                        "partitions": [f"{t}/{p}" for t, p in assigned]})
    committed = committed_offsets(admin, group)
    keys = sorted(set(committed) | set(owners))
    latest = end_offsets(admin, keys)
    partitions = []
    for key in keys:
        offset = committed.get(key)
        owner = owners.get(key)
        partitions.append({"topic": key[0], "partition": key[1], "committed": offset, "latest": latest[key],
                           "lag": None if offset is None else max(latest[key] - offset, 0),
                           "member": owner.member_id if owner is not None else None})
    coordinator = described.coordinator
    return {"group": group, "state": described.state.name, "assignor": described.partition_assignor or None,
            "coordinator": f"{coordinator.host}:{coordinator.port}" if coordinator is not None else None,
            "members": members, "partitions": partitions}


@dataclass(frozen=True)
class ResetTarget:
    """Where reset-offsets moves a group: one of earliest, latest, an offset, a time, or a shift."""

    earliest: bool = False
    latest: bool = False
    offset: int | None = None
    timestamp_ms: int | None = None
    shift_by: int | None = None

    def __post_init__(self) -> None:
        chosen = [self.earliest, self.latest, self.offset is not None, self.timestamp_ms is not None,
                  self.shift_by is not None]
        if sum(chosen) != 1:
            raise AdminError("choose exactly one of --to-earliest, --to-latest, --to-offset, --to-datetime, "
                             "--shift-by")


def plan_reset(admin: Any, group: str, partitions: Sequence[tuple[str, int]],
               target: ResetTarget) -> list[dict[str, Any]]:
    """The new offset of each partition, clamped to what the partition holds: rows of topic, partition,
    current (committed) offset and new offset. Changes nothing."""
    committed = committed_offsets(admin, group)
    earliest = end_offsets(admin, partitions, latest=False)
    latest = end_offsets(admin, partitions, latest=True)
    at_time = offsets_for_time(admin, partitions, target.timestamp_ms) if target.timestamp_ms is not None else {}
    rows = []
    for key in partitions:
        current = committed.get(key)
        if target.earliest:
            wanted = earliest[key]
        elif target.latest:
            wanted = latest[key]
        elif target.offset is not None:
            wanted = target.offset
        elif target.timestamp_ms is not None:
            wanted = at_time[key] if at_time[key] >= 0 else latest[key]   # nothing that late: the end
        else:
            assert target.shift_by is not None
            wanted = (current if current is not None else latest[key]) + target.shift_by
        rows.append({"topic": key[0], "partition": key[1], "current": current,
                     "new": min(max(wanted, earliest[key]), latest[key])})
    return rows


def partitions_of(admin: Any, group: str, topics: Sequence[str]) -> list[tuple[str, int]]:
    """The partitions a reset covers: every partition of ``topics`` (``TOPIC`` or ``TOPIC:0,2``), or, with
    no topics, every partition the group has committed."""
    if not topics:
        found = sorted(committed_offsets(admin, group))
        if not found:
            raise AdminError(f"group {group} has committed no offsets: name the topics to reset")
        return found
    chosen = []
    for spec in topics:
        name, _, listed = spec.partition(":")
        metadata = topic_metadata(admin, name)
        numbers = sorted(metadata.partitions)
        if listed:
            try:
                wanted = sorted({int(p) for p in listed.split(",")})
            except ValueError:
                raise AdminError(f"{spec!r}: expected TOPIC or TOPIC:PARTITION[,PARTITION...]") from None
            missing = [p for p in wanted if p not in metadata.partitions]
            if missing:
                raise AdminError(f"topic {name} has no partition {missing[0]} (it has {len(numbers)})")
            numbers = wanted
        chosen += [(name, p) for p in numbers]
    return chosen


def reset_offsets(admin: Any, group: str, rows: Sequence[dict[str, Any]]) -> None:
    """Commit a plan's new offsets for the group, which must have no active members."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    state = describe_state(admin, group)
    if state not in RESETTABLE_STATES:
        raise AdminError(f"group {group} is {state}: stop its consumers first (offsets can be reset only in an "
                         "empty group)")
    offsets = [TopicPartition(r["topic"], r["partition"], r["new"]) for r in rows]
    futures = admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(group, offsets)],
                                                 request_timeout=REQUEST_TIMEOUT_S)
    done = answer(admin, futures[group], f"reset the offsets of group {group}")
    failed = [tp for tp in done.topic_partitions if tp.error is not None]
    if failed:
        raise AdminError(f"reset the offsets of group {group}: {failed[0].topic}/{failed[0].partition}: "
                         f"{failed[0].error.str()}")


def describe_state(admin: Any, group: str) -> str:
    futures = admin.describe_consumer_groups([group], request_timeout=REQUEST_TIMEOUT_S)
    return str(answer(admin, futures[group], f"describe group {group}").state.name)


def delete_groups(admin: Any, groups: Sequence[str]) -> list[str]:
    """Delete groups (each must be empty); the ids deleted."""
    futures = admin.delete_consumer_groups(list(groups), request_timeout=REQUEST_TIMEOUT_S)
    for group in groups:
        answer(admin, futures[group], f"delete group {group}")
    return list(groups)
