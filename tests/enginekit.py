"""Helpers for stream-engine tests: an in-memory object store and small store configs."""

from __future__ import annotations

import threading
from collections.abc import Iterator

from stratalog.engine.config import StoreConfig
from stratalog.engine.store import StreamStore
from stratalog.objects.store import ObjectInfo, ObjectNotFoundError
from stratalog.wal import WALConfig


class MemoryStore:
    """An ObjectStore in a dict: enough for engine tests that need no real storage."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self.gets = 0

    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        with self._lock:
            self.objects[key] = bytes(data)

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        with self._lock:
            self.gets += 1
            try:
                data = self.objects[key]
            except KeyError:
                raise ObjectNotFoundError(key) from None
        return data[start:end]

    def size(self, key: str) -> int:
        return len(self.get(key))

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        with self._lock:
            items = sorted((k, len(v)) for k, v in self.objects.items() if k.startswith(prefix))
        return iter([ObjectInfo(k, n) for k, n in items])

    def delete(self, key: str) -> None:
        with self._lock:
            self.objects.pop(key, None)

    def rename(self, src: str, dst: str) -> None:
        with self._lock:
            try:
                self.objects[dst] = self.objects.pop(src)
            except KeyError:
                raise ObjectNotFoundError(src) from None

    def close(self) -> None:
        pass


def small_store_config(**overrides: object) -> StoreConfig:
    """A store scaled for tests: 4 MiB WAL, small caches, uploads only when asked (or nearly full)."""
    values: dict[str, object] = {
        "wal_capacity_bytes": 8192 + (4 << 20),
        "wal": WALConfig(record_bytes_max=256 << 10, window_bytes_max=1 << 20, buffered_bytes_max=2 << 20),
        "log_cache_bytes_max": 2 << 20,
        "upload_bytes_threshold": 1 << 20,
        "upload_interval_s": 3600.0,
        "stream_object_bytes_min": 256 << 10,
        "block_cache_bytes_max": 1 << 20,
        "object_grace_s": 0.0,
        "retention_interval_s": 3600.0,
        "append_wait_s_max": 10.0,
        "upload_backoff_s": 0.01,
        "upload_retry_s_min": 0.0,   # a test's faults stop the store after upload_attempts_max tries
        "free_bytes_min": 0,         # the machine's own free space never refuses a test's appends
        "free_percent_min": 0.0,
    }
    values.update(overrides)
    return StoreConfig(**values)  # type: ignore[arg-type]


def abandon(store: StreamStore) -> None:
    """Stop a store as a crash would: no final upload; the WAL keeps what was not uploaded."""
    store._core.failure = RuntimeError("abandoned")
    store.close()
