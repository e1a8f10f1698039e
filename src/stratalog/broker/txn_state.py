"""A transaction's state and the rules of its coordinator (KIP-98, as Kafka's TransactionCoordinator),
sans I/O: each rule takes a transaction's last durable state and a request, and returns the answer and the
state to make durable before answering. broker/transactions.py is the shell that stores, writes markers
and keeps time; docs/formats/transactions.md the spec.

| state          | InitProducerId          | AddPartitions, AddOffsets   | EndTxn                            |
|----------------|-------------------------|-----------------------------|-----------------------------------|
| (none)         | a new producer id       | INVALID_PRODUCER_ID_MAPPING | INVALID_PRODUCER_ID_MAPPING       |
| Empty          | epoch + 1               | -> Ongoing                  | INVALID_TXN_STATE                 |
| Ongoing        | abort, epoch + 1 (fence)| -> Ongoing (more)           | -> PrepareCommit / PrepareAbort   |
| PrepareCommit  | CONCURRENT_TRANSACTIONS | CONCURRENT_TRANSACTIONS     | same end: CONCURRENT_TRANSACTIONS |
| PrepareAbort   | CONCURRENT_TRANSACTIONS | CONCURRENT_TRANSACTIONS     | other end: INVALID_TXN_STATE      |
| CompleteCommit | epoch + 1               | -> Ongoing                  | same end: none (a retry)          |
| CompleteAbort  | epoch + 1               | -> Ongoing                  | other end: INVALID_TXN_STATE      |

Before any of these, a request naming another producer id gets INVALID_PRODUCER_ID_MAPPING and an older
epoch PRODUCER_FENCED. An Ongoing transaction older than its timeout is aborted with its epoch bumped, so
the producer that let it lapse is fenced too (as Kafka does).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from kio.schema.errors import ErrorCode

#: The largest producer epoch (an int16 on the wire); a bump past it takes a new producer id.
EPOCH_MAX = 32767


class TxnState(enum.Enum):
    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"

    @property
    def preparing(self) -> bool:
        return self in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)


#: States of a transaction not ended yet: it holds back its partitions' last stable offset, and the offsets
#: it took are unstable to an OffsetFetch that requires stable ones (KIP-447).
OPEN_STATES = frozenset((TxnState.ONGOING, TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT))


@dataclass(frozen=True, slots=True)
class TxnPartition:
    """A partition in a transaction, with an offset its records start at or after: the partition's end
    when it was added (its records come later), which bounds the last stable offset and starts the
    aborted range a read_committed consumer skips."""

    topic: str
    partition: int
    first_offset: int


@dataclass(frozen=True, slots=True)
class PendingOffset:
    """An offset committed in a transaction (TxnOffsetCommit): the group's once the transaction commits."""

    group_id: str
    topic: str
    partition: int
    offset: int
    leader_epoch: int
    metadata: str | None


