"""A broker on a disk that fills: produce is refused at once with KAFKA_STORAGE_ERROR, fetches go on,
produce resumes once space is freed, with no restart; kill -9 while refusing loses nothing acknowledged.

The disk is a real one: a small ext4 filesystem in a file, loop-mounted for the test (the tests run as
root, as `make test` does on its machines), filled by the broker's own objects and a ballast file the test
deletes to free space."""

from __future__ import annotations

import shutil
import subprocess
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from brokerkit import BrokerProcess, start_broker
from waiting import WAIT_S, wait_until

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.errors import KafkaStorageError

MIB = 1 << 20
#: The filesystem, and what the broker keeps free on it (its free_bytes_min here).
FS_BYTES = 192 * MIB
HEADROOM_BYTES = 48 * MIB
#: Taken by the test's ballast file at the start: what remains free above the headroom is what the
#: producer fills (about 40 MiB), so the refusal comes after some thousands of records.
BALLAST_BYTES = 72 * MIB
VALUE_BYTES = 64 << 10
SEND_BATCH = 8
#: More than the disk could take: a produce loop that reaches it without a refusal has failed.
SENDS_MAX = FS_BYTES // VALUE_BYTES


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    image, mount = tmp_path / "fs.img", tmp_path / "mnt"
    with image.open("wb") as f:
        f.truncate(FS_BYTES)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(image)], check=True)
    mount.mkdir()
    subprocess.run(["mount", "-o", "loop", str(image), str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def broker_config(tmp_path: Path) -> Path:
    config = tmp_path / "broker.toml"
    config.write_text(
        f"message_bytes_max = {MIB}\n"
        "[store]\n"
        f"free_bytes_min = {HEADROOM_BYTES}\n"
        "free_percent_min = 0.0\n"
        f"wal_capacity_bytes = {16 * MIB + 8192}\n"
        f"log_cache_bytes_max = {8 * MIB}\n"
        f"upload_bytes_threshold = {2 * MIB}\n"
        "upload_interval_s = 0.2\n"
        "[store.wal]\n"
        f"record_bytes_max = {2 * MIB}\n"
        f"buffered_bytes_max = {4 * MIB}\n")
    return config


def ballast(disk: Path) -> Path:
    path = disk / "ballast"
    subprocess.run(["fallocate", "-l", str(BALLAST_BYTES), str(path)], check=True)
    return path


def produce_until_refused(bootstrap: str, topic: str, acked: list[bytes]) -> None:
    """Send records in small batches (no retries, so a refusal reaches the test as the broker's error)
    until one is refused; ``acked`` gets every record acknowledged, in order."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", retries=0, linger_ms=0,
                             max_in_flight_requests_per_connection=1)
    try:
        sent = 0
        while sent < SENDS_MAX:
            batch = [f"{sent + i:08d}".encode().ljust(VALUE_BYTES, b".") for i in range(SEND_BATCH)]
            futures = [producer.send(topic, value) for value in batch]
            sent += SEND_BATCH
            refused = False
            for value, future in zip(batch, futures, strict=True):
                try:
                    future.get(timeout=WAIT_S)
                except KafkaStorageError:
                    refused = True
                else:
                    acked.append(value)
            if refused:
                return
    finally:
        producer.close()
    raise AssertionError(f"{SENDS_MAX} records of {VALUE_BYTES} bytes were all taken by a {FS_BYTES}-byte disk")


def produce_one(bootstrap: str, topic: str, value: bytes) -> bool:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", retries=0, linger_ms=0)
    try:
        producer.send(topic, value).get(timeout=WAIT_S)
    except KafkaStorageError:
        return False
    finally:
        producer.close()
    return True


def read_all(bootstrap: str, topic: str, expected: int) -> list[bytes]:
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                             group_id=None, enable_auto_commit=False, consumer_timeout_ms=1000)
    got: list[bytes] = []
    try:
        wait_until(lambda: (got.extend(r.value for r in consumer) or len(got) >= expected) or None,
                   lambda: f"{expected} records read back (got {len(got)})", poll_s=0)
        got.extend(r.value for r in consumer)   # and nothing more
    finally:
        consumer.close()
    return got


def said(broker: BrokerProcess, words: str) -> bool:
    return any(words in line for line in broker.output)


def test_a_full_disk_refuses_produce_at_once_serves_fetches_and_resumes_without_a_restart(
        small_disk: Path, tmp_path: Path) -> None:
    extra = ("--config", str(broker_config(tmp_path)))
    freed = ballast(small_disk)
    broker = start_broker(small_disk / "data", *extra)
    try:
        acked: list[bytes] = []
        produce_until_refused(broker.bootstrap, "filling", acked)
        assert len(acked) * VALUE_BYTES > 16 * MIB, "the disk took tens of MiB before the refusal"
        assert said(broker, "nearly full") and said(broker, "writes are refused")
        assert not produce_one(broker.bootstrap, "filling", b"refused again"), "still refused: nothing freed"
        assert read_all(broker.bootstrap, "filling", len(acked)) == acked, "fetches go on meanwhile"
        freed.unlink()
        resumed = b"after the disk was freed"
        wait_until(lambda: produce_one(broker.bootstrap, "filling", resumed), "produce taken again")
        acked.append(resumed)
        assert said(broker, "writes accepted again")
        assert broker.stop() == 0
    finally:
        if broker.process.poll() is None:
            broker.process.kill()
            broker.process.wait(timeout=30)
        broker.close_output()
    again = start_broker(small_disk / "data", *extra)
    try:
        assert read_all(again.bootstrap, "filling", len(acked)) == acked, "every acknowledged record, once"
    finally:
        again.stop()
        again.close_output()


def test_kill9_while_refusing_loses_nothing_acknowledged(small_disk: Path, tmp_path: Path) -> None:
    extra = ("--config", str(broker_config(tmp_path)))
    freed = ballast(small_disk)
    broker = start_broker(small_disk / "data", *extra)
    acked: list[bytes] = []
    try:
        produce_until_refused(broker.bootstrap, "filling", acked)
    finally:
        broker.kill9()
        broker.close_output()
    again = start_broker(small_disk / "data", *extra)
    try:
        assert read_all(again.bootstrap, "filling", len(acked)) == acked, "every acknowledged record, once"
        freed.unlink()
        wait_until(lambda: produce_one(again.bootstrap, "filling", b"resumed"), "produce taken after the restart")
    finally:
        again.stop()
        again.close_output()
    assert shutil.disk_usage(small_disk).free > HEADROOM_BYTES
