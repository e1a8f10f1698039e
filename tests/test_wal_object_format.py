"""The object WAL's format: golden bytes, and one test per way an object can be damaged."""

from __future__ import annotations

import struct

import pytest

from enginekit import MemoryStore
from owalkit import PREFIX, key, new_wal, reopen
from stratalog.wal.format import crc32c
from stratalog.wal.object_format import (
    FOOTER_BYTES,
    OBJECT_HEADER_BYTES,
    DamagedObjectError,
    NewerFormatError,
    check_owner,
    decode_object,
    decode_object_header,
    decode_trim_marker,
    encode_object,
    encode_trim_marker,
    object_key,
    offset_of_key,
    owner_prefix,
)
from waiting import wait_until

#: The worked example of docs/formats/object-wal.md: "hello" and "world" from offset 0, written by a
#: writer with 8 puts in flight.
HELLO_WORLD = bytes.fromhex(
    "534c574f010000000000000000000000"
    "02000000080000003a00000000000000"
    "7ab95cb2534c57520500000000000000"
    "000000004cbb719a67c7bcea68656c6c"
    "6f534c57520500000001000000000000"
    "004e81aa314062522b776f726c64534c"
    "5746cc9fec6b"
)
TRIM_41 = bytes.fromhex("534c5754010000002900000000000000c198bf6c")


def test_an_object_has_the_golden_bytes_of_the_spec() -> None:
    assert encode_object(0, [b"hello", b"world"], 8) == HELLO_WORLD
    assert len(HELLO_WORLD) == OBJECT_HEADER_BYTES + 2 * (24 + 5) + FOOTER_BYTES == 102


def test_the_golden_object_decodes_to_its_records() -> None:
    header, bodies = decode_object(0, HELLO_WORLD)
    assert bodies == [b"hello", b"world"]
    assert (header.first_offset, header.record_count, header.end_offset, header.puts_in_flight_max) == (0, 2, 2, 8)


def test_the_trim_marker_has_the_golden_bytes_of_the_spec() -> None:
    assert encode_trim_marker(41) == TRIM_41
    assert decode_trim_marker(TRIM_41) == 41
    assert decode_trim_marker(encode_trim_marker(-1)) == -1


def test_crc32c_is_the_castagnoli_check_value() -> None:
    assert crc32c(b"123456789") == 0xE3069283


def test_keys_sort_in_offset_order_and_name_their_offset() -> None:
    prefix = owner_prefix("broker-1")
    assert prefix == "wal/broker-1/"
    keys = [object_key(prefix, n) for n in (0, 9, 10, 255, 1 << 40)]
    assert keys == sorted(keys)
    assert keys[3] == "wal/broker-1/00000000000000ff"
    assert [offset_of_key(prefix, k) for k in keys] == [0, 9, 10, 255, 1 << 40]
    assert offset_of_key(prefix, prefix + "trim") is None
    assert offset_of_key(prefix, prefix + "damaged/00000000000000ff-1") is None
    assert offset_of_key(prefix, "wal/broker-10/0000000000000000") is None


@pytest.mark.parametrize("owner", ["", "a/b", "..", ".hidden", "x" * 65, "a b"])
def test_owner_names_that_cannot_be_a_key_segment_are_refused(owner: str) -> None:
    with pytest.raises(ValueError, match="WAL owner"):
        check_owner(owner)


def _flip(data: bytes, at: int) -> bytes:
    out = bytearray(data)
    out[at] ^= 0x01
    return bytes(out)


@pytest.mark.parametrize(("what", "damaged", "reason"), [
    ("empty", b"", "shorter than an object header"),
    ("header only", HELLO_WORLD[:OBJECT_HEADER_BYTES], "truncated"),
    ("cut in a record", HELLO_WORLD[:70], "truncated"),
    ("footer cut", HELLO_WORLD[:-1], "truncated"),
    ("bytes appended", HELLO_WORLD + b"\0", "truncated or extended"),
    ("magic", _flip(HELLO_WORLD, 0), "bad object magic"),
    ("header field", _flip(HELLO_WORLD, 16), "object header CRC"),
    ("record header", _flip(HELLO_WORLD, 40), "object CRC"),
    ("body byte", _flip(HELLO_WORLD, 60), "object CRC"),
    ("footer magic", _flip(HELLO_WORLD, 96), "bad footer magic"),
    ("footer CRC", _flip(HELLO_WORLD, 100), "object CRC"),
])
def test_every_kind_of_damage_is_detected(what: str, damaged: bytes, reason: str) -> None:
    with pytest.raises(DamagedObjectError, match=reason):
        decode_object(0, damaged)


def _refooter(data: bytearray) -> bytes:
    """Recompute the object CRC, as a writer with a bug (or a forger) would: the record CRCs still catch it."""
    struct.pack_into("<I", data, len(data) - 4, crc32c(bytes(data[:-FOOTER_BYTES])))
    return bytes(data)


def test_a_body_damaged_under_a_valid_object_crc_fails_its_record_crc() -> None:
    data = bytearray(HELLO_WORLD)
    data[60] ^= 0x01
    with pytest.raises(DamagedObjectError, match="body CRC"):
        decode_object(0, _refooter(data))


def test_a_record_with_the_wrong_offset_is_refused() -> None:
    other = encode_object(5, [b"hello", b"world"], 8)
    data = bytearray(HELLO_WORLD)
    data[OBJECT_HEADER_BYTES:-FOOTER_BYTES] = other[OBJECT_HEADER_BYTES:-FOOTER_BYTES]
    with pytest.raises(DamagedObjectError, match="says offset 5"):
        decode_object(0, _refooter(data))


def test_an_object_under_another_offset_key_is_refused() -> None:
    with pytest.raises(DamagedObjectError, match="its key 16"):
        decode_object(16, HELLO_WORLD)


def test_a_newer_version_says_upgrade() -> None:
    data = bytearray(HELLO_WORLD)
    data[4] = 2
    struct.pack_into("<I", data, 32, crc32c(bytes(data[:32])))
    with pytest.raises(NewerFormatError, match="upgrade stratalog"):
        decode_object_header(bytes(data))


@pytest.mark.parametrize("damaged", [TRIM_41[:-1], _flip(TRIM_41, 0), _flip(TRIM_41, 9), _flip(TRIM_41, 19)])
def test_a_damaged_trim_marker_is_refused(damaged: bytes) -> None:
    with pytest.raises(DamagedObjectError):
        decode_trim_marker(damaged)


def test_the_writer_produces_the_worked_example_of_the_spec() -> None:
    store = MemoryStore()
    wal = new_wal(store, linger_s=1.0, object_bytes_soft_max=1 << 20, puts_in_flight_max=8)
    hello, world = wal.append(b"hello"), wal.append(b"world")
    wal.close()
    assert hello.future.result(0) == world.future.result(0) == 2
    assert store.objects == {key(0): HELLO_WORLD}
    _, wal, store = reopen(store.objects)
    wal.trim(1)
    assert store.objects[PREFIX + "trim"] == bytes.fromhex("534c575401000000" "0100000000000000" "82f98423")
    wait_until(lambda: key(0) not in store.objects, "the trimmed object's delete")
    wal.close()
    records, again, _ = reopen(store.objects)
    assert records == [] and again.append(b"next").offset == 2
    again.close()
