"""Hostile clients against a real broker: malformed frames beyond test_broker_bad_input's, size claims inside
frames, stalled frames, idle and flooding connections, pipelining without reading, fetches that ask for
everything. Each costs only its own connection, within the broker's named bounds (set small here through
--config), and a well-behaved producer and consumer keep working beside them.

Every wait is on an event (the broker closing a socket, a response arriving), bounded by a timeout that
only a broken broker reaches.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import os
import socket
import struct
import time
import warnings
import zlib
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
from kio.schema.produce.v3.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.schema.produce.v3.response import ProduceResponse
from kio.schema.request_header.v1.header import RequestHeader as HeaderV1
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i16, i32

from brokerkit import BrokerProcess, running_broker
from stratalog.bench import abuse_wire as wire
from stratalog.bench.abuse import FETCH_TOPIC, broker_answers, prefill_fetch_topic, read_status_kib
from waiting import wait_until

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.record.default_records import DefaultRecordBatchBuilder
    from kafka.record.util import calc_crc32c

#: The bounds the module's broker runs with: small, so each is reached in a test's time.
REQUEST_READ_TIMEOUT_S = 1.0
#: The module's broker keeps its default idle timeout (600 s), far beyond any wait here: a connection it
#: closes within EVENT_WAIT_S was closed for what the test did, never for idling. The idle timeout is tested
#: on a broker of its own with this one.
IDLE_TIMEOUT_S = 2.0
REQUEST_BYTES_MAX = 1 << 20
FETCH_WAIT_MS_MAX = 1000
FETCH_RESPONSE_BYTES_MAX = 64 << 10
CONNECTIONS_MAX = 16
#: The longest any event here is awaited; reaching it means the broker did not do what it must.
EVENT_WAIT_S = 20.0
#: Resident memory the broker may gain over a test that sends it many refused claims or pipelined requests:
#: allocator noise and the responses in flight (64 per connection), far below what the claims say.
RSS_GROWTH_KIB_MAX = 32 << 10
#: What a produce of a batch that lies about itself may be answered with: CORRUPT_MESSAGE, MESSAGE_TOO_LARGE
#: (a length claim beyond message_bytes_max), INVALID_RECORD.
BATCH_ERRORS = {2, 10, 87}
#: A record batch's fields (Kafka's v2 format): the length after the first 12 bytes, the CRC (over
#: attributes to the end) and the record count.
BATCH_LENGTH_AT, CRC_AT, ATTRIBUTES_AT, RECORD_COUNT_AT = 8, 17, 21, 57


def _config(path: Path, **settings: float) -> Path:
    path.write_text("".join(f"{k} = {v}\n" for k, v in settings.items()))
    return path


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    root = tmp_path_factory.mktemp("hostile")
    config = _config(root / "broker.toml", request_read_timeout_ms=int(REQUEST_READ_TIMEOUT_S * 1000),
                     request_bytes_max=REQUEST_BYTES_MAX,
                     fetch_wait_ms_max=FETCH_WAIT_MS_MAX, fetch_response_bytes_max=FETCH_RESPONSE_BYTES_MAX)
    with running_broker(root / "data", "--config", str(config)) as b:
        yield b


def connect(broker: BrokerProcess) -> socket.socket:
    return socket.create_connection((broker.host, broker.port), timeout=EVENT_WAIT_S)


def closed_after_s(sock: socket.socket, timeout_s: float = EVENT_WAIT_S, since_s: float | None = None
                   ) -> float | None:
    """Seconds from ``since_s`` (a time.monotonic() taken before what the broker times, so that a late
    start here cannot shorten what is measured; by default now) until the broker closes ``sock`` (reading
    and dropping what it sends), None if it does not within ``timeout_s``."""
    start_s = time.monotonic() if since_s is None else since_s
    sock.settimeout(timeout_s)
    try:
        while sock.recv(1 << 16):
            pass
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return time.monotonic() - start_s


def _closed_now(sock: socket.socket) -> bool:
    """Whether the broker has closed ``sock``, without waiting (nothing else is sent on a flood socket)."""
    sock.settimeout(0.0)
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def peer_ports(pid: int) -> set[int]:
    """The remote ports of the process's TCP connections over IPv4, from /proc (Linux)."""
    inodes = set()
    with os.scandir(f"/proc/{pid}/fd") as entries:
        for entry in entries:
            with contextlib.suppress(OSError):
                if (target := os.readlink(entry.path)).startswith("socket:["):
                    inodes.add(target[len("socket:["):-1])
    ports = set()
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()  # sl, local, remote, state, queues, ..., uid, timeout, inode
        if fields[9] in inodes:
            ports.add(int(fields[2].rsplit(":", 1)[1], 16))
    return ports