@dataclass(frozen=True, slots=True)
class Txn:
    """A transactional id's last durable state."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState = TxnState.EMPTY
    partitions: tuple[TxnPartition, ...] = ()
    groups: tuple[str, ...] = ()
    offsets: tuple[PendingOffset, ...] = ()
    #: When its last transaction began (an Ongoing one's timeout counts from here); 0: none yet.
    started_ms: int = 0

    def has_partition(self, topic: str, partition: int) -> bool:
        return any(p.topic == topic and p.partition == partition for p in self.partitions)


class InitAction(enum.Enum):
    NEW_ID = "a new producer id"
    BUMP = "the epoch bumped"
    ABORT_FIRST = "the ongoing transaction aborted first"


@dataclass(frozen=True, slots=True)
class InitDecision:
    error: ErrorCode = ErrorCode.none
    action: InitAction | None = None


def on_init(txn: Txn | None, producer_id: int, producer_epoch: int) -> InitDecision:
    """InitProducerId with a transactional id (``producer_id`` -1, or KIP-360's current id and epoch)."""
    if txn is None:
        return InitDecision(action=InitAction.NEW_ID)
    if producer_id >= 0 and (producer_id, producer_epoch) != (txn.producer_id, txn.producer_epoch):
        return InitDecision(ErrorCode.producer_fenced)
    if txn.state.preparing:
        return InitDecision(ErrorCode.concurrent_transactions)
    if txn.state is TxnState.ONGOING:
        return InitDecision(action=InitAction.ABORT_FIRST)
    return InitDecision(action=InitAction.BUMP)


def needs_new_id(txn: Txn) -> bool:
    return txn.producer_epoch + 1 >= EPOCH_MAX


def check_producer(txn: Txn | None, producer_id: int, producer_epoch: int) -> ErrorCode:
    """What every request of a transaction checks first."""
    if txn is None or txn.producer_id != producer_id:
        return ErrorCode.invalid_producer_id_mapping
    if producer_epoch != txn.producer_epoch:
        return ErrorCode.producer_fenced
    return ErrorCode.none


@dataclass(frozen=True, slots=True)
class Outcome:
    """An answer, and the state to make durable first (None: nothing changes)."""

    error: ErrorCode = ErrorCode.none
    txn: Txn | None = None


def on_add(txn: Txn | None, producer_id: int, producer_epoch: int, now_ms: int, *,
           partitions: tuple[TxnPartition, ...] = (), group_id: str | None = None) -> Outcome:
    """AddPartitionsToTxn (``partitions``, each with the partition's end now) or AddOffsetsToTxn
    (``group_id``)."""
    error = check_producer(txn, producer_id, producer_epoch)
    if error or txn is None:
        return Outcome(error)
    if txn.state.preparing:
        return Outcome(ErrorCode.concurrent_transactions)
    ongoing = txn.state is TxnState.ONGOING
    base = txn if ongoing else replace(txn, state=TxnState.ONGOING, partitions=(), groups=(), offsets=(),
                                       started_ms=now_ms)
    added = tuple(p for p in partitions if not base.has_partition(p.topic, p.partition))
    groups = base.groups + ((group_id,) if group_id is not None and group_id not in base.groups else ())
    if ongoing and not added and groups == base.groups:
        return Outcome()
    return Outcome(txn=replace(base, partitions=base.partitions + added, groups=groups))


def on_offset_commit(txn: Txn | None, producer_id: int, producer_epoch: int, group_id: str,
                     offsets: tuple[PendingOffset, ...]) -> Outcome:
    """TxnOffsetCommit: offsets kept with the transaction until it ends."""
    error = check_producer(txn, producer_id, producer_epoch)
    if error or txn is None:
        return Outcome(error)
    if txn.state is not TxnState.ONGOING or group_id not in txn.groups:
        return Outcome(ErrorCode.invalid_txn_state)
    replaced = {(o.group_id, o.topic, o.partition) for o in offsets}
    kept = tuple(o for o in txn.offsets if (o.group_id, o.topic, o.partition) not in replaced)
    return Outcome(txn=replace(txn, offsets=kept + offsets))


def on_end(txn: Txn | None, producer_id: int, producer_epoch: int, commit: bool) -> Outcome:
    """EndTxn: an Ongoing transaction goes to PrepareCommit or PrepareAbort (the shell then writes the
    markers and completes it)."""
    error = check_producer(txn, producer_id, producer_epoch)
    if error or txn is None:
        return Outcome(error)
    prepare, complete = (TxnState.PREPARE_COMMIT, TxnState.COMPLETE_COMMIT) if commit \
        else (TxnState.PREPARE_ABORT, TxnState.COMPLETE_ABORT)
    if txn.state is TxnState.ONGOING:
        return Outcome(txn=replace(txn, state=prepare))
    if txn.state is prepare:
        return Outcome(ErrorCode.concurrent_transactions)
    if txn.state is complete:
        return Outcome()   # a retry of the end that completed
    return Outcome(ErrorCode.invalid_txn_state)


def produce_refusal(txn: Txn | None, producer_id: int, producer_epoch: int, topic: str, partition: int) -> ErrorCode:
    """Whether a transactional batch may be appended (ErrorCode.none) or why not: its transaction must be
    Ongoing under this epoch, with the partition added."""
    if txn is None or txn.producer_id != producer_id:
        return ErrorCode.invalid_producer_id_mapping
    if producer_epoch < txn.producer_epoch:
        return ErrorCode.invalid_producer_epoch
    if producer_epoch > txn.producer_epoch or txn.state is not TxnState.ONGOING or not txn.has_partition(topic,
                                                                                                         partition):
        return ErrorCode.invalid_txn_state
    return ErrorCode.none


def completed(txn: Txn) -> Txn:
    """A prepared transaction once its markers are written (and its offsets, on commit, stored)."""
    state = TxnState.COMPLETE_COMMIT if txn.state is TxnState.PREPARE_COMMIT else TxnState.COMPLETE_ABORT
    return replace(txn, state=state)


def expired(txn: Txn, now_ms: int) -> bool:
    """Whether an Ongoing transaction has outlived its timeout."""
    return txn.state is TxnState.ONGOING and now_ms - txn.started_ms > txn.timeout_ms


def aborting(txn: Txn) -> Txn:
    """An Ongoing transaction aborted by the coordinator (its timeout, or a new InitProducerId): its epoch
    bumped, so that the producer that began it is fenced, and PrepareAbort."""
    return replace(txn, state=TxnState.PREPARE_ABORT, producer_epoch=txn.producer_epoch + 1)

