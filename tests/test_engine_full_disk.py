"""A full disk under the stream store: appends refused early and clearly, reads go on, appends resume
without a restart, and nothing acknowledged is lost (free_space.py's states seen through the store)."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from diskkit import FakeDisk
from enginekit import MemoryStore, small_store_config
from stratalog.engine import StoreFullError, StreamStore
from stratalog.engine.metadata_backends import MetadataFullError, _full_or
from stratalog.errors import OutOfSpaceError
from stratalog.objects.store import ObjectStoreFullError
from waiting import wait_until

MIB = 1 << 20
CHECK_S = 0.02


class FullObjects(MemoryStore):
    """Object storage that answers every put with "out of room" while ``full`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.full = threading.Event()
        self.refused_puts = 0

    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        if self.full.is_set():
            self.refused_puts += 1
            raise ObjectStoreFullError(f"put of {key}: QuotaExceeded")
        super().put(key, data)


def open_store(path: Path, objects: MemoryStore, **overrides: object) -> StreamStore:
    settings: dict[str, object] = {"free_bytes_min": 100 * MIB, "free_percent_min": 0.0,
                                   "free_space_check_interval_s": CHECK_S, "free_space_recheck_interval_s": 0.0}
    settings.update(overrides)
    return StreamStore.open(path, objects, small_store_config(**settings))


def append_until_refused(store: StreamStore, name: str, acked: list[bytes]) -> StoreFullError:
    stream = store.open_stream(name)

    def refused() -> StoreFullError | None:
        value = f"r{len(acked)}".encode()
        try:
            stream.append([value]).result()
        except StoreFullError as e:
            return e
        acked.append(value)
        return None

    return wait_until(refused, "an append refused for want of space")


def test_below_the_headroom_appends_are_refused_reads_go_on_and_appends_resume(tmp_path: Path,
                                                                               disk: FakeDisk) -> None:
    store = open_store(tmp_path, MemoryStore())
    stream = store.create_stream("s")
    acked = [b"first"]
    stream.append(acked).result()
    disk.free_bytes = 60 * MIB
    error = append_until_refused(store, "s", acked)
    assert "nearly full" in str(error) and "60 MiB free" in str(error) and "100 MiB" in str(error)
    assert isinstance(error, OutOfSpaceError)
    assert [r.value for r in stream.fetch(0)] == acked, "reads go on while appends are refused"
    assert store.failure is None
    stats = store.stats()
    assert (stats["space_free_bytes"], stats["space_kept_free_bytes"], stats["space_refusing"]) == \
        (60 * MIB, 100 * MIB, 1)
    disk.free_bytes = 500 * MIB
    stream.append([b"after"]).result()   # the refusal itself looks again: no wait for the timer
    acked.append(b"after")
    store.flush()
    store.close()
    with StreamStore.open(tmp_path, store.object_store, small_store_config()) as again:
        assert [r.value for r in again.open_stream("s").fetch(0)] == acked, "every acknowledged record, once"


def test_looking_at_free_space_every_check_does_not_upload_before_its_time(tmp_path: Path, disk: FakeDisk) -> None:
    """The uploader thread wakes every free_space_check_interval_s to look at the disk; an upload still
    waits for upload_interval_s (or the threshold, or a flush): objects of a second's appends each would
    multiply the objects and the object store's requests."""
    objects = MemoryStore()
    with open_store(tmp_path, objects) as store:   # (small_store_config: upload_interval_s is an hour)
        stream = store.create_stream("s")
        stream.append([b"waits"]).result()
        looks = disk.looks
        wait_until(lambda: disk.looks >= looks + 10, "ten looks at the free space")
        assert not [k for k in objects.objects if k.startswith("data/")], "nothing was uploaded yet"
        store.flush()
        assert [k for k in objects.objects if k.startswith("data/")], "a flush uploads"


def test_a_store_opened_on_a_full_disk_refuses_from_the_start(tmp_path: Path, disk: FakeDisk) -> None:
    disk.free_bytes = 10 * MIB
    with open_store(tmp_path, MemoryStore()) as store:
        stream = store.create_stream("s")
        with pytest.raises(StoreFullError, match="10 MiB free"):
            stream.append([b"x"])


def test_object_storage_out_of_room_refuses_appends_without_stopping_and_uploads_resume(
        tmp_path: Path, disk: FakeDisk) -> None:
    objects = FullObjects()
    store = open_store(tmp_path, objects, upload_interval_s=CHECK_S)
    stream = store.create_stream("s")
    acked: list[bytes] = []
    objects.full.set()
    error = append_until_refused(store, "s", acked)
    assert "an upload ran out of room" in str(error) and "QuotaExceeded" in str(error)
    assert objects.refused_puts >= 1 and store.failure is None, "the store did not stop"
    assert [r.value for r in stream.fetch(0)] == acked, "what was acknowledged is read from the log cache"
    refused_puts = objects.refused_puts
    wait_until(lambda: objects.refused_puts > refused_puts, "the upload retried while the store is full")
    objects.full.clear()

    def appended() -> bool:
        try:
            stream.append([b"resumed"]).result()
        except StoreFullError:
            return False
        return True

    wait_until(appended, "appends taken again once an upload went through")
    acked.append(b"resumed")
    wait_until(lambda: not store.stats()["log_cache_bytes"] or None, "the waiting data uploaded")
    store.close()
    with StreamStore.open(tmp_path, objects, small_store_config()) as again:
        assert [r.value for r in again.open_stream("s").fetch(0)] == acked


def test_close_with_object_storage_full_keeps_the_appends_in_the_wal(tmp_path: Path, disk: FakeDisk) -> None:
    objects = FullObjects()
    store = open_store(tmp_path, objects)
    stream = store.create_stream("s")
    stream.append([b"a", b"b"]).result()
    objects.full.set()
    store.close()   # the upload at close runs out of room: logged, not raised
    assert not any(k.startswith("data/") for k in objects.objects)
    objects.full.clear()
    with StreamStore.open(tmp_path, objects, small_store_config()) as again:
        assert [r.value for r in again.open_stream("s").fetch(0)] == [b"a", b"b"], "recovered from the WAL"


def test_sqlite_full_is_an_out_of_space_error_and_other_errors_pass_through() -> None:
    full = sqlite3.OperationalError("database or disk is full")
    full.sqlite_errorcode = sqlite3.SQLITE_FULL
    mapped = _full_or(full)
    assert isinstance(mapped, MetadataFullError) and isinstance(mapped, OutOfSpaceError)
    locked = sqlite3.OperationalError("database is locked")
    locked.sqlite_errorcode = sqlite3.SQLITE_BUSY
    assert _full_or(locked) is locked
