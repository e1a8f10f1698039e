"""The hand-written Produce response encoder: kio's bytes for every version served."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from stratalog.invariant import InvariantError
from stratalog.kafka.api_keys import ApiKey
from stratalog.kafka.build import build
from stratalog.kafka.codec import encode_response, response_schema
from stratalog.kafka.produce_response import (
    PRODUCE_VERSION_MAX,
    PRODUCE_VERSION_MIN,
    ProducePartitionResult,
    ProduceTopicResult,
    encode_produce_response,
)

VERSIONS = range(PRODUCE_VERSION_MIN, PRODUCE_VERSION_MAX + 1)
I32 = st.integers(-(2**31), 2**31 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)
ERROR_CODES = st.sampled_from([int(e) for e in ErrorCode])
#: kio takes LogAppendTime as a datetime (None for -1); whole milliseconds up to the year 2100 survive
#: its float round trip exactly.
APPEND_TIMES_MS = st.just(-1) | st.integers(0, 4_102_444_800_000)


def kio_frame(correlation_id: int, version: int, topics: list[ProduceTopicResult], throttle_time_ms: int = 0) -> bytes:
    """The same response through kio: the reference."""
    values: dict[str, Any] = {"throttle_time": throttle_time_ms, "responses": [{
        "name": t.name, "partition_responses": [{
            "index": p.index, "error_code": p.error_code, "base_offset": p.base_offset,
            "log_append_time": None if p.log_append_time_ms == -1 else datetime.datetime.fromtimestamp(
                p.log_append_time_ms / 1000, tz=datetime.UTC),
            "log_start_offset": p.log_start_offset, "record_errors": [], "error_message": p.error_message,
        } for p in t.partitions]} for t in topics]}
    return encode_response(correlation_id, build(response_schema(ApiKey.PRODUCE, version), values))


partitions = st.builds(
    ProducePartitionResult, index=I32, error_code=ERROR_CODES, base_offset=I64, log_append_time_ms=APPEND_TIMES_MS,
    log_start_offset=I64, error_message=st.none() | st.text(max_size=200))
topics_strategy = st.lists(st.builds(ProduceTopicResult, name=st.text(max_size=60),
                                     partitions=st.lists(partitions, max_size=4)), max_size=4)


@pytest.mark.parametrize("version", VERSIONS)
@settings(max_examples=80, deadline=None)
@given(correlation_id=I32, throttle_time_ms=st.integers(0, 2**31 - 1), topics=topics_strategy)
def test_bytes_equal_kio_for_every_version(version: int, correlation_id: int, throttle_time_ms: int,
                                            topics: list[ProduceTopicResult]) -> None:
    out = encode_produce_response(correlation_id, version, topics, throttle_time_ms)
    assert out == kio_frame(correlation_id, version, topics, throttle_time_ms)


def test_non_ascii_names_and_messages_are_counted_in_bytes() -> None:
    """Lengths are of the UTF-8 bytes, not of the characters: 'é' is 2 bytes, '𝄞' 4."""
    topics = [ProduceTopicResult("tópico-𝄞", [ProducePartitionResult(0, 87, error_message="réfusé: 𝄞 ✓")])]
    for version in VERSIONS:
        assert encode_produce_response(3, version, topics) == kio_frame(3, version, topics)


def test_long_names_and_messages_take_multi_byte_lengths() -> None:
    """From v9 a length of 127 or more needs a two-byte varint, 16383 or more three bytes."""
    for size in (125, 126, 127, 300, 16_383, 20_000):
        topics = [ProduceTopicResult("t" * min(size, 249), [ProducePartitionResult(1, 2, error_message="m" * size)])]
        for version in (8, 9):
            assert encode_produce_response(7, version, topics) == kio_frame(7, version, topics)


def test_many_topics_and_partitions() -> None:
    topics = [ProduceTopicResult(f"topic-{t}", [ProducePartitionResult(p, 0, base_offset=p * 10, log_start_offset=0)
                                                for p in range(100)]) for t in range(3)]
    for version in VERSIONS:
        assert encode_produce_response(1, version, topics) == kio_frame(1, version, topics)


# Golden frames, worked by hand from ProduceResponse.json: one partition stored at offset 5.
GOLDEN_TOPICS = [ProduceTopicResult("t", [ProducePartitionResult(index=0, error_code=0, base_offset=5,
                                                                 log_start_offset=0)])]

GOLDEN_V3 = (
    "00000029"  # size: 41
    "00000007"  # correlation_id (header v0)
    "00000001"  # topics: 1
    "0001" "74"  # "t"
    "00000001"  # partitions: 1
    "00000000"  # index
    "0000"  # error_code
    "0000000000000005"  # base_offset
    "ffffffffffffffff"  # log_append_time_ms: -1
    "00000000"  # throttle_time_ms
)

GOLDEN_V9 = (
    "00000030"  # size: 48
    "00000007" "00"  # correlation_id, no tagged fields (header v1)
    "02"  # topics: 1 (compact: length + 1)
    "02" "74"  # "t"
    "02"  # partitions: 1
    "00000000"  # index
    "0000"  # error_code
    "0000000000000005"  # base_offset
    "ffffffffffffffff"  # log_append_time_ms: -1
    "0000000000000000"  # log_start_offset
    "01"  # record_errors: empty
    "00"  # error_message: null
    "00"  # partition: no tagged fields
    "00"  # topic: no tagged fields
    "00000000"  # throttle_time_ms
    "00"  # response: no tagged fields
)


@pytest.mark.parametrize(("version", "golden"), [(3, GOLDEN_V3), (9, GOLDEN_V9)])
def test_golden_frames(version: int, golden: str) -> None:
    assert encode_produce_response(7, version, GOLDEN_TOPICS).hex() == golden
    assert kio_frame(7, version, GOLDEN_TOPICS) == bytes.fromhex(golden)


def test_versions_not_served_are_refused() -> None:
    for version in (PRODUCE_VERSION_MIN - 1, PRODUCE_VERSION_MAX + 1):
        with pytest.raises(InvariantError):
            encode_produce_response(1, version, [])
