"""Leader epochs (KIP-320) as pure functions: Kafka's check of a client's current epoch, where an epoch of a
log ends (against a model of LeaderEpochFileCache), and the epoch a leader writes into the batches it
appends."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from stratalog.broker.leader_epochs import (
    STANDALONE_HISTORY,
    UNDEFINED_EPOCH,
    UNDEFINED_OFFSET,
    History,
    end_offset_for,
    epoch_error,
    stamped,
)
from stratalog.kafka.records import check_batch, decode_records, encode_batch


def test_an_older_epoch_is_fenced_a_newer_one_unknown_and_none_not_checked() -> None:
    assert epoch_error(3, 5) == ErrorCode.fenced_leader_epoch
    assert epoch_error(6, 5) == ErrorCode.unknown_leader_epoch
    assert epoch_error(5, 5) == ErrorCode.none
    assert epoch_error(-1, 5) == ErrorCode.none, "the client knows no epoch"
    assert epoch_error(3, -1) == ErrorCode.none, "the partition has no leader: another check answers"


def test_alone_epoch_zero_ends_at_the_log_end() -> None:
    assert end_offset_for(STANDALONE_HISTORY, 0, 42) == (0, 42)
    assert end_offset_for(STANDALONE_HISTORY, 1, 42) == (UNDEFINED_EPOCH, UNDEFINED_OFFSET), "past every epoch"
    assert end_offset_for(STANDALONE_HISTORY, -1, 42) == (UNDEFINED_EPOCH, UNDEFINED_OFFSET)


def test_an_epoch_ends_where_the_next_one_recorded_begins() -> None:
    history = ((2, 0), (3, 10), (7, 25))   # 4, 5 and 6: leaders that never served (a gain that failed)
    assert end_offset_for(history, 2, 40) == (2, 10)
    assert end_offset_for(history, 3, 40) == (3, 25)
    assert end_offset_for(history, 5, 40) == (3, 25), "the largest epoch at or below the one asked"
    assert end_offset_for(history, 7, 40) == (7, 40)
    assert end_offset_for(history, 1, 40) == (1, 0), "older than every epoch kept: where the oldest begins"


def model(history: History, requested: int, log_end: int) -> tuple[int, int]:
    """LeaderEpochFileCache.endOffsetFor, read from Kafka's source, in the plainest terms."""
    if requested == UNDEFINED_EPOCH:
        return UNDEFINED_EPOCH, UNDEFINED_OFFSET
    if history and history[-1][0] == requested:
        return requested, log_end
    higher = [(e, start) for e, start in history if e > requested]
    if not higher:
        return UNDEFINED_EPOCH, UNDEFINED_OFFSET
    floor = [(e, start) for e, start in history if e <= requested]
    return (floor[-1][0] if floor else requested), higher[0][1]


@st.composite
def histories(draw: st.DrawFn) -> History:
    epochs = sorted(draw(st.sets(st.integers(0, 40), min_size=1, max_size=8)))
    starts = sorted(draw(st.lists(st.integers(0, 1000), min_size=len(epochs), max_size=len(epochs))))
    return tuple(zip(epochs, starts, strict=True))


@given(history=histories(), requested=st.integers(-1, 45), extra=st.integers(0, 100))
def test_end_offsets_are_kafkas(history: History, requested: int, extra: int) -> None:
    log_end = history[-1][1] + extra
    answer = end_offset_for(history, requested, log_end)
    assert answer == model(history, requested, log_end)
    if answer[1] != UNDEFINED_OFFSET:
        # Never below what was written at or before the epoch asked: a consumer never truncates for nothing.
        written_by = [start for epoch, start in history if epoch <= requested]
        assert answer[1] >= max(written_by, default=0)


def test_a_stamped_batch_keeps_its_crc_and_records() -> None:
    batch = encode_batch([(b"k", b"v", (), 1_000), (None, b"w", (), 1_001)], base_offset=0, partition_leader_epoch=-1)
    view = memoryview(batch)
    out = stamped(view, 7)
    assert out is not view and bytes(out[12:16]) == (7).to_bytes(4, "big")
    header = check_batch(out, 0, batch_bytes_max=len(batch))   # the CRC does not cover the epoch
    assert header.partition_leader_epoch == 7
    assert [r.value for r in decode_records(bytes(out), decompressed_bytes_max=1 << 20)] == [b"v", b"w"]
    assert stamped(out, 7) is out, "already at the epoch: no copy"
    assert bytes(view) == batch, "the request's bytes are left as they came"
