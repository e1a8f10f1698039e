"""The transaction coordinator's rules (broker/txn_state.py): one test per row of its table, and the checks
every request makes first."""

from __future__ import annotations

from dataclasses import replace

import pytest
from kio.schema.errors import ErrorCode

from stratalog.broker.txn_state import (
    EPOCH_MAX,
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

PID, EPOCH = 10, 3
P0 = TxnPartition("t", 0, 100)


def txn(state: TxnState, **changes: object) -> Txn:
    base = Txn("tx", PID, EPOCH, 60_000, state, partitions=(P0,) if state is not TxnState.EMPTY else (),
               groups=("g",) if state is TxnState.ONGOING else (), started_ms=1_000)
    return replace(base, **changes)  # type: ignore[arg-type]


def test_none_init_takes_a_new_producer_id() -> None:
    assert on_init(None, -1, -1).action is InitAction.NEW_ID


@pytest.mark.parametrize("state", [TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT])
def test_ended_or_empty_init_bumps_the_epoch(state: TxnState) -> None:
    assert on_init(txn(state), -1, -1).action is InitAction.BUMP


def test_ongoing_init_aborts_it_first_with_the_epoch_bumped() -> None:
    assert on_init(txn(TxnState.ONGOING), -1, -1).action is InitAction.ABORT_FIRST
    fenced = aborting(txn(TxnState.ONGOING))
    assert (fenced.state, fenced.producer_epoch) == (TxnState.PREPARE_ABORT, EPOCH + 1)


@pytest.mark.parametrize("state", [TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT])
def test_preparing_init_is_told_concurrent_transactions(state: TxnState) -> None:
    assert on_init(txn(state), -1, -1).error == ErrorCode.concurrent_transactions


def test_init_naming_an_old_epoch_is_fenced() -> None:
    assert on_init(txn(TxnState.EMPTY), PID, EPOCH - 1).error == ErrorCode.producer_fenced
    assert on_init(txn(TxnState.EMPTY), PID, EPOCH).action is InitAction.BUMP


def test_an_epoch_at_its_end_takes_a_new_id() -> None:
    assert needs_new_id(txn(TxnState.EMPTY, producer_epoch=EPOCH_MAX - 1))
    assert not needs_new_id(txn(TxnState.EMPTY))


def test_none_add_is_told_invalid_producer_id_mapping() -> None:
    assert on_add(None, PID, EPOCH, 5, partitions=(P0,)).error == ErrorCode.invalid_producer_id_mapping


@pytest.mark.parametrize("state", [TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT])
def test_add_starts_a_transaction(state: TxnState) -> None:
    p1 = TxnPartition("t", 1, 7)
    outcome = on_add(txn(state), PID, EPOCH, 5_000, partitions=(p1,))
    assert outcome.txn is not None
    assert (outcome.txn.state, outcome.txn.partitions, outcome.txn.started_ms) == (TxnState.ONGOING, (p1,), 5_000)


def test_ongoing_add_adds_what_is_new_and_keeps_first_offsets() -> None:
    outcome = on_add(txn(TxnState.ONGOING), PID, EPOCH, 5_000, partitions=(TxnPartition("t", 0, 999),
                                                                           TxnPartition("t", 1, 7)))
    assert outcome.txn is not None and outcome.txn.partitions == (P0, TxnPartition("t", 1, 7))
    assert outcome.txn.started_ms == 1_000
    assert on_add(txn(TxnState.ONGOING), PID, EPOCH, 5_000, partitions=(P0,)).txn is None, "nothing new"
    with_group = on_add(txn(TxnState.ONGOING), PID, EPOCH, 5_000, group_id="h").txn
    assert with_group is not None and with_group.groups == ("g", "h")


@pytest.mark.parametrize("state", [TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT])
def test_preparing_add_is_told_concurrent_transactions(state: TxnState) -> None:
    assert on_add(txn(state), PID, EPOCH, 5, partitions=(P0,)).error == ErrorCode.concurrent_transactions


def test_requests_of_another_id_or_an_old_epoch_are_refused() -> None:
    assert on_add(txn(TxnState.ONGOING), PID + 1, EPOCH, 5).error == ErrorCode.invalid_producer_id_mapping
    assert on_add(txn(TxnState.ONGOING), PID, EPOCH - 1, 5).error == ErrorCode.producer_fenced
    assert on_end(txn(TxnState.ONGOING), PID, EPOCH + 1, True).error == ErrorCode.producer_fenced


@pytest.mark.parametrize(("commit", "prepared"), [(True, TxnState.PREPARE_COMMIT), (False, TxnState.PREPARE_ABORT)])
def test_ongoing_end_prepares_and_completes(commit: bool, prepared: TxnState) -> None:
    outcome = on_end(txn(TxnState.ONGOING), PID, EPOCH, commit)
    assert outcome.txn is not None and outcome.txn.state is prepared
    done = completed(outcome.txn)
    assert done.state is (TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT)
    assert done.started_ms == outcome.txn.started_ms, "DescribeTransactions shows when the last one began"


def test_empty_end_is_an_invalid_state() -> None:
    assert on_end(txn(TxnState.EMPTY), PID, EPOCH, True).error == ErrorCode.invalid_txn_state


def test_preparing_end_same_is_concurrent_and_other_is_invalid() -> None:
    assert on_end(txn(TxnState.PREPARE_COMMIT), PID, EPOCH, True).error == ErrorCode.concurrent_transactions
    assert on_end(txn(TxnState.PREPARE_ABORT), PID, EPOCH, True).error == ErrorCode.invalid_txn_state


def test_completed_end_same_is_a_retry_and_other_is_invalid() -> None:
    retry = on_end(txn(TxnState.COMPLETE_COMMIT), PID, EPOCH, True)
    assert (retry.error, retry.txn) == (ErrorCode.none, None)
    assert on_end(txn(TxnState.COMPLETE_ABORT), PID, EPOCH, True).error == ErrorCode.invalid_txn_state


def test_offsets_commit_only_inside_an_ongoing_transaction_with_the_group() -> None:
    o = PendingOffset("g", "t", 0, 5, -1, None)
    outcome = on_offset_commit(txn(TxnState.ONGOING), PID, EPOCH, "g", (o,))
    assert outcome.txn is not None and outcome.txn.offsets == (o,)
    newer = replace(o, offset=9)
    again = on_offset_commit(outcome.txn, PID, EPOCH, "g", (newer,))
    assert again.txn is not None and again.txn.offsets == (newer,), "the latest per partition"
    assert on_offset_commit(txn(TxnState.ONGOING), PID, EPOCH, "other", (o,)).error == ErrorCode.invalid_txn_state
    assert on_offset_commit(txn(TxnState.EMPTY), PID, EPOCH, "g", (o,)).error == ErrorCode.invalid_txn_state


def test_an_ongoing_transaction_expires_after_its_timeout_only() -> None:
    ongoing = txn(TxnState.ONGOING)
    assert not expired(ongoing, 1_000 + 60_000)
    assert expired(ongoing, 1_000 + 60_001)
    assert not expired(txn(TxnState.COMPLETE_COMMIT), 10**12)


@pytest.mark.parametrize(("state", "epoch", "partition", "expected"), [
    (TxnState.ONGOING, EPOCH, 0, ErrorCode.none),
    (TxnState.ONGOING, EPOCH, 1, ErrorCode.invalid_txn_state),            # the partition was not added
    (TxnState.ONGOING, EPOCH - 1, 0, ErrorCode.invalid_producer_epoch),   # a fenced producer
    (TxnState.ONGOING, EPOCH + 1, 0, ErrorCode.invalid_txn_state),
    (TxnState.PREPARE_ABORT, EPOCH, 0, ErrorCode.invalid_txn_state),      # a late batch of an ending transaction
    (TxnState.COMPLETE_COMMIT, EPOCH, 0, ErrorCode.invalid_txn_state),    # ... or an ended one
])
def test_a_transactional_batch_is_taken_only_inside_its_ongoing_transaction(
        state: TxnState, epoch: int, partition: int, expected: ErrorCode) -> None:
    assert produce_refusal(txn(state, partitions=(P0,)), PID, epoch, "t", partition) == expected
    assert produce_refusal(None, PID, EPOCH, "t", 0) == ErrorCode.invalid_producer_id_mapping
    assert produce_refusal(txn(TxnState.ONGOING), PID + 1, EPOCH, "t", 0) == ErrorCode.invalid_producer_id_mapping
