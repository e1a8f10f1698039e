"""The WAL's on-disk format: every constant and codec, imported by writer and reader alike.

The prose spec, with a grammar and a worked example, is docs/formats/wal.md. All integers are
little-endian. Change nothing here without changing that page and the golden-bytes tests.

Device layout::

    [header slot 0: 4 KiB][header slot 1: 4 KiB][ring: capacity_bytes - 8 KiB]

A logical offset ``L`` (it only grows) lives at physical position ``HEADERS_BYTES + L % ring_bytes``.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import crc32c as _crc32c

from stratalog.native import native_crc

#: Direct I/O unit: every write starts and ends on a multiple of it (page size and the 4 KiB sector).
ALIGN_BYTES = 4096

HEADER_SLOT_BYTES = ALIGN_BYTES
HEADER_SLOTS = 2
#: Bytes before the ring: the two header slots.
HEADERS_BYTES = HEADER_SLOT_BYTES * HEADER_SLOTS

#: "SLWH" read as a little-endian u32: marks a header slot.
HEADER_MAGIC = 0x48574C53
#: "SLWR": marks a data record.
RECORD_MAGIC = 0x52574C53
#: "SLWP": marks a padding record that fills the ring up to its physical end.
PAD_MAGIC = 0x50574C53

FORMAT_VERSION = 1

#: magic u32, version u16, shutdown u16, sequence u64, capacity_bytes u64, trim_offset i64,
#: window_bytes_max u64, crc32c u32 (of the 40 bytes before it).
HEADER = struct.Struct("<IHHQQqQI")
HEADER_CRC_COVERS_BYTES = HEADER.size - 4

#: magic u32, body_bytes u32, offset u64, body_crc32c u32, header_crc32c u32 (of the 20 bytes before it).
RECORD_HEADER = struct.Struct("<IIQII")
RECORD_HEADER_BYTES = RECORD_HEADER.size
#: The header's body length is a uint32.
BODY_BYTES_LIMIT = 0xFFFF_FFFF
RECORD_HEADER_CRC_COVERS_BYTES = RECORD_HEADER_BYTES - 4
_RECORD_PREFIX = struct.Struct("<IIQI")

#: No trim yet: recovery starts at logical offset 0.
TRIM_NONE = -1

crc32c = _crc32c.crc32c


class ShutdownType(IntEnum):
    """How the writer last stopped; written in the header."""

    UNCLEAN = 0
    GRACEFUL = 1


@dataclass(frozen=True, slots=True)
class WALHeader:
    """One header slot's content."""

    sequence: int
    capacity_bytes: int
    trim_offset: int
    window_bytes_max: int
    shutdown: ShutdownType
    version: int = FORMAT_VERSION

    @property
    def ring_bytes(self) -> int:
        return self.capacity_bytes - HEADERS_BYTES


def align_up(value: int) -> int:
    """The smallest multiple of ALIGN_BYTES that is >= value."""
    return (value + ALIGN_BYTES - 1) & ~(ALIGN_BYTES - 1)


def align_down(value: int) -> int:
    return value & ~(ALIGN_BYTES - 1)


def encode_header(header: WALHeader) -> bytes:
    """The header's bytes, zero-padded to one full slot."""
    head = HEADER.pack(
        HEADER_MAGIC,
        header.version,
        int(header.shutdown),
        header.sequence,
        header.capacity_bytes,
        header.trim_offset,
        header.window_bytes_max,
        0,
    )
    crc = crc32c(head[:HEADER_CRC_COVERS_BYTES])
    return head[:HEADER_CRC_COVERS_BYTES] + crc.to_bytes(4, "little") + bytes(HEADER_SLOT_BYTES - HEADER.size)


def header_version(slot: bytes | memoryview) -> int | None:
    """The version of a slot that has the header magic and a valid CRC, whatever its version; else None."""
    if len(slot) < HEADER.size:
        return None
    magic, version = struct.unpack_from("<IH", slot, 0)
    crc = HEADER.unpack_from(slot, 0)[-1]
    if magic != HEADER_MAGIC or crc != crc32c(bytes(slot[:HEADER_CRC_COVERS_BYTES])):
        return None
    return int(version)


