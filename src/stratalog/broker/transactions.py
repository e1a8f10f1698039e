"""The transaction coordinator (KIP-98, KIP-447): the shell around broker/txn_state.py's rules. It keeps
each transactional id's state durable (broker/txn_table.py) before answering, writes the commit or abort
markers into every partition of a transaction when it ends (broker/txn_markers.py, as each partition's
leader), stores the offsets committed in it when it commits, and aborts transactions that outlive their
timeout. What read_committed consumers get (last stable offsets, aborted ranges) is each partition's own
state (broker/txn_partitions.py), not the coordinator's. Spec: docs/formats/transactions.md.

Standalone, this broker coordinates every transactional id and leads every partition, so a transactional
batch is checked against the coordinator's own state (the partition must have been added, under the
producer's current epoch). In a cluster, each id is coordinated by the broker that holds it (a lease, as
groups; docs/cluster.md): it loads the id's state when it gets it, every change is fenced by that hold
in the database, the markers of partitions led elsewhere go through the database to their leaders
(broker/txn_marker_queue.py), and offsets committed in the transaction at another broker (the group's
coordinator) are kept beside its state. A partition led by a broker that does not coordinate the
transaction checks the first batch of the transaction there against the state in the database (as
Kafka's leaders ask the coordinator since KIP-890). Every method runs on the broker's event loop; requests
of one transactional id take turns (a lock each).

Recovery: a transaction found Prepare* at start had its end decided and made durable, and some of its
markers may be missing: they are written again (a marker twice in a partition is harmless: the second
ends nothing) and the transaction completed. An Ongoing one goes on, and its timeout aborts it if its
producer is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from kio.schema.errors import ErrorCode

from stratalog.broker.offsets import OffsetEntry
from stratalog.broker.txn_markers import MarkerRequest, MarkerWriteError, write_marker
from stratalog.broker.txn_state import (
    OPEN_STATES,
    InitAction,
    PendingOffset,
    Txn,
    TxnPartition,
    TxnState,
    aborting,
    completed,
    expired,
    needs_new_id,
    on_add,
    on_end,
    on_init,
    on_offset_commit,
    produce_refusal,
)
from stratalog.broker.txn_table import TxnTable
from stratalog.cluster.assignment import Kind
from stratalog.cluster.leases import ClusterError
from stratalog.engine.metadata_backends import Backend, MetadataUnavailableError
from stratalog.errors import StratalogError
from stratalog.kafka.control_batch import MarkerType

if TYPE_CHECKING:
    from stratalog.broker.broker import Broker

log = logging.getLogger("stratalog.broker.transactions")

P = ParamSpec("P")
R = TypeVar("R")

#: The coordinator's epoch written in every marker, in a cluster too: an outcome is durable under the
#: coordinator's hold before any marker is written, so no epoch has to fence a stale coordinator's markers
#: (docs/formats/transactions.md, "Markers").
COORDINATOR_EPOCH = 0


def _answering_errors(shape: Callable[[ErrorCode], Any] = lambda error: error,
                      ) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """A transaction API whose database is out of reach (COORDINATOR_NOT_AVAILABLE) or whose id this broker
    no longer holds (a cluster's move, found by the fence: NOT_COORDINATOR) answers the error clients retry
    by finding the coordinator again, as ``shape`` makes it the method's answer."""
    def decorate(method: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        @functools.wraps(method)
        async def answered(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return await method(*args, **kwargs)
            except (ClusterError, MetadataUnavailableError) as e:
                log.warning("%s answered with a retriable error: %s", method.__name__, e)
                retriable = ErrorCode.not_coordinator if isinstance(e, ClusterError) \
                    else ErrorCode.coordinator_not_available
                return shape(retriable)  # type: ignore[no-any-return]
        return answered
    return decorate


class Transactions:
    """Transactional ids, their state and the partitions they hold open (see the module's docstring)."""

    def __init__(self, broker: Broker, table: TxnTable) -> None:
        self._broker = broker
        self._table = table
        self._in_cluster = broker.ownership.in_cluster
        table.fence = broker.ownership.txn_fence
        # Alone, every id is this broker's from the start; in a cluster, each as it is gained.
        loaded = [] if self._in_cluster else table.load()
        self._txns: dict[str, Txn] = {t.transactional_id: t for t, _ in loaded}
        #: When each id's state last changed: an ended one untouched for transactional_id_expiration_ms goes.
        self._updated_ms: dict[str, int] = {t.transactional_id: at for t, at in loaded}
        self._by_producer: dict[int, str] = {t.producer_id: t.transactional_id for t in self._txns.values()}
        self._locks: dict[str, asyncio.Lock] = {}
        self._task: asyncio.Task[None] | None = None

    # Lifecycle ---------------------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="stratalog-transactions")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def close(self) -> None:
        self._table.close()

    async def _run(self) -> None:
        interval_s = self._broker.config.transaction_abort_interval_ms / 1000
        while True:
            try:
                await self.complete_and_expire()
            except Exception:   # a database out of reach, say: the next round tries again
                log.exception("a round of the transaction coordinator failed; it runs again in %.0f s", interval_s)
            await asyncio.sleep(interval_s)

    async def complete_and_expire(self, now_ms: int | None = None) -> int:
        """Complete the prepared transactions and abort the expired ones (how many ended); forget the ids
        idle past their expiration."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        await self._forget_expired(now_ms)
        ended = 0
        for txn_id in list(self._txns):
            if not self._here(txn_id):
                continue
            async with self._lock(txn_id):
                txn = self._txns.get(txn_id)
                if txn is None or not (txn.state.preparing or expired(txn, now_ms)):
                    continue
                if txn.state is TxnState.ONGOING:
                    log.info("transaction of %r aborted: older than its timeout of %d ms", txn_id, txn.timeout_ms)
                    txn = aborting(txn)
                try:
                    await self._end(txn)
                    ended += 1
                except StratalogError as e:
                    log.warning("transaction of %r not completed yet (tried again later): %s", txn_id, e)
        return ended

    async def _forget_expired(self, now_ms: int) -> None:
        """Kafka's transactional.id.expiration.ms: an id whose last transaction ended (or that never began
        one) and that nothing touched for that long is forgotten, so the ids kept stay bounded by use."""
        expiry_ms = self._broker.config.transactional_id_expiration_ms
        for txn_id, txn in list(self._txns.items()):
            if txn.state in OPEN_STATES or now_ms - self._updated_ms.get(txn_id, now_ms) <= expiry_ms:
                continue
            async with self._lock(txn_id):
                if self._txns.get(txn_id) is txn:
                    await asyncio.to_thread(self._table.delete, txn_id)
                    await self._broker.ownership.forget_coordinated(txn_id, Kind.TRANSACTION)
                    del self._txns[txn_id]
                    self._updated_ms.pop(txn_id, None)
                    self._locks.pop(txn_id, None)
                    if self._by_producer.get(txn.producer_id) == txn_id:
                        del self._by_producer[txn.producer_id]

    def _lock(self, txn_id: str) -> asyncio.Lock:
        return self._locks.setdefault(txn_id, asyncio.Lock())

    # Which ids are this broker's ----------------------------------------------------------------------

    def _here(self, txn_id: str) -> bool:
        """Whether this broker coordinates the id (always, alone)."""
        return self._broker.ownership.coordinates(txn_id, Kind.TRANSACTION)

    async def _loaded(self, txn_id: str) -> Txn | None:
        """The id's state (under its lock): a broker of a cluster reads it from the database the first time."""
        txn = self._txns.get(txn_id)
        if txn is not None or not self._in_cluster:
            return txn
        found = await asyncio.to_thread(self._table.load_one, txn_id)
        if found is None:
            return None
        txn, updated_ms = found
        self._txns[txn_id] = txn
        self._updated_ms[txn_id] = updated_ms
        self._by_producer[txn.producer_id] = txn_id
        return txn

    async def held(self, txn_id: str) -> None:
        """A broker of a cluster holds the id: its state is loaded (so its timeout runs here)."""
        async with self._lock(txn_id):
            await self._loaded(txn_id)

    def unload(self, txn_id: str) -> None:
        """The id is no longer coordinated here: what was loaded of it goes (its next holder reads it)."""
        txn = self._txns.pop(txn_id, None)
        self._updated_ms.pop(txn_id, None)
        if txn is not None and self._by_producer.get(txn.producer_id) == txn_id:
            del self._by_producer[txn.producer_id]

    # The APIs ----------------------------------------------------------------------------------------

    @_answering_errors(lambda error: (error, -1, -1))   # InitProducerId's answer with no producer
    async def init_producer_id(self, txn_id: str, timeout_ms: int, producer_id: int,
                               producer_epoch: int) -> tuple[ErrorCode, int, int]:
        if not self._here(txn_id):
            return ErrorCode.not_coordinator, -1, -1
        async with self._lock(txn_id):
            txn = await self._loaded(txn_id)
            decision = on_init(txn, producer_id, producer_epoch)
            if decision.error:
                return decision.error, -1, -1
            if txn is not None and decision.action is InitAction.ABORT_FIRST:
                log.info("transaction of %r aborted: its producer started again", txn_id)
                try:
                    txn = await self._end(aborting(txn))
                except MarkerWriteError as e:
                    # Prepared and durable: the coordinator's rounds complete it; the client retries.
                    log.warning("transaction of %r prepared to abort, its markers not all written yet: %s", txn_id, e)
                    return ErrorCode.concurrent_transactions, -1, -1
            if txn is None or needs_new_id(txn):
                new_id = await asyncio.to_thread(self._broker.topics.next_counter, "producer_id")
                fresh = Txn(txn_id, new_id, 0, timeout_ms)
            else:
                fresh = Txn(txn_id, txn.producer_id, txn.producer_epoch + 1, timeout_ms)
            await self._save(fresh)
            return ErrorCode.none, fresh.producer_id, fresh.producer_epoch

    @_answering_errors()
    async def add_partitions(self, txn_id: str, producer_id: int, producer_epoch: int,
                             partitions: list[tuple[str, int]]) -> ErrorCode:
        """AddPartitionsToTxn for partitions that exist (the caller answers the others)."""
        if not self._here(txn_id):
            return ErrorCode.not_coordinator
        async with self._lock(txn_id):
            now_ms = int(time.time() * 1000)
            added = tuple(TxnPartition(topic, index, self._end_offset(topic, index)) for topic, index in partitions)
            outcome = on_add(await self._loaded(txn_id), producer_id, producer_epoch, now_ms, partitions=added)
            if outcome.txn is not None:
                await self._save(outcome.txn)
            return outcome.error

    @_answering_errors()
    async def add_offsets(self, txn_id: str, producer_id: int, producer_epoch: int, group_id: str) -> ErrorCode:
        if not self._here(txn_id):
            return ErrorCode.not_coordinator
        async with self._lock(txn_id):
            outcome = on_add(await self._loaded(txn_id), producer_id, producer_epoch, int(time.time() * 1000),
                             group_id=group_id)
            if outcome.txn is not None:
                await self._save(outcome.txn)
            return outcome.error

    @_answering_errors()
    async def offset_commit(self, txn_id: str, producer_id: int, producer_epoch: int, group_id: str,
                            offsets: tuple[PendingOffset, ...]) -> ErrorCode:
        """TxnOffsetCommit, at the group's coordinator: kept in the transaction's state if this broker
        coordinates it too, else beside it in the database for its coordinator."""
        if not self._here(txn_id):
            return await asyncio.to_thread(self._table.offset_commit_elsewhere, txn_id, producer_id, producer_epoch,
                                           group_id, offsets)
        async with self._lock(txn_id):
            outcome = on_offset_commit(await self._loaded(txn_id), producer_id, producer_epoch, group_id, offsets)
            if outcome.txn is not None:
                await self._save(outcome.txn)
            return outcome.error

    async def pending_offsets(self, group_id: str) -> set[tuple[str, int]]:
        """The group's partitions that a transaction not ended has offsets for (TxnOffsetCommit taken, the
        transaction neither committed nor aborted, here or at any broker of a cluster): an OffsetFetch that
        requires stable offsets is answered UNSTABLE_OFFSET_COMMIT for them (KIP-447), so a consumer of a
        consume-transform-produce loop never starts from offsets a commit under way is about to move."""
        return await asyncio.to_thread(self._table.pending_offsets, group_id)

    @_answering_errors()
    async def end_txn(self, txn_id: str, producer_id: int, producer_epoch: int, commit: bool) -> ErrorCode:
        if not self._here(txn_id):
            return ErrorCode.not_coordinator
        async with self._lock(txn_id):
            outcome = on_end(await self._loaded(txn_id), producer_id, producer_epoch, commit)
            if outcome.txn is None:
                return outcome.error
            try:
                await self._end(outcome.txn)
            except MarkerWriteError as e:
                # Prepared and durable: it completes in the background; the client's retry of EndTxn is told
                # CONCURRENT_TRANSACTIONS until then, and OK after.
                log.warning("transaction of %r prepared, its markers not all written yet: %s", txn_id, e)
                return ErrorCode.coordinator_load_in_progress
            return ErrorCode.none

    # What the admin APIs show ------------------------------------------------------------------------

    def get(self, txn_id: str) -> Txn | None:
        return self._txns.get(txn_id)

    def all(self) -> list[Txn]:
        return list(self._txns.values())

    # The produce path --------------------------------------------------------------------------------

    def check_produce(self, producer_id: int, producer_epoch: int, topic: str, partition: int) -> ErrorCode:
        """Whether a transactional batch may be appended: its transaction Ongoing under this epoch, with the
        partition added (txn_state.produce_refusal). In a cluster, a transaction coordinated elsewhere was
        checked by :meth:`verify` before its first batch here."""
        txn = self._txns.get(self._by_producer.get(producer_id, ""))
        if self._in_cluster and txn is None:
            return ErrorCode.none
        return produce_refusal(txn, producer_id, producer_epoch, topic, partition)

    @_answering_errors()
    async def verify(self, txn_id: str, producer_id: int, producer_epoch: int, topic: str,
                     partition: int) -> ErrorCode:
        """A broker of a cluster, before the first batch of a transaction in a partition it leads: the rule of
        :meth:`check_produce` against the transaction's durable state when another broker coordinates it (as
        Kafka's leaders ask the coordinator since KIP-890), so a late batch of an ended transaction cannot
        open one that no coordinator would ever end."""
        if self._here(txn_id):
            return self.check_produce(producer_id, producer_epoch, topic, partition)
        found = await asyncio.to_thread(self._table.load_one, txn_id)
        return produce_refusal(None if found is None else found[0], producer_id, producer_epoch, topic, partition)

    # Inside ------------------------------------------------------------------------------------------

    def _end_offset(self, topic: str, partition: int) -> int:
        stream = self._broker.partition(topic, partition)
        return stream.end_offset if stream is not None else 0

    async def _save(self, txn: Txn) -> None:
        now_ms = int(time.time() * 1000)
        await asyncio.to_thread(self._table.save, txn, now_ms)
        self._updated_ms[txn.transactional_id] = now_ms
        old = self._txns.get(txn.transactional_id)
        if old is not None and old.producer_id != txn.producer_id:
            self._by_producer.pop(old.producer_id, None)
        self._txns[txn.transactional_id] = txn
        self._by_producer[txn.producer_id] = txn.transactional_id

    async def _end(self, prepared: Txn) -> Txn:
        """Make ``prepared`` (PrepareCommit or PrepareAbort) durable, write its markers, store its offsets
        if it commits, and complete it."""
        await self._save(prepared)
        commit = prepared.state is TxnState.PREPARE_COMMIT
        await self._write_markers(prepared, MarkerType.COMMIT if commit else MarkerType.ABORT)
        offsets = prepared.offsets
        if commit and self._in_cluster:
            offsets += await asyncio.to_thread(self._table.offsets_elsewhere, prepared)
        if commit and offsets:
            await self._store_offsets(prepared.transactional_id, offsets)
        done = completed(prepared)
        await self._save(done)
        return done

    async def _write_markers(self, txn: Txn, kind: MarkerType) -> None:
        """The transaction's marker into each of its partitions: those led here directly, the others through
        their leaders (a cluster)."""
        broker = self._broker
        markers = [MarkerRequest(p.topic, p.partition, txn.producer_id, txn.producer_epoch, kind, COORDINATOR_EPOCH,
                                 txn.transactional_id) for p in txn.partitions]
        # Led elsewhere: the partition exists and is not served here. (A deleted topic's marker is "written"
        # here: write_marker ends nothing there.)
        here: list[MarkerRequest] = []
        elsewhere: list[MarkerRequest] = []
        for m in markers:
            led_elsewhere = self._in_cluster and broker.partition(m.topic, m.partition) is None \
                and broker.topics.get(m.topic) is not None
            (elsewhere if led_elsewhere else here).append(m)
        await asyncio.gather(*(write_marker(broker, m.topic, m.partition, m.producer_id, m.producer_epoch, kind,
                                            m.coordinator_epoch) for m in here),
                             *([broker.ownership.deliver_markers(elsewhere)] if elsewhere else []))

    async def _store_offsets(self, txn_id: str, offsets: tuple[PendingOffset, ...]) -> None:
        """A committed transaction's offsets into its groups: fenced by this broker's hold of the transaction
        (in a cluster the group may be coordinated elsewhere), not by the group's."""
        now_ms = int(time.time() * 1000)
        by_group: dict[str, list[OffsetEntry]] = {}
        for o in offsets:
            by_group.setdefault(o.group_id, []).append(OffsetEntry(o.topic, o.partition, o.offset, o.leader_epoch,
                                                                   o.metadata, now_ms))
        fence = self._table.fence
        for group_id, entries in by_group.items():
            await self._broker.in_offsets_order(self._broker.offsets.commit, group_id, entries,
                                                None if fence is None else functools.partial(_fenced_by, fence,
                                                                                             txn_id))


def _fenced_by(fence: Callable[[Backend, str], None], txn_id: str, db: Backend, _group_id: str) -> None:
    """An offsets commit's fence: this broker still coordinates the transaction ``txn_id``."""
    fence(db, txn_id)
