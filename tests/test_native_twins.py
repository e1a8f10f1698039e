"""The compiled core against its Python twins: the same inputs, valid and hostile, give the same result
or the same error (type and message). These tests need the compiled module (make test builds it); the
twins' own behaviour is tested elsewhere (test_kafka_record_check.py, test_record_index.py), and runs on
either core."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.serial import entity_reader

from bytekit import MUTATIONS, mutated
from examples import examples
from recordgen import NATIVE_RECORDS_BY_SEED, RECORDS, RECORDS_BY_SEED, KafkaRecord
from stratalog import _native
from stratalog.chaos.fuzz_kafka import produce_seeds, request_seeds, sample_entity
from stratalog.engine.batch import BATCH_HEADER_BYTES
from stratalog.engine.batch import encode_batch as encode_native_batch
from stratalog.engine.record_index import index_native_records
from stratalog.engine.record_layout import encode_records
from stratalog.kafka.array_bounds import Plan, plan_of, walk_array_counts
from stratalog.kafka.codec import encode_request, load_request_schema, peek_header
from stratalog.kafka.compaction import gap_batch, kafka_batch_records, rebuilt_batch
from stratalog.kafka.produce_request import decode_produce_fields
from stratalog.kafka.record_check import walk_records
from stratalog.kafka.record_index import index_kafka_records
from stratalog.kafka.records import RECORDS_POSITION, encode_batch
from stratalog.native import PURE_PYTHON_ENV
from stratalog.records import NewRecord

Outcome = tuple[str, object]


def outcome(walk: object, data: bytes, position: int, count: int) -> Outcome:
    try:
        return "returned", walk(data, position, count)  # type: ignore[operator]
    except Exception as e:
        return type(e).__name__, str(e)


def same_walk(data: bytes, position: int, count: int) -> Outcome:
    python = outcome(walk_records, data, position, count)
    native = outcome(_native.walk_records, data, position, count)
    assert native == python, (data.hex(), position, count)
    native_view = outcome(_native.walk_records, memoryview(data), position, count)
    assert native_view == python
    return python


def records_part(records: list[KafkaRecord]) -> bytes:
    return encode_batch([(k, v, tuple(h), ts) for k, v, h, ts in records], base_offset=0)[RECORDS_POSITION:]


@settings(max_examples=examples(300), deadline=None)
@given(records=RECORDS)
def test_valid_records_walk_to_the_same_end(
        records: list[KafkaRecord]) -> None:
    data = records_part(records)
    assert same_walk(data, 0, len(records)) == ("returned", len(data))


@settings(max_examples=examples(1500), deadline=None)
@given(records=RECORDS_BY_SEED, mutations=MUTATIONS, cut=st.integers(0, 1 << 16), count_change=st.integers(-2, 2))
def test_damaged_records_fail_alike(records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]],
                                                       int]],
                                    mutations: list[tuple[str, int, int]], cut: int, count_change: int) -> None:
    data = bytearray(mutated(records_part(records), mutations))
    if cut % 3 == 0:
        del data[cut % (len(data) + 1):]
    same_walk(bytes(data), 0, len(records) + count_change)


@settings(max_examples=examples(1000), deadline=None)
@given(data=st.binary(max_size=200), position=st.integers(0, 210), count=st.integers(-1, 20))
def test_any_bytes_fail_alike(data: bytes, position: int, count: int) -> None:
    same_walk(data, position, count)


def varint(value: int) -> bytes:
    raw = (value << 1) ^ (value >> 127)  # zigzag, wide enough for the 70-bit values below
    out = bytearray()
    while raw >= 0x80:
        out.append(raw & 0x7F | 0x80)
        raw >>= 7
    out.append(raw)
    return bytes(out)


@pytest.mark.parametrize("value", [
    1 << 62, (1 << 63) - 1, 1 << 63, -(1 << 63), (1 << 68) + 5, -(1 << 68), (1 << 69) - 1, -(1 << 69)])
@pytest.mark.parametrize("field", ["length", "offset_delta", "key", "value"])
def test_wide_varints_are_read_to_seventy_bits_alike(value: int, field: str) -> None:
    # A varint of up to 10 bytes: Python reads its 70 bits exactly, and so must the compiled walk.
    fields = {"length": varint(20), "attributes": b"\0", "timestamp": varint(0), "offset_delta": varint(0),
              "key": varint(-1), "value": varint(3) + b"abc", "headers": varint(0)}
    fields[field] = varint(value) + (b"" if field != "value" else b"abc")
    data = b"".join(fields.values()) + bytes(40)
    same_walk(data, 0, 1)


def test_a_varint_of_eleven_bytes_is_refused_alike() -> None:
    assert same_walk(b"\xff" * 11 + b"\x01", 0, 1)[0] == "CorruptRecordError"


def test_a_negative_position_is_refused_alike() -> None:
    assert same_walk(b"\0" * 8, -1, 1) == ("ValueError", "position must not be negative")


def test_the_python_core_is_taken_when_asked_for() -> None:
    code = "from stratalog.native import core, native; print(native is None, core())"
    forced = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, **{PURE_PYTHON_ENV: "1"}),
                            capture_output=True, text=True, check=True).stdout
    assert forced == f"True pure Python ({PURE_PYTHON_ENV} is set)\n"
    default = subprocess.run([sys.executable, "-c", code], env={k: v for k, v in os.environ.items()
                                                                 if k != PURE_PYTHON_ENV},
                             capture_output=True, text=True, check=True).stdout
    assert default == "False native (C)\n"


# The record indexes (kafka/record_index.py, engine/record_index.py) ------------------------------------


def called(function: Callable[..., object], *args: object) -> Outcome:
    try:
        return "returned", function(*args)
    except Exception as e:
        return type(e).__name__, str(e)


def same_outcome(python: Callable[..., object], compiled: Callable[..., object], *args: object) -> Outcome:
    expected = called(python, *args)
    assert called(compiled, *args) == expected, args
    return expected


@settings(max_examples=examples(300), deadline=None)
@given(records=RECORDS, append=st.none() | st.integers(-(1 << 63), (1 << 63) - 1),
       base=st.integers(-(1 << 63), (1 << 63) - 1))
def test_kafka_indexes_are_the_same(records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]],
                                                        int]], append: int | None, base: int) -> None:
    # Bases near the ends of int64 make some timestamps overflow: both refuse those records alike.
    data = records_part(records)
    last = len(records) - 1
    same_outcome(index_kafka_records, _native.index_kafka_records, data, 0, len(records), last, base, append)
    same_outcome(index_kafka_records, _native.index_kafka_records, memoryview(data), 0, len(records), last, 0, append)


def gapped_part(records: list[KafkaRecord],
                kept: list[bool]) -> tuple[bytes, int, int]:
    """The records part of the batch of ``records`` as log compaction rewrites it, keeping the records
    ``kept`` (an empty batch over its offsets where none is), with its record count and lastOffsetDelta."""
    source = kafka_batch_records(encode_batch([(k, v, tuple(h), ts) for k, v, h, ts in records], base_offset=7))
    chosen = [r for r, keep in zip(source.records, kept, strict=False) if keep]
    batch = rebuilt_batch(source, chosen) if chosen else gap_batch(7, len(records))
    return batch[RECORDS_POSITION:], len(chosen), len(records) - 1


@settings(max_examples=examples(300), deadline=None)
@given(records=RECORDS, kept=st.lists(st.booleans(), min_size=12, max_size=12),
       append=st.none() | st.integers(-(1 << 63), (1 << 63) - 1), base=st.integers(-(1 << 63), (1 << 63) - 1))
def test_compacted_kafka_indexes_are_the_same(
        records: list[KafkaRecord], kept: list[bool],
        append: int | None, base: int) -> None:
    data, count, last = gapped_part(records, kept)
    assert same_outcome(index_kafka_records, _native.index_kafka_records, data, 0, count, last, 0, append)[0] == \
        "returned"
    same_outcome(index_kafka_records, _native.index_kafka_records, data, 0, count, last, base, append)


@settings(max_examples=examples(1500), deadline=None)
@given(records=RECORDS_BY_SEED, kept=st.lists(st.booleans(), min_size=12, max_size=12), mutations=MUTATIONS,
       count_change=st.integers(-3, 2), span_change=st.integers(-3, 3), position=st.integers(-1, 3))
def test_damaged_kafka_records_index_alike(
        records: list[KafkaRecord], kept: list[bool],
        mutations: list[tuple[str, int, int]], count_change: int, span_change: int, position: int) -> None:
    data, count, last = gapped_part(records, kept)
    same_outcome(index_kafka_records, _native.index_kafka_records, mutated(data, mutations), position,
                 count + count_change, last + span_change, 0, None)


def test_more_records_than_the_bytes_hold_fail_alike_before_an_index_is_made() -> None:
    data = records_part([(b"k", b"v", [], 0)])
    for count in (2, 1 << 40):   # an index of 2**40 rows would be 64 TiB: the walk fails first
        assert same_outcome(index_kafka_records, _native.index_kafka_records, data, 0, count, count, 0, None) == \
            ("CorruptRecordError", "a record runs past the end of the batch")


@settings(max_examples=examples(1500), deadline=None)
@given(records=NATIVE_RECORDS_BY_SEED, mutations=st.lists(MUTATIONS, max_size=1), count_change=st.integers(-3, 2),
       start=st.integers(-1, 30), end_change=st.integers(-3, 3))
def test_native_indexes_are_the_same_whole_or_damaged(records: list[NewRecord],
                                                      mutations: list[list[tuple[str, int, int]]],
                                                      count_change: int, start: int, end_change: int) -> None:
    data = mutated(encode_native_batch(7, 100, records)[0], mutations[0] if mutations else [])
    position = BATCH_HEADER_BYTES if start == 30 else start
    same_outcome(index_native_records, _native.index_native_records, data, position,
                 len(data) + end_change, len(records) + count_change)


@settings(max_examples=examples(1000), deadline=None)
@given(data=st.binary(max_size=200), position=st.integers(-1, 210), end=st.integers(-1, 210), count=st.integers(-1, 12))
def test_any_bytes_index_alike(data: bytes, position: int, end: int, count: int) -> None:
    same_outcome(index_native_records, _native.index_native_records, data, position, end, count)
    same_outcome(index_kafka_records, _native.index_kafka_records, data, max(position, 0), count, end, 0, None)


# The bulk record layout of Spark writes (engine/record_layout.py) ------------------------------------------


ROWS = st.lists(st.tuples(st.none() | st.binary(max_size=30), st.binary(max_size=60),
                          st.integers(-(1 << 63), (1 << 63) - 1)), max_size=10)


@settings(max_examples=examples(500), deadline=None)
@given(rows=ROWS, gaps=st.lists(st.integers(0, 40), min_size=10, max_size=10), damage=st.sampled_from(
    ["none", "key_start", "key_bytes", "value_start", "value_bytes", "dest", "short_out", "ragged"]),
       row=st.integers(0, 9), by=st.integers(-50, 50))
def test_record_layouts_are_the_same(rows: list[tuple[bytes | None, bytes, int]], gaps: list[int], damage: str,
                                     row: int, by: int) -> None:
    keys = b"".join(k or b"" for k, _, _ in rows)
    values = b"".join(v for _, v, _ in rows)
    key_bytes = np.array([-1 if k is None else len(k) for k, _, _ in rows], dtype=np.int64)
    value_bytes = np.array([len(v) for _, v, _ in rows], dtype=np.int64)
    key_start = np.cumsum(np.maximum(key_bytes, 0)) - np.maximum(key_bytes, 0)
    value_start = np.cumsum(value_bytes) - value_bytes
    sizes = 22 + np.maximum(key_bytes, 0) + value_bytes
    dest = np.cumsum(sizes) - sizes + np.cumsum(gaps[:len(rows)]).astype(np.int64)
    columns = {"dest": dest, "key_start": key_start, "key_bytes": key_bytes, "value_start": value_start,
               "value_bytes": value_bytes, "timestamp_ms": np.array([t for _, _, t in rows], dtype=np.int64)}
    out_bytes = int(dest[-1] + sizes[-1]) if rows else 0
    if damage in columns and rows:
        columns[damage][row % len(rows)] += by
    if damage == "short_out":
        out_bytes = max(out_bytes - abs(by), 0)
    if damage == "ragged":
        columns["value_bytes"] = columns["value_bytes"][:-1]

    def laid(function: Callable[..., object]) -> tuple[Outcome, bytes]:
        out = bytearray(b"\xaa" * out_bytes)
        return called(function, out, keys, values, *columns.values()), bytes(out)

    assert laid(_native.encode_records) == laid(encode_records)


# The array-count walk of a request, before kio reads it ---------------------------------------------------

REQUESTS = request_seeds()   # one request of every API version the broker serves


def body_position(frame: bytes) -> tuple[int, Plan]:
    api_key, api_version, _ = peek_header(frame)
    schema = load_request_schema(api_key, api_version)
    return entity_reader(schema.__header_schema__)(frame, 0)[1], plan_of(schema)


def same_array_counts(frame: bytes, position: int, plan: Plan) -> Outcome:
    python = outcome(walk_array_counts, frame, position, plan)
    native = outcome(_native.check_array_counts, frame, position, plan)
    assert native == python, (frame.hex(), position, plan[0])
    assert outcome(_native.check_array_counts, memoryview(frame), position, plan) == python
    return python


@pytest.mark.parametrize("frame", REQUESTS, ids=lambda f: "key{}-v{}-id{}".format(*peek_header(f)))
def test_every_served_request_walks_alike(frame: bytes) -> None:
    position, plan = body_position(frame)
    assert same_array_counts(frame, position, plan) == ("returned", None)


@settings(max_examples=examples(3000), deadline=None)
@given(index=st.integers(0, len(REQUESTS) - 1), mutations=MUTATIONS, shift=st.integers(-3, 3))
def test_damaged_requests_are_refused_alike(index: int, mutations: list[tuple[str, int, int]], shift: int) -> None:
    frame = REQUESTS[index]
    position, plan = body_position(frame)
    same_array_counts(mutated(frame, mutations), position + shift, plan)


def test_a_lying_array_count_is_refused_alike_with_its_field() -> None:
    body = dataclasses.replace(sample_entity(load_request_schema(0, 3)), transactional_id=None)
    frame = encode_request(0, 3, 1, "c", body)
    position, plan = body_position(frame)
    # Produce v3: transactional_id (int16 length -1: null), acks, timeout, then topic_data's count.
    count_at = position + 2 + 2 + 4
    lying = frame[:count_at] + (10**9).to_bytes(4, "big") + frame[count_at + 4:]
    kind, message = same_array_counts(lying, position, plan)
    assert kind == "ArrayCountError" and message.startswith("ProduceRequest.topic_data: an array of 1000000000")


# The Produce request reader --------------------------------------------------------------------------------

PRODUCE_SEEDS = produce_seeds()


def same_produce(frame: bytes, flexible: bool) -> Outcome:
    def read(decode: Callable[[bytes, bool], object], data: bytes | memoryview) -> Outcome:
        try:
            return "returned", decode(data, flexible)
        except Exception as e:
            return type(e).__name__, str(e)

    python = read(decode_produce_fields, frame)
    assert read(_native.decode_produce, frame) == python, (frame.hex(), flexible)
    assert read(_native.decode_produce, memoryview(frame)) == python
    return python


@pytest.mark.parametrize("index", range(len(PRODUCE_SEEDS)))
def test_every_produce_version_reads_alike(index: int) -> None:
    frame = PRODUCE_SEEDS[index]
    assert same_produce(frame, peek_header(frame)[1] >= 9)[0] == "returned"


@settings(max_examples=examples(400), deadline=None)
@given(index=st.integers(0, len(PRODUCE_SEEDS) - 1), mutations=MUTATIONS, flexible=st.booleans())
def test_damaged_produce_requests_read_or_fail_alike(index: int, mutations: list[tuple[str, int, int]],
                                                     flexible: bool) -> None:
    same_produce(mutated(PRODUCE_SEEDS[index], mutations), flexible)


@settings(max_examples=examples(300), deadline=None)
@given(data=st.binary(max_size=64), flexible=st.booleans())
def test_any_bytes_read_or_fail_alike_as_produce(data: bytes, flexible: bool) -> None:
    same_produce(data, flexible)


def test_produce_reader_takes_two_arguments() -> None:
    with pytest.raises(TypeError, match=r"decode_produce\(frame, flexible\)"):
        _native.decode_produce(b"")   # type: ignore[call-arg]
