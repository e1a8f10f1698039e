"""What a broker of a cluster owns (``stratalog serve --cluster``): the questions of ``Ownership``
(broker/ownership.py), answered from this broker's ``ClusterNode`` (broker/cluster_node.py).

The node follows PostgreSQL: it holds the lease, and its reconcile gains and hands off partitions and
groups (docs/cluster.md). This module only reads what the node published and translates it: a partition
is served here while the node serves its stream, led by whoever holds it under a live lease; a group is
coordinated by its holder; answers are acknowledged while the lease is confirmed. It also opens the stream
store the way a cluster needs (:func:`open_cluster_store`): on this incarnation's log in the shared object
store, its commits fenced by what this broker holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kio.schema.errors import ErrorCode

from stratalog.broker.cluster_node import ClusterNode
from stratalog.broker.config import BrokerConfig
from stratalog.broker.leader_epochs import History
from stratalog.broker.ownership import BrokerEndpoint, OffsetsFence
from stratalog.broker.topics import Topic, stream_name
from stratalog.broker.txn_marker_queue import ClusterMarkers
from stratalog.broker.txn_markers import MarkerRequest, MarkerWriteError
from stratalog.cluster.assignment import Kind, Resource
from stratalog.cluster.failover import log_owner
from stratalog.datadir import prepare_data_dir
from stratalog.engine import Stream, StreamStore
from stratalog.engine.metadata import UnknownStreamError
from stratalog.errors import StratalogError
from stratalog.invariant import InvariantError
from stratalog.wal.object_wal import ObjectWAL

if TYPE_CHECKING:
    from stratalog.broker.broker import Broker
    from stratalog.broker.listeners import Listener

log = logging.getLogger("stratalog.broker")


def open_cluster_store(path: Path, config: BrokerConfig,
                       object_store: str | None) -> tuple[ClusterOwnership, StreamStore]:
    """Join the cluster, then open the stream store on this incarnation's log in the shared object store,
    its metadata commits fenced by the partitions this incarnation holds."""
    assert config.metadata is not None
    if object_store is None:
        raise ValueError("a broker of a cluster needs an object store the others reach too (--object-store)")
    node = ClusterNode(config.cluster, config.metadata,
                       [(listener.protocol.value, *listener.endpoint) for listener in config.listeners])
    epoch = node.join()
    try:
        path, objects = prepare_data_dir(path, object_store)
        wal = ObjectWAL.open(objects, log_owner(config.cluster.broker_id, epoch))
        store = StreamStore.open(path, objects, config.store, metadata=config.metadata,
                                 fence=node.cluster.stream_fence, wal=wal)
    except BaseException:
        node.leave(clean=False)
        raise
    return ClusterOwnership(node), store


class ClusterOwnership:
    """One broker of several, as its ``ClusterNode`` sees the cluster."""

    in_cluster = True
    topics_shared = True
    snapshot_partitions_only = True
    #: The partition exists, another broker leads it: the client refreshes its metadata.
    not_served_error = ErrorCode.not_leader_or_follower

    def __init__(self, node: ClusterNode) -> None:
        self.node = node
        self._broker: Broker | None = None
        #: The markers queued between coordinators and leaders, while serving.
        self._markers: ClusterMarkers | None = None

    def _opened(self) -> Broker:
        if self._broker is None:
            raise InvariantError("ownership asked before the broker opened it")
        return self._broker

    @property
    def offsets_fence(self) -> OffsetsFence | None:
        # Only the group's coordinator commits its offsets, checked in the commit's transaction.
        return self.node.cluster.group_fence

    # The broker's lifecycle ------------------------------------------------------------------------

    def open(self, broker: Broker) -> None:
        # Nothing is this broker's yet: each partition's producers are loaded when it is gained, and a
        # doomed stream is deleted by whoever deletes its topic (or at a reconcile).
        self._broker = broker

    def start(self) -> None:
        broker = self._opened()
        self.node.start(broker)
        self._markers = ClusterMarkers(broker, str(broker.tables.transactions))
        self._markers.start()

    async def stop(self) -> None:
        if self._markers is not None:
            await self._markers.stop()
        await self.node.stop()

    def commit_before_leaving(self) -> bool:
        try:
            self._opened().store.flush()   # everything acknowledged committed: the log needs no replay
        except Exception as e:  # the log keeps it: another broker replays it
            log.warning("the last upload before leaving the cluster failed: %s", e)
            return False
        return True

    def leave(self, clean: bool) -> None:
        self.node.leave(clean)

    # Partitions ------------------------------------------------------------------------------------

    def stream(self, topic: str, partition: int) -> Stream | None:
        return self.node.stream(stream_name(topic, partition))   # only the partitions it leads now

    def stream_anywhere(self, topic: str, partition: int) -> Stream | None:
        return self.node.stream(stream_name(topic, partition))

    def forget(self, topic: str, partition: int) -> Stream | None:
        return None   # the node keeps the streams it serves, and drops them itself

    def served_streams(self) -> list[Stream]:
        return self.node.served()

    def leader(self, topic: str, partition: int) -> tuple[int, int] | None:
        return self.node.leader(stream_name(topic, partition))

    def epochs(self, topic: str, partition: int) -> History | None:
        return self.node.epochs(stream_name(topic, partition))

    def topic_created(self) -> None:
        self.node.poke()   # its partitions get leaders at once, not at the next reconcile

    def set_retention(self, topic: Topic, retention_ms: int | None, retention_bytes: int | None) -> None:
        meta = self._opened().store.metadata
        for p in range(topic.partitions):
            # Every partition's row, led here or not: the retention is the stream's, whoever leads it.
            meta.set_retention(meta.stream(stream_name(topic.name, p)).stream_id, retention_ms, retention_bytes)

    def delete_stream(self, name: str) -> bool:
        try:
            self._delete_stream(name)
        except StratalogError as e:
            # Only the partition's last leader may change its stream (the fence); it deletes it at its
            # next reconcile.
            log.info("the stream %s of a deleted topic is left to its leader: %s", name, e)
            return False
        return True

    def _delete_stream(self, name: str) -> None:
        store = self._opened().store
        try:
            stream = store.open_stream(name)
        except UnknownStreamError:
            try:
                stream = store.reload_stream(name)   # made by another broker of the cluster
            except UnknownStreamError:
                return   # deleted already, by whichever broker could
        with contextlib.suppress(UnknownStreamError):
            store.delete_stream(stream)
        try:
            self.node.forget_epochs(stream.stream_id)
        except Exception as e:  # the rows stay (a hundred at most), keyed by a stream id never used again
            log.warning("the leader epochs of the deleted stream %s were not deleted: %s", name, e)

    # Brokers and groups ----------------------------------------------------------------------------

    def brokers(self, listener: Listener) -> list[BrokerEndpoint]:
        protocol = listener.protocol.value
        return [BrokerEndpoint(b.broker_id, *b.endpoint(protocol)) for b in self.node.live.values()]

    async def coordinator(self, key: str, listener: Listener, kind: Kind = Kind.GROUP) -> BrokerEndpoint | None:
        found = await self.node.coordinator(key, kind)
        if found is None:
            return None
        return BrokerEndpoint(found.broker_id, *found.endpoint(listener.protocol.value))

    def coordinates(self, key: str, kind: Kind = Kind.GROUP) -> bool:
        return self.node.coordinates(key, kind)

    async def forget_coordinated(self, key: str, kind: Kind) -> None:
        await asyncio.to_thread(self.node.cluster.forget, Resource(kind, key))

    @property
    def txn_fence(self) -> OffsetsFence | None:
        # Only a transactional id's coordinator changes its state, checked in the change's transaction.
        return self.node.cluster.txn_fence

    async def deliver_markers(self, markers: Sequence[MarkerRequest]) -> None:
        if self._markers is None:
            raise MarkerWriteError("the broker is not serving yet")
        await self._markers.deliver(markers)

    def assignment_refused(self, named: set[int]) -> str | None:
        # Partitions go where the cluster's balance puts them: an assignment that names a broker is refused
        # rather than silently not followed.
        unknown = named - set(self.node.live)
        if unknown:
            return f"no live broker {', '.join(map(str, sorted(unknown)))}"
        return "in a cluster, partitions are placed by the cluster's balance: create the topic without an assignment"

    def may_acknowledge(self) -> bool:
        return self.node.may_acknowledge()

    def stats(self) -> dict[str, int]:
        return self.node.stats()

    def summary(self) -> str | None:
        return (f"broker {self.node.broker_id} of a cluster (incarnation {self.node.epoch}; lease "
                f"{self.node.config.lease_ms} ms)")
