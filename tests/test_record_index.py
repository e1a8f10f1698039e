"""The record indexes readers build Arrow columns from: every field they point at is the field the
record decoders return, for Kafka batches (as produced, and as log compaction leaves them: offsets with
gaps, records none even) and for the store's own encoding; damaged bytes raise the format's own error and
nothing else. Runs on whichever core is loaded (make test runs it on both)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bytekit import MUTATIONS, mutated
from examples import examples
from recordgen import NATIVE_RECORDS, NATIVE_RECORDS_BY_SEED, RECORDS, RECORDS_BY_SEED, KafkaRecord
from stratalog.engine.batch import BATCH_HEADER_BYTES, CorruptBatchError, decode_records, encode_batch, read_batch_info
from stratalog.engine.record_index import index_records as index_native
from stratalog.kafka.compaction import gap_batch, kafka_batch_records, rebuilt_batch
from stratalog.kafka.record_index import (
    HEADER_COUNT,
    HEADERS_START,
    INDEX_COLUMNS,
    KEY_BYTES,
    KEY_START,
    OFFSET_DELTA,
    TIMESTAMP_MS,
    VALUE_BYTES,
    VALUE_START,
    index_kafka_batch,
    kafka_headers,
)
from stratalog.kafka.record_index import index_records as index_kafka
from stratalog.kafka.records import (
    RECORDS_POSITION,
    Compression,
    InvalidRecordError,
    KafkaBatchError,
    check_batch,
)
from stratalog.kafka.records import decode_records as decode_kafka
from stratalog.kafka.records import encode_batch as encode_kafka
from stratalog.records import NewRecord


def columns(index: bytes, count: int) -> np.ndarray:
    return np.frombuffer(index, dtype=np.int64).reshape(INDEX_COLUMNS, count)


@settings(max_examples=examples(300), deadline=None)
@given(records=RECORDS, append_time=st.booleans())
def test_a_kafka_index_points_at_what_the_decoder_returns(
        records: list[KafkaRecord],
        append_time: bool) -> None:
    data = encode_kafka([(k, v, tuple(h), ts) for k, v, h, ts in records], base_offset=0)
    header = check_batch(memoryview(data), 0, batch_bytes_max=len(data))
    append_ms = header.max_timestamp_ms if append_time else None  # a LogAppendTime batch: one time for all
    body = data[RECORDS_POSITION:]
    index = columns(index_kafka(body, 0, len(records), len(records) - 1, header.base_timestamp_ms, append_ms),
                    len(records))
    decoded = list(decode_kafka(data, decompressed_bytes_max=1 << 20))
    assert index[OFFSET_DELTA].tolist() == list(range(len(records)))
    for row, (key, value, headers, ts) in enumerate(records):
        assert index[TIMESTAMP_MS, row] == (append_ms if append_time else ts)
        if key is None:
            assert index[KEY_BYTES, row] == -1
        else:
            assert body[index[KEY_START, row]:index[KEY_START, row] + index[KEY_BYTES, row]] == key
        assert body[index[VALUE_START, row]:index[VALUE_START, row] + index[VALUE_BYTES, row]] == (value or b"")
        assert index[HEADER_COUNT, row] == len(headers)
        assert kafka_headers(body, int(index[HEADERS_START, row]), len(headers)) == tuple(headers)
        assert (decoded[row].key, decoded[row].value, decoded[row].headers) == (key, value or b"", tuple(headers))


@settings(max_examples=examples(1000), deadline=None)
@given(records=RECORDS_BY_SEED, mutations=MUTATIONS, count_change=st.integers(-2, 2), span_change=st.integers(-2, 3))
def test_damaged_kafka_records_raise_the_formats_error(
        records: list[KafkaRecord],
        mutations: list[tuple[str, int, int]], count_change: int, span_change: int) -> None:
    body = encode_kafka([(k, v, tuple(h), ts) for k, v, h, ts in records], base_offset=0)[RECORDS_POSITION:]
    data = mutated(body, mutations)
    count = max(len(records) + count_change, 0)
    last_offset_delta = len(records) - 1 + span_change
    try:
        index = columns(index_kafka(data, 0, count, last_offset_delta, 0, None), count)
    except KafkaBatchError:
        return
    # What is indexed lies within the data, at offsets that increase within the batch's span.
    assert (index[KEY_START] + np.maximum(index[KEY_BYTES], 0) <= len(data)).all()
    assert (index[VALUE_START] + index[VALUE_BYTES] <= len(data)).all()
    assert (np.diff(index[OFFSET_DELTA]) > 0).all() and (index[OFFSET_DELTA] <= last_offset_delta).all()
    assert count == 0 or index[OFFSET_DELTA, 0] >= 0


# Stored Kafka batches that log compaction rewrote -------------------------------------------------------


def compacted(records: list[KafkaRecord],
              kept: list[bool], base_offset: int, compression: Compression = Compression.NONE) -> bytes:
    """The batch of ``records`` at ``base_offset`` with only the records ``kept`` (as the cleaner rewrites
    it); an empty batch over its offsets where none is kept."""
    batch = encode_kafka([(k, v, tuple(h), ts) for k, v, h, ts in records], base_offset=base_offset,
                         compression=compression)
    source = kafka_batch_records(batch)
    chosen = [r for r, keep in zip(source.records, kept, strict=False) if keep]
    return rebuilt_batch(source, chosen) if chosen else gap_batch(base_offset, len(records))


@settings(max_examples=examples(300), deadline=None)
@given(records=RECORDS, kept=st.lists(st.booleans(), min_size=12, max_size=12), base_offset=st.integers(0, 1 << 40),
       compression=st.sampled_from([Compression.NONE, Compression.GZIP, Compression.ZSTD]))
def test_a_compacted_batchs_index_points_at_what_the_decoder_returns_at_its_offsets(
        records: list[KafkaRecord], kept: list[bool],
        base_offset: int, compression: Compression) -> None:
    batch = compacted(records, kept, base_offset, compression)
    header, body, raw = index_kafka_batch(memoryview(batch), decompressed_bytes_max=1 << 20)
    decoded = list(decode_kafka(batch, decompressed_bytes_max=1 << 20))
    index = columns(raw, header.record_count)
    assert header.record_count == len(decoded) == sum(kept[:len(records)])
    assert header.last_offset_delta == len(records) - 1, "the batch still spans every offset it did"
    assert (base_offset + index[OFFSET_DELTA]).tolist() == [r.offset for r in decoded]
    data = bytes(body)
    for row, record in enumerate(decoded):
        assert index[TIMESTAMP_MS, row] == record.timestamp_ms
        key_at, key_bytes = int(index[KEY_START, row]), int(index[KEY_BYTES, row])
        assert (data[key_at:key_at + key_bytes] if key_bytes >= 0 else None) == record.key
        assert data[index[VALUE_START, row]:index[VALUE_START, row] + index[VALUE_BYTES, row]] == record.value
        assert kafka_headers(data, int(index[HEADERS_START, row]), int(index[HEADER_COUNT, row])) == record.headers


def test_a_batch_that_lost_every_record_indexes_as_none() -> None:
    header, body, raw = index_kafka_batch(memoryview(gap_batch(40, 7)), decompressed_bytes_max=1 << 20)
    assert (header.base_offset, header.last_offset_delta, header.record_count, len(body), raw) == (40, 6, 0, 0, b"")


def test_the_specs_compacted_batches_index_at_their_offsets() -> None:
    # docs/formats/kafka-batch.md, "Worked example": the batch stored at offset 40, compacted to its second
    # record, then emptied.
    source = kafka_batch_records(encode_kafka([(b"k", b"hi", (), 1000), (None, b"yo", (("h", b"v"),), 1005)],
                                              base_offset=40))
    kept = rebuilt_batch(source, source.records[1:])
    assert kept == bytes.fromhex(
        "0000000000000028 0000003e ffffffff 02 3ea1c9a1 0000 00000001 00000000000003e8 00000000000003ed"
        "ffffffffffffffff ffff ffffffff 00000001 18000a020104796f 0202680276")
    header, body, raw = index_kafka_batch(memoryview(kept), decompressed_bytes_max=1 << 20)
    index = columns(raw, 1)
    assert header.base_offset + index[OFFSET_DELTA].tolist()[0] == 41
    assert bytes(body)[index[VALUE_START, 0]:index[VALUE_START, 0] + index[VALUE_BYTES, 0]] == b"yo"
    assert gap_batch(40, 2) == bytes.fromhex(
        "0000000000000028 00000031 ffffffff 02 19f63ed9 0000 00000001 ffffffffffffffff ffffffffffffffff"
        "ffffffffffffffff ffff ffffffff 00000000")


def records_with_deltas(deltas: list[int]) -> bytes:
    """Records (key "k", value "v") whose offset deltas are ``deltas``: what a batch's payload holds."""
    return b"".join(bytes([16, 0, 0, 2 * d, 2]) + b"k" + bytes([2]) + b"v" + bytes([0]) for d in deltas)


