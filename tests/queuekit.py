"""Helpers for the queue store's tests: small bounds so uploads, WAL trims and cache evictions happen at
test scale."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from stratalog.queues import QueueConfig, QueueStore
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
        "free_bytes_min": 0,        # the machine's own free space never refuses a test's puts
        "free_percent_min": 0.0,
    }
    base.update(overrides)
    return QueueConfig(**base)


def one_object_per_round(path: Path, rounds: Iterable[Iterable[int]], message: Callable[[int, int], bytes]) -> None:
    """A store at ``path`` with one object per round r, holding ``message(q, r)`` for each queue ``q{q}``
    of ``rounds[r]``. Only a close uploads (an upload at idle could take the new queues' names record
    alone, as an object of its own), and nothing merges."""
    for r, queues in enumerate(rounds):
        with QueueStore.open(path, config=small_queue_config(compact_fanout=0, upload_idle_s=60.0,
                                                             upload_interval_s=60.0)) as qs:
            qs.put_many([f"q{q}" for q in queues], [message(q, r) for q in queues])
