"""Golden bytes for the WAL's on-disk encodings (docs/formats/wal.md): any change here is a format change."""

from __future__ import annotations

from stratalog.wal.format import (
    HEADER_SLOT_BYTES,
    PAD_MAGIC,
    RECORD_HEADER,
    RECORD_MAGIC,
    ShutdownType,
    WALHeader,
    crc32c,
    decode_header,
    encode_header,
    encode_pad,
    encode_record,
)


def test_crc32c_is_castagnoli() -> None:
    # The check value of CRC-32C over "123456789" (RFC 3720, appendix B.4).
    assert crc32c(b"123456789") == 0xE3069283


def test_header_golden_bytes() -> None:
    header = WALHeader(7, 1 << 20, 4096, 16 << 20, ShutdownType.GRACEFUL)
    encoded = encode_header(header)
    assert len(encoded) == HEADER_SLOT_BYTES
    assert encoded[:44].hex() == (
        "534c5748"            # magic "SLWH"
        "0100" "0100"         # version 1, shutdown graceful
        "0700000000000000"    # sequence 7
        "0000100000000000"    # capacity 1 MiB
        "0010000000000000"    # trim offset 4096
        "0000000100000000"    # window 16 MiB
        "941ba501"            # crc32c of the 40 bytes before
    )
    assert encoded[44:] == bytes(HEADER_SLOT_BYTES - 44)
    assert decode_header(encoded) == header


def test_record_golden_bytes() -> None:
    assert encode_record(8192, b"hello").hex() == (
        "534c5752"            # magic "SLWR"
        "05000000"            # body length 5
        "0020000000000000"    # logical offset 8192
        "4cbb719a"            # crc32c(b"hello")
        "b5bd9d51"            # crc32c of the 20 header bytes before
        "68656c6c6f"          # body
    )
    magic, length, offset, body_crc, _ = RECORD_HEADER.unpack_from(encode_record(8192, b"hello"))
    assert (magic, length, offset, body_crc) == (RECORD_MAGIC, 5, 8192, crc32c(b"hello"))


def test_pad_golden_bytes() -> None:
    pad = encode_pad(12288, 16384)
    assert pad.hex() == (
        "534c5750"            # magic "SLWP"
        "e80f0000"            # body length: 16384 - 12288 - 24
        "0030000000000000"    # logical offset 12288
        "00000000"            # no body CRC: the body is never written
        "81ec0471"            # header crc32c
    )
    assert RECORD_HEADER.unpack_from(pad)[0] == PAD_MAGIC


def test_header_decode_rejects_each_damage() -> None:
    good = bytearray(encode_header(WALHeader(3, 1 << 20, -1, 1 << 20, ShutdownType.UNCLEAN)))
    assert decode_header(good) is not None
    for position in range(44):
        damaged = bytearray(good)
        damaged[position] ^= 0x10
        assert decode_header(damaged) is None, f"a flipped bit at byte {position} went unnoticed"
