"""Recovery: scan the ring from the trim offset and yield every valid record, in offset order.

What is read at each position, what it means and where the scan goes next is the decision table of
docs/formats/wal.md, "Recovery" (six rows; tests/test_wal_corruption.py has a test per corruption mode); so
are the stop rule (``window_bytes_max`` beyond the aligned end of the last valid record: the writer never
has bytes in flight farther than that) and where the writer continues. Records at or below the trim
offset are read (to find where they end) but never returned.
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

from stratalog.errors import RecoveryReadError
from stratalog.io.device import Device, aligned_buffer
from stratalog.wal.format import (
    HEADER_SLOT_BYTES,
    HEADER_SLOTS,
    HEADERS_BYTES,
    PAD_MAGIC,
    RECORD_HEADER,
    RECORD_HEADER_BYTES,
    RECORD_HEADER_CRC_COVERS_BYTES,
    RECORD_MAGIC,
    align_up,
    crc32c,
)


class RecoveredRecord(NamedTuple):
    """A record found by recovery: its logical offset and its body."""

    offset: int
    data: bytes


@dataclass(slots=True)
class RecoveryStats:
    """What a scan saw; filled in as it runs."""

    records: int = 0
    record_bytes: int = 0
    trimmed_records: int = 0
    bad_body_records: int = 0
    invalid_positions: int = 0
    bytes_read: int = 0
    #: Where the writer continues: aligned end of the last valid record (never at or below the trim).
    next_offset: int = 0
    #: End of the last valid record, and the farthest end claimed by a torn record after it (0: none).
    #: Those torn records are left from blocks in flight at the crash; the writer erases
    #: ``[valid_end, stale_end)`` before it reuses their offsets, or a later scan would trust their
    #: headers and jump over the new records written there.
    valid_end: int = 0
    stale_end: int = 0
    stale_bytes_erased: int = 0
    finished: bool = False


class _RingReader:
    """Reads logical ranges of the ring through large aligned reads, one chunk held at a time."""

    def __init__(self, device: Device, ring_bytes: int, chunk_bytes: int, stats: RecoveryStats) -> None:
        self._device = device
        self._ring_bytes = ring_bytes
        self._chunk_bytes = min(chunk_bytes, ring_bytes)
        self._buf = aligned_buffer(self._chunk_bytes)
        self._view = memoryview(self._buf)
        self._start = -1
        self._len = 0
        self._stats = stats

    def get(self, offset: int, length: int) -> memoryview:
        """View of ``length`` bytes at logical ``offset``; the range must not cross the ring's end."""
        rel = offset - self._start
        if self._start < 0 or rel < 0 or rel + length > self._len:
            self._load(offset, length)
            rel = offset - self._start
        return self._view[rel:rel + length]

    def _load(self, offset: int, length: int) -> None:
        start = offset - offset % 4096
        phys_rel = start % self._ring_bytes
        want = max(self._chunk_bytes, align_up(offset + length) - start)
        want = min(want, self._ring_bytes - phys_rel)
        if want > len(self._buf):
            # The old buffer may still back views the caller holds: let the GC unmap it.
            self._buf = aligned_buffer(want)
            self._view = memoryview(self._buf)
        try:
            n = self._device.pread_into(self._view[:want], HEADERS_BYTES + phys_rel)
        except OSError as e:
            raise RecoveryReadError(
                f"reading the WAL at logical offset {start} failed ({e}); recovery stopped instead of "
                "guessing where the log ends: check the device, then reopen"
            ) from e
        self._stats.bytes_read += n
        self._start = start
        self._len = n

    def close(self) -> None:
        self._view.release()
        with contextlib.suppress(BufferError):  # a caller's view still points into it: unmapped with it
            self._buf.close()


_U32 = struct.Struct("<I")


def read_header_slots(device: Device) -> list[bytes]:
    """The raw bytes of both header slots."""
    buf = aligned_buffer(HEADERS_BYTES)
    try:
        device.pread_into(buf, 0)
        raw = bytes(buf)
    finally:
        buf.close()
    return [raw[i * HEADER_SLOT_BYTES:(i + 1) * HEADER_SLOT_BYTES] for i in range(HEADER_SLOTS)]


def scan(
    device: Device,
    *,
    ring_bytes: int,
    trim_offset: int,
    window_bytes_max: int,
    read_bytes: int,
    stats: RecoveryStats,
) -> Iterator[RecoveredRecord]:
    """Yield the records after ``trim_offset`` in offset order; fill ``stats`` (see module doc)."""
    start = max(trim_offset, 0)
    limit = start + ring_bytes  # live data never reaches past one ring length from the trim point
    reader = _RingReader(device, ring_bytes, read_bytes, stats)
    unpack_header = RECORD_HEADER.unpack_from
    covers = RECORD_HEADER_CRC_COVERS_BYTES
    pos = start
    last_end = start
    scan_until = align_up(start) + window_bytes_max
    try:
        while pos < scan_until and pos < limit:
            room = ring_bytes - pos % ring_bytes  # bytes left before the ring's physical end
            if room < RECORD_HEADER_BYTES:
                pos += room
                continue
            head = reader.get(pos, RECORD_HEADER_BYTES)
            magic, body_bytes, offset, body_crc, header_crc = unpack_header(head, 0)
            if offset == pos and header_crc == crc32c(head[:covers]):
                total = RECORD_HEADER_BYTES + body_bytes
                if magic == RECORD_MAGIC and total <= room:
                    body = reader.get(pos + RECORD_HEADER_BYTES, body_bytes)
                    if crc32c(body) == body_crc:
                        if pos > trim_offset:
                            stats.records += 1
                            stats.record_bytes += body_bytes
                            yield RecoveredRecord(pos, bytes(body))
                        else:
                            stats.trimmed_records += 1
                        pos += total
                        last_end = pos
                        scan_until = align_up(pos) + window_bytes_max
                    else:
                        stats.bad_body_records += 1
                        pos += total
                        stats.stale_end = max(stats.stale_end, pos)
                    continue
                if magic == PAD_MAGIC and total == room:
                    pos += room
                    last_end = pos
                    scan_until = pos + window_bytes_max
                    continue
            stats.invalid_positions += 1
            pos = align_up(pos + 1)
    finally:
        reader.close()
    stats.next_offset = align_up(max(last_end, trim_offset + 1))
    stats.valid_end = max(last_end, trim_offset + 1)
    stats.stale_end = min(stats.stale_end, limit) if stats.stale_end > stats.valid_end else 0
    stats.finished = True
