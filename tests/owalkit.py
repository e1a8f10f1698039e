"""Helpers for object WAL tests: small configs, crash images, and a store whose puts finish when told."""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterator

from enginekit import MemoryStore
from stratalog.objects.store import ObjectInfo, ObjectStore
from stratalog.wal.config import ObjectWALConfig
from stratalog.wal.object_format import object_key, owner_prefix
from stratalog.wal.object_wal import ObjectWAL
from stratalog.wal.recovery import RecoveredRecord
from waiting import WAIT_S

OWNER = "node-1"
PREFIX = owner_prefix(OWNER)


def small_config(**overrides: object) -> ObjectWALConfig:
    """Quick retries and a short linger; one record per object unless a test says otherwise."""
    values: dict[str, object] = {
        "linger_s": 0.001,
        "object_bytes_soft_max": 1,
        "puts_in_flight_max": 4,
        "put_attempts_max": 3,
        "put_backoff_s": 0.001,
        "put_retry_s_min": 0.0,
        "read_attempts_max": 2,
        "record_bytes_max": 64 << 10,
        "buffered_bytes_max": 1 << 20,
        "append_wait_s_max": 5.0,
        "recovery_gets_in_flight_max": 3,
    }
    values.update(overrides)
    return ObjectWALConfig(**values)  # type: ignore[arg-type]


def key(offset: int) -> str:
    return object_key(PREFIX, offset)


def new_wal(store: ObjectStore, **overrides: object) -> ObjectWAL:
    wal = ObjectWAL.open(store, OWNER, small_config(**overrides))
    assert list(wal.recover()) == []
    return wal


def reopen(image: dict[str, bytes], **overrides: object) -> tuple[list[RecoveredRecord], ObjectWAL, MemoryStore]:
    """Open a crash image (a copy of a store's objects) in a fresh store and recover it; the caller closes
    the returned log."""
    store = MemoryStore()
    store.objects.update(image)
    wal = ObjectWAL.open(store, OWNER, small_config(**overrides))
    return list(wal.recover()), wal, store


class GatedStore:
    """An ObjectStore whose puts wait until the test opens their key's gate, so a test chooses the order in
    which puts finish (and which never do). Gates of keys not named in ``gated`` are open."""

    def __init__(self, inner: ObjectStore, gated: set[str]) -> None:
        self.inner = inner
        self._gated = set(gated)
        self._gates: defaultdict[str, threading.Event] = defaultdict(threading.Event)
        self._arrived: defaultdict[str, threading.Event] = defaultdict(threading.Event)
        self._landed: defaultdict[str, threading.Event] = defaultdict(threading.Event)
        self._lock = threading.Lock()

    def open_gate(self, key: str) -> None:
        with self._lock:
            self._gates[key].set()

    def wait_arrived(self, key: str) -> None:
        with self._lock:
            arrived = self._arrived[key]
        assert arrived.wait(WAIT_S), f"no put of {key} arrived"

    def wait_landed(self, key: str) -> None:
        with self._lock:
            landed = self._landed[key]
        assert landed.wait(WAIT_S), f"the put of {key} did not land"

    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        with self._lock:
            gate = self._gates[key] if key in self._gated else None
            self._arrived[key].set()
        if gate is not None:
            gate.wait(WAIT_S)
        self.inner.put(key, data)
        with self._lock:
            self._landed[key].set()

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        return self.inner.get(key, start, end)

    def size(self, key: str) -> int:
        return self.inner.size(key)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def rename(self, src: str, dst: str) -> None:
        self.inner.rename(src, dst)

    def close(self) -> None:
        self.inner.close()
