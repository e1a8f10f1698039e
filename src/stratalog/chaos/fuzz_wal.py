"""Fuzz target of the write-ahead log: open and recover a device whose bytes are the input.

``wal_recovery`` builds a small WAL device (two header slots and a 48 KiB ring) in the in-memory
``MemDevice``, opens it with ``WriteAheadLog.open`` and runs ``recover`` to its end. The contract:
open and recovery return or raise a WALError (CorruptHeaderError, CapacityMismatchError, ...); every
record returned has a valid header and body CRC where it lies, an offset above the trim and above the
record before it; and the log recovered is a working log: a second recovery returns the records of
the first, then a record appended in between.

The device is built from the input in one of two ways (control byte, bit 1): *raw*, the input's bytes
copied into the ring; or *records*, a list of operations that lay records out as the writer does (with
valid CRCs), with damage of every kind recovery must survive: bad body CRCs, headers of an older lap,
holes to the next 4 KiB, a pad to the ring's end, raw bytes. A valid header (bit 0) with the input's
trim offset and window is written to one of the slots; without it, the slots are the input's too. In
records mode with nothing damaged and nothing trimmed, recovery must return exactly the records laid.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from stratalog.chaos.fuzz_targets import FuzzTarget, Reader, check
from stratalog.errors import WALError
from stratalog.io.faulty import MemDevice
from stratalog.wal.config import WALConfig
from stratalog.wal.format import (
    ALIGN_BYTES,
    HEADER_SLOT_BYTES,
    HEADERS_BYTES,
    RECORD_HEADER,
    RECORD_HEADER_BYTES,
    RECORD_HEADER_CRC_COVERS_BYTES,
    RECORD_MAGIC,
    TRIM_NONE,
    ShutdownType,
    WALHeader,
    align_up,
    crc32c,
    encode_header,
    encode_pad,
    encode_record,
)
from stratalog.wal.log import WriteAheadLog
from stratalog.wal.object_format import (
    TRIM_MARKER,
    DamagedObjectError,
    decode_object,
    decode_trim_marker,
    encode_object,
    encode_trim_marker,
)

#: The smallest WAL the config below accepts: a ring of four of its largest blocks (8 KiB) and a page each.
CONFIG = WALConfig(block_bytes_soft_max=ALIGN_BYTES, record_bytes_max=ALIGN_BYTES, window_bytes_max=16 << 10,
                   buffered_bytes_max=64 << 10, io_threads=1, recovery_read_bytes=ALIGN_BYTES)
RING_BYTES = 48 << 10
CAPACITY_BYTES = HEADERS_BYTES + RING_BYTES
#: Control byte bits.
VALID_HEADER = 0x01
RECORDS_MODE = 0x02
SECOND_SLOT = 0x04
#: Operations of records mode (one byte each, then its arguments).
OP_RECORD, OP_BAD_BODY, OP_OLD_LAP, OP_HOLE, OP_PAD, OP_RAW = range(6)
OPERATIONS = 6
BODY_BYTES_MAX = ALIGN_BYTES - RECORD_HEADER_BYTES


def check_recovery(data: bytes) -> None:
    image, laid, exact = build_device(data)
    _recover_and_append(image, laid, exact=exact)


def build_device(data: bytes) -> tuple[bytearray, dict[int, bytes], bool]:
    """The device image an input describes, the records laid out in it (by offset), and whether
    recovery must return exactly those (nothing damaged, nothing trimmed, the whole ring in the window)."""
    reader = Reader(data)
    control = reader.u8()
    image = bytearray(CAPACITY_BYTES)
    trim = TRIM_NONE
    window = CONFIG.window_bytes_max
    if control & VALID_HEADER:
        trim = reader.uint(3) - 1          # -1 (nothing trimmed) up to ~16 M: laps of the ring too
        window = reader.uint(3)
        header = WALHeader(reader.uint(2), CAPACITY_BYTES, trim, window, ShutdownType(reader.u8() & 1))
        slot = HEADER_SLOT_BYTES if control & SECOND_SLOT else 0
        image[slot:slot + HEADER_SLOT_BYTES] = encode_header(header)
    laid: dict[int, bytes] = {}
    damaged = True
    if control & RECORDS_MODE:
        damaged = _lay_records(reader, image, max(trim, 0), laid)
    else:
        start = HEADERS_BYTES if control & VALID_HEADER else 0   # without a header, the slots are input too
        raw = reader.take(CAPACITY_BYTES - start)
        image[start:start + len(raw)] = raw
    return image, laid, not damaged and trim == TRIM_NONE and window >= RING_BYTES


def _lay_records(reader: Reader, image: bytearray, start: int, laid: dict[int, bytes]) -> bool:
    """Lay the input's operations out from logical ``start``; return whether any damaged the log."""
    position = start
    damaged = False
    end = start + RING_BYTES
    while reader.remaining and position < end:
        op = reader.u8() % OPERATIONS
        room = RING_BYTES - position % RING_BYTES
        if op in (OP_RECORD, OP_BAD_BODY, OP_OLD_LAP):
            body = reader.take(reader.below(BODY_BYTES_MAX + 1))
            if RECORD_HEADER_BYTES + len(body) > room:
                continue
            offset = position - RING_BYTES if op == OP_OLD_LAP else position
            record = bytearray(encode_record(max(offset, 0), body))
            if op == OP_BAD_BODY and body:
                record[-1] ^= 0x01
            _write_ring(image, position, record)
            if op == OP_RECORD:
                laid[position] = body
            damaged |= op != OP_RECORD
            position += len(record)
        elif op == OP_HOLE:
            position = align_up(position + 1)
            damaged = True
        elif op == OP_PAD:
            if room >= RECORD_HEADER_BYTES:
                _write_ring(image, position, encode_pad(position, position + room))
            position += room
        else:
            raw = reader.take(reader.below(64))
            _write_ring(image, position, raw[:room])
            position += min(len(raw), room)
            damaged = True
    return damaged


