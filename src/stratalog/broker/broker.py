"""The broker: the stream store, its topics, groups and producers, and the table of the APIs it serves.

``Broker`` is what the request handlers share. It runs on one asyncio event loop (the server's): every
method is called from that loop's thread, so its dicts need no locks; the engine's own threads (WAL,
uploader) reach back only through futures, which complete on the loop via ``wrap_future``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from kio.schema.errors import ErrorCode

from stratalog.broker.acls import Authorizer
from stratalog.broker.api_registry import all_apis
from stratalog.broker.apis import Api
from stratalog.broker.appender import OrderedAppender
from stratalog.broker.cluster_node import ClusterNode
from stratalog.broker.config import BrokerConfig
from stratalog.broker.credentials import CredentialStore
from stratalog.broker.groups import GroupCoordinator
from stratalog.broker.memory import MemoryBudget
from stratalog.broker.metadata_db import BrokerTables
from stratalog.broker.metrics import BrokerMetrics
from stratalog.broker.offsets import CommittedOffsets
from stratalog.broker.producer_recovery import ProducerSnapshots, replay
from stratalog.broker.producers import ProducerStates
from stratalog.broker.quotas import Quotas
from stratalog.broker.sasl import new_secret
from stratalog.broker.topic_configs import check_configs, retention
from stratalog.broker.topics import Topic, TopicExistsError, TopicRegistry, check_topic_name, stream_name
from stratalog.cluster.failover import log_owner
from stratalog.datadir import prepare_data_dir
from stratalog.engine import Stream, StreamStore
from stratalog.engine.metadata import UnknownStreamError
from stratalog.engine.metadata_backends import MetadataUnavailableError
from stratalog.errors import StratalogError
from stratalog.io.block_io import CompletionWatch
from stratalog.io.device import Device
from stratalog.objects.uri import without_credentials
from stratalog.wal.object_wal import ObjectWAL

log = logging.getLogger("stratalog.broker")


def _open_cluster_store(path: Path, config: BrokerConfig, object_store: str | None) -> tuple[ClusterNode, StreamStore]:
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
    return node, store

T = TypeVar("T")


class Broker:
    """State shared by the handlers. Open with ``Broker.open`` inside the event loop; ``close`` it."""

    def __init__(self, data_dir: Path, store: StreamStore, config: BrokerConfig,
                 object_store_uri: str | None = None, node: ClusterNode | None = None) -> None:
        self.config = config
        self.store = store
        #: This broker's membership of a cluster (``--cluster``), or None: alone, it leads everything.
        self.node = node
        self.data_dir = data_dir
        #: The object store as other processes open it (DescribeConfigs ``stratalog.object.store.uri``).
        self.object_store_uri = object_store_uri or without_credentials(None, data_dir)
        #: Where the broker's tables live: the data directory's files, or config.metadata's database.
        self.tables = BrokerTables(data_dir, config.metadata)
        self.topics = TopicRegistry(self.tables.broker, shared=node is not None)
        self.credentials = CredentialStore(self.tables.broker)
        self.authorizer = Authorizer(self.tables.broker, config.authorizer)
        self.quotas = Quotas(self.tables.broker, config.quotas)
        #: Response bytes written to sockets and not yet sent, across connections (the server counts them).
        self.response_memory = MemoryBudget(config.response_memory_bytes_max)
        #: Keys the stand-in credentials of unknown users (sasl.py): fresh at each start.
        self.sasl_secret = new_secret()
        self.offsets = CommittedOffsets(self.tables.offsets)
        if node is not None:   # only the group's coordinator commits its offsets, checked in the commit
            self.offsets.fence = node.cluster.group_fence
        self.groups = GroupCoordinator(self.offsets, config=config.groups)
        #: One thread for the handlers' calls on the committed offsets, run in the order they were made:
        #: commits of a group from several connections land, and are answered, in the order they came.
        self._offsets_worker = ThreadPoolExecutor(1, thread_name_prefix="stratalog-offsets")
        self.producers = ProducerStates(config.producers_max)
        #: What the broker counts as it serves (Prometheus; served by ``serve --metrics-listen``).
        self.metrics = BrokerMetrics()
        self.appender = OrderedAppender(on_full=functools.partial(self.metrics.bound_reached, "log_cache_bytes_max"))
        self._snapshots = ProducerSnapshots(self.tables.producers)
        self.producer_snapshots = self._snapshots
        self._snapshot_task: asyncio.Task[None] | None = None
        #: The WAL's write completions, taken on the event loop (None: the WAL's own thread takes them).
        self._completions: CompletionWatch | None = None
        #: Appends of idempotent batches not durable yet, by (producer id, stream id, base sequence): a
        #: retry arriving meanwhile waits for the first one's offset.
        self.producing: dict[tuple[int, int, int], asyncio.Future[int]] = {}
        #: Per stream: offsets below were acknowledged *and* their idempotent producers' batches recorded,
        #: on the loop. A stream's durable end moves on a WAL thread, before the loop settles the batch, so
        #: a snapshot taken between the two with the durable end would skip a batch its producer states do
        #: not hold yet (and the producer's next batch after a restart would be out of order).
        self.settled_ends: dict[int, int] = {}
        self._streams: dict[tuple[str, int], Stream] = {}
        #: Fetches waiting for data, by stream id.
        self._waiters: dict[int, set[asyncio.Future[None]]] = {}
        self.apis: dict[int, Api] = {}
        #: api key -> (min, max) version served: what every request is checked against.
        self.supported_versions: dict[int, tuple[int, int]] = {}
        self._stopping = False
        if node is None:
            # In a cluster, each partition's producers are loaded when this broker gains it, and a doomed
            # stream is deleted by whoever deletes its topic.
            self._finish_deletes()
            self._recover_producers()

    @classmethod
    def open(cls, data_dir: str | os.PathLike[str], config: BrokerConfig | None = None, *,
             object_store: str | None = None, wal_device: Device | None = None) -> Broker:
        """Open the store and the broker's state in ``data_dir``. ``wal_device``: the WAL on a raw block
        device or preallocated file (the caller closes it after the broker)."""
        config = config or BrokerConfig()
        config.validate()
        path = Path(data_dir)
        node = None
        if config.cluster.enabled:
            node, store = _open_cluster_store(path, config, object_store)
        else:
            store = StreamStore.open(path, object_store, config.store, wal_device=wal_device,
                                     metadata=config.metadata)
        try:
            broker = cls(path, store, config, without_credentials(object_store, path), node)
        except BaseException:
            store.close()
            if node is not None:
                node.leave(clean=False)
            raise
        for api in all_apis():
            broker.register(api)
        broker._watch_completions()
        broker.groups.start()
        broker._snapshot_task = asyncio.get_running_loop().create_task(broker._snapshot_periodically())
        if node is not None:
            node.start(broker)
        return broker

    @property
    def stopping(self) -> bool:
        return self._stopping

    def stop_waiting(self) -> None:
        """Wake every waiting fetch, and let no fetch wait from now on (the broker is stopping)."""
        self._stopping = True
        for waiters in self._waiters.values():
            for w in waiters:
                if not w.done():
                    w.set_result(None)
        self._waiters.clear()

    def in_offsets_order(self, call: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """``call(*args)`` on the offsets' thread, after every call handed to it before (call this before
        the handler's first await, so the order is the requests')."""
        return asyncio.get_running_loop().run_in_executor(self._offsets_worker, call, *args)

    async def close(self) -> None:
        if self.node is not None:
            await self.node.stop()
        if self._snapshot_task is not None:
            self._snapshot_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._snapshot_task
        await self.groups.close()
        self._unwatch_completions()  # before the calls below block the loop and the WAL closes
        self.appender.close()
        try:
            self._save_producers()
        except MetadataUnavailableError as e:   # the store still closes; the next start replays more
            log.warning("idempotent producers' snapshot not saved at the stop: %s", e)
        self._snapshots.close()
        for waiters in self._waiters.values():
            for w in waiters:
                if not w.done():
                    w.set_result(None)
        self.topics.close()
        self.credentials.close()
        self.authorizer.close()
        self.quotas.close()
        self._offsets_worker.shutdown(wait=True)
        self.offsets.close()
        clean = False
        if self.node is not None:
            try:
                self.store.flush()   # everything acknowledged committed: the log needs no replay
                clean = True
            except Exception as e:  # the log keeps it: another broker replays it
                log.warning("the last upload before leaving the cluster failed: %s", e)
        self.store.close()
        if self.node is not None:
            self.node.leave(clean)

    def _watch_completions(self) -> None:
        """Complete the WAL's appends on this loop, as soon as their block is written (a produce answered
        without a thread's wake-up and GIL hand-over between the disk and the loop)."""
        backstop_ms = self.config.wal_completion_backstop_ms
        watch = self.store.watch_completions(backstop_ms / 1000) if backstop_ms > 0 else None
        if watch is not None:
            asyncio.get_running_loop().add_reader(watch.fd, watch.reap)
        self._completions = watch

    def _unwatch_completions(self) -> None:
        watch, self._completions = self._completions, None
        if watch is not None:
            asyncio.get_running_loop().remove_reader(watch.fd)
            watch.release()

    def register(self, api: Api) -> None:
        self.apis[api.key] = api
        self.supported_versions[api.key] = (api.min_version, api.max_version)

    # Topics and partitions ---------------------------------------------------------------------------

    def partition(self, topic: str, partition: int) -> Stream | None:
        """The stream of a topic's partition, or None when there is no such partition."""
        stream = self._streams.get((topic, partition))
        if stream is not None:
            return stream
        if self.node is not None:   # a cluster: only the partitions this broker leads now
            return self.node.stream(stream_name(topic, partition))
        t = self.topics.get(topic)
        if t is None or not 0 <= partition < t.partitions:
            return None
        stream = self.store.open_stream(stream_name(topic, partition))
        self._streams[(topic, partition)] = stream
        return stream

    def end_offset_of(self, topic: str, partition: int) -> int | None:
        """A partition's end offset, or None where this broker does not serve it; from any thread."""
        stream = self.stream_anywhere(topic, partition)
        return None if stream is None else stream.end_offset

    def stream_anywhere(self, topic: str, partition: int) -> Stream | None:
        """The stream of a partition this broker serves (None: it serves no such partition), from any
        thread: it changes nothing here, unlike :meth:`partition`."""
        stream = self._streams.get((topic, partition))
        if stream is not None:
            return stream
        name = stream_name(topic, partition)
        if self.node is not None:
            return self.node.stream(name)
        try:
            return self.store.open_stream(name)
        except UnknownStreamError:
            return None

    def partition_error(self, topic: str, partition: int) -> int:
        """Why ``partition`` gave no stream: NOT_LEADER_OR_FOLLOWER for a partition another broker of the
        cluster leads (the client refreshes its metadata), else UNKNOWN_TOPIC_OR_PARTITION."""
        t = self.topics.get(topic)
        if self.node is not None and t is not None and 0 <= partition < t.partitions:
            return int(ErrorCode.not_leader_or_follower)
        return int(ErrorCode.unknown_topic_or_partition)

    def leader_epoch(self, topic: str, partition: int) -> int:
        """The partition's leader epoch: 0 alone, the cluster's count of leader changes in a cluster."""
        if self.node is None:
            return 0
        led = self.node.leader(stream_name(topic, partition))
        return -1 if led is None else led[1]

    def forget_partition(self, topic: str, partition: int) -> None:
        """This broker no longer leads the partition (a cluster's handoff)."""
        self._streams.pop((topic, partition), None)

    def create_topic(self, name: str, partitions: int, configs: dict[str, str | None]) -> Topic:
        """Create a topic with its streams; raises InvalidTopicError, TopicExistsError, InvalidConfigError,
        ValueError (partition count)."""
        check_topic_name(name)
        if not 0 < partitions <= self.config.partitions_per_topic_max:
            raise ValueError(f"a topic has 1 to {self.config.partitions_per_topic_max} partitions, not {partitions}")
        checked = check_configs(configs)
        if self.topics.get(name) is not None:
            raise TopicExistsError(f"topic {name!r} already exists")
        self._create_streams(name, 0, partitions, checked)
        topic = self.topics.add(name, partitions, checked)
        if self.node is not None:
            self.node.poke()   # its partitions get leaders at once, not at the next reconcile
        return topic

    def _create_streams(self, name: str, first: int, count: int, configs: dict[str, str]) -> None:
        names = [stream_name(name, p) for p in range(first, first + count)]
        # Streams a create cut short by a crash left (empty: no topic row, so nothing was produced).
        missing = []
        for n in names:
            try:
                self.store.open_stream(n)
            except UnknownStreamError:
                missing.append(n)
        self.store.create_streams(missing)
        retention_ms, retention_bytes = retention(configs)
        if retention_ms is not None or retention_bytes is not None:
            for n in names:
                self.store.set_retention(self.store.open_stream(n), retention_ms=retention_ms,
                                         retention_bytes=retention_bytes)

    def add_partitions(self, name: str, count: int) -> Topic:
        topic = self.topics.get(name)
        assert topic is not None
        self._create_streams(name, topic.partitions, count - topic.partitions, topic.configs)
        return self.topics.set_partitions(name, count)

    def set_topic_configs(self, name: str, configs: dict[str, str]) -> Topic:
        topic = self.topics.set_configs(name, configs)
        retention_ms, retention_bytes = retention(configs)
        for p in range(topic.partitions):
            if self.node is not None:
                # Every partition's row, led here or not: the retention is the stream's, whoever leads it.
                meta = self.store.metadata
                meta.set_retention(meta.stream(stream_name(name, p)).stream_id, retention_ms, retention_bytes)
                continue
            stream = self.partition(name, p)
            if stream is not None:
                self.store.set_retention(stream, retention_ms=retention_ms, retention_bytes=retention_bytes)
        return topic

    def delete_topic(self, name: str) -> Topic:
        self.topics.get(name)   # a topic another broker of the cluster made: known here from now on
        topic = self.topics.remove(name)
        for p in range(topic.partitions):
            stream = self._streams.pop((name, p), None)
            if stream is not None:
                self.producers.forget_partition(stream.stream_id)
        self.offsets.delete_topic(name)
        self._finish_deletes()
        return topic

    def _finish_deletes(self) -> None:
        doomed = self.topics.doomed_streams()
        deleted = []
        for n in doomed:
            try:
                self._delete_stream(n)
            except StratalogError as e:
                if self.node is None:
                    raise
                # A cluster: only the partition's last leader may change its stream (the fence); it deletes
                # it at its next reconcile.
                log.info("the stream %s of a deleted topic is left to its leader: %s", n, e)
                continue
            deleted.append(n)
        self.topics.forget_doomed(deleted)

    def finish_deletes(self) -> None:
        """Delete the streams of deleted topics this broker may delete (a cluster's reconcile calls it)."""
        self._finish_deletes()

    def _delete_stream(self, name: str) -> None:
        try:
            stream = self.store.open_stream(name)
        except UnknownStreamError:
            if self.node is None:
                return   # deleted before a crash cut the cleanup short
            try:
                stream = self.store.reload_stream(name)   # made by another broker of the cluster
            except UnknownStreamError:
                return   # deleted already, by whichever broker could
        with contextlib.suppress(UnknownStreamError):
            self.store.delete_stream(stream)

    def auto_create(self, name: str) -> Topic | None:
        """The topic, created with the defaults if auto-creation is on and the name is valid."""
        topic = self.topics.get(name)
        if topic is not None or not self.config.auto_create_topics:
            return topic
        try:
            topic = self.create_topic(name, self.config.default_partitions, {})
        except TopicExistsError:
            return self.topics.get(name)   # another broker of the cluster made it meanwhile
        except ValueError:
            return None
        log.info("created topic %s (%d partitions) on first use", name, topic.partitions)
        return topic

    # Idempotent producers across restarts -----------------------------------------------------------

    def _partition_streams(self) -> list[Stream]:
        if self.node is not None:
            return self.node.served()
        return [s for t in self.topics.all() for p in range(t.partitions) if (s := self.partition(t.name, p))]

    def _recover_producers(self) -> None:
        ends = self._snapshots.load(self.producers)
        streams = self._partition_streams()
        replayed = sum(replay(self.producers, s, ends.get(s.stream_id, 0)) for s in streams)
        self.settled_ends.update((s.stream_id, s.end_offset) for s in streams)
        if replayed:
            log.info("idempotent producers: %d batches replayed after the last snapshot", replayed)

    def _snapshot_ends(self) -> dict[int, int]:
        """Where the snapshot taken now ends for each partition: at the end of what the loop has settled,
        so every batch past it is replayed at the next start, none skipped."""
        return {s.stream_id: min(s.end_offset, self.settled_ends.get(s.stream_id, s.end_offset))
                for s in self._partition_streams()}

    def _save_producers(self) -> None:
        ends = self._snapshot_ends()
        self._snapshots.save(self.producers.entries(), ends, partitions_only=self.node is not None)

    async def _snapshot_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.config.producer_snapshot_interval_ms / 1000)
            ends = self._snapshot_ends()         # in the same loop step as the entries: they agree
            entries = self.producers.entries()
            try:
                await asyncio.to_thread(self._snapshots.save, entries, ends, partitions_only=self.node is not None)
            except MetadataUnavailableError as e:
                # The last snapshot stands; a restart replays more batches after it. The next one retries.
                log.warning("idempotent producers' snapshot not saved: %s", e)

    # Waiting for data --------------------------------------------------------------------------------

    def data_arrived(self, stream_id: int) -> None:
        """Wake the fetches waiting on a stream (an append became durable)."""
        waiters = self._waiters.pop(stream_id, None)
        if waiters:
            for w in waiters:
                if not w.done():
                    w.set_result(None)

    async def wait_for_data(self, stream_ids: list[int], timeout_s: float) -> None:
        """Return once any of ``stream_ids`` gets new data, or after ``timeout_s``."""
        if timeout_s <= 0 or not stream_ids or self._stopping:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for sid in stream_ids:
            self._waiters.setdefault(sid, set()).add(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout_s)
        except TimeoutError:
            pass
        finally:
            for sid in stream_ids:
                waiters = self._waiters.get(sid)
                if waiters is not None:
                    waiters.discard(waiter)
                    if not waiters:
                        del self._waiters[sid]