def read_frame(sock: socket.socket) -> bytes | None:
    head = _read_exactly(sock, 4)
    return None if head is None else _read_exactly(sock, struct.unpack(">i", head)[0])


def _read_exactly(sock: socket.socket, size: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < size:
        chunk = sock.recv(size - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def assert_still_serves(broker: BrokerProcess) -> None:
    assert broker.process.poll() is None, "the broker exited"
    assert broker_answers(broker.host, broker.port) is not None, "a fresh connection's ApiVersions went unanswered"


def rss_kib(broker: BrokerProcess) -> int:
    found = read_status_kib(broker.process.pid, "VmRSS")
    assert found is not None
    return found


class GoodClient:
    """A producer and a consumer (confluent-kafka) that each connect once and then behave."""

    def __init__(self, broker: BrokerProcess, topic: str) -> None:
        from confluent_kafka import Consumer, Producer, TopicPartition

        self.topic = topic
        self.producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 0,
                                  "message.timeout.ms": int(EVENT_WAIT_S * 1000)})
        self.consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"good-{topic}",
                                  "enable.auto.commit": False, "fetch.wait.max.ms": 100})
        self.consumer.assign([TopicPartition(topic, 0, 0)])
        self.sent = 0

    def round_trip(self, count: int) -> None:
        """Produce ``count`` records, each acknowledged, then read every one of them back."""
        failures: list[Any] = []
        for i in range(count):
            self.producer.produce(self.topic, f"good-{self.sent + i}".encode(),
                                  on_delivery=lambda err, _m: failures.append(err) if err else None)
        assert self.producer.flush(EVENT_WAIT_S) == 0 and not failures, failures
        want = [f"good-{i}".encode() for i in range(self.sent, self.sent + count)]
        self.sent += count
        got: list[bytes] = []

        def all_read() -> bool:
            if len(got) >= len(want):
                return True
            msg = self.consumer.poll(0.2)  # blocks up to 0.2 s: no pause needed between polls
            if msg is not None:
                assert not msg.error(), msg.error()
                got.append(msg.value())
            return False

        wait_until(all_read, lambda: f"{len(want)} records read back (got {len(got)})", EVENT_WAIT_S, poll_s=0)
        assert got == want

    def close(self) -> None:
        self.consumer.close()


@contextmanager
def good_client(broker: BrokerProcess, topic: str) -> Iterator[GoodClient]:
    client = GoodClient(broker, topic)
    try:
        client.round_trip(1)  # connected, metadata known, fetching: no new connection needed from here
        yield client
    finally:
        client.close()


# Malformed frames and claims inside them ------------------------------------------------------------------


def _header(api_key: int, version: int, client_id: bytes = b"t") -> bytes:
    return struct.pack(">hhih", api_key, version, 1, len(client_id)) + client_id


@pytest.mark.parametrize("payload", [
    pytest.param(struct.pack(">i", REQUEST_BYTES_MAX + 1) + b"\0" * 16, id="one byte over request_bytes_max"),
    pytest.param(struct.pack(">i", 0), id="zero-length frame"),
    pytest.param(wire.frame(struct.pack(">hhih", 3, 1, 1, 1000) + b"ab"), id="client_id longer than the frame"),
    pytest.param(wire.frame(_header(3, -1)), id="version -1"),
    pytest.param(wire.frame(_header(3, 1) + struct.pack(">i", 2**31 - 1)), id="array claims 2^31 entries"),
    pytest.param(wire.frame(_header(3, 1) + struct.pack(">ih", 1, 32767) + b"abc"), id="string claims 32 KiB"),
    pytest.param(wire.frame(_header(3, 9) + b"\0" + b"\xff" * 10), id="flexible: a varint that never ends"),
    pytest.param(wire.frame(_header(3, 9) + b"\0" + b"\x80\x80\x80\xa8\x03" + b"\0" * 16),
                 id="flexible: a compact array claims 0x35000000 entries"),
    pytest.param(wire.frame(_header(1, 4) + struct.pack(">iiiib", -1, 100, 1, 1 << 20, 0) + struct.pack(">i", -7)),
                 id="fetch: negative topic count"),
])
def test_a_malformed_frame_closes_only_its_connection(broker: BrokerProcess, payload: bytes) -> None:
    with connect(broker) as sock:
        sock.sendall(payload)
        assert read_frame(sock) is None, "the broker closes a connection that sent a malformed request"
    assert_still_serves(broker)


