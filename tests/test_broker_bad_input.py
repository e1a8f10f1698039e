"""Hostile and broken input: each gets its error or closes its own connection; the broker serves others."""

from __future__ import annotations

import io
import socket
import struct
import warnings
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.api_versions.v0.request import ApiVersionsRequest as ApiVersionsV0
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.request_header.v1.header import RequestHeader as HeaderV1
from kio.schema.request_header.v2.header import RequestHeader as HeaderV2
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i16, i32

from brokerkit import BrokerProcess, running_broker
from stratalog.kafka.codec import KafkaProtocolError, UnsupportedVersionError, decode_request
from stratalog.kafka.connection import FrameReader, FrameTooLargeError
from waiting import wait_until

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaConsumer, KafkaProducer

SUPPORTED = {18: (0, 3), 3: (0, 12), 0: (3, 9)}


def frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def api_versions_request(version: int, correlation_id: int) -> bytes:
    out = io.BytesIO()
    if version >= 3:
        entity_writer(HeaderV2)(out, HeaderV2(request_api_key=i16(18), request_api_version=i16(version),
                                              correlation_id=i32(correlation_id), client_id="t"))
        entity_writer(ApiVersionsRequest)(out, ApiVersionsRequest(client_software_name="t",
                                                                  client_software_version="1"))
    else:
        entity_writer(HeaderV1)(out, HeaderV1(request_api_key=i16(18), request_api_version=i16(version),
                                              correlation_id=i32(correlation_id), client_id="t"))
        entity_writer(ApiVersionsV0)(out, ApiVersionsV0())
    return frame(out.getvalue())


def read_frame(sock: socket.socket) -> bytes | None:
    """One response frame, or None when the broker closed the connection."""
    head = _read_exactly(sock, 4)
    if head is None:
        return None
    (size,) = struct.unpack(">i", head)
    return _read_exactly(sock, size)


