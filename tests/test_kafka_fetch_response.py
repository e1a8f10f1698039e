"""The zero-copy Fetch response encoder: kio's bytes for every version served, records passed on as is."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from stratalog.invariant import InvariantError
from stratalog.kafka.api_keys import ApiKey
from stratalog.kafka.build import build
from stratalog.kafka.codec import encode_response, response_schema
from stratalog.kafka.fetch_response import (
    FETCH_VERSION_MAX,
    FETCH_VERSION_MIN,
    AbortedTransaction,
    FetchPartitionResult,
    FetchTopicResult,
    NodeEndpoint,
    encode_fetch_response,
)

VERSIONS = range(FETCH_VERSION_MIN, FETCH_VERSION_MAX + 1)
I32 = st.integers(-(2**31), 2**31 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)
ERROR_CODES = st.sampled_from([int(e) for e in ErrorCode])


def kio_frame(correlation_id: int, version: int, throttle_time_ms: int, error_code: int, session_id: int,
              topics: list[FetchTopicResult], node_endpoints: list[NodeEndpoint] | None = None) -> bytes:
    """The same response through kio: the reference."""
    values: dict[str, Any] = {
        "throttle_time": throttle_time_ms, "error_code": error_code, "session_id": session_id,
        "node_endpoints": [{"node_id": e.node_id, "host": e.host, "port": e.port, "rack": e.rack}
                           for e in node_endpoints or ()],
        "responses": [{"topic": t.topic, "topic_id": t.topic_id, "partitions": [{
            "partition_index": p.partition_index, "error_code": p.error_code, "high_watermark": p.high_watermark,
            "last_stable_offset": p.last_stable_offset, "log_start_offset": p.log_start_offset,
            "preferred_read_replica": p.preferred_read_replica,
            "current_leader": {"leader_id": p.current_leader[0], "leader_epoch": p.current_leader[1]}
            if p.current_leader else {},
            "aborted_transactions": None if p.aborted_transactions is None else [
                {"producer_id": a.producer_id, "first_offset": a.first_offset} for a in p.aborted_transactions],
            "records": b"".join(p.records)} for p in t.partitions]} for t in topics]}
    return encode_response(correlation_id, build(response_schema(ApiKey.FETCH, version), values))


def record_pieces() -> st.SearchStrategy[list[bytes | memoryview]]:
    piece = st.binary(max_size=300).flatmap(lambda b: st.sampled_from([b, memoryview(b)]))
    return st.lists(piece, max_size=4)


partitions = st.builds(
    FetchPartitionResult, partition_index=I32, error_code=ERROR_CODES, high_watermark=I64,
    last_stable_offset=I64, log_start_offset=I64, preferred_read_replica=I32,
    aborted_transactions=st.none() | st.lists(st.builds(AbortedTransaction, I64, I64), max_size=3),
    records=record_pieces(), current_leader=st.none() | st.tuples(I32, I32))
topics_strategy = st.lists(st.builds(FetchTopicResult, topic=st.text(max_size=40),
                                     partitions=st.lists(partitions, max_size=4), topic_id=st.uuids()), max_size=4)
endpoints = st.lists(st.builds(NodeEndpoint, node_id=I32, host=st.text(max_size=30), port=I32,
                               rack=st.none() | st.text(max_size=10)), max_size=3)


@pytest.mark.parametrize("version", VERSIONS)
@settings(max_examples=60, deadline=None)
@given(correlation_id=I32, throttle_time_ms=st.integers(0, 2**31 - 1), error_code=ERROR_CODES, session_id=I32,
       topics=topics_strategy, node_endpoints=endpoints)
def test_bytes_equal_kio_for_every_version(version: int, correlation_id: int, throttle_time_ms: int,
                                            error_code: int, session_id: int, topics: list[FetchTopicResult],
                                            node_endpoints: list[NodeEndpoint]) -> None:
    pieces = encode_fetch_response(correlation_id, version, throttle_time_ms, error_code, session_id, topics,
                                   node_endpoints)
    assert b"".join(pieces) == kio_frame(correlation_id, version, throttle_time_ms, error_code, session_id, topics,
                                         node_endpoints)


def test_long_records_take_multi_byte_lengths() -> None:
    """A v12 records length of 300 bytes needs a two-byte varint; a 2**21-byte one three bytes."""
    for size in (126, 127, 300, 2**21):
        topics = [FetchTopicResult("t", [FetchPartitionResult(0, 0, size, records=[bytes(size)])])]
        for version in (11, 12):
            assert b"".join(encode_fetch_response(7, version, 0, 0, 0, topics)) == kio_frame(7, version, 0, 0, 0,
                                                                                            topics)


def test_record_views_are_passed_on_not_copied() -> None:
    store = bytes(range(256)) * 64
    first, second, third = memoryview(store)[0:1000], memoryview(store)[1000:5000], b"x" * 300
    topics = [FetchTopicResult("a", [FetchPartitionResult(0, 0, 9, records=[first, second]),
                                     FetchPartitionResult(1, 0, 9, records=[])]),
              FetchTopicResult("b", [FetchPartitionResult(3, 0, 9, records=[third])])]
    for version in VERSIONS:
        out = encode_fetch_response(1, version, 0, 0, 0, topics)
        views = [piece for piece in out if any(piece is r for r in (first, second, third))]
        assert len(views) == 3
        assert views[0] is first and views[1] is second and views[2] is third
        assert out[out.index(first) + 1] is second  # consecutive batches stay consecutive pieces
        # Everything else is a few bytes of header.
        assert sum(len(p) for p in out if all(p is not r for r in (first, second, third))) < 200


# Golden frames, worked by hand from FetchResponse.json: one partition of 10 bytes of records.
GOLDEN_TOPICS = [FetchTopicResult("t", [FetchPartitionResult(
    partition_index=0, error_code=0, high_watermark=5, last_stable_offset=5, log_start_offset=0,
    records=[b"0123456789"])])]

GOLDEN_V4 = (
    "0000003b"  # size: 59
    "00000007"  # correlation_id (header v0)
    "00000000"  # throttle_time_ms
    "00000001"  # topics: 1
    "0001" "74"  # "t"
    "00000001"  # partitions: 1
    "00000000"  # partition_index
    "0000"  # error_code
    "0000000000000005"  # high_watermark
    "0000000000000005"  # last_stable_offset
    "ffffffff"  # aborted_transactions: null
    "0000000a" "30313233343536373839"  # records
)

GOLDEN_V12 = (
    "00000044"  # size: 68
    "00000007" "00"  # correlation_id, no tagged fields (header v1)
    "00000000"  # throttle_time_ms
    "0000"  # error_code
    "00000000"  # session_id
    "02"  # topics: 1 (compact: length + 1)
    "02" "74"  # "t"
    "02"  # partitions: 1
    "00000000"  # partition_index
    "0000"  # error_code
    "0000000000000005"  # high_watermark
    "0000000000000005"  # last_stable_offset
    "0000000000000000"  # log_start_offset
    "00"  # aborted_transactions: null
    "ffffffff"  # preferred_read_replica: -1
    "0b" "30313233343536373839"  # records (compact: length + 1)
    "00"  # partition: no tagged fields
    "00"  # topic: no tagged fields
    "00"  # response: no tagged fields
)


@pytest.mark.parametrize(("version", "golden"), [(4, GOLDEN_V4), (12, GOLDEN_V12)])
def test_golden_frames(version: int, golden: str) -> None:
    out = b"".join(encode_fetch_response(7, version, 0, 0, 0, GOLDEN_TOPICS))
    assert out.hex() == golden
    assert kio_frame(7, version, 0, 0, 0, GOLDEN_TOPICS) == bytes.fromhex(golden)


# v16: a partition answered NOT_LEADER_OR_FOLLOWER names its leader, and the response where it listens.
GOLDEN_V16_TOPICS = [FetchTopicResult("unused", [FetchPartitionResult(
    partition_index=0, error_code=6, high_watermark=-1, current_leader=(2, 7))], topic_id=uuid.UUID(int=1))]
GOLDEN_V16_ENDPOINTS = [NodeEndpoint(2, "b", 9092)]
GOLDEN_V16 = (
    "00000062"  # size: 98
    "00000007" "00"  # correlation_id, no tagged fields (header v1)
    "00000000" "0000" "00000000"  # throttle_time_ms, error_code, session_id
    "02"  # topics: 1
    "00000000000000000000000000000001"  # topic_id (v13+: in place of the name)
    "02"  # partitions: 1
    "00000000" "0006"  # partition_index, error_code NOT_LEADER_OR_FOLLOWER
    "ffffffffffffffff" "ffffffffffffffff" "ffffffffffffffff"  # high_watermark, last_stable, log_start: -1
    "00" "ffffffff" "01"  # aborted_transactions null, preferred_read_replica -1, records empty
    "01" "01" "09" "00000002" "00000007" "00"  # one tagged field: 1 (current_leader), 9 bytes: leader 2, epoch 7
    "00"  # topic: no tagged fields
    "01" "00" "0d"  # one tagged field: 0 (node_endpoints), 13 bytes
    "02" "00000002" "0262" "00002384" "00" "00"  # 1 endpoint: node 2, "b", port 9092, rack null, no tags
)


def test_golden_frame_with_topic_ids_and_the_current_leader() -> None:
    out = b"".join(encode_fetch_response(7, 16, 0, 0, 0, GOLDEN_V16_TOPICS, GOLDEN_V16_ENDPOINTS))
    assert out.hex() == GOLDEN_V16
    assert kio_frame(7, 16, 0, 0, 0, GOLDEN_V16_TOPICS, GOLDEN_V16_ENDPOINTS) == bytes.fromhex(GOLDEN_V16)


def test_node_endpoints_are_left_out_before_v16() -> None:
    for version in (12, 15):
        with_endpoints = encode_fetch_response(7, version, 0, 0, 0, GOLDEN_V16_TOPICS, GOLDEN_V16_ENDPOINTS)
        assert with_endpoints == encode_fetch_response(7, version, 0, 0, 0, GOLDEN_V16_TOPICS)


def test_versions_not_served_are_refused() -> None:
    for version in (FETCH_VERSION_MIN - 1, FETCH_VERSION_MAX + 1):
        with pytest.raises(InvariantError):
            encode_fetch_response(1, version, 0, 0, 0, [])