def test_requests_before_a_malformed_one_are_answered_then_the_connection_closes(broker: BrokerProcess) -> None:
    with connect(broker) as sock:
        sock.sendall(wire.api_versions_request(1) + wire.api_versions_request(2) + wire.frame(b"\xff" * 12)
                     + wire.api_versions_request(3))
        ids = []
        while (response := read_frame(sock)) is not None:
            ids.append(struct.unpack(">i", response[:4])[0])
    assert ids == [1, 2]
    assert_still_serves(broker)


def _produce_frame(topic: str, batch: bytes) -> bytes:
    out = io.BytesIO()
    entity_writer(HeaderV1)(out, HeaderV1(request_api_key=i16(0), request_api_version=i16(3),
                                          correlation_id=i32(5), client_id="t"))
    entity_writer(ProduceRequest)(out, ProduceRequest(
        transactional_id=None, acks=i16(-1), timeout=datetime.timedelta(seconds=5),
        topic_data=(TopicProduceData(name=topic, partition_data=(PartitionProduceData(index=i32(0),
                                                                                       records=batch),)),)))
    return wire.frame(out.getvalue())


def _batch(*values: bytes) -> bytearray:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for i, value in enumerate(values):
        builder.append(i, timestamp=1000, key=None, value=value, headers=[])
    return bytearray(builder.build())


def _resign(batch: bytearray) -> bytes:
    """The batch with its CRC made right again after surgery: only the claim inside is wrong."""
    struct.pack_into(">I", batch, CRC_AT, calc_crc32c(bytes(batch[ATTRIBUTES_AT:])))
    return bytes(batch)


def _batch_claiming_records(count: int) -> bytes:
    batch = _batch(b"one")
    struct.pack_into(">i", batch, RECORD_COUNT_AT, count)
    return _resign(batch)


def _batch_claiming_length(extra: int) -> bytes:
    batch = _batch(b"one")
    struct.pack_into(">i", batch, BATCH_LENGTH_AT, len(batch) - 12 + extra)
    return bytes(batch)


@pytest.mark.parametrize("batch", [
    pytest.param(_batch_claiming_records(2**31 - 1), id="batch claims 2^31 records, CRC right"),
    pytest.param(_batch_claiming_length(1 << 30), id="batch length claims 1 GiB more than sent"),
    pytest.param(b"\0" * 30, id="records shorter than a batch header"),
])
def test_a_produce_with_a_lying_batch_stores_nothing_and_others_produce(broker: BrokerProcess,
                                                                         batch: bytes) -> None:
    topic = f"lying-{zlib.crc32(batch):08x}"
    with good_client(broker, topic) as good, connect(broker) as sock:
        sock.sendall(_produce_frame(topic, batch))
        response = read_frame(sock)
        if response is not None:  # answered with an error, or the connection closed: both leave the log as it was
            decoded, _ = entity_reader(ProduceResponse)(response, 4)
            assert decoded.responses[0].partition_responses[0].error_code in BATCH_ERRORS
        good.round_trip(3)  # reads exactly the good records back from offset 0: nothing else was stored
    assert_still_serves(broker)


def test_many_connections_claiming_2_gib_cost_the_broker_no_memory(broker: BrokerProcess) -> None:
    before_kib = rss_kib(broker)
    with ExitStack() as stack:
        socks = [stack.enter_context(connect(broker)) for _ in range(200)]
        for sock in socks:
            sock.sendall(wire.oversize_claim() + b"\0" * 4096)
        for sock in socks:
            assert closed_after_s(sock) is not None
    assert rss_kib(broker) - before_kib < RSS_GROWTH_KIB_MAX
    assert_still_serves(broker)


# Slow, idle and flooding connections ----------------------------------------------------------------------


