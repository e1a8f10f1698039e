"""The broker's own request StratalogCommitStaged on the wire, and Kafka's default partitioner."""

from __future__ import annotations

import random
import struct
import warnings

import pyarrow as pa
import pytest

from stratalog.kafka import aborted_ranges
from stratalog.kafka.codec import KafkaProtocolError, UnsupportedVersionError, decode_request
from stratalog.kafka.partitioner import murmur2, partition_for_key
from stratalog.kafka.staged_commit import (
    API_KEY,
    COMMIT_VERSION_MAX,
    REPLACE_API_KEY,
    CommitStagedRequest,
    CommitStagedResponse,
    PartitionResult,
    ReplaceObjectsRequest,
    StagedObjectEntry,
    StagedStreamEntry,
    decode_response,
    encode_replace_request,
    encode_request,
    encode_response,
)
from stratalog.spark.broker_write import Destinations

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.partitioner.default import murmur2 as kafka_python_murmur2

SERVED = {API_KEY: (0, COMMIT_VERSION_MAX)}
REQUEST = CommitStagedRequest("sink-1", 42, (
    StagedObjectEntry(0, "spark-staging/w/000000-0.slo", 4096, (StagedStreamEntry("clicks/0", 0, 10),
                                                                 StagedStreamEntry("clicks/1", 0, 3))),
    StagedObjectEntry(5, "spark-staging/w/000005-0.slo", 77, (StagedStreamEntry("é/2", 3, 1),))))


def test_a_request_round_trips_through_the_broker_codec() -> None:
    frame = encode_request(9, "spark", REQUEST)
    assert struct.unpack(">i", frame[:4])[0] == len(frame) - 4
    request = decode_request(frame[4:], SERVED)
    assert (request.api_key, request.correlation_id, request.client_id, request.body) == (API_KEY, 9, "spark", REQUEST)
    batch = CommitStagedRequest(None, -1, ())
    assert decode_request(encode_request(1, None, batch)[4:], SERVED).body == batch


def test_a_replace_request_round_trips_and_its_counts_are_bounded() -> None:
    request = ReplaceObjectsRequest(("data/1.slo", "data/2.slo"), (("spark-staging/c/0.slo", 4096),))
    frame = encode_replace_request(3, None, request)[4:]
    decoded = decode_request(frame, {REPLACE_API_KEY: (0, 0)})
    assert (decoded.api_key, decoded.body) == (REPLACE_API_KEY, request)
    lying = bytearray(frame)
    struct.pack_into(">i", lying, 8 + 2, 1 << 28)  # replaced_count, after the header and a null client id
    with pytest.raises(KafkaProtocolError, match="replaced objects cannot fit"):
        decode_request(bytes(lying), {REPLACE_API_KEY: (0, 0)})


def test_a_response_round_trips() -> None:
    response = CommitStagedResponse(0, None, True, 13, 2, throttle_time_ms=5)
    assert decode_response(encode_response(77, response)[4:]) == (77, response)


def test_a_v1_response_carries_each_partitions_result_and_v0_does_not() -> None:
    results = (PartitionResult("clicks/0", 0, None, True, 10),
               PartitionResult("clicks/1", 6, "not led by this broker: partition 1 of topic 'clicks'"),
               PartitionResult("é/2"))
    response = CommitStagedResponse(0, None, True, 10, 1, throttle_time_ms=0, partitions=results)
    assert decode_response(encode_response(8, response, 1)[4:], 1) == (8, response)
    v0 = encode_response(8, response, 0)
    assert decode_response(v0[4:], 0) == (8, CommitStagedResponse(0, None, True, 10, 1))
    assert len(v0) == 4 + 4 + 4 + 2 + 2 + 1 + 8 + 4, "v0 ends after the objects count"


def test_v1_response_golden_bytes() -> None:
    """The worked layout of a v1 response: v0's fields, then one partition's name, error, message (null),
    committed flag and records, big-endian."""
    frame = encode_response(1, CommitStagedResponse(0, None, True, 3, 1, partitions=(
        PartitionResult("t/0", 0, None, True, 3),)), 1)
    assert frame.hex() == ("0000002f" "00000001" "00000000" "0000" "ffff" "01" "0000000000000003" "00000001"
                           "00000001" "0003" "742f30" "0000" "ffff" "01" "0000000000000003")


def test_every_truncation_of_a_v1_response_is_a_protocol_error() -> None:
    frame = encode_response(8, CommitStagedResponse(partitions=(PartitionResult("a/1", 6, "moved"),)), 1)[4:]
    for cut in range(len(frame)):
        with pytest.raises(KafkaProtocolError):
            decode_response(frame[:cut], 1)


