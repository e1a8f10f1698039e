"""The object WAL's format: keys, object layout, the trim marker; imported by writer and reader alike.

The prose spec, with a grammar, a worked example and the recovery decision table, is
docs/formats/object-wal.md. All integers are little-endian. Change nothing here without changing that
page and the golden-bytes tests (tests/test_wal_object_format.py).

One owner's objects live under ``wal/<owner>/``::

    wal/<owner>/<first offset: 16 lowercase hex digits>   a batch object: header, records, footer
    wal/<owner>/trim                                      the trim marker
    wal/<owner>/damaged/<16 hex digits>-<n>                a damaged last object, moved aside by recovery

Offsets are record numbers (0, 1, 2, ...), not byte positions: an object holding ``record_count``
records from ``first_offset`` holds offsets ``first_offset .. first_offset + record_count - 1``.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from stratalog.wal.format import (
    RECORD_HEADER,
    RECORD_HEADER_BYTES,
    RECORD_HEADER_CRC_COVERS_BYTES,
    RECORD_MAGIC,
    TRIM_NONE,
    crc32c,
)

#: Where every owner's prefix lives in the object store.
ROOT_PREFIX = "wal/"
#: Owner names: what is safe in a key segment on every store, short enough for any key limit.
OWNER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
#: A batch object's key ends in its first offset, zero-padded so that key order is offset order.
OFFSET_HEX_DIGITS = 16
OBJECT_KEY_RE = re.compile(r"^[0-9a-f]{16}$")
TRIM_KEY = "trim"
DAMAGED_DIR = "damaged"

#: "SLWO" read as a little-endian u32: starts a batch object.
OBJECT_MAGIC = 0x4F574C53
#: "SLWF": starts a batch object's footer.
FOOTER_MAGIC = 0x46574C53
#: "SLWT": starts the trim marker.
TRIM_MAGIC = 0x54574C53

OBJECT_FORMAT_VERSION = 1

#: magic u32, version u16, flags u16 (0), first_offset u64, record_count u32, puts_in_flight_max u32,
#: records_bytes u64, header_crc32c u32 (of the 32 bytes before it).
OBJECT_HEADER = struct.Struct("<IHHQIIQI")
OBJECT_HEADER_BYTES = OBJECT_HEADER.size
OBJECT_HEADER_CRC_COVERS_BYTES = OBJECT_HEADER_BYTES - 4
#: magic u32, object_crc32c u32 (of every byte of the object before the footer).
FOOTER = struct.Struct("<II")
FOOTER_BYTES = FOOTER.size
#: Bytes an object adds around its records.
OBJECT_OVERHEAD_BYTES = OBJECT_HEADER_BYTES + FOOTER_BYTES

#: magic u32, version u16, flags u16 (0), trim_offset i64, crc32c u32 (of the 16 bytes before it).
TRIM_MARKER = struct.Struct("<IHHqI")
TRIM_MARKER_CRC_COVERS_BYTES = TRIM_MARKER.size - 4

class DamagedObjectError(ValueError):
    """An object's bytes are not a valid batch object (or trim marker); the message says which check failed."""


class NewerFormatError(DamagedObjectError):
    """A valid header of a newer format version than this stratalog reads."""


@dataclass(frozen=True, slots=True)
class ObjectHeader:
    first_offset: int
    record_count: int
    puts_in_flight_max: int
    records_bytes: int
    version: int = OBJECT_FORMAT_VERSION

    @property
    def end_offset(self) -> int:
        """The offset after the object's last record."""
        return self.first_offset + self.record_count

    @property
    def object_bytes(self) -> int:
        return OBJECT_OVERHEAD_BYTES + self.records_bytes


def check_owner(owner: str) -> str:
    """Return ``owner`` if it can name a prefix; ValueError saying what is allowed otherwise."""
    if not OWNER_RE.match(owner):
        raise ValueError(f"WAL owner {owner!r} must be 1-64 characters of A-Z a-z 0-9 . _ - and start with a "
                         "letter or digit")
    return owner