@pytest.mark.parametrize("head", [
    pytest.param(wire.slowloris_head(1000), id="size and half a header"),
    pytest.param(struct.pack(">i", 1000)[:2], id="half a size"),
])
def test_a_stalled_frame_is_closed_after_request_read_timeout(broker: BrokerProcess, head: bytes) -> None:
    with connect(broker) as sock:
        sent_s = time.monotonic()
        sock.sendall(head)
        held_s = closed_after_s(sock, since_s=sent_s)
    # Closed at all: the read timeout (this broker's idle timeout is far beyond the wait). Not before it:
    # timed from before the send, so a slow machine can only make this longer.
    assert held_s is not None, "a connection stalled inside a frame must be closed"
    assert held_s >= REQUEST_READ_TIMEOUT_S * 0.9, held_s
    assert_still_serves(broker)


def test_an_idle_connection_is_closed_after_idle_timeout(tmp_path: Path) -> None:
    config = _config(tmp_path / "idle.toml", idle_timeout_ms=int(IDLE_TIMEOUT_S * 1000))
    with running_broker(tmp_path / "data", "--config", str(config)) as broker:
        connected_s = time.monotonic()  # before the connection exists, so before the broker's clock starts
        with connect(broker) as sock:
            held_s = closed_after_s(sock, since_s=connected_s)
        assert held_s is not None and held_s >= IDLE_TIMEOUT_S * 0.9, held_s
        assert broker.stop() == 0, "".join(broker.output)


def test_stalled_connections_do_not_stop_a_good_client(broker: BrokerProcess) -> None:
    with ExitStack() as stack, good_client(broker, "hostile-stalled") as good:
        stalled = [stack.enter_context(connect(broker)) for _ in range(50)]
        for sock in stalled:
            sock.sendall(wire.slowloris_head(REQUEST_BYTES_MAX))
        good.round_trip(20)
        for sock in stalled:
            assert closed_after_s(sock) is not None
        good.round_trip(20)
    assert_still_serves(broker)


def test_a_flood_beyond_connections_max_is_refused_while_a_good_client_works(tmp_path: Path) -> None:
    config = _config(tmp_path / "crowded.toml", connections_max=CONNECTIONS_MAX)
    flood_size = CONNECTIONS_MAX * 4
    with running_broker(tmp_path / "data", "--config", str(config)) as broker, ExitStack() as stack, \
            good_client(broker, "hostile-flood") as good:
        flood: dict[int, socket.socket] = {}  # by the local port, which the broker sees as the peer's
        for _ in range(flood_size):
            sock = stack.enter_context(connect(broker))
            flood[sock.getsockname()[1]] = sock
        good.round_trip(20)

        # The broker holds a connection for exactly the flood sockets that it did not close: each refused one
        # is let go of (the good client's own connections, which come and go, are not counted).
        def settled() -> set[int] | None:
            open_ports = {port for port, sock in flood.items() if not _closed_now(sock)}
            return open_ports if peer_ports(broker.process.pid) & flood.keys() == open_ports else None

        open_ports = wait_until(settled, lambda: f"the broker to hold only the flood sockets it did not close "
                                                 f"({sorted(peer_ports(broker.process.pid) & flood.keys())})")
        # The good client's connections count towards the bound too: every one beyond it was refused.
        assert 0 < len(open_ports) <= CONNECTIONS_MAX - 1, len(open_ports)
        good.round_trip(20)
        for sock in flood.values():
            sock.close()
        assert broker_answers(broker.host, broker.port) is not None  # room again once the flood is gone
        good.round_trip(20)


def test_a_client_that_pipelines_without_reading_holds_a_bounded_amount(broker: BrokerProcess) -> None:
    """The broker reads at most in_flight_requests_max requests ahead of their responses and stops reading
    while its send buffer is full: what the client pushes waits in the kernel, not in the broker."""
    before_kib = rss_kib(broker)
    with connect(broker) as hog, good_client(broker, "hostile-pipeline") as good:
        hog.setblocking(False)
        request, pushed = wire.metadata_all_request(1), [0]

        def refused() -> bool:
            try:
                pushed[0] += hog.send(request * 100)
            except BlockingIOError:
                return True
            return False

        wait_until(refused, "the kernel to take no more: the broker stopped reading", EVENT_WAIT_S, poll_s=0)
        assert pushed[0] >= len(request) * 100
        good.round_trip(20)
        assert rss_kib(broker) - before_kib < RSS_GROWTH_KIB_MAX
    assert_still_serves(broker)