def _write_ring(image: bytearray, position: int, data: bytes | bytearray) -> None:
    at = HEADERS_BYTES + position % RING_BYTES
    image[at:at + len(data)] = data


def _recover_and_append(image: bytearray, laid: dict[int, bytes], *, exact: bool) -> None:
    device = MemDevice(CAPACITY_BYTES, image=image)
    try:
        wal = WriteAheadLog.open(device, create=False, config=CONFIG)
    except WALError:
        return
    window_bytes = wal._header_window_bytes   # what the first scan reads past the last valid record
    try:
        recovered = list(wal.recover())
        stats = wal.recovery_stats
        _check_recovered(device.visible_image(), wal.trim_offset, recovered)
        if exact:
            check([(r.offset, r.data) for r in recovered] == sorted(laid.items()),
                  "recovery of an undamaged log did not return exactly the records laid out")
        else:
            check(all(laid.get(r.offset, r.data) == r.data for r in recovered),
                  "a recovered record differs from the record laid out at its offset")
        appended = wal.append(b"after recovery")
        appended.future.result()
    finally:
        wal.close()
    again = WriteAheadLog.open(device, create=False, config=CONFIG)
    try:
        second = list(again.recover())
    finally:
        again.close()
    # Every record of the first recovery is still there, then the appended one. Others may come back
    # only from beyond the first scan's reach (its header's window past the last valid record): only a
    # crafted device holds those (a writer never writes past its window), and recovery leaves them in
    # place by design (see docs/fuzzing.md, "What the targets do not promise").
    # The first scan stopped before this position: a window past the aligned end of the last valid
    # record (valid_end is that end, or trim + 1 when there was none: the scan started at the trim).
    reach = align_up(max(stats.valid_end - 1, 0)) + window_bytes
    expected = [*(r for r in recovered if r.offset > again.trim_offset), (appended.offset, b"after recovery")]
    found = [r for r in second if r in expected or r.offset < reach]
    check(found == expected, "the next recovery does not return the records recovered, then the one appended")


