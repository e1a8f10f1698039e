"""What this broker owns, the partitions it serves and the groups it coordinates: everything when it is
alone, its share when it is one broker of several.

``Ownership`` is what the broker and its handlers ask instead of testing whether there is a cluster: which
partitions this broker serves and their streams, who leads a partition and coordinates a group, which
brokers Metadata names, whether an answer may be acknowledged now, and the few places where the broker's
own work differs (a deleted topic's streams, retention, the idempotent producers' snapshot). The broker
holds one for its life and calls its lifecycle steps from its own (``open``, ``start``, ``stop``,
``leave``).

Two implementations: :class:`StandaloneOwnership` here (alone, a broker is the whole cluster: it leads every
partition and coordinates every group, from the start), and ``ClusterOwnership``
(broker/cluster_ownership.py), which answers from a ``ClusterNode`` (broker/cluster_node.py): the lease,
the holders PostgreSQL keeps, the partitions gained and handed off.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

from kio.schema.errors import ErrorCode

from stratalog.broker.leader_epochs import STANDALONE_HISTORY, History
from stratalog.broker.topics import Topic, stream_name
from stratalog.broker.txn_markers import MarkerRequest
from stratalog.cluster.assignment import Kind
from stratalog.engine import Stream
from stratalog.engine.metadata import UnknownStreamError
from stratalog.engine.metadata_backends import Backend
from stratalog.invariant import InvariantError

if TYPE_CHECKING:
    from stratalog.broker.broker import Broker
    from stratalog.broker.listeners import Listener

#: The check a commit of committed offsets runs inside its transaction (``CommittedOffsets.fence``).
OffsetsFence = Callable[[Backend, str], None]


class BrokerEndpoint(NamedTuple):
    """A broker as clients are told it (Metadata, DescribeCluster, FindCoordinator)."""

    broker_id: int
    host: str
    port: int


class Ownership(Protocol):
    """The questions the broker asks about where things are served. Everything is called on the broker's
    event loop except where a method says otherwise."""

    @property
    def in_cluster(self) -> bool:
        """Whether this broker is one of several (the console says so)."""
        ...

    @property
    def topics_shared(self) -> bool:
        """Whether other brokers create and delete topics in the same tables (a topic not cached here may
        exist: ``TopicRegistry(shared=...)``)."""
        ...

    @property
    def snapshot_partitions_only(self) -> bool:
        """Whether a snapshot of the idempotent producers replaces only the rows of the partitions this
        broker serves, leaving the others' rows to the brokers that serve them (``ProducerSnapshots.save``)."""
        ...

    @property
    def offsets_fence(self) -> OffsetsFence | None:
        """What a commit of a group's offsets checks first (None: nothing, every group is this broker's)."""
        ...

    @property
    def not_served_error(self) -> ErrorCode:
        """The error for a partition that exists but is not served here (a client that gets
        NOT_LEADER_OR_FOLLOWER refreshes its metadata and goes to the leader)."""
        ...

    # The broker's lifecycle ------------------------------------------------------------------------

    def open(self, broker: Broker) -> None:
        """The broker's state is made (its last step before ``Broker.open`` returns it): answer for it from
        now on, and take over what is this broker's from the start."""
        ...

    def start(self) -> None:
        """The broker is open and serving: start the work that keeps what it owns current."""
        ...

    async def stop(self) -> None:
        """The broker is stopping: stop that work. What is served stays known (the last producers'
        snapshot reads it)."""
        ...

    def commit_before_leaving(self) -> bool:
        """Just before the store closes: whether everything acknowledged is committed, so no other broker
        needs to replay this one's log."""
        ...

    def leave(self, clean: bool) -> None:
        """After the store closed (or failed to open the broker): give up what this broker held."""
        ...

    # Partitions ------------------------------------------------------------------------------------

    def stream(self, topic: str, partition: int) -> Stream | None:
        """The stream of a partition this broker serves now, or None."""
        ...

    def stream_anywhere(self, topic: str, partition: int) -> Stream | None:
        """As :meth:`stream`, from any thread: it changes nothing here."""
        ...

    def forget(self, topic: str, partition: int) -> Stream | None:
        """The partition is no longer served here (its topic deleted, or handed off): the stream that was
        kept for it, if any."""
        ...

    def served_streams(self) -> list[Stream]:
        """The streams of every partition served here (the producers' snapshot covers these)."""
        ...

    def leader(self, topic: str, partition: int) -> tuple[int, int] | None:
        """The partition's live leader and its leader epoch, or None while it has none."""
        ...

    def epochs(self, topic: str, partition: int) -> History | None:
        """The leader epochs of a partition served here and the offset each began at, oldest first (the
        last is the epoch it is served at); None for a partition not served here."""
        ...

    def topic_created(self) -> None:
        """A topic was made (from any thread): its partitions should be served soon."""
        ...

    def set_retention(self, topic: Topic, retention_ms: int | None, retention_bytes: int | None) -> None:
        """Set a topic's retention on its partitions' streams."""
        ...

    def delete_stream(self, name: str) -> bool:
        """Delete the stream of a deleted topic's partition: whether it is gone (False: left to the broker
        that may delete it, at its next chance)."""
        ...

    # Brokers and groups ----------------------------------------------------------------------------

    def brokers(self, listener: Listener) -> list[BrokerEndpoint]:
        """Every live broker, each at its listener of the protocol of ``listener`` (the client's)."""
        ...

    async def coordinator(self, key: str, listener: Listener, kind: Kind = Kind.GROUP) -> BrokerEndpoint | None:
        """The live broker that coordinates the group (or, with ``kind`` TRANSACTION, the transactional
        id): one is given if it has none; None if none could be given."""
        ...

    def coordinates(self, key: str, kind: Kind = Kind.GROUP) -> bool:
        """Whether this broker coordinates the group or transactional id (else its APIs answer
        NOT_COORDINATOR here)."""
        ...

    async def forget_coordinated(self, key: str, kind: Kind) -> None:
        """A group or transactional id this broker coordinates is gone (expired): nobody holds it any more."""
        ...

    @property
    def txn_fence(self) -> OffsetsFence | None:
        """What a change of a transactional id's state checks first, in its database transaction (None:
        nothing, every id is this broker's)."""
        ...

    async def deliver_markers(self, markers: Sequence[MarkerRequest]) -> None:
        """Have the transaction markers written into partitions led by other brokers, each durable when
        this returns (raises MarkerWriteError otherwise: the coordinator tries again later). A broker
        alone leads every partition: it is never asked."""
        ...

    def assignment_refused(self, named: set[int]) -> str | None:
        """Why CreateTopics may not place partitions on the brokers ``named``, or None if it may."""
        ...

    def may_acknowledge(self) -> bool:
        """Whether an answer for what this broker serves may be given now (from any thread)."""
        ...

    def stats(self) -> dict[str, int]:
        """Figures for /metrics and the console (from any thread)."""
        ...

    def summary(self) -> str | None:
        """A line for ``stratalog serve``'s start on this broker's place among others, or None alone."""
        ...