def owner_prefix(owner: str) -> str:
    return f"{ROOT_PREFIX}{check_owner(owner)}/"


def object_key(prefix: str, first_offset: int) -> str:
    return f"{prefix}{first_offset:0{OFFSET_HEX_DIGITS}x}"


def offset_of_key(prefix: str, key: str) -> int | None:
    """The first offset a batch object's key names; None for any other key under the prefix."""
    tail = key[len(prefix):] if key.startswith(prefix) else ""
    return int(tail, 16) if OBJECT_KEY_RE.match(tail) else None


def encode_object_header(header: ObjectHeader) -> bytes:
    head = OBJECT_HEADER.pack(OBJECT_MAGIC, header.version, 0, header.first_offset, header.record_count,
                              header.puts_in_flight_max, header.records_bytes, 0)
    covered = head[:OBJECT_HEADER_CRC_COVERS_BYTES]
    return covered + crc32c(covered).to_bytes(4, "little")


def encode_record_header(offset: int, body_bytes: int, body_crc: int) -> bytes:
    """A record's 24-byte header: the device WAL's record header (docs/formats/wal.md), unchanged."""
    head = bytearray(RECORD_HEADER_BYTES)
    RECORD_HEADER.pack_into(head, 0, RECORD_MAGIC, body_bytes, offset, body_crc, 0)
    struct.pack_into("<I", head, RECORD_HEADER_CRC_COVERS_BYTES, crc32c(head[:RECORD_HEADER_CRC_COVERS_BYTES]))
    return bytes(head)


def encode_object(first_offset: int, records: list[bytes], puts_in_flight_max: int) -> bytes:
    """A whole batch object holding ``records`` (bodies) at offsets from ``first_offset`` on."""
    parts: list[bytes | memoryview] = []
    for i, body in enumerate(records):
        parts.append(encode_record_header(first_offset + i, len(body), crc32c(body)))
        parts.append(body)
    return join_object(first_offset, len(records), parts, puts_in_flight_max)


def join_object(first_offset: int, record_count: int, record_parts: Sequence[bytes | memoryview],
                puts_in_flight_max: int) -> bytes:
    """Header + the record bytes (headers and bodies, already laid out) + footer, as one buffer."""
    records_bytes = sum(map(len, record_parts))
    header = encode_object_header(ObjectHeader(first_offset, record_count, puts_in_flight_max, records_bytes))
    out = bytearray(OBJECT_HEADER_BYTES + records_bytes + FOOTER_BYTES)
    out[:OBJECT_HEADER_BYTES] = header
    pos = OBJECT_HEADER_BYTES
    for part in record_parts:
        out[pos:pos + len(part)] = part
        pos += len(part)
    with memoryview(out) as view:
        crc = crc32c(view[:pos])
    FOOTER.pack_into(out, pos, FOOTER_MAGIC, crc)
    return bytes(out)


def decode_object_header(data: bytes | memoryview) -> ObjectHeader:
    """The header at the start of ``data``; DamagedObjectError when it is not a valid one."""
    if len(data) < OBJECT_HEADER_BYTES:
        raise DamagedObjectError(f"{len(data)} bytes is shorter than an object header ({OBJECT_HEADER_BYTES})")
    magic, version, flags, first, count, window, records_bytes, crc = OBJECT_HEADER.unpack_from(data, 0)
    if magic != OBJECT_MAGIC:
        raise DamagedObjectError(f"bad object magic {magic:#010x}")
    if crc != crc32c(bytes(data[:OBJECT_HEADER_CRC_COVERS_BYTES])):
        raise DamagedObjectError("object header CRC mismatch")
    if version != OBJECT_FORMAT_VERSION:
        raise NewerFormatError(f"object format version {version}; this stratalog reads version "
                               f"{OBJECT_FORMAT_VERSION}: upgrade stratalog")
    if flags != 0 or count < 1 or window < 1:
        raise DamagedObjectError(f"object header out of range (flags {flags}, records {count}, window {window})")
    return ObjectHeader(first, count, window, records_bytes, version)


