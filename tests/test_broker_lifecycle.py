"""The broker's life: a clean stop answers what is in flight; slow and idle connections are closed alone."""

from __future__ import annotations

import signal
import socket
import struct
import time
import warnings
from pathlib import Path

from brokerkit import running_broker, start_broker
from test_broker_bad_input import api_versions_request, read_frame
from waiting import WAIT_S

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaConsumer, KafkaProducer


#: A fetch that waits this long for a record that never comes: far beyond any wait of the tests (WAIT_S).
LONG_POLL_MS = 600_000


def write_config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "broker.toml"
    path.write_text(text)
    return str(path)


def long_poll_fetch(topic: str, offset: int, wait_ms: int, max_bytes: int = 1 << 20) -> bytes:
    """A Fetch v4 frame for ``topic`` partition 0 from ``offset``, waiting up to ``wait_ms`` for a byte."""
    import datetime
    import io

    from kio.schema.fetch.v4.request import FetchPartition, FetchRequest, FetchTopic
    from kio.schema.request_header.v1.header import RequestHeader
    from kio.serial import entity_writer
    from kio.static.primitive import i8, i16, i32, i64

    out = io.BytesIO()
    entity_writer(RequestHeader)(out, RequestHeader(request_api_key=i16(1), request_api_version=i16(4),
                                                    correlation_id=i32(77), client_id="t"))
    entity_writer(FetchRequest)(out, FetchRequest(
        replica_id=i32(-1), max_wait=datetime.timedelta(milliseconds=wait_ms), min_bytes=i32(1),
        max_bytes=i32(max_bytes), isolation_level=i8(0), topics=(FetchTopic(topic=topic, partitions=(
            FetchPartition(partition=i32(0), fetch_offset=i64(offset), partition_max_bytes=i32(max_bytes)),)),)))
    body = out.getvalue()
    return struct.pack(">i", len(body)) + body


def test_sigterm_answers_what_is_in_flight_and_loses_nothing(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    # A long poll of ten minutes against waits of WAIT_S: only a stop that waits the poll out misses them,
    # however slow the machine.
    broker = start_broker(data_dir, "--config", write_config(tmp_path, f"fetch_wait_ms_max = {LONG_POLL_MS}\n"))
    try:
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=0)
        futures = [producer.send("life", b"v%d" % i, partition=0) for i in range(200)]
        producer.flush()
        assert [f.get(1).offset for f in futures] == list(range(200))
        producer.close()
        with socket.create_connection((broker.host, broker.port), timeout=WAIT_S) as poll:
            # ApiVersions and the long poll (it waits for a record that never comes) in one segment: once
            # ApiVersions is answered, the broker has read the fetch too, so the fetch is in flight when the
            # signal comes (a request still unread at the stop is not answered: its connection just closes).
            poll.sendall(api_versions_request(3, 1) + long_poll_fetch("life", 200, LONG_POLL_MS))
            assert read_frame(poll) is not None
            broker.process.send_signal(signal.SIGTERM)
            response = read_frame(poll)  # a recv timeout here: the stop waited on the long poll
            assert response is not None and response[:4] == struct.pack(">i", 77), "the long poll is answered"
            assert read_frame(poll) is None, "then the connection closes"
        assert broker.process.wait(WAIT_S) == 0
        assert "stopped: everything acknowledged is durable" in "".join(broker.output)
    finally:
        if broker.process.poll() is None:
            broker.process.kill()
    with running_broker(data_dir) as again:
        consumer = KafkaConsumer("life", bootstrap_servers=again.bootstrap, auto_offset_reset="earliest",
                                 consumer_timeout_ms=5000)
        assert [m.value for m in consumer] == [b"v%d" % i for i in range(200)]
        consumer.close()


def test_a_half_sent_request_is_closed_after_the_read_timeout_while_others_are_served(tmp_path: Path) -> None:
    config = write_config(tmp_path, "request_read_timeout_ms = 1000\nidle_timeout_ms = 600000\n")
    with running_broker(tmp_path / "data", "--config", config) as broker:
        # Closed within the socket's timeout (a recv timeout fails the test): the read timeout, as the idle one
        # is ten minutes away.
        slow = socket.create_connection((broker.host, broker.port), timeout=WAIT_S)
        slow.sendall(struct.pack(">i", 1000) + b"\0" * 10)  # 10 of 1,000 bytes, then nothing
        with socket.create_connection((broker.host, broker.port), timeout=WAIT_S) as good:
            good.sendall(api_versions_request(3, 1))
            assert read_frame(good) is not None
        assert read_frame(slow) is None, "the stalled connection is closed"
        slow.close()
        assert broker.process.poll() is None, "the broker serves on"


