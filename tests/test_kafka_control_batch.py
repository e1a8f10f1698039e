"""Transaction markers (kafka/control_batch.py): read back as written, and as Kafka's own reader (through
kafka-python's record batch parser) reads a control batch."""

from __future__ import annotations

import warnings

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stratalog.kafka.batch_format import HEADER_BYTES
from stratalog.kafka.control_batch import ControlBatchError, MarkerType, marker_batch, read_marker
from stratalog.kafka.records import check_batch, encode_batch

with warnings.catch_warnings():   # kafka-python imports a deprecated importlib API
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.record.default_records import DefaultRecordBatch

LONGS = st.integers(0, 2**63 - 1)


@given(LONGS, st.integers(0, 32767), st.sampled_from(list(MarkerType)), st.integers(0, 2**31 - 1),
       st.integers(0, 2**62), LONGS)
def test_a_marker_reads_back_as_written(producer_id: int, epoch: int, kind: MarkerType, coordinator_epoch: int,
                                        timestamp_ms: int, base_offset: int) -> None:
    batch = marker_batch(producer_id, epoch, kind, coordinator_epoch=coordinator_epoch, timestamp_ms=timestamp_ms,
                         base_offset=base_offset)
    header = check_batch(memoryview(batch), 0, batch_bytes_max=len(batch))
    assert header.is_control and header.is_transactional
    assert (header.producer_id, header.producer_epoch, header.base_sequence, header.record_count) == (
        producer_id, epoch, -1, 1)
    marker = read_marker(header, memoryview(batch)[HEADER_BYTES:])
    assert (marker.producer_id, marker.producer_epoch, marker.kind, marker.coordinator_epoch,
            marker.timestamp_ms) == (producer_id, epoch, kind, coordinator_epoch, timestamp_ms)


def test_kafkas_reader_sees_a_control_batch_of_its_own_format() -> None:
    batch = DefaultRecordBatch(marker_batch(7, 3, MarkerType.COMMIT, coordinator_epoch=5, timestamp_ms=1000,
                                            base_offset=42))
    assert batch.validate_crc()
    assert batch.is_control_batch and batch.is_transactional
    assert (batch.base_offset, batch.producer_id, batch.producer_epoch) == (42, 7, 3)
    [record] = list(batch)
    assert record.key == b"\x00\x00\x00\x01" and record.value == b"\x00\x00\x00\x00\x00\x05"


def test_a_data_batch_is_not_a_marker() -> None:
    batch = encode_batch([(b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x05", (), 0)], base_offset=0)
    header = check_batch(memoryview(batch), 0, batch_bytes_max=len(batch))
    with pytest.raises(ControlBatchError):
        read_marker(header, memoryview(batch)[HEADER_BYTES:])