def _read_exactly(sock: socket.socket, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with running_broker(tmp_path_factory.mktemp("bad-input") / "data") as b:
        yield b


def connect(broker: BrokerProcess) -> socket.socket:
    sock = socket.create_connection((broker.host, broker.port), timeout=10)
    return sock


def assert_still_serves(broker: BrokerProcess) -> None:
    with connect(broker) as sock:
        sock.sendall(api_versions_request(3, 99))
        response = read_frame(sock)
        assert response is not None and response[:4] == struct.pack(">i", 99)


@pytest.mark.parametrize("payload", [
    pytest.param(struct.pack(">i", 2**31 - 1) + b"x" * 100, id="claims 2 GiB"),
    pytest.param(struct.pack(">i", -5) + b"\0" * 8, id="negative length"),
    pytest.param(struct.pack(">i", 3) + b"\0\0\0", id="shorter than a header"),
    pytest.param(frame(struct.pack(">hhi", 9999, 0, 1) + b"\0\0"), id="unknown API key"),
    pytest.param(frame(struct.pack(">hhi", 0, 99, 1) + b"\0\0"), id="unsupported Produce version"),
    pytest.param(frame(struct.pack(">hhi", 3, 12, 1) + b"\xff" * 40), id="garbage Metadata body"),
    pytest.param(api_versions_request(3, 5)[:-3], id="truncated then closed"),
])
def test_a_bad_frame_closes_only_its_connection(broker: BrokerProcess, payload: bytes) -> None:
    with connect(broker) as sock:
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        assert read_frame(sock) is None, "the broker closes a connection that sent garbage"
    assert_still_serves(broker)


def test_api_versions_of_an_unknown_version_answers_unsupported_version_with_the_range(
        broker: BrokerProcess) -> None:
    from kio.schema.api_versions.v0.response import ApiVersionsResponse

    with connect(broker) as sock:
        body = api_versions_request(3, 7)[4:]
        sock.sendall(frame(body[:2] + struct.pack(">h", 42) + body[4:]))  # version 42
        response = read_frame(sock)
    assert response is not None
    assert response[:4] == struct.pack(">i", 7)
    decoded, _ = entity_reader(ApiVersionsResponse)(response, 4)
    assert decoded.error_code == 35
    assert {(k.api_key, k.min_version, k.max_version) for k in decoded.api_keys} >= {(18, 0, 3), (0, 3, 9)}


@pytest.mark.parametrize(("api_key", "version", "said"), [
    (27, 0, "WriteTxnMarkers (API 27) v0 is not served (this broker serves no version of it)"),
    (26, 4, "EndTxn (API 26) v4 is not served (this broker serves versions 0-3)"),
    (3, 99, "Metadata (API 3) v99 is not served (this broker serves versions 0-12)"),
    (9000, 0, "API 9000 v0 is not served (this broker serves no version of it)"),
])
def test_a_request_of_an_api_or_version_not_served_is_logged_by_name(broker: BrokerProcess, api_key: int,
                                                                     version: int, said: str) -> None:
    def refused_and_logged() -> bool:
        with connect(broker) as sock:
            sock.sendall(frame(struct.pack(">hhih", api_key, version, 5, 1) + b"t"))
            assert read_frame(sock) is None, "the broker closes the connection, as Kafka does"
        return any(said in line for line in broker.output)

    # Refusals are logged 10 a second at most (the rest counted): the bad frames before may have used a
    # second's share, so the request is sent again until its line shows.
    wait_until(refused_and_logged, f"a log line saying {said!r}", poll_s=0.2)
    assert_still_serves(broker)


def test_pipelined_requests_are_answered_in_order(broker: BrokerProcess) -> None:
    with connect(broker) as sock:
        sock.sendall(b"".join(api_versions_request(v % 4, 1000 + v) for v in range(20)))
        ids = []
        for _ in range(20):
            response = read_frame(sock)
            assert response is not None
            ids.append(struct.unpack(">i", response[:4])[0])
    assert ids == list(range(1000, 1020))


def test_a_batch_with_a_bad_crc_gets_corrupt_message_and_others_produce(broker: BrokerProcess) -> None:
    from kafka.errors import CorruptRecordError

    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", retries=0)
    producer.send("crc", b"fine").get(30)
    with connect(broker) as sock:
        from kafka.record.default_records import DefaultRecordBatchBuilder

        builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0, producer_id=-1,
                                            producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
        builder.append(0, timestamp=1000, key=None, value=b"hello", headers=[])
        batch = bytearray(builder.build())
        batch[-1] ^= 0xFF  # inside the CRC's range
        from kio.schema.produce.v3.request import PartitionProduceData, ProduceRequest, TopicProduceData

        out = io.BytesIO()
        entity_writer(HeaderV1)(out, HeaderV1(request_api_key=i16(0), request_api_version=i16(3),
                                              correlation_id=i32(5), client_id="t"))
        import datetime

        entity_writer(ProduceRequest)(out, ProduceRequest(
            transactional_id=None, acks=i16(-1), timeout=datetime.timedelta(seconds=5),
            topic_data=(TopicProduceData(name="crc", partition_data=(
                PartitionProduceData(index=i32(0), records=bytes(batch)),)),)))
        sock.sendall(frame(out.getvalue()))
        response = read_frame(sock)
    assert response is not None
    from kio.schema.produce.v3.response import ProduceResponse

    decoded, _ = entity_reader(ProduceResponse)(response, 4)
    assert decoded.responses[0].partition_responses[0].error_code == CorruptRecordError.errno
    assert producer.send("crc", b"still fine").get(30).offset == 1
    producer.close()
    consumer = KafkaConsumer("crc", bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest",
                             consumer_timeout_ms=5000)
    assert [m.value for m in consumer] == [b"fine", b"still fine"], "the damaged batch was not stored"
    consumer.close()


def test_frames_read_byte_at_a_time_equal_frames_read_whole() -> None:
    data = b"".join(api_versions_request(v, v) for v in range(4))
    whole = FrameReader(1 << 20)
    whole.receive_data(data)
    expected = list(iter(whole.next_frame, None))
    drip = FrameReader(1 << 20)
    got = []
    for i in range(len(data)):
        drip.receive_data(data[i:i + 1])
        got.extend(iter(drip.next_frame, None))
    assert got == expected and len(got) == 4


def test_a_frame_over_the_limit_is_refused_before_its_bytes_arrive() -> None:
    reader = FrameReader(1024)
    reader.receive_data(struct.pack(">i", 1025))
    with pytest.raises(FrameTooLargeError):
        reader.next_frame()


@settings(max_examples=400, deadline=None)
@given(api_key=st.sampled_from(sorted(SUPPORTED)), version=st.integers(-1, 14), body=st.binary(max_size=300),
       correlation_id=st.integers(-(2**31), 2**31 - 1))
def test_the_request_decoder_raises_only_its_own_errors(api_key: int, version: int, body: bytes,
                                                         correlation_id: int) -> None:
    raw = struct.pack(">hhi", api_key, version, correlation_id) + body
    try:
        request = decode_request(raw, SUPPORTED)
    except (KafkaProtocolError, UnsupportedVersionError):
        return
    assert (request.api_key, request.api_version, request.correlation_id) == (api_key, version, correlation_id)
