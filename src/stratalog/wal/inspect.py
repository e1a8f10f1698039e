"""Read a WAL without changing it: its headers and every record recovery would return."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

from stratalog.errors import CorruptHeaderError
from stratalog.io.device import Device, FileDevice
from stratalog.wal.format import WALHeader, decode_header
from stratalog.wal.recovery import RecoveredRecord, RecoveryStats, read_header_slots, scan


@dataclass(frozen=True, slots=True)
class WALView:
    """Both header slots (None where invalid) and the current header."""

    slots: tuple[WALHeader | None, ...]
    current: WALHeader


def read_headers(device: Device) -> WALView:
    slots = tuple(map(decode_header, read_header_slots(device)))
    valid = [h for h in slots if h is not None]
    if not valid:
        raise CorruptHeaderError("neither header slot holds a valid WAL header")
    return WALView(slots, max(valid, key=lambda h: h.sequence))


def read_records(device: Device, view: WALView, stats: RecoveryStats,
                 read_bytes: int = 4 << 20) -> Iterator[RecoveredRecord]:
    """The records recovery would return, read-only."""
    h = view.current
    yield from scan(device, ring_bytes=h.ring_bytes, trim_offset=h.trim_offset,
                    window_bytes_max=h.window_bytes_max, read_bytes=read_bytes, stats=stats)


def open_read_only(path: str | os.PathLike[str]) -> FileDevice:
    return FileDevice.open(path, read_only=True)