def decode_object(expected_first: int, data: bytes) -> tuple[ObjectHeader, list[bytes]]:
    """Check every CRC of a batch object whose key names ``expected_first``; return its header and bodies.

    DamagedObjectError (NewerFormatError for a newer version) names the first check that failed.
    """
    header = decode_object_header(data)
    if header.first_offset != expected_first:
        raise DamagedObjectError(f"object header says first offset {header.first_offset}, its key "
                                 f"{expected_first}")
    if len(data) != header.object_bytes:
        raise DamagedObjectError(f"object is {len(data)} bytes, its header says {header.object_bytes} "
                                 "(truncated or extended)")
    footer_at = len(data) - FOOTER_BYTES
    magic, object_crc = FOOTER.unpack_from(data, footer_at)
    if magic != FOOTER_MAGIC:
        raise DamagedObjectError(f"bad footer magic {magic:#010x}")
    with memoryview(data) as view:
        if object_crc != crc32c(view[:footer_at]):
            raise DamagedObjectError("object CRC mismatch")
        bodies = _decode_records(header, view[OBJECT_HEADER_BYTES:footer_at])
    return header, bodies


def _decode_records(header: ObjectHeader, area: memoryview) -> list[bytes]:
    bodies: list[bytes] = []
    pos = 0
    for i in range(header.record_count):
        if pos + RECORD_HEADER_BYTES > len(area):
            raise DamagedObjectError(f"record {i} of {header.record_count} runs past the records")
        magic, body_bytes, offset, body_crc, header_crc = RECORD_HEADER.unpack_from(area, pos)
        if magic != RECORD_MAGIC or header_crc != crc32c(area[pos:pos + RECORD_HEADER_CRC_COVERS_BYTES]):
            raise DamagedObjectError(f"record {i} has a bad magic or header CRC")
        if offset != header.first_offset + i:
            raise DamagedObjectError(f"record {i} says offset {offset}, expected {header.first_offset + i}")
        start = pos + RECORD_HEADER_BYTES
        body = area[start:start + body_bytes]
        if len(body) != body_bytes or crc32c(body) != body_crc:
            raise DamagedObjectError(f"record at offset {offset} fails its body CRC")
        bodies.append(bytes(body))
        pos = start + body_bytes
    if pos != len(area):
        raise DamagedObjectError(f"{len(area) - pos} bytes follow the last record")
    return bodies


def encode_trim_marker(trim_offset: int) -> bytes:
    head = TRIM_MARKER.pack(TRIM_MAGIC, OBJECT_FORMAT_VERSION, 0, trim_offset, 0)
    covered = head[:TRIM_MARKER_CRC_COVERS_BYTES]
    return covered + crc32c(covered).to_bytes(4, "little")


def decode_trim_marker(data: bytes) -> int:
    """The trim offset a marker holds; DamagedObjectError when it is not a valid marker."""
    if len(data) != TRIM_MARKER.size:
        raise DamagedObjectError(f"trim marker is {len(data)} bytes, not {TRIM_MARKER.size}")
    magic, version, flags, trim_offset, crc = TRIM_MARKER.unpack(data)
    if magic != TRIM_MAGIC or crc != crc32c(data[:TRIM_MARKER_CRC_COVERS_BYTES]):
        raise DamagedObjectError("trim marker has a bad magic or CRC")
    if version != OBJECT_FORMAT_VERSION:
        raise NewerFormatError(f"trim marker format version {version}; this stratalog reads version "
                               f"{OBJECT_FORMAT_VERSION}: upgrade stratalog")
    if flags != 0 or trim_offset < TRIM_NONE:
        raise DamagedObjectError(f"trim marker out of range (flags {flags}, trim {trim_offset})")
    return int(trim_offset)
