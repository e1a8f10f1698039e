"""The record indexes readers build Arrow columns from: every field they point at is the field the
record decoders return, for Kafka batches and for the store's own encoding; damaged bytes raise the
format's own error and nothing else. Runs on whichever core is loaded (make test runs it on both)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from bytekit import MUTATIONS, mutated
from stratalog.engine.batch import BATCH_HEADER_BYTES, CorruptBatchError, decode_records, encode_batch, read_batch_info
from stratalog.engine.record_index import index_records as index_native
from stratalog.kafka.record_index import (
    HEADER_COUNT,
    HEADERS_START,
    INDEX_COLUMNS,
    KEY_BYTES,
    KEY_START,
    TIMESTAMP_MS,
    VALUE_BYTES,
    VALUE_START,
    kafka_headers,
)
from stratalog.kafka.record_index import index_records as index_kafka
from stratalog.kafka.records import RECORDS_POSITION, KafkaBatchError, check_batch
from stratalog.kafka.records import decode_records as decode_kafka
from stratalog.kafka.records import encode_batch as encode_kafka
from stratalog.records import NewRecord

HEADER_KEYS = st.text(max_size=8)
RECORDS = st.lists(st.tuples(
    st.none() | st.binary(max_size=40),
    st.none() | st.binary(max_size=300),
    st.lists(st.tuples(HEADER_KEYS, st.none() | st.binary(max_size=20)), max_size=3),
    st.integers(0, 1 << 45)), min_size=1, max_size=12)
def columns(index: bytes, count: int) -> np.ndarray:
    return np.frombuffer(index, dtype=np.int64).reshape(INDEX_COLUMNS, count)


@settings(max_examples=300, deadline=None)
@given(records=RECORDS, append_time=st.booleans())
def test_a_kafka_index_points_at_what_the_decoder_returns(
        records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]],
        append_time: bool) -> None:
    data = encode_kafka([(k, v, tuple(h), ts) for k, v, h, ts in records], base_offset=0)
    header = check_batch(memoryview(data), 0, batch_bytes_max=len(data))
    append_ms = header.max_timestamp_ms if append_time else None  # a LogAppendTime batch: one time for all
    body = data[RECORDS_POSITION:]
    index = columns(index_kafka(body, 0, len(records), header.base_timestamp_ms, append_ms), len(records))
    decoded = list(decode_kafka(data, decompressed_bytes_max=1 << 20))
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


@settings(max_examples=1000, deadline=None)
@given(records=RECORDS, mutations=MUTATIONS, count_change=st.integers(-2, 2))
def test_damaged_kafka_records_raise_the_formats_error(
        records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]],
        mutations: list[tuple[str, int, int]], count_change: int) -> None:
    body = encode_kafka([(k, v, tuple(h), ts) for k, v, h, ts in records], base_offset=0)[RECORDS_POSITION:]
    data = mutated(body, mutations)
    count = max(len(records) + count_change, 0)
    try:
        index = columns(index_kafka(data, 0, count, 0, None), count)
    except KafkaBatchError:
        return
    # What is indexed lies within the data.
    assert (index[KEY_START] + np.maximum(index[KEY_BYTES], 0) <= len(data)).all()
    assert (index[VALUE_START] + index[VALUE_BYTES] <= len(data)).all()


NATIVE_RECORDS = st.lists(st.builds(
    NewRecord, st.binary(max_size=300), st.none() | st.binary(max_size=40), st.integers(-(1 << 62), 1 << 62),
    st.lists(st.tuples(HEADER_KEYS, st.none() | st.binary(max_size=20)), max_size=3).map(tuple)),
    min_size=1, max_size=12)


@settings(max_examples=300, deadline=None)
@given(records=NATIVE_RECORDS)
def test_a_native_index_points_at_what_the_decoder_returns(records: list[NewRecord]) -> None:
    data, _ = encode_batch(7, 100, records)
    info = read_batch_info(data)
    index = columns(index_native(data, BATCH_HEADER_BYTES, len(data), len(records)), len(records))
    for row, decoded in enumerate(decode_records(data, 0, info)):
        assert index[TIMESTAMP_MS, row] == decoded.timestamp_ms
        if decoded.key is None:
            assert index[KEY_BYTES, row] == -1
        else:
            assert data[index[KEY_START, row]:index[KEY_START, row] + index[KEY_BYTES, row]] == decoded.key
        assert data[index[VALUE_START, row]:index[VALUE_START, row] + index[VALUE_BYTES, row]] == decoded.value
        assert index[HEADER_COUNT, row] == len(decoded.headers)


@settings(max_examples=1000, deadline=None)
@given(records=NATIVE_RECORDS, mutations=MUTATIONS, count_change=st.integers(-2, 2))
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
