"""What the console's pages show, gathered from a live broker as plain dicts.

The broker's own tables (topics, groups) are read on its event loop, through ``on_loop``; the streams'
offsets and records, the committed offsets and the store's figures are safe to read from the console's
thread (each behind its own lock), so a page that reads records never holds up the loop. A messages page
shows committed records, as a read_committed consumer reads them: ``Stream.fetch`` asks the partition's
open and aborted transactions of the loop itself (broker/txn_read_view.py), two quick calls, and decodes
on this thread.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from kio.schema.consumer_protocol_assignment.v0.data import ConsumerProtocolAssignment
from kio.serial import entity_reader

from stratalog.broker.acls import Operation, ResourceType
from stratalog.broker.topics import Topic, stream_name
from stratalog.console.login import Access, Viewer
from stratalog.errors import StratalogError

if TYPE_CHECKING:
    from stratalog.broker.broker import Broker
    from stratalog.console.history import History

T = TypeVar("T")
OnLoop = Callable[[Callable[[], T]], T]

#: Records a messages page shows at most: a page is for looking, `stratalog consume` for reading.
MESSAGES_MAX = 200
#: Bytes of record values one messages page reads at most (a few large records fill it).
MESSAGES_BYTES_MAX = 1 << 20
#: Characters of one key or value shown; the rest is cut, saying how much was.
SHOWN_CHARS_MAX = 2000
#: A consumer assignment's leading version (int16); every version starts with v0's fields.
ASSIGNMENT_VERSION_BYTES = 2
#: Topics and groups listed on one page at most (the rest are counted, not listed).
LISTED_MAX = 1000


class ConsoleError(StratalogError):
    """A page asked for something that is not there (a topic, a partition, a group), or that its viewer
    may not describe: the two look alike, so a page does not tell what exists to whoever may not see it."""


class ConsoleForbiddenError(StratalogError):
    """The viewer may see the thing but not do this with it (read a topic's messages without Read)."""


@dataclass(frozen=True)
class Formats:
    """How a record's key and value are shown: ``text`` (UTF-8, other bytes escaped), ``json`` (indented
    when the bytes are JSON, else as text) or ``hex``."""

    name: str = "text"

    def show(self, data: bytes | None) -> str | None:
        if data is None:
            return None
        if self.name == "hex":
            shown = data.hex(" ")
        elif self.name == "json":
            try:
                shown = json.dumps(json.loads(data), indent=2, ensure_ascii=False)
            except ValueError:   # not JSON (nor UTF-8): shown as text
                shown = data.decode("utf-8", "backslashreplace")
        else:
            shown = data.decode("utf-8", "backslashreplace")
        if len(shown) > SHOWN_CHARS_MAX:
            return f"{shown[:SHOWN_CHARS_MAX]}... ({len(shown) - SHOWN_CHARS_MAX} more characters)"
        return shown


FORMATS = ("text", "json", "hex")


class ConsoleData:
    """The data of every page, from ``broker``; ``on_loop(fn)`` runs ``fn`` on the broker's loop and
    returns its result."""

    def __init__(self, broker: Broker, on_loop: OnLoop[Any], history: History,
                 connections: Callable[[], int]) -> None:
        self.broker = broker
        self._on_loop = on_loop
        self.history = history
        self._connections = connections
        self.access = Access(broker, on_loop)

    def _visible_topics(self, viewer: Viewer) -> list[Topic]:
        topics = sorted(self._on_loop(self.broker.topics.all), key=lambda t: t.name)
        names = set(self.access.allowed(viewer, Operation.DESCRIBE, ResourceType.TOPIC, [t.name for t in topics]))
        return [t for t in topics if t.name in names]

    # Overview --------------------------------------------------------------------------------------

    def overview(self, viewer: Viewer) -> dict[str, Any]:
        """The broker; its store, connections and object store only for a viewer who may describe the
        cluster; the counts of the topics and groups the viewer may see."""
        broker = self.broker
        topics = self._visible_topics(viewer)
        listeners = [listener.name for listener in broker.config.listeners]
        groups = self.access.allowed(viewer, Operation.DESCRIBE, ResourceType.GROUP, broker.offsets.groups())
        stats = broker.store.stats()
        whole = self.access.cluster(viewer)
        return {"node_id": broker.config.node_id, "cluster": broker.ownership.in_cluster, "listeners": listeners,
                "connections": self._connections() if whole else None, "topics": len(topics),
                "partitions": sum(t.partitions for t in topics), "groups": len(groups),
                "object_store": broker.object_store_uri if whole else None, "store": stats if whole else None,
                "writable": not stats.get("space_refusing", 0),
                "cluster_stats": broker.ownership.stats() if whole and broker.ownership.in_cluster else None,
                "objects": self._objects() if whole else None}

    def _objects(self) -> dict[str, int]:
        """The store's objects in object storage, as its metadata lists them (those still referenced)."""
        live = [o for o in self.broker.store.metadata.objects() if o.unreferenced_ms is None]
        return {"count": len(live), "bytes": sum(o.size_bytes for o in live)}

    # Topics ----------------------------------------------------------------------------------------

    def topics(self, viewer: Viewer) -> dict[str, Any]:
        topics = self._visible_topics(viewer)
        sizes = self._sizes()
        rows = []
        for topic in topics[:LISTED_MAX]:
            partitions = [self._partition(topic.name, p, sizes) for p in range(topic.partitions)]
            rows.append({"topic": topic.name, "partitions": topic.partitions,
                         "records": sum(p["records"] for p in partitions),
                         "bytes": sum(p["bytes"] for p in partitions),
                         "produced_per_s": self.history.latest_rate(("produced", topic.name))})
        return {"topics": rows, "unlisted": max(0, len(topics) - LISTED_MAX)}

    def topic(self, viewer: Viewer, name: str) -> dict[str, Any]:
        topic = self._on_loop(lambda: self.broker.topics.get(name))
        if topic is None or not self.access.topic(viewer, name):
            raise ConsoleError(f"no topic {name!r}")
        sizes = self._sizes()
        partitions = [self._partition(name, p, sizes) for p in range(topic.partitions)]
        return {"topic": name, "configs": dict(sorted(topic.configs.items())), "partitions": partitions,
                "records": sum(p["records"] for p in partitions), "bytes": sum(p["bytes"] for p in partitions),
                "produced": self.history.series(("produced", name)),
                "consumed": self.history.series(("consumed", name))}

    def _sizes(self) -> dict[str, int]:
        """Bytes in object storage of each stream (the part not uploaded yet is not counted)."""
        return {meta.name: meta.committed_bytes for meta in self.broker.store.iter_streams() if meta.name}

    def _partition(self, topic: str, partition: int, sizes: dict[str, int]) -> dict[str, Any]:
        stream = self.broker.stream_anywhere(topic, partition)
        if stream is None:   # led by another broker of the cluster
            return {"partition": partition, "start": None, "end": None, "records": 0, "bytes": 0, "here": False}
        start, end = stream.start_offset, stream.end_offset
        return {"partition": partition, "start": start, "end": end, "records": end - start,
                "bytes": sizes.get(stream_name(topic, partition), 0), "here": True}

    def messages(self, viewer: Viewer, topic: str, partition: int, offset: int | None, timestamp_ms: int | None,
                 count: int, formats: Formats) -> dict[str, Any]:
        """Up to ``count`` records of a partition from ``offset`` (or from the first at or after
        ``timestamp_ms``; neither: the last ``count``), for a viewer who may read the topic. Committed
        records only (read_committed, Stream.fetch's default): none of an aborted transaction, and none from
        where a transaction still open began."""
        if not self.access.topic(viewer, topic):
            raise ConsoleError(f"no topic {topic!r}")
        if not self.access.topic(viewer, topic, Operation.READ):
            raise ConsoleForbiddenError(f"{viewer.principal} may not read topic {topic!r}")
        stream = self.broker.stream_anywhere(topic, partition)
        if stream is None:
            raise ConsoleError(f"no partition {partition} of topic {topic!r} on this broker")
        count = max(1, min(count, MESSAGES_MAX))
        start, end = stream.start_offset, stream.end_offset
        if timestamp_ms is not None:
            found = stream.offset_for_timestamp(timestamp_ms)
            first = end if found is None else found
        elif offset is not None:
            first = offset
        else:
            first = end - count
        first = min(max(first, start), end)
        records = stream.fetch(first, min(first + count, end), MESSAGES_BYTES_MAX,
                               isolation="read_committed") if first < end else []
        shown = [{"offset": r.offset, "timestamp_ms": r.timestamp_ms, "key": formats.show(r.key),
                  "value": formats.show(r.value), "headers": [(k, formats.show(v)) for k, v in r.headers]}
                 for r in records]
        return {"topic": topic, "partition": partition, "start": start, "end": end, "first": first,
                "records": shown, "format": formats.name}

    # Groups ----------------------------------------------------------------------------------------

    def groups(self, viewer: Viewer) -> dict[str, Any]:
        every = self._on_loop(self.broker.groups.list_groups)
        names = set(self.access.allowed(viewer, Operation.DESCRIBE, ResourceType.GROUP, [g[0] for g in every]))
        listed = [g for g in every if g[0] in names]
        rows = []
        for group_id, protocol_type, state in listed[:LISTED_MAX]:
            lags = self._lags(viewer, group_id)
            rows.append({"group": group_id, "state": state, "protocol": protocol_type or None,
                         "lag": sum(row["lag"] for row in lags if row["lag"] is not None)})
        return {"groups": rows, "unlisted": max(0, len(listed) - LISTED_MAX)}

    def group(self, viewer: Viewer, group_id: str) -> dict[str, Any]:
        [described] = self._on_loop(lambda: self.broker.groups.describe([group_id]))
        if described.state == "Dead" or not self.access.group(viewer, group_id):
            raise ConsoleError(f"no group {group_id!r}")
        owners: dict[tuple[str, int], str] = {}
        members = []
        assignments = [assignment(m.member_assignment) for m in described.members]
        visible = set(self.access.allowed(viewer, Operation.DESCRIBE, ResourceType.TOPIC,
                                          sorted({t for assigned in assignments for t, _ in assigned})))
        for m, every in zip(described.members, assignments, strict=True):
            assigned = [(t, p) for t, p in every if t in visible]
            owners.update({tp: m.member_id for tp in assigned})
            members.append({"member": m.member_id, "instance": m.group_instance_id, "client_id": m.client_id,
                            "host": m.client_host, "partitions": [f"{t}/{p}" for t, p in assigned]})
        lags = self._lags(viewer, group_id)
        for row in lags:
            row["member"] = owners.get((row["topic"], row["partition"]))
        return {"group": group_id, "state": described.state, "protocol": described.protocol_data or None,
                "members": members, "partitions": lags, "lag": sum(r["lag"] or 0 for r in lags),
                "lag_series": self.history.series(("lag", group_id))}

    def _lags(self, viewer: Viewer, group_id: str) -> list[dict[str, Any]]:
        """The group's committed offsets and lag on the topics the viewer may describe."""
        committed = sorted(self.broker.offsets.fetch(group_id).items())
        visible = set(self.access.allowed(viewer, Operation.DESCRIBE, ResourceType.TOPIC,
                                          sorted({t for (t, _), _ in committed})))
        rows = []
        for (topic, partition), entry in committed:
            if topic not in visible:
                continue
            end = self.broker.end_offset_of(topic, partition)
            rows.append({"topic": topic, "partition": partition, "committed": entry.offset, "end": end,
                         "lag": None if end is None else max(0, end - entry.offset)})
        return rows


def assignment(data: bytes) -> list[tuple[str, int]]:
    """The partitions of a consumer's assignment (Kafka's ConsumerProtocolAssignment: a version, then the
    topics and their partitions); empty for bytes that are not one, as a client may send anything."""
    if len(data) < ASSIGNMENT_VERSION_BYTES:
        return []
    try:
        decoded, _ = entity_reader(ConsumerProtocolAssignment)(memoryview(data), ASSIGNMENT_VERSION_BYTES)
    except Exception:  # a client's bytes: any parse failure means "not a consumer assignment"
        return []
    return sorted((tp.topic, p) for tp in decoded.assigned_partitions for p in tp.partitions)
