"""Shared helpers for WAL tests: small logs on the in-memory device, and byte-surgery on images."""

from __future__ import annotations

import random
from concurrent.futures import Future

from stratalog.io.faulty import FaultPlan, MemDevice
from stratalog.wal import RecoveredRecord, WALConfig, WriteAheadLog
from stratalog.wal.format import (
    ALIGN_BYTES,
    HEADER_SLOT_BYTES,
    HEADERS_BYTES,
    TRIM_NONE,
    ShutdownType,
    WALHeader,
    align_up,
    encode_header,
    encode_pad,
    encode_record,
)

RING_BYTES = 128 << 10
CAPACITY_BYTES = HEADERS_BYTES + RING_BYTES
RECORD_BYTES_MAX = 8 << 10


def small_config(**overrides: object) -> WALConfig:
    """A config scaled to a 128 KiB ring so tests wrap it often."""
    values: dict[str, object] = {
        "block_bytes_soft_max": 16 << 10,
        "record_bytes_max": RECORD_BYTES_MAX,
        "window_bytes_max": 64 << 10,
        "buffered_bytes_max": 64 << 10,
        "block_linger_s": 0.0002,
        "io_threads": 3,
        "recovery_read_bytes": 32 << 10,
        "append_wait_s_max": 5.0,
        # Records share blocks as under load, which the packing and crash-state tests rely on; sealing
        # on an idle device has tests of its own.
        "seal_when_idle": False,
    }
    values.update(overrides)
    return WALConfig(**values)  # type: ignore[arg-type]


def new_wal(faults: FaultPlan | None = None, **overrides: object) -> tuple[WriteAheadLog, MemDevice]:
    device = MemDevice(CAPACITY_BYTES, faults=faults)
    wal = WriteAheadLog.open(device, capacity_bytes=CAPACITY_BYTES, config=small_config(**overrides))
    assert list(wal.recover()) == []
    return wal, device


def reopen(image: bytes | bytearray, **overrides: object) -> tuple[list[RecoveredRecord], WriteAheadLog]:
    """Open a crashed image on a fresh device and recover it. The caller closes the returned log."""
    device = MemDevice(len(image), image=image)
    wal = WriteAheadLog.open(device, config=small_config(**overrides))
    return list(wal.recover()), wal


def recover_image(image: bytes | bytearray, **overrides: object) -> list[RecoveredRecord]:
    records, wal = reopen(image, **overrides)
    wal.close()
    return records


def payload(rng: random.Random, size_max: int = 3000) -> bytes:
    return rng.randbytes(rng.randint(0, size_max))


def acknowledged(results: list[tuple[int, bytes, Future[int]]]) -> dict[int, bytes]:
    """Offsets whose future completed successfully, with their data. Read this before taking an image."""
    return {
        off: data for off, data, fut in results
        if fut.done() and not fut.cancelled() and fut.exception() is None
    }


# Byte-surgery: hand-built images --------------------------------------------------------------------


def physical(offset: int, ring_bytes: int = RING_BYTES) -> int:
    return HEADERS_BYTES + offset % ring_bytes


def blank_image(trim_offset: int = TRIM_NONE, window_bytes_max: int = 64 << 10, sequence: int = 1,
                shutdown: ShutdownType = ShutdownType.UNCLEAN) -> bytearray:
    image = bytearray(CAPACITY_BYTES)
    header = WALHeader(sequence, CAPACITY_BYTES, trim_offset, window_bytes_max, shutdown)
    slot = sequence % 2
    image[slot * HEADER_SLOT_BYTES:(slot + 1) * HEADER_SLOT_BYTES] = encode_header(header)
    return image


def put_block(image: bytearray, start: int, bodies: list[bytes]) -> list[int]:
    """Lay records out as the writer does, one block from ``start``; return their offsets."""
    invariant_aligned = start % ALIGN_BYTES == 0
    assert invariant_aligned
    offsets = []
    pos = start
    for body in bodies:
        rec = encode_record(pos, body)
        at = physical(pos)
        image[at:at + len(rec)] = rec
        offsets.append(pos)
        pos += len(rec)
    return offsets


def put_pad(image: bytearray, start: int) -> int:
    """A padding record from ``start`` to the ring's end; return where the next lap starts."""
    ring_end = start - start % RING_BYTES + RING_BYTES
    pad = encode_pad(start, ring_end)
    at = physical(start)
    image[at:at + len(pad)] = pad
    return ring_end


def block_end(start: int, bodies: list[bytes]) -> int:
    return start + align_up(sum(24 + len(b) for b in bodies))