def test_v0_and_v1_requests_carry_the_same_body() -> None:
    v0, v1 = encode_request(9, "spark", REQUEST, 0)[4:], encode_request(9, "spark", REQUEST, 1)[4:]
    assert v0[:2] == v1[:2] and v0[4:] == v1[4:] and (v0[2:4], v1[2:4]) == (b"\0\0", b"\0\1")
    assert decode_request(v0, SERVED).body == decode_request(v1, SERVED).body == REQUEST


def test_every_truncation_of_a_request_is_a_protocol_error() -> None:
    frame = encode_request(9, "spark", REQUEST)[4:]
    for cut in range(len(frame)):
        with pytest.raises(KafkaProtocolError):
            decode_request(frame[:cut], SERVED)


def test_a_damaged_request_names_its_own_api() -> None:
    """Each of the broker's own APIs names itself in a decoding error, its header's included."""
    replace = encode_replace_request(3, "spark", ReplaceObjectsRequest(("old-object",), (("new-object", 10),)))[4:]
    ranges = aborted_ranges.encode_request(4, "spark", aborted_ranges.AbortedRangesRequest(()))[4:]
    served = {API_KEY: (0, COMMIT_VERSION_MAX), REPLACE_API_KEY: (0, 0), aborted_ranges.API_KEY: (0, 0)}
    for frame, name in ((encode_request(2, "spark", REQUEST)[4:], "StratalogCommitStaged"),
                        (replace, "StratalogReplaceObjects"), (ranges, "StratalogAbortedRanges")):
        for cut in (10, len(frame) - 1):   # inside the client id, and inside the body's last field
            with pytest.raises(KafkaProtocolError, match=f"^{name}: "):
                decode_request(frame[:cut], served)


@pytest.mark.parametrize("where, value, message", [
    ("object_count", 1 << 30, "objects cannot fit"),
    ("object_count", -1, "objects cannot fit"),
    ("key_length", 0x7FFF, "a string of 32767 bytes"),
])
def test_counts_and_lengths_are_bounded_by_the_bytes_left(where: str, value: int, message: str) -> None:
    frame = bytearray(encode_request(9, "spark", REQUEST)[4:])
    body = 8 + 2 + len("spark") + 2 + len("sink-1") + 8  # header, sink id, batch id
    if where == "object_count":
        struct.pack_into(">i", frame, body, value)
    else:
        struct.pack_into(">h", frame, body + 4 + 4, value)
    with pytest.raises(KafkaProtocolError, match=message):
        decode_request(bytes(frame), SERVED)


def test_other_versions_are_not_served() -> None:
    frame = bytearray(encode_request(9, "spark", REQUEST)[4:])
    struct.pack_into(">h", frame, 2, COMMIT_VERSION_MAX + 1)
    with pytest.raises(UnsupportedVersionError):
        decode_request(bytes(frame), SERVED)


def test_murmur2_is_kafkas_bit_for_bit() -> None:
    rng = random.Random(5)
    for _ in range(3000):
        data = rng.randbytes(rng.randrange(0, 64))
        assert murmur2(data) == kafka_python_murmur2(data) & 0xFFFFFFFF
    # Kafka's own test vectors (UtilsTest.testMurmur2), as signed 32-bit numbers.
    vectors = {b"21": -973932308, b"foobar": -790332482, b"a-little-bit-long-string": -985981536,
               b"a-little-bit-longer-string": -1486304829, b"abc": 479470107}
    assert {k: murmur2(k) - (1 << 32 if murmur2(k) >= 1 << 31 else 0) for k in vectors} == vectors
    assert partition_for_key(b"21", 7) == (-973932308 & 0x7FFFFFFF) % 7


def test_rows_go_to_a_stream_by_column_topic_or_key() -> None:
    batch = pa.RecordBatch.from_pydict({"key": ["a", None, "b"], "value": [b"1", b"2", b"3"]})
    routed = Destinations(["key", "value"], "t", {"t": 4}).streams(batch, task=6)
    assert routed.column("stream").to_pylist() == [f"t/{partition_for_key(b'a', 4)}", "t/2",
                                                    f"t/{partition_for_key(b'b', 4)}"]
    explicit = pa.RecordBatch.from_pydict({"topic": ["u", "v"], "partition": [3, 0], "value": [b"1", b"2"]})
    assert Destinations(["topic", "partition", "value"], None, {}).streams(explicit, 0).column("stream").to_pylist() \
        == ["u/3", "v/0"]
    with pytest.raises(ValueError, match="needs a 'stream' column"):
        Destinations(["value"], None, {})
    with pytest.raises(ValueError, match="topic 'missing' does not exist"):
        Destinations(["key", "value"], "missing", {})
