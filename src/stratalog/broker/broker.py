"""The broker: the stream store, its topics, groups and producers, and the table of the APIs it serves.

``Broker`` is what the request handlers share. It runs on one asyncio event loop (the server's): every
method is called from that loop's thread, so its dicts need no locks; the engine's own threads (WAL,
uploader) reach back only through futures, which complete on the loop via ``wrap_future``. Which partitions
and groups it serves, alone or as one broker of a cluster, its ``ownership`` answers (ownership.py).
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
from stratalog.broker.cluster_ownership import open_cluster_store
from stratalog.broker.config import BrokerConfig
from stratalog.broker.credentials import CredentialStore
from stratalog.broker.fetch_sessions import FetchSessions
from stratalog.broker.groups import GroupCoordinator
from stratalog.broker.log_cleaner import LogCleaner
from stratalog.broker.memory import MemoryBudget
from stratalog.broker.metadata_db import BrokerTables
from stratalog.broker.metrics import BrokerMetrics
from stratalog.broker.offsets import CommittedOffsets
from stratalog.broker.ownership import Ownership, StandaloneOwnership
from stratalog.broker.producer_recovery import ProducerSnapshots, replay
from stratalog.broker.producers import ProducerStates
from stratalog.broker.quotas import Quotas
from stratalog.broker.sasl import new_secret
from stratalog.broker.topic_configs import check_configs, retention
from stratalog.broker.topics import Topic, TopicExistsError, TopicRegistry, check_topic_name, stream_name
from stratalog.broker.transactions import Transactions
from stratalog.broker.txn_partitions import ALL_OFFSETS_END, PartitionTxns
from stratalog.broker.txn_read_view import LoopTxnView
from stratalog.broker.txn_table import TxnTable
from stratalog.engine import Stream, StreamStore
from stratalog.engine.metadata import UnknownStreamError
from stratalog.engine.metadata_backends import MetadataUnavailableError
from stratalog.io.block_io import CompletionWatch
from stratalog.io.device import Device
from stratalog.objects.uri import without_credentials

log = logging.getLogger("stratalog.broker")


T = TypeVar("T")


class Broker:
    """State shared by the handlers. Open with ``Broker.open`` inside the event loop; ``close`` it."""

    def __init__(self, data_dir: Path, store: StreamStore, config: BrokerConfig,
                 object_store_uri: str | None = None, *, ownership: Ownership) -> None:
        self.config = config
        self.store = store
        #: The partitions this broker serves and the groups it coordinates: all of them alone, its share as
        #: one broker of a cluster (``--cluster``). The handlers ask it (broker/ownership.py).
        self.ownership = ownership
        self.data_dir = data_dir
        #: The object store as other processes open it (DescribeConfigs ``stratalog.object.store.uri``).
        self.object_store_uri = object_store_uri or without_credentials(None, data_dir)
        #: Where the broker's tables live: the data directory's files, or config.metadata's database.
        self.tables = BrokerTables(data_dir, config.metadata)
        self.topics = TopicRegistry(self.tables.broker, shared=self.ownership.topics_shared)
        self.credentials = CredentialStore(self.tables.broker)
        self.authorizer = Authorizer(self.tables.broker, config.authorizer)
        self.quotas = Quotas(self.tables.broker, config.quotas)
        #: Response bytes written to sockets and not yet sent, across connections (the server counts them).
        self.response_memory = MemoryBudget(config.response_memory_bytes_max)
        #: Keys the stand-in credentials of unknown users (sasl.py): fresh at each start.
        self.sasl_secret = new_secret()
        self.offsets = CommittedOffsets(self.tables.offsets)
        self.offsets.fence = self.ownership.offsets_fence
        self.groups = GroupCoordinator(self.offsets, config=config.groups)
        #: One thread for the handlers' calls on the committed offsets, run in the order they were made:
        #: commits of a group from several connections land, and are answered, in the order they came.
        self._offsets_worker = ThreadPoolExecutor(1, thread_name_prefix="stratalog-offsets")
        self.producers = ProducerStates(config.producers_max)
        #: What the broker counts as it serves (Prometheus; served by ``serve --metrics-listen``).
        self.metrics = BrokerMetrics()
        #: Consumers' fetch sessions (KIP-227), kept by id whatever connection they come on.
        self.fetch_sessions = FetchSessions(config.fetch_sessions_max, config.fetch_session_partitions_max,
                                            config.fetch_session_cache_partitions_max,
                                            config.fetch_session_eviction_ms / 1000)
        self.metrics.watch_fetch_sessions(self.fetch_sessions.stats)
        self.appender = OrderedAppender(on_full=functools.partial(self.metrics.bound_reached, "log_cache_bytes_max"))
        self._snapshots = ProducerSnapshots(self.tables.producers)
        self.producer_snapshots = self._snapshots
        #: Each partition's open transactions and aborted ranges, as its leader: read_committed's answers.
        self.partition_txns = PartitionTxns()
        # Stream.fetch is read_committed by default: it asks these, through the loop (txn_read_view.py).
        store.set_txn_view(LoopTxnView(self.partition_txns, asyncio.get_running_loop()))
        self._snapshot_task: asyncio.Task[None] | None = None
        #: Where the last saved snapshot of idempotent producers ends, per stream: the log cleaner compacts
        #: no further (the batches after it are replayed at a restart, producer fields and all).
        self.snapshot_ends_saved: dict[int, int] = {}
        self.cleaner = LogCleaner(self)
        #: The transaction coordinator: transactional ids, their states and the ends of their transactions.
        self.transactions = Transactions(self, TxnTable(self.tables.transactions))
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
        #: Fetches waiting for data, by stream id.
        self._waiters: dict[int, set[asyncio.Future[None]]] = {}
        self.apis: dict[int, Api] = {}
        #: api key -> (min, max) version served: what every request is checked against.
        self.supported_versions: dict[int, tuple[int, int]] = {}
        self._stopping = False
        self.ownership.open(self)

    @classmethod
    def open(cls, data_dir: str | os.PathLike[str], config: BrokerConfig | None = None, *,
             object_store: str | None = None, wal_device: Device | None = None) -> Broker:
        """Open the store and the broker's state in ``data_dir``. ``wal_device``: the WAL on a raw block
        device or preallocated file (the caller closes it after the broker)."""
        config = config or BrokerConfig()
        config.validate()
        path = Path(data_dir)
        ownership: Ownership
        if config.cluster.enabled:
            ownership, store = open_cluster_store(path, config, object_store)
        else:
            ownership = StandaloneOwnership()
            store = StreamStore.open(path, object_store, config.store, wal_device=wal_device,
                                     metadata=config.metadata)
        try:
            broker = cls(path, store, config, without_credentials(object_store, path), ownership=ownership)
        except BaseException:
            store.close()
            ownership.leave(clean=False)
            raise
        for api in all_apis():
            broker.register(api)
        broker._watch_completions()
        broker.groups.start()
        broker._snapshot_task = asyncio.get_running_loop().create_task(broker._snapshot_periodically())
        broker.cleaner.start()
        broker.transactions.start()
        broker.ownership.start()
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
        await self.cleaner.stop()
        await self.transactions.stop()
        await self.ownership.stop()
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
        self.transactions.close()
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
        clean = self.ownership.commit_before_leaving()
        self.store.close()
        self.ownership.leave(clean)

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
        """The stream of a topic's partition, or None when there is no such partition or another broker of
        the cluster leads it."""
        return self.ownership.stream(topic, partition)

    def end_offset_of(self, topic: str, partition: int) -> int | None:
        """A partition's end offset, or None where this broker does not serve it; from any thread."""
        stream = self.stream_anywhere(topic, partition)
        return None if stream is None else stream.end_offset

    def stream_anywhere(self, topic: str, partition: int) -> Stream | None:
        """The stream of a partition this broker serves (None: it serves no such partition), from any
        thread: it changes nothing here, unlike :meth:`partition`."""
        return self.ownership.stream_anywhere(topic, partition)

    def partition_error(self, topic: str, partition: int) -> int:
        """Why ``partition`` gave no stream: NOT_LEADER_OR_FOLLOWER for a partition another broker of the
        cluster leads (the client refreshes its metadata), else UNKNOWN_TOPIC_OR_PARTITION."""
        t = self.topics.get(topic)
        if t is not None and 0 <= partition < t.partitions:
            return int(self.ownership.not_served_error)
        return int(ErrorCode.unknown_topic_or_partition)

    def leader_epoch(self, topic: str, partition: int) -> int:
        """The partition's leader epoch: 0 alone, the cluster's count of leader changes in a cluster (-1
        while the partition has no leader)."""
        led = self.ownership.leader(topic, partition)
        return -1 if led is None else led[1]

    def forget_partition(self, topic: str, partition: int) -> None:
        """This broker no longer leads the partition (a cluster's handoff)."""
        self.ownership.forget(topic, partition)

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
        self.ownership.topic_created()
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
        self.ownership.set_retention(topic, retention_ms, retention_bytes)
        return topic

    def delete_topic(self, name: str) -> Topic:
        self.topics.get(name)   # a topic another broker of the cluster made: known here from now on
        topic = self.topics.remove(name)
        for p in range(topic.partitions):
            stream = self.ownership.forget(name, p)
            if stream is not None:
                self.producers.forget_partition(stream.stream_id)
                self.partition_txns.forget(stream.stream_id)
                self._snapshots.forget_aborted_before(stream.stream_id, ALL_OFFSETS_END)
        self.offsets.delete_topic(name)
        self.finish_deletes()
        return topic

    def finish_deletes(self) -> None:
        """Delete the streams of deleted topics this broker may delete (at the open alone; a cluster's
        reconcile calls it)."""
        doomed = self.topics.doomed_streams()
        self.topics.forget_doomed([n for n in doomed if self.ownership.delete_stream(n)])

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

    # Producers and transactions across restarts ----------------------------------------------------

    def recover_producers(self) -> None:
        """Rebuild the idempotent producers and open transactions of every partition served here: their
        snapshot, then the batches after it (at the open alone; a cluster's broker does it per partition as
        it gains each)."""
        ends = self._snapshots.load(self.producers, self.partition_txns)
        self.snapshot_ends_saved.update(ends)
        streams = self.ownership.served_streams()
        replayed = 0
        for s in streams:
            found = replay(self.producers, self.partition_txns, s, ends.get(s.stream_id, 0))
            self._snapshots.add_aborted(s.stream_id, found.aborted)
            replayed += found.batches
        self.settled_ends.update((s.stream_id, s.end_offset) for s in streams)
        if replayed:
            log.info("idempotent producers: %d batches replayed after the last snapshot", replayed)

    def _snapshot_ends(self) -> dict[int, int]:
        """Where the snapshot taken now ends for each partition: at the end of what the loop has settled,
        so every batch past it is replayed at the next start, none skipped; and below every transaction
        marker still being written, so each is read again if its range was not made durable."""
        return {s.stream_id: self.partition_txns.snapshot_bound(
                    s.stream_id, min(s.end_offset, self.settled_ends.get(s.stream_id, s.end_offset)))
                for s in self.ownership.served_streams()}

    def _save_producers(self) -> None:
        ends = self._snapshot_ends()
        self._snapshots.save(self.producers.entries(), ends, self.partition_txns.entries(),
                             partitions_only=self.ownership.snapshot_partitions_only)
        self.snapshot_ends_saved = ends

    async def _snapshot_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.config.producer_snapshot_interval_ms / 1000)
            # In the same loop step: the ends, the producers and the open transactions agree.
            ends = self._snapshot_ends()
            entries = self.producers.entries()
            open_txns = self.partition_txns.entries()
            try:
                await asyncio.to_thread(self._snapshots.save, entries, ends, open_txns,
                                        partitions_only=self.ownership.snapshot_partitions_only)
                await self._forget_trimmed_ranges()
            except MetadataUnavailableError as e:
                # The last snapshot stands; a restart replays more batches after it. The next one retries.
                log.warning("idempotent producers' snapshot not saved: %s", e)
                continue
            self.snapshot_ends_saved = ends

    async def _forget_trimmed_ranges(self) -> None:
        """Aborted ranges end below their partition's start once retention (or DeleteRecords) trims it."""
        for stream in self.ownership.served_streams():
            if self.partition_txns.trimmed(stream.stream_id, stream.start_offset):
                await asyncio.to_thread(self._snapshots.forget_aborted_before, stream.stream_id, stream.start_offset)

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
