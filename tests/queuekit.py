"""Helpers for the queue store's tests: small bounds so uploads, WAL trims and cache evictions happen at
test scale."""

from __future__ import annotations

from typing import Any

from stratalog.queues import QueueConfig
from stratalog.wal.config import WALConfig


def small_queue_config(**overrides: Any) -> QueueConfig:
    base: dict[str, Any] = {
        "wal_capacity_bytes": 32 << 20,
        "wal": WALConfig(record_bytes_max=1 << 20, window_bytes_max=4 << 20, buffered_bytes_max=8 << 20),
        "record_bytes_target": 512 << 10,
        "message_bytes_max": 4096,
        "log_cache_bytes_max": 4 << 20,
        "upload_bytes_threshold": 256 << 10,
        "upload_idle_s": 0.05,
        "linger_s": 0.002,
        "read_cache_bytes_max": 256 << 10,
        "compact_retire_s": 0.05,
    }
    base.update(overrides)
    return QueueConfig(**base)
