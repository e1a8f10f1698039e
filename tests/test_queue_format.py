"""The bulk formats: golden bytes of the worked example in docs/formats/queues.md, round trips, and one
test per way a run object or bulk record can be damaged."""

from __future__ import annotations

import numpy as np
import pytest

from stratalog.engine.bulkformat import (
    OBJECT_FOOTER_BYTES,
    CorruptBulkError,
    build_object,
    decode_bulk,
    decode_footer,
    decode_index,
    decode_run,
    encode_bulk,
)
from stratalog.wal.format import crc32c


def _example() -> bytearray:
    # Queues a (id 0) and b (id 1); a gets x, yz; b gets w; nothing uploaded before.
    data = memoryview(b"xyzw")
    raw, ends, positions = build_object(np.zeros(0, np.uint32), 2, 0, [(0, "a"), (1, "b")],
                                        np.array([0, 1]), np.array([2, 1]), np.array([1, 3, 4]), data)
    assert ends.tolist() == [2, 1] and positions.tolist() == [0, 15, 24]
    return raw


def test_run_object_golden_bytes() -> None:
    raw = _example()

    run_a = bytes.fromhex("01000000 03000000 78797a")
    run_b = bytes.fromhex("01000000 77")
    names = bytes.fromhex("00000000 0100") + b"a" + bytes.fromhex("01000000 0100") + b"b"
    index = bytes.fromhex("02000000 01000000 00000000 0f000000 18000000")
    assert raw[0:4] == crc32c(run_a).to_bytes(4, "little") and raw[4:15] == run_a
    assert raw[15:19] == crc32c(run_b).to_bytes(4, "little") and raw[19:24] == run_b
    assert raw[24:38] == names
    assert raw[38:58] == index
    assert len(raw) == 58 + OBJECT_FOOTER_BYTES
    footer = decode_footer(bytes(raw[58:]), len(raw))
    assert (footer.names_position, footer.names_bytes, footer.first_stream, footer.stream_count,
            footer.message_count) == (24, 14, 0, 2, 3)


def test_run_object_round_trip() -> None:
    raw = bytes(_example())
    footer = decode_footer(raw[-OBJECT_FOOTER_BYTES:], len(raw))
    names, ends, positions = decode_index(raw[footer.names_position:-OBJECT_FOOTER_BYTES], footer)
    assert names == [(0, "a"), (1, "b")]
    assert decode_run(raw[positions[0]:positions[1]], int(ends[0]), "k", 0) == [b"x", b"yz"]
    assert decode_run(raw[positions[1]:positions[2]], int(ends[1]), "k", 1) == [b"w"]


@pytest.mark.parametrize("at", [0, 5, 9, 14])
def test_a_flipped_bit_in_a_run_fails_its_crc(at: int) -> None:
    raw = _example()
    raw[at] ^= 0x10
    with pytest.raises(CorruptBulkError):
        decode_run(bytes(raw[0:15]), 2, "k", 0)


def test_a_flipped_bit_in_the_index_or_footer_is_detected() -> None:
    raw = _example()
    raw[40] ^= 1
    footer = decode_footer(bytes(raw[-OBJECT_FOOTER_BYTES:]), len(raw))
    with pytest.raises(CorruptBulkError, match="index"):
        decode_index(bytes(raw[footer.names_position:-OBJECT_FOOTER_BYTES]), footer)
    raw = _example()
    raw[-10] ^= 1
    with pytest.raises(CorruptBulkError, match="footer"):
        decode_footer(bytes(raw[-OBJECT_FOOTER_BYTES:]), len(raw))
    with pytest.raises(CorruptBulkError, match="add up"):
        decode_footer(bytes(_example()[-OBJECT_FOOTER_BYTES:]), 1000)


def test_bulk_record_round_trip_and_bad_lengths() -> None:
    body = b"".join(encode_bulk(np.array([3, 9]), np.array([10, 0]), np.array([2, 1]), [(9, "new")], 10,
                                np.array([1, 3, 4]), b"xyzw"))
    rec = decode_bulk(body)
    assert rec.stream_ids.tolist() == [3, 9] and rec.base_offsets.tolist() == [10, 0]
    assert rec.counts.tolist() == [2, 1] and rec.names == [(9, "new")] and rec.stream_count == 10
    assert rec.ends.tolist() == [1, 3, 4] and bytes(rec.data) == b"xyzw"
    with pytest.raises(CorruptBulkError):
        decode_bulk(body[:-1])
    with pytest.raises(CorruptBulkError):
        decode_bulk(b"\0" * 4 + body[4:])
