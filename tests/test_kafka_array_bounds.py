"""A request whose array claims more elements than its frame has bytes left is refused before kio reads it
(kio would reserve room for the whole count first); honest requests of every served version pass, and a
frame cut short is refused, by the walk or by kio. On either core (STRATALOG_PURE_PYTHON=1: the Python walk)."""

from __future__ import annotations

import dataclasses

import pytest

from stratalog.chaos.fuzz_kafka import request_seeds, sample_entity
from stratalog.kafka.array_bounds import ArrayCountError, check_array_counts
from stratalog.kafka.codec import KafkaProtocolError, decode_request, encode_request, load_request_schema

SERVED = {0: (3, 9), 1: (4, 12), 3: (0, 12)}


def produce_v3(transactional_id: str | None = None) -> tuple[bytes, int]:
    """A Produce v3 request and where its topic_data count lies."""
    body = dataclasses.replace(sample_entity(load_request_schema(0, 3)), transactional_id=transactional_id)
    frame = encode_request(0, 3, 1, "c", body)
    header_bytes = 2 + 2 + 4 + 2 + len("c")
    return frame, header_bytes + 2 + 2 + 4   # transactional_id null (int16 -1), acks, timeout


def test_every_served_request_passes() -> None:
    for frame in request_seeds():
        api_key, api_version = int.from_bytes(frame[:2], "big"), int.from_bytes(frame[2:4], "big")
        schema = load_request_schema(api_key, api_version)
        header_bytes = 2 + 2 + 4 + 2 + (len("fuzz") if frame[8:10] != b"\xff\xff" else 0) + schema.__flexible__
        check_array_counts(frame, header_bytes, schema)


@pytest.mark.parametrize("count", [10**9, 2**31 - 1, 200])
def test_a_count_beyond_the_bytes_left_is_refused(count: int) -> None:
    frame, at = produce_v3()
    lying = frame[:at] + count.to_bytes(4, "big") + frame[at + 4:]
    with pytest.raises(ArrayCountError, match=f"ProduceRequest.topic_data: an array of {count} elements in a frame "
                                              f"with {len(frame) - at - 4} bytes left"):
        check_array_counts(lying, at - 8, load_request_schema(0, 3))
    with pytest.raises(KafkaProtocolError, match="malformed request"):
        decode_request(lying, SERVED)


def test_a_count_the_bytes_could_hold_is_left_to_kio() -> None:
    frame, at = produce_v3()
    claims_two = frame[:at] + (2).to_bytes(4, "big") + frame[at + 4:]
    check_array_counts(claims_two, at - 8, load_request_schema(0, 3))   # two topics would fit: kio finds one
    with pytest.raises(KafkaProtocolError):
        decode_request(claims_two, SERVED)


def test_a_frame_cut_short_is_refused_by_one_or_the_other() -> None:
    frame, at = produce_v3()
    left_to_kio = 0
    for end in range(at - 8, len(frame)):
        try:
            check_array_counts(frame[:end], at - 8, load_request_schema(0, 3))
            left_to_kio += 1
        except ArrayCountError:
            assert end <= at + 4 + 2 + 1 + 4, "only a cut within the first topic leaves its arrays too long"
        with pytest.raises(KafkaProtocolError):
            decode_request(frame[:end], SERVED)
    assert left_to_kio > len(frame) - at - 20   # most cuts end inside a field, which kio refuses
