"""Idempotent producers' sequence state (broker/producers.py): the rows of its decision table, and a
failed append rolled back so that the producer's retry continues the sequence."""

from __future__ import annotations

from stratalog.broker.producers import ProducerStates, Verdict

PID, EPOCH, PARTITION = 7, 0, 1


def written(*batches: tuple[int, int, int]) -> ProducerStates:
    """States holding batches (base sequence, count, base offset) of one producer on one partition."""
    states = ProducerStates(entries_max=100)
    for base_sequence, count, offset in batches:
        states.record(PID, EPOCH, PARTITION, base_sequence, count, offset)
    return states


def test_a_producer_without_state_starts_at_sequence_zero_only() -> None:
    states = written()
    assert states.check(PID, EPOCH, PARTITION, 0, 1) == (Verdict.APPEND, -1)
    assert states.check(PID, EPOCH, PARTITION, 5, 1)[0] is Verdict.OUT_OF_ORDER


def test_the_next_sequence_appends_a_retry_is_a_duplicate_and_a_gap_is_out_of_order() -> None:
    states = written((0, 2, 0), (2, 3, 2))
    assert states.check(PID, EPOCH, PARTITION, 5, 1) == (Verdict.APPEND, -1)
    assert states.check(PID, EPOCH, PARTITION, 2, 3) == (Verdict.DUPLICATE, 2)
    assert states.check(PID, EPOCH, PARTITION, 6, 1)[0] is Verdict.OUT_OF_ORDER


def test_an_older_epoch_is_fenced_and_a_newer_one_starts_at_zero() -> None:
    states = ProducerStates(entries_max=100)
    states.record(PID, 3, PARTITION, 0, 1, 0)
    assert states.check(PID, 2, PARTITION, 1, 1)[0] is Verdict.FENCED
    assert states.check(PID, 4, PARTITION, 0, 1) == (Verdict.APPEND, -1)
    assert states.check(PID, 4, PARTITION, 1, 1)[0] is Verdict.OUT_OF_ORDER


def test_a_failed_append_and_those_in_flight_after_it_are_rolled_back_and_the_retry_appends() -> None:
    states = written((0, 2, 0), (2, 2, 2), (4, 1, -1), (5, 1, -1))   # 4 and 5 in flight
    states.forget(PID, PARTITION, 4)                                  # 4 failed (so 5 cannot land)
    assert states.check(PID, EPOCH, PARTITION, 4, 1) == (Verdict.APPEND, -1)
    assert states.check(PID, EPOCH, PARTITION, 2, 2) == (Verdict.DUPLICATE, 2)   # written ones stay
    states.record(PID, EPOCH, PARTITION, 4, 1, -1)
    states.settle(PID, PARTITION, 4, 4)
    assert states.check(PID, EPOCH, PARTITION, 5, 1) == (Verdict.APPEND, -1)
    # A snapshot keeps what was written.
    assert states.entries() == [(PID, PARTITION, EPOCH, [(0, 1, 0), (2, 3, 2), (4, 4, 4)])]


def test_forgetting_a_batch_that_is_not_in_flight_changes_nothing() -> None:
    states = written((0, 1, 0))
    states.forget(PID, PARTITION, 0)      # written, not in flight
    states.forget(PID + 1, PARTITION, 0)  # unknown producer
    assert states.check(PID, EPOCH, PARTITION, 0, 1) == (Verdict.DUPLICATE, 0)


def test_a_marker_fences_the_epochs_before_its_own() -> None:
    states = ProducerStates(10)
    states.record(7, 0, "p", 0, 1, 0)
    states.marked(7, 1, "p")          # the coordinator bumped the epoch to abort a lapsed transaction
    assert states.check(7, 0, "p", 1, 1) == (Verdict.FENCED, -1)
    assert states.check(7, 1, "p", 0, 1) == (Verdict.APPEND, -1)
    states.marked(7, 1, "p")          # a commit at the same epoch changes nothing
    states.record(7, 1, "p", 0, 1, 5)
    states.marked(7, 1, "p")
    assert states.check(7, 1, "p", 1, 1) == (Verdict.APPEND, -1), "the sequence goes on after a marker"
    states.marked(8, 2, "p")          # a producer with no batch here yet
    assert states.check(8, 1, "p", 0, 1) == (Verdict.FENCED, -1)