def test_a_fetch_for_everything_is_cut_to_the_broker_bounds(broker: BrokerProcess) -> None:
    end_offsets = list(prefill_fetch_topic(broker.bootstrap, FETCH_RESPONSE_BYTES_MAX * 4))
    with connect(broker) as sock, good_client(broker, "hostile-fetch") as good:
        sock.sendall(wire.fetch_request(11, FETCH_TOPIC, [0] * len(end_offsets), max_wait_ms=wire.INT32_MAX,
                                        min_bytes=wire.INT32_MAX))
        everything = read_frame(sock)
        # Asked for 2 GiB of each partition: got at most fetch_response_bytes_max of records, and at once
        # (min_bytes cannot be met, but nothing new can come either: the data is there).
        assert everything is not None and len(everything) <= FETCH_RESPONSE_BYTES_MAX + 1024
        start_s = time.monotonic()
        sock.sendall(wire.fetch_request(12, FETCH_TOPIC, end_offsets, max_wait_ms=wire.INT32_MAX,
                                        min_bytes=wire.INT32_MAX))
        good.round_trip(20)  # served while the fetch waits
        waited = read_frame(sock)
        waited_s = time.monotonic() - start_s
    # Answered at all: the cap of fetch_wait_ms_max, not the 24 days asked (nor the default cap of 30 s, beyond
    # the socket's EVENT_WAIT_S, whose timeout fails the read). After waiting the cap out: timed from before
    # the send, so a slow machine can only make it longer.
    assert waited is not None and struct.unpack(">i", waited[:4])[0] == 12
    assert waited_s >= FETCH_WAIT_MS_MAX / 1000 * 0.9, waited_s
    assert_still_serves(broker)


def test_a_frame_trickled_a_byte_at_a_time_is_closed_after_request_read_timeout(broker: BrokerProcess) -> None:
    """The read timeout runs from a request's first byte: a byte now and then does not keep it open."""
    with connect(broker) as sock:
        sock.sendall(wire.slowloris_head(1000))
        # The slow peer: a byte every third of the timeout, however long this takes. A broker that restarted
        # the timeout on each byte would never close (its idle timeout is far away, and does not apply while a
        # frame is half read), so the bound is EVENT_WAIT_S, not a multiple of the timeout a busy machine may
        # exceed.
        sock.settimeout(REQUEST_READ_TIMEOUT_S / 3)

        def closed() -> bool:
            try:
                return sock.recv(1) == b""
            except TimeoutError:
                pass
            except ConnectionResetError:
                return True
            try:
                sock.sendall(b"\0")  # one more byte of the frame, well before the timeout
            except (ConnectionResetError, BrokenPipeError):
                return True  # closed while the byte went out
            return False

        wait_until(closed, "the broker to close a connection whose frame trickles in", EVENT_WAIT_S, poll_s=0)
    assert_still_serves(broker)


def _batch_with_record_claiming_value_bytes(size: int) -> bytes:
    """A record's value length is a zig-zag varint inside the record: set it to ``size``."""
    batch = _batch(b"xyz")
    at = bytes(batch).rindex(b"xyz") - 1  # the one-byte varint of 3 before the value
    zigzag, varint = size << 1, bytearray()
    while zigzag >= 0x80:
        varint.append((zigzag & 0x7F) | 0x80)
        zigzag >>= 7
    varint.append(zigzag)
    batch[at:at + 1] = varint
    struct.pack_into(">i", batch, BATCH_LENGTH_AT, len(batch) - 12)
    return _resign(batch)


def test_a_record_claiming_1_gib_inside_a_batch_with_a_right_crc_is_refused(broker: BrokerProcess) -> None:
    """Every record is checked on produce, as Kafka does: the lie never reaches a consumer."""
    topic = "lying-record"
    with good_client(broker, topic) as good, connect(broker) as sock:
        sock.sendall(_produce_frame(topic, _batch_with_record_claiming_value_bytes(1 << 30)))
        response = read_frame(sock)
        assert response is not None
        decoded, _ = entity_reader(ProduceResponse)(response, 4)
        assert decoded.responses[0].partition_responses[0].error_code in BATCH_ERRORS
        good.round_trip(3)
    assert_still_serves(broker)