def _check_recovered(image: bytes | bytearray, trim_offset: int, recovered: Sequence[tuple[int, bytes]]) -> None:
    previous = trim_offset
    for offset, body in recovered:
        check(offset > previous, f"record at {offset} returned after {previous} (order, or at/below the trim)")
        at = HEADERS_BYTES + offset % RING_BYTES
        magic, body_bytes, stored_offset, body_crc, header_crc = RECORD_HEADER.unpack_from(image, at)
        check(magic == RECORD_MAGIC and stored_offset == offset and body_bytes == len(body)
              and header_crc == crc32c(image[at:at + RECORD_HEADER_CRC_COVERS_BYTES]),
              f"record at {offset} returned without a valid record header there")
        check(crc32c(body) == body_crc and image[at + RECORD_HEADER_BYTES:at + RECORD_HEADER_BYTES + len(body)] == body,
              f"record at {offset} returned with a body that is not the one stored, or fails its CRC")
        previous = offset


def recovery_seeds() -> list[bytes]:
    header = bytes([0, 0, 0]) + (16 << 10).to_bytes(3, "little") + bytes([1, 0, 0])
    records = b"".join(bytes([OP_RECORD]) + struct.pack("<H", n) + bytes(range(256)) * (n // 256) + bytes(n % 256)
                       for n in (10, 100, 1000))
    seeds = [
        bytes([VALID_HEADER | RECORDS_MODE]) + header + records,
        bytes([VALID_HEADER | RECORDS_MODE]) + header + records + bytes([OP_HOLE]) + records,
        bytes([VALID_HEADER | RECORDS_MODE]) + header + bytes([OP_BAD_BODY, 50, 0]) + bytes(50) + records,
        bytes([VALID_HEADER | RECORDS_MODE]) + header + bytes([OP_PAD]) + records,
        bytes([VALID_HEADER | RECORDS_MODE | SECOND_SLOT]) + header + bytes([OP_OLD_LAP, 9, 0]) + bytes(9) + records,
        bytes([VALID_HEADER]) + header + encode_record(0, b"golden") + encode_pad(30, 4096),
        bytes([0]) + encode_header(WALHeader(3, CAPACITY_BYTES, TRIM_NONE, 1 << 14, ShutdownType.GRACEFUL)),
    ]
    return seeds


def check_object_wal(data: bytes) -> None:
    """A batch object of the object WAL and its trim marker, decoded as recovery reads them. Half the
    inputs are valid objects of fuzzed records with one fuzzed byte change, so the checks past the header
    are reached. Whatever decodes re-encodes to the same bytes: no two objects read the same."""
    reader = Reader(data)
    if reader.u8() & 1:
        first = reader.below(1 << 40)
        records = [reader.take(reader.below(300)) for _ in range(1 + reader.below(8))]
        raw = bytearray(encode_object(first, records, 1 + reader.below(16)))
        if reader.u8() & 1:
            raw[reader.below(len(raw))] ^= 1 + reader.below(255)
        expected_first = first
    else:
        expected_first = reader.below(1 << 40)
        raw = bytearray(reader.rest())
    try:
        header, bodies = decode_object(expected_first, bytes(raw))
    except DamagedObjectError:
        pass
    else:
        check(header.first_offset == expected_first and len(bodies) == header.record_count,
              "a decoded object's header disagrees with its key or its records")
        check(encode_object(header.first_offset, bodies, header.puts_in_flight_max) == bytes(raw),
              "a decoded object does not re-encode to its own bytes")
    try:
        trim = decode_trim_marker(bytes(raw[:TRIM_MARKER.size]))
    except DamagedObjectError:
        return
    check(encode_trim_marker(trim) == bytes(raw[:TRIM_MARKER.size]), "a trim marker does not re-encode")


def object_wal_seeds() -> list[bytes]:
    return [
        bytes([1]) + (7).to_bytes(5, "little") + bytes([2, 5]) + b"hello" + bytes([0, 3]) + bytes([0]),
        bytes([0]) + (7).to_bytes(5, "little") + encode_object(7, [b"a", b"bc"], 8),
        bytes([0, 0, 0, 0, 0, 0]) + encode_trim_marker(41),
    ]


TARGETS = (
    FuzzTarget("wal_object", "object WAL: object_format.decode_object and decode_trim_marker; round trips",
               check_object_wal, (DamagedObjectError,), object_wal_seeds),
    FuzzTarget("wal_recovery", "WriteAheadLog.open + recover on a device of fuzzed bytes, then append and "
               "recover again", check_recovery, (WALError,), recovery_seeds, input_bytes_max=CAPACITY_BYTES),
)