@pytest.mark.parametrize(("deltas", "last", "message"), [
    ([0, 0], 3, "record 1 has offsetDelta 0: offset deltas must increase, up to the batch's lastOffsetDelta 3"),
    ([2, 1], 3, "record 1 has offsetDelta 1: offset deltas must increase"),
    ([1, 4], 3, "record 1 has offsetDelta 4: offset deltas must increase, up to the batch's lastOffsetDelta 3"),
    ([0, 1, 2], 1, "record 2 has offsetDelta 2"),
])
def test_offset_deltas_that_do_not_increase_within_the_span_are_invalid(deltas: list[int], last: int,
                                                                       message: str) -> None:
    with pytest.raises(InvalidRecordError, match=message):
        index_kafka(records_with_deltas(deltas), 0, len(deltas), last, 0, None)


def test_offset_deltas_with_gaps_are_indexed_as_they_are() -> None:
    index = columns(index_kafka(records_with_deltas([1, 5, 6]), 0, 3, 9, 0, None), 3)
    assert index[OFFSET_DELTA].tolist() == [1, 5, 6]
    assert index[KEY_BYTES].tolist() == [1, 1, 1]


@settings(max_examples=examples(300), deadline=None)
@given(records=NATIVE_RECORDS)
def test_a_native_index_points_at_what_the_decoder_returns(records: list[NewRecord]) -> None:
    data, _ = encode_batch(7, 100, records)
    info = read_batch_info(data)
    index = columns(index_native(data, BATCH_HEADER_BYTES, len(data), len(records)), len(records))
    assert index[OFFSET_DELTA].tolist() == list(range(len(records))), "the store's own batches are dense"
    for row, decoded in enumerate(decode_records(data, 0, info)):
        assert index[TIMESTAMP_MS, row] == decoded.timestamp_ms
        if decoded.key is None:
            assert index[KEY_BYTES, row] == -1
        else:
            assert data[index[KEY_START, row]:index[KEY_START, row] + index[KEY_BYTES, row]] == decoded.key
        assert data[index[VALUE_START, row]:index[VALUE_START, row] + index[VALUE_BYTES, row]] == decoded.value
        assert index[HEADER_COUNT, row] == len(decoded.headers)


@settings(max_examples=examples(1000), deadline=None)
@given(records=NATIVE_RECORDS_BY_SEED, mutations=MUTATIONS, count_change=st.integers(-2, 2))
def test_damaged_native_records_raise_the_formats_error(records: list[NewRecord], mutations: list[tuple[str, int, int]],
                                                        count_change: int) -> None:
    body = encode_batch(7, 100, records)[0][BATCH_HEADER_BYTES:]
    data = mutated(body, mutations)
    count = max(len(records) + count_change, 0)
    try:
        index = columns(index_native(data, 0, len(data), count), count)
    except CorruptBatchError:
        return
    assert (index[KEY_START] + np.maximum(index[KEY_BYTES], 0) <= len(data)).all()
    assert (index[VALUE_START] + index[VALUE_BYTES] <= len(data)).all()