def decode_header(slot: bytes | memoryview) -> WALHeader | None:
    """The header in a slot, or None when the slot is not a valid header (magic, CRC, version, shape)."""
    if len(slot) < HEADER.size:
        return None
    magic, version, shutdown, sequence, capacity, trim, window, crc = HEADER.unpack_from(slot, 0)
    if magic != HEADER_MAGIC or crc != crc32c(bytes(slot[:HEADER_CRC_COVERS_BYTES])):
        return None
    if version != FORMAT_VERSION or shutdown not in (0, 1):
        return None
    if capacity % ALIGN_BYTES or capacity <= HEADERS_BYTES or trim < TRIM_NONE:
        return None
    if window < ALIGN_BYTES:
        # No writer has a window below one aligned block (WALConfig.validate), and recovery that scans
        # less than a block from the trim misses what lies between it and where the writer resumes: a
        # pad there later hid an acknowledged record (found by fuzzing, a header window of 0).
        return None
    return WALHeader(sequence, capacity, trim, window, ShutdownType(shutdown), version)


def pack_record_header(buf: bytearray | memoryview, pos: int, magic: int, body_bytes: int,
                       offset: int, body_crc: int) -> None:
    """Write a record header at ``buf[pos:pos + 24]``; the header CRC covers its first 20 bytes."""
    _RECORD_PREFIX.pack_into(buf, pos, magic, body_bytes, offset, body_crc)
    struct.pack_into("<I", buf, pos + RECORD_HEADER_CRC_COVERS_BYTES,
                     crc32c(buf[pos:pos + RECORD_HEADER_CRC_COVERS_BYTES]))


def encode_record(offset: int, body: bytes) -> bytes:
    """A whole data record (header + body), as the writer lays it out."""
    out = bytearray(RECORD_HEADER_BYTES + len(body))
    pack_record_header(out, 0, RECORD_MAGIC, len(body), offset, crc32c(body))
    out[RECORD_HEADER_BYTES:] = body
    return bytes(out)


def place_record_python(buf: Any, pos: int, views: Sequence[memoryview], offset: int) -> int:
    """Lay a data record out at ``buf[pos:]``: its header, then ``views`` (byte views, the body's parts, in
    order) as its body; return where it ends. The twin of ``_native.place_record``."""
    if offset < 0:
        raise ValueError(f"place_record: offset {offset} < 0")
    if memoryview(buf).readonly:
        raise TypeError("place_record: buf must be a writable buffer")
    body_bytes = sum(map(len, views))
    if body_bytes > BODY_BYTES_LIMIT or pos < 0 or pos > len(buf) or len(buf) - pos < RECORD_HEADER_BYTES + body_bytes:
        raise ValueError(f"place_record: a body of {body_bytes} bytes at {pos} does not fit a buffer of {len(buf)}")
    at = pos + RECORD_HEADER_BYTES
    body_crc = 0
    for view in views:
        buf[at:at + len(view)] = view
        body_crc = crc32c(view, body_crc)
        at += len(view)
    pack_record_header(buf, pos, RECORD_MAGIC, body_bytes, offset, body_crc)
    return at


def place_record(buf: Any, pos: int, views: Sequence[memoryview], offset: int) -> int:
    """:func:`place_record_python` in one C call where the compiled core and its CRC32C are loaded
    (``_native.place_record``: a large body is copied, and its CRC taken as it is, with the GIL released)."""
    if _place_record is None:
        return place_record_python(buf, pos, views, offset)
    end: int = _place_record(buf, pos, views, offset)
    return end


def encode_pad(offset: int, ring_end_offset: int) -> bytes:
    """A padding record at ``offset`` whose (unwritten, unchecked) body reaches ``ring_end_offset``."""
    out = bytearray(RECORD_HEADER_BYTES)
    pack_record_header(out, 0, PAD_MAGIC, ring_end_offset - offset - RECORD_HEADER_BYTES, offset, 0)
    return bytes(out)


_place_record: Any = native_crc.place_record if native_crc is not None else None