def test_an_idle_connection_is_closed_after_the_idle_timeout(tmp_path: Path) -> None:
    config = write_config(tmp_path, "idle_timeout_ms = 1000\n")
    with running_broker(tmp_path / "data", "--config", config) as broker, \
            socket.create_connection((broker.host, broker.port), timeout=WAIT_S) as idle:
        # Timed from before the request, so before the broker's idle clock starts: a slow machine can only
        # make it longer. Closed at all within the socket's timeout, or the recv fails the test.
        started = time.monotonic()
        idle.sendall(api_versions_request(3, 1))
        assert read_frame(idle) is not None
        assert read_frame(idle) is None
        assert time.monotonic() - started >= 0.9


def test_the_wal_on_a_device_of_its_own_keeps_acknowledged_records_through_kill9(tmp_path: Path) -> None:
    from stratalog.io.device import FileDevice

    device_path = tmp_path / "wal.device"
    FileDevice.open(device_path, size_bytes=64 << 20, create=True).close()
    data_dir = tmp_path / "data"
    broker = start_broker(data_dir, "--wal-device", str(device_path))
    try:
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
        offsets = [producer.send("dev", b"r%d" % i).get(30).offset for i in range(50)]
        producer.close()
        broker.kill9()
    finally:
        if broker.process.poll() is None:
            broker.process.kill()
    assert not (data_dir / "wal").exists(), "the WAL is on the device, not in the data directory"
    with running_broker(data_dir, "--wal-device", str(device_path)) as again:
        consumer = KafkaConsumer("dev", bootstrap_servers=again.bootstrap, auto_offset_reset="earliest",
                                 consumer_timeout_ms=5000)
        assert [(m.offset, m.value) for m in consumer] == [(o, b"r%d" % i) for i, o in enumerate(offsets)]
        consumer.close()


def test_a_non_loopback_listener_needs_the_explicit_flag(tmp_path: Path) -> None:
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", "from stratalog.cli import main; main()", "serve", "--data-dir",
                          str(tmp_path / "data"), "--listen", "0.0.0.0:0"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 2
    assert "--allow-plaintext-anywhere" in run.stderr and "does not authenticate clients" in run.stderr
    assert not (tmp_path / "data").exists(), "refused before anything is opened"



def test_the_config_file_sets_broker_group_store_and_wal_settings_and_refuses_unknown_ones(tmp_path: Path) -> None:
    from click import BadParameter

    from stratalog.broker.listeners import Listener
    from stratalog.commands.serve import load_config
    from stratalog.engine.config import StoreConfig
    from stratalog.wal.config import FsyncPolicy

    path = tmp_path / "broker.toml"
    path.write_text("default_partitions = 3\n[groups]\ngroup_initial_rebalance_delay_ms = 0\n"
                    "[store]\nupload_bytes_threshold = 134217728\n[store.wal]\nfsync = \"interval\"\n")
    config = load_config(path, listeners=(Listener.parse("127.0.0.1:19999"),))
    assert (config.default_partitions, config.listeners[0].port) == (3, 19999)
    assert config.groups.group_initial_rebalance_delay_ms == 0
    assert config.store.upload_bytes_threshold == 128 << 20
    assert config.store.wal.fsync is FsyncPolicy.INTERVAL
    # What [store.wal] leaves out is the store's default, not the bare WAL's (its write buffer differs).
    assert config.store.wal.buffered_bytes_max == StoreConfig().wal.buffered_bytes_max
    for text, named in (("[store]\nupload_bytes = 1\n", "upload_bytes"),
                        ("[store.wal]\nfsync = \"sometimes\"\n", "sometimes"),
                        ("partitions = 2\n", "partitions"),
                        ("[store]\nupload_bytes_threshold = 1073741824\n", "log_cache_bytes_max")):
        path.write_text(text)
        try:
            load_config(path)
        except BadParameter as e:
            assert named in str(e), (text, str(e))
        else:
            raise AssertionError(f"accepted {text!r}")