class StandaloneOwnership:
    """A broker alone: it serves every partition of every topic, and coordinates every group."""

    in_cluster = False
    topics_shared = False
    snapshot_partitions_only = False
    offsets_fence: OffsetsFence | None = None
    #: Every partition that exists is served here: one without a stream does not exist.
    not_served_error = ErrorCode.unknown_topic_or_partition

    def __init__(self) -> None:
        self._broker: Broker | None = None
        #: The streams of the partitions asked for so far, opened once.
        self._streams: dict[tuple[str, int], Stream] = {}

    def _opened(self) -> Broker:
        if self._broker is None:
            raise InvariantError("ownership asked before the broker opened it")
        return self._broker

    def open(self, broker: Broker) -> None:
        self._broker = broker
        # Every partition is this broker's from the start (in a cluster, each is taken over when gained):
        # the streams of topics deleted before a crash go now, and the producers come back from their
        # snapshot and the batches after it.
        broker.finish_deletes()
        broker.recover_producers()

    def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def commit_before_leaving(self) -> bool:
        return False   # nobody else replays this broker's log: its own next start does

    def leave(self, clean: bool) -> None:
        pass

    def stream(self, topic: str, partition: int) -> Stream | None:
        stream = self._streams.get((topic, partition))
        if stream is not None:
            return stream
        broker = self._opened()
        t = broker.topics.get(topic)
        if t is None or not 0 <= partition < t.partitions:
            return None
        stream = broker.store.open_stream(stream_name(topic, partition))
        self._streams[(topic, partition)] = stream
        return stream

    def stream_anywhere(self, topic: str, partition: int) -> Stream | None:
        stream = self._streams.get((topic, partition))
        if stream is not None:
            return stream
        try:
            return self._opened().store.open_stream(stream_name(topic, partition))
        except UnknownStreamError:
            return None

    def forget(self, topic: str, partition: int) -> Stream | None:
        return self._streams.pop((topic, partition), None)

    def served_streams(self) -> list[Stream]:
        return [s for t in self._opened().topics.all() for p in range(t.partitions) if (s := self.stream(t.name, p))]

    def leader(self, topic: str, partition: int) -> tuple[int, int] | None:
        return self._opened().config.node_id, 0

    def epochs(self, topic: str, partition: int) -> History | None:
        return STANDALONE_HISTORY if self.stream(topic, partition) is not None else None

    def topic_created(self) -> None:
        pass

    def set_retention(self, topic: Topic, retention_ms: int | None, retention_bytes: int | None) -> None:
        store = self._opened().store
        for p in range(topic.partitions):
            stream = self.stream(topic.name, p)
            if stream is not None:
                store.set_retention(stream, retention_ms=retention_ms, retention_bytes=retention_bytes)

    def delete_stream(self, name: str) -> bool:
        store = self._opened().store
        try:
            stream = store.open_stream(name)
        except UnknownStreamError:
            return True   # deleted before a crash cut the cleanup short
        with contextlib.suppress(UnknownStreamError):
            store.delete_stream(stream)
        return True

    def brokers(self, listener: Listener) -> list[BrokerEndpoint]:
        return [BrokerEndpoint(self._opened().config.node_id, *listener.endpoint)]

    async def coordinator(self, key: str, listener: Listener, kind: Kind = Kind.GROUP) -> BrokerEndpoint | None:
        return BrokerEndpoint(self._opened().config.node_id, *listener.endpoint)

    def coordinates(self, key: str, kind: Kind = Kind.GROUP) -> bool:
        return True

    txn_fence: OffsetsFence | None = None

    async def forget_coordinated(self, key: str, kind: Kind) -> None:
        pass   # alone, nothing is held

    async def deliver_markers(self, markers: Sequence[MarkerRequest]) -> None:
        raise InvariantError("a broker alone leads every partition: no marker is for another broker")

    def assignment_refused(self, named: set[int]) -> str | None:
        node_id = self._opened().config.node_id
        others = named - {node_id}
        if not others:
            return None
        return f"this broker is broker {node_id}, alone: no broker {', '.join(map(str, sorted(others)))}"

    def may_acknowledge(self) -> bool:
        return True

    def stats(self) -> dict[str, int]:
        return {}

    def summary(self) -> str | None:
        return None
