"""Produce requests read without kio (stratalog.kafka.produce_request): every version the broker serves
reads as kio reads it, and each way a frame can be wrong is refused with its own message, on whichever
core runs (the compiled one in the suite, the Python twin under STRATALOG_PURE_PYTHON=1)."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema
from kio.serial import entity_reader
from kio.static.primitive import Records, i16, i32, i32Timedelta

from examples import examples
from stratalog.kafka.codec import KafkaProtocolError, decode_request, encode_request
from stratalog.kafka.produce_request import (
    HEADER_PREFIX_BYTES,
    MalformedProduceError,
    ProduceBody,
    decode_produce,
)

VERSIONS = range(3, 10)
FLEXIBLE_FROM = 9

PARTITIONS = st.lists(st.tuples(st.integers(-(1 << 31), (1 << 31) - 1), st.none() | st.binary(max_size=300)),
                      max_size=4)
TOPICS = st.lists(st.tuples(st.text(max_size=20), PARTITIONS), max_size=4)


def frame_of(version: int, client_id: str | None, transactional_id: str | None, acks: int, timeout_ms: int,
             topics: list[tuple[str, list[tuple[int, bytes | None]]]]) -> bytes:
    """A Produce request as a client writes it (through kio's writer)."""
    schema: Any = load_request_schema(0, version)
    module = __import__(schema.__module__, fromlist=["PartitionProduceData", "TopicProduceData"])
    body = schema(transactional_id=transactional_id, acks=i16(acks),
                  timeout=i32Timedelta.parse(datetime.timedelta(milliseconds=timeout_ms)),
                  topic_data=tuple(module.TopicProduceData(name=name, partition_data=tuple(
                      module.PartitionProduceData(index=i32(index),
                                                  records=None if records is None else Records(records))
                      for index, records in partitions)) for name, partitions in topics))
    return encode_request(0, version, 7, client_id, body)


def as_kio_reads_it(frame: bytes, version: int) -> tuple[str | None, ProduceBody]:
    schema: Any = load_request_schema(0, version)
    header, at = entity_reader(schema.__header_schema__)(frame, 0)
    body, _ = entity_reader(schema)(frame, at)
    timeout_ms = body.timeout // datetime.timedelta(milliseconds=1)
    topics = tuple((t.name, tuple((p.index, p.records) for p in t.partition_data)) for t in body.topic_data)
    return header.client_id, ProduceBody(body.transactional_id, body.acks, timeout_ms, topics)


@settings(max_examples=examples(300), deadline=None)
@given(version=st.sampled_from(VERSIONS), client_id=st.none() | st.text(max_size=20),
       transactional_id=st.none() | st.text(max_size=20), acks=st.integers(-(1 << 15), (1 << 15) - 1),
       timeout_ms=st.integers(-(1 << 31), (1 << 31) - 1), topics=TOPICS)
def test_every_version_reads_as_kio_reads_it(version: int, client_id: str | None, transactional_id: str | None,
                                              acks: int, timeout_ms: int,
                                              topics: list[tuple[str, list[tuple[int, bytes | None]]]]) -> None:
    frame = frame_of(version, client_id, transactional_id, acks, timeout_ms, topics)
    read = decode_produce(frame, version >= FLEXIBLE_FROM)
    assert read == as_kio_reads_it(frame, version)
    assert read[1].topics == tuple((name, tuple(partitions)) for name, partitions in topics)
    assert decode_produce(memoryview(frame), version >= FLEXIBLE_FROM) == read
    assert decode_produce(frame + b"\x00\x01\x02", version >= FLEXIBLE_FROM) == read   # bytes after it ignored


@settings(max_examples=examples(200), deadline=None)
@given(version=st.sampled_from(VERSIONS), topics=TOPICS.filter(bool), data=st.data())
def test_a_frame_cut_short_is_refused(version: int, topics: list[tuple[str, list[tuple[int, bytes | None]]]],
                                      data: st.DataObject) -> None:
    frame = frame_of(version, "client", None, -1, 30_000, topics)
    cut = data.draw(st.integers(HEADER_PREFIX_BYTES, len(frame) - 1))
    # Either it runs out of bytes, or an array claims more elements than the bytes left could hold.
    with pytest.raises(MalformedProduceError, match=r"^the request ends in |^the (topics|partitions): an array of "):
        decode_produce(frame[:cut], version >= FLEXIBLE_FROM)


def _v3(body: bytes, client_id: bytes = b"\x00\x01c") -> bytes:
    return b"\x00\x00\x00\x03\x00\x00\x00\x07" + client_id + body


def _v9(body: bytes) -> bytes:
    return b"\x00\x00\x00\x09\x00\x00\x00\x07" + b"\x00\x01c" + b"\x00" + body


ACKS_TIMEOUT = b"\xff\xff\x00\x00\x75\x30"


@pytest.mark.parametrize(("frame", "flexible", "message"), [
    (_v3(b"\xff\xff" + ACKS_TIMEOUT + b"\x00\x00\x00\x01\xff\xff\x00\x00\x00\x00"), False, "the topic name is null"),
    (_v9(b"\x00" + ACKS_TIMEOUT + b"\x02\x00\x01\x00"), True, "the topic name is null"),
    (_v3(b"\xff\xff" + ACKS_TIMEOUT + b"\xff\xff\xff\xff"), False, "the topics are null"),
    (_v9(b"\x00" + ACKS_TIMEOUT + b"\x00"), True, "the topics are null"),
    (_v3(b"\xff\xff" + ACKS_TIMEOUT + b"\x00\x00\x00\x02" + b"\x00\x00" * 3), False,
     "the topics: an array of 2 elements with 6 bytes left"),
    (_v3(b"\xff\xff" + ACKS_TIMEOUT + b"\x00\x00\x00\x01\x00\x01t\x00\x00\x00\x02" + b"\x00" * 8), False,
     "the partitions: an array of 2 elements with 8 bytes left"),
    (_v9(b"\x00" + ACKS_TIMEOUT + b"\xff\xff\xff\xff\x0f"), True,
     "the topics: an array of 4294967294 elements with 0 bytes left"),
    (_v9(b"\x00" + ACKS_TIMEOUT + b"\xff\xff\xff\xff\xff\x01"), True, "a varint of over 5 bytes in the topics"),
    (_v3(b"\xff\xfe" + ACKS_TIMEOUT), False, "the transactional id has the length -2"),
    (_v3(b"\xff\xff" + ACKS_TIMEOUT + b"\x00\x00\x00\x01\x00\x01t\x00\x00\x00\x01\x00\x00\x00\x00\xff\xff\xff\xfe"),
     False, "the records has the length -2"),
    (_v3(b"\xff\xff" + ACKS_TIMEOUT + b"\x00\x00\x00\x01\x00\x01t\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x09ab"),
     False, "the request ends in the records"),
    (_v3(b"", client_id=b"\x00\x05ab"), False, "the request ends in the client id"),
    (_v3(b"\xff\xff\xff"), False, "the request ends in the acks"),
    (_v9(b"\x00" + ACKS_TIMEOUT + b"\x01\x05"), True, "the request ends in the body's tagged fields"),
    (b"\x00\x00\x00\x09\x00\x00\x00\x07\x00\x01c\x01", True, "the request ends in the header's tagged fields"),
])
def test_each_fault_is_refused_with_its_own_message(frame: bytes, flexible: bool, message: str) -> None:
    with pytest.raises(MalformedProduceError) as caught:
        decode_produce(frame, flexible)
    assert str(caught.value) == message


def test_a_name_that_is_not_utf8_is_refused_as_python_refuses_it() -> None:
    frame = _v3(b"\xff\xff" + ACKS_TIMEOUT + b"\x00\x00\x00\x01\x00\x02\xc3\x28\x00\x00\x00\x00")
    with pytest.raises(UnicodeDecodeError) as caught:
        decode_produce(frame, False)
    assert "can't decode byte 0xc3 in position 0" in str(caught.value)


def test_unknown_tagged_fields_are_skipped_as_kafka_skips_them() -> None:
    plain = frame_of(9, "client", None, -1, 30_000, [("t", [(0, b"batch")])])
    expected = decode_produce(plain, True)
    header_end = HEADER_PREFIX_BYTES + 2 + len("client")
    # The header's tagged fields: two unknown ones (tag 5, 3 bytes; tag 9, 0 bytes) instead of none.
    tagged = plain[:header_end] + b"\x02\x05\x03xyz\x09\x00" + plain[header_end + 1:]
    assert decode_produce(tagged, True) == expected
    # A tagged field that claims more bytes than the frame has is a frame cut short.
    with pytest.raises(MalformedProduceError, match="the request ends in the header's tagged fields"):
        decode_produce(plain[:header_end] + b"\x01\x05\x7f", True)


def test_the_codec_reads_produce_and_closes_on_a_malformed_one() -> None:
    frame = frame_of(9, "client", None, 1, 5_000, [("events", [(3, b"batch")])])
    request = decode_request(frame, {0: (3, 9)})
    assert (request.api_key, request.api_version, request.correlation_id, request.client_id) == (0, 9, 7, "client")
    assert request.body == ProduceBody(None, 1, 5_000, (("events", ((3, b"batch"),)),))
    assert request.frame_bytes == len(frame)
    with pytest.raises(KafkaProtocolError, match=r"API 0 v9: malformed request \(the request ends in the "):
        decode_request(frame[:-4], {0: (3, 9)})
    with pytest.raises(KafkaProtocolError, match=r"API 0 v3: malformed request .*can't decode"):
        decode_request(_v3(b"\xff\xff" + ACKS_TIMEOUT + b"\x00\x00\x00\x01\x00\x01\xff\x00\x00\x00\x00"), {0: (3, 9)})
