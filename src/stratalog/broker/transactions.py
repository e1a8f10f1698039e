"""The transaction coordinator (KIP-98, KIP-447): the shell around broker/txn_state.py's rules. It keeps
each transactional id's state durable (broker/txn_table.py) before answering, writes the commit or abort
markers into every partition of a transaction when it ends (broker/txn_markers.py, as each partition's
leader), stores the offsets committed in it when it commits, and aborts transactions that outlive their
timeout. What read_committed consumers get (last stable offsets, aborted ranges) is each partition's own
state (broker/txn_partitions.py), not the coordinator's. Spec: docs/formats/transactions.md.

Standalone, this broker coordinates every transactional id and leads every partition, so a transactional
batch is checked against the coordinator's own state (the partition must have been added, under the
producer's current epoch). Every method runs on the broker's event loop; requests of one transactional id
take turns (a lock each).

Recovery: a transaction found Prepare* at start had its end decided and made durable, and some of its
markers may be missing: they are written again (a marker twice in a partition is harmless: the second
ends nothing) and the transaction completed. An Ongoing one goes on, and its timeout aborts it if its
producer is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

from kio.schema.errors import ErrorCode

from stratalog.broker.offsets import OffsetEntry
from stratalog.broker.txn_markers import write_marker
from stratalog.broker.txn_state import (
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
)
from stratalog.broker.txn_table import TxnTable
from stratalog.errors import StratalogError
from stratalog.kafka.control_batch import MarkerType

if TYPE_CHECKING:
    from stratalog.broker.broker import Broker

log = logging.getLogger("stratalog.broker.transactions")

#: States of a transaction not ended yet in its partitions: they hold back the last stable offset.
OPEN_STATES = frozenset((TxnState.ONGOING, TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT))
#: The coordinator's epoch written in every marker: one coordinator, that never moves, standalone.
COORDINATOR_EPOCH = 0


class Transactions:
    """Transactional ids, their state and the partitions they hold open (see the module's docstring)."""

    def __init__(self, broker: Broker, table: TxnTable) -> None:
        self._broker = broker
        self._table = table
        loaded = table.load()
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
                    del self._txns[txn_id]
                    self._updated_ms.pop(txn_id, None)
                    self._locks.pop(txn_id, None)
                    if self._by_producer.get(txn.producer_id) == txn_id:
                        del self._by_producer[txn.producer_id]

    def _lock(self, txn_id: str) -> asyncio.Lock:
        return self._locks.setdefault(txn_id, asyncio.Lock())

    # The APIs ----------------------------------------------------------------------------------------

    async def init_producer_id(self, txn_id: str, timeout_ms: int, producer_id: int,
                               producer_epoch: int) -> tuple[ErrorCode, int, int]:
        async with self._lock(txn_id):
            txn = self._txns.get(txn_id)
            decision = on_init(txn, producer_id, producer_epoch)
            if decision.error:
                return decision.error, -1, -1
            if txn is not None and decision.action is InitAction.ABORT_FIRST:
                log.info("transaction of %r aborted: its producer started again", txn_id)
                try:
                    txn = await self._end(aborting(txn))
                except StratalogError as e:
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

    async def add_partitions(self, txn_id: str, producer_id: int, producer_epoch: int,
                             partitions: list[tuple[str, int]]) -> ErrorCode:
        """AddPartitionsToTxn for partitions this broker leads (the caller answers the others)."""
        async with self._lock(txn_id):
            now_ms = int(time.time() * 1000)
            added = tuple(TxnPartition(topic, index, self._end_offset(topic, index)) for topic, index in partitions)
            outcome = on_add(self._txns.get(txn_id), producer_id, producer_epoch, now_ms, partitions=added)
            if outcome.txn is not None:
                await self._save(outcome.txn)
            return outcome.error

    async def add_offsets(self, txn_id: str, producer_id: int, producer_epoch: int, group_id: str) -> ErrorCode:
        async with self._lock(txn_id):
            outcome = on_add(self._txns.get(txn_id), producer_id, producer_epoch, int(time.time() * 1000),
                             group_id=group_id)
            if outcome.txn is not None:
                await self._save(outcome.txn)
            return outcome.error

    async def offset_commit(self, txn_id: str, producer_id: int, producer_epoch: int, group_id: str,
                            offsets: tuple[PendingOffset, ...]) -> ErrorCode:
        async with self._lock(txn_id):
            outcome = on_offset_commit(self._txns.get(txn_id), producer_id, producer_epoch, group_id, offsets)
            if outcome.txn is not None:
                await self._save(outcome.txn)
            return outcome.error

    async def end_txn(self, txn_id: str, producer_id: int, producer_epoch: int, commit: bool) -> ErrorCode:
        async with self._lock(txn_id):
            outcome = on_end(self._txns.get(txn_id), producer_id, producer_epoch, commit)
            if outcome.txn is None:
                return outcome.error
            try:
                await self._end(outcome.txn)
            except StratalogError as e:
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
        partition added."""
        txn = self._txns.get(self._by_producer.get(producer_id, ""))
        if txn is None or txn.producer_id != producer_id:
            return ErrorCode.invalid_producer_id_mapping
        if producer_epoch < txn.producer_epoch:
            return ErrorCode.invalid_producer_epoch
        if producer_epoch > txn.producer_epoch or txn.state is not TxnState.ONGOING \
                or not txn.has_partition(topic, partition):
            return ErrorCode.invalid_txn_state
        return ErrorCode.none

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
        kind = MarkerType.COMMIT if commit else MarkerType.ABORT
        await asyncio.gather(*(write_marker(self._broker, p.topic, p.partition, prepared.producer_id,
                                            prepared.producer_epoch, kind, COORDINATOR_EPOCH)
                               for p in prepared.partitions))
        if commit and prepared.offsets:
            await self._store_offsets(prepared.offsets)
        done = completed(prepared)
        await self._save(done)
        return done

    async def _store_offsets(self, offsets: tuple[PendingOffset, ...]) -> None:
        now_ms = int(time.time() * 1000)
        by_group: dict[str, list[OffsetEntry]] = {}
        for o in offsets:
            by_group.setdefault(o.group_id, []).append(OffsetEntry(o.topic, o.partition, o.offset, o.leader_epoch,
                                                                   o.metadata, now_ms))
        for group_id, entries in by_group.items():
            await self._broker.in_offsets_order(self._broker.offsets.commit, group_id, entries)
