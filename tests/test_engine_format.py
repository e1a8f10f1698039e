"""Golden bytes and damage detection for batches and objects (docs/formats/object.md)."""

from __future__ import annotations

import pytest

from stratalog.engine.batch import CorruptBatchError, NewRecord, check_batch, decode_records, encode_batch
from stratalog.engine.objformat import (
    FOOTER_BYTES,
    CorruptObjectError,
    ObjectBuilder,
    StreamBatch,
    check_block,
    decode_footer,
    decode_index,
)
from stratalog.wal.format import crc32c

FLAG_PROVISIONAL = 1

BATCH_HEX = (
    "0700000000000000" "0000000000000000" "01000000" "41000000" "e803000000000000" "00" "000000" "3fdbeb0e"
    "15000000" "e803000000000000" "01000000" "02000000" "0000" "6b" "6869"
)
INDEX_AND_FOOTER_HEX = (
    "0700000000000000" "0000000000000000" "0100000000000000" "0000000000000000" "41000000" "01000000"
    "e803000000000000" "5474d4ba"
    "4100000000000000" "34000000" "99486df3" "01000000" "0300" "0000" "534c4f42" "eaeaba78"
)


PROVISIONAL_INDEX_AND_FOOTER_HEX = (
    "0000000000000000" "0000000000000000" "0100000000000000" "0000000000000000" "41000000" "01000000"
    "e803000000000000" "fee3e017"
    "4100000000000000" "34000000" "856525d0" "01000000" "0300" "0100" "534c4f42" "5d4caf78"
)


def example() -> tuple[bytes, bytes]:
    batch, ts = encode_batch(7, 0, [NewRecord(b"hi", key=b"k", timestamp_ms=1000)], now_ms=1000)
    builder = ObjectBuilder()
    builder.add_stream(7, [StreamBatch(0, 1, ts, batch)])
    return batch, builder.finish()


def test_batch_golden_bytes() -> None:
    batch, _ = example()
    assert batch.hex() == BATCH_HEX


def test_object_golden_bytes_and_round_trip() -> None:
    batch, obj = example()
    assert obj[:len(batch)] == batch
    assert obj[len(batch):].hex() == INDEX_AND_FOOTER_HEX
    footer = decode_footer(obj[-FOOTER_BYTES:], len(obj))
    (entry,) = decode_index(obj[footer.index_position:footer.index_position + footer.index_bytes], footer)
    block = check_block(obj[entry.position:entry.position + entry.size_bytes], entry)
    info = check_batch(block)
    assert [(r.offset, r.key, r.value, r.timestamp_ms) for r in decode_records(block, 0, info)] == [
        (0, b"k", b"hi", 1000)]


def test_provisional_object_golden_bytes() -> None:
    batch, ts = encode_batch(0, 0, [NewRecord(b"hi", key=b"k", timestamp_ms=1000)], now_ms=1000)
    builder = ObjectBuilder(flags=FLAG_PROVISIONAL)
    builder.add_stream(0, [StreamBatch(0, 1, ts, batch)])
    obj = builder.finish()
    assert obj[len(batch):].hex() == PROVISIONAL_INDEX_AND_FOOTER_HEX
    footer = decode_footer(obj[-FOOTER_BYTES:], len(obj))
    assert footer.provisional and (footer.version, footer.flags) == (3, FLAG_PROVISIONAL)
    assert not decode_footer(example()[1][-FOOTER_BYTES:], len(example()[1])).provisional


def test_unknown_versions_and_flags_are_refused() -> None:
    _, obj = example()
    for version, flags, message in ((4, 0, "version 4"), (2, 0, "version 2"), (1, 0, "version 1"),
                                    (3, 2, "flags")):
        head = bytearray(obj[-FOOTER_BYTES:-4])
        head[20:24] = version.to_bytes(2, "little") + flags.to_bytes(2, "little")
        footer = bytes(head) + crc32c(bytes(head)).to_bytes(4, "little")
        with pytest.raises(CorruptObjectError, match=message):
            decode_footer(footer, len(obj))


def test_every_byte_of_a_batch_record_is_covered() -> None:
    batch, _ = example()
    for position in range(36, len(batch)):
        damaged = bytearray(batch)
        damaged[position] ^= 0x01
        with pytest.raises(CorruptBatchError):
            check_batch(bytes(damaged))


def test_damaged_object_parts_are_refused() -> None:
    _, obj = example()
    footer = decode_footer(obj[-FOOTER_BYTES:], len(obj))
    for position in range(len(obj) - FOOTER_BYTES, len(obj)):
        damaged = bytearray(obj)
        damaged[position] ^= 0x01
        with pytest.raises(CorruptObjectError):
            decode_footer(bytes(damaged[-FOOTER_BYTES:]), len(obj))
    index = bytearray(obj[footer.index_position:footer.index_position + footer.index_bytes])
    index[10] ^= 0x01
    with pytest.raises(CorruptObjectError, match="index"):
        decode_index(bytes(index), footer)
    (entry,) = decode_index(obj[footer.index_position:footer.index_position + footer.index_bytes], footer)
    block = bytearray(obj[:entry.size_bytes])
    block[3] ^= 0x01
    with pytest.raises(CorruptObjectError, match="bad CRC"):
        check_block(bytes(block), entry)


def test_blocks_split_near_the_target_and_stay_contiguous() -> None:
    builder = ObjectBuilder(block_bytes_target=1000)
    batches = []
    for i in range(10):
        data, ts = encode_batch(3, i * 2, [b"x" * 200, b"y" * 200], now_ms=i)
        batches.append(StreamBatch(i * 2, 2, ts, data))
    entries = builder.add_stream(3, batches)
    assert len(entries) == 10 // 2
    assert [(e.start_offset, e.end_offset) for e in entries] == [(i, i + 4) for i in range(0, 20, 4)]
    with pytest.raises(ValueError, match="ascending"):
        builder.add_stream(2, batches)
    with pytest.raises(ValueError, match="contiguous"):
        ObjectBuilder().add_stream(4, [batches[0], batches[2]])
