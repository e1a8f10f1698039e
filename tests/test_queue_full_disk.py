"""A full disk under the queue store: puts refused early and clearly (single puts, compiled or not, and
put_many), gets go on, puts resume without a restart, and every put that was taken is kept."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from pathlib import Path

import pytest

from diskkit import FakeDisk
from queuekit import small_queue_config
from stratalog.errors import OutOfSpaceError
from stratalog.objects.local import LocalDirStore
from stratalog.objects.store import ObjectStoreFullError
from stratalog.queues import QueueStore
from stratalog.queues.errors import QueueStoreFullError
from waiting import wait_until

MIB = 1 << 20
CHECK_S = 0.02


class FullDir(LocalDirStore):
    """A local object store whose puts run out of room while ``full`` is set."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.full = threading.Event()
        self.refused_puts = 0

    def put_parts(self, key: str, parts: Iterable[bytes | bytearray | memoryview], *,
                  sync_every_bytes: int | None = None, size_hint: int | None = None) -> None:
        if self.full.is_set():
            self.refused_puts += 1
            raise ObjectStoreFullError(f"put of {key}: No space left on device")
        super().put_parts(key, parts, sync_every_bytes=sync_every_bytes, size_hint=size_hint)


def open_store(path: Path, objects: LocalDirStore | None = None, **overrides: object) -> QueueStore:
    settings: dict[str, object] = {"free_bytes_min": 100 * MIB, "free_space_check_interval_s": CHECK_S,
                                   "free_space_recheck_interval_s": 0.0, "compact_fanout": 0}
    settings.update(overrides)
    return QueueStore.open(path, objects, small_queue_config(**settings))


def put_until_refused(store: QueueStore, kept: list[bytes]) -> QueueStoreFullError:
    def refused() -> QueueStoreFullError | None:
        message = f"m{len(kept)}".encode()
        try:
            store.put("q", message)
        except QueueStoreFullError as e:
            return e
        kept.append(message)
        return None

    return wait_until(refused, "a put refused for want of space", poll_s=0.001)


def test_below_the_headroom_puts_are_refused_gets_go_on_and_puts_resume(tmp_path: Path, disk: FakeDisk) -> None:
    store = open_store(tmp_path / "s")
    kept: list[bytes] = []
    disk.free_bytes = 60 * MIB
    error = put_until_refused(store, kept)
    assert isinstance(error, OutOfSpaceError) and "60 MiB free" in str(error) and "100 MiB" in str(error)
    with pytest.raises(QueueStoreFullError):
        store.put_many(["q", "r"], [b"bulk", b"bulk"])
    with pytest.raises(QueueStoreFullError):
        store.put("q", b"x" * 2000)     # a large message takes the other path: refused the same
    store.flush()   # what was taken before the refusal is made durable all the same
    assert store.get("q", 0, len(kept) + 10) == kept, "gets go on, and see every put that was taken"
    disk.free_bytes = 500 * MIB
    store.put("q", b"after")   # the refusal itself looks again: no wait for the timer
    store.put_many(["q"], [b"bulk after"])
    kept += [b"after", b"bulk after"]
    store.close()
    with QueueStore.open(tmp_path / "s", config=small_queue_config()) as again:
        assert again.get("q", 0, len(kept) + 10) == kept


def test_a_queue_store_opened_on_a_full_disk_refuses_from_the_start(tmp_path: Path, disk: FakeDisk) -> None:
    disk.free_bytes = MIB
    with open_store(tmp_path / "s") as store:
        with pytest.raises(QueueStoreFullError, match="1 MiB free"):
            store.put("q", b"x")
        assert store.get("q", 0, 1) == []


def test_object_storage_out_of_room_refuses_puts_without_stopping_and_uploads_resume(
        tmp_path: Path, disk: FakeDisk) -> None:
    objects = FullDir(tmp_path / "objects")
    store = open_store(tmp_path / "s", objects, upload_interval_s=CHECK_S)
    kept: list[bytes] = []
    objects.full.set()
    error = put_until_refused(store, kept)
    assert "an upload ran out of room" in str(error)
    assert store._lifecycle.failure is None, "the store did not stop"
    assert store.get("q", 0, len(kept) + 10) == kept
    refused_puts = objects.refused_puts
    wait_until(lambda: objects.refused_puts > refused_puts, "the upload retried while the store is full")
    objects.full.clear()

    def put_taken() -> bool:
        try:
            store.put("q", b"resumed")
        except QueueStoreFullError:
            return False
        return True

    wait_until(put_taken, "puts taken again once an upload went through")
    kept.append(b"resumed")
    store.close()
    with QueueStore.open(tmp_path / "s", objects, config=small_queue_config()) as again:
        assert again.get("q", 0, len(kept) + 10) == kept
