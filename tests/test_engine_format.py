"""Golden bytes and damage detection for batches and objects (docs/formats/object.md)."""

from __future__ import annotations

import pytest

from stratalog.chaos import fuzz_engine
from stratalog.engine.batch import CorruptBatchError, check_batch, decode_records, encode_batch
from stratalog.engine.manifest import ManifestError
from stratalog.engine.objformat import (
    FOOTER_BYTES,
    CorruptObjectError,
    ObjectBuilder,
    StreamBatch,
    check_block,
    decode_footer,
    decode_index,
)
from stratalog.records import NewRecord
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


def test_fuzz_finding_a_kafka_body_shorter_than_its_base_offset_is_corrupt_batch() -> None:
    # Found by `stratalog chaos fuzz` (engine_batch): struct.error escaped the reader.
    data = bytes.fromhex(
        "010100000000000000faff00000000000000000000000000000000000000000000015e000000004f00003a0000000000")
    with pytest.raises(CorruptBatchError):
        fuzz_engine.check_engine_batches(data)


def test_fuzz_finding_a_kafka_batch_placed_beyond_an_int64_offset_is_corrupt_batch() -> None:
    # Found by `stratalog chaos fuzz` (engine_batch): struct.error escaped the reader.
    data = bytes.fromhex(
        "010300000000000000be000000000000b60200000078000000ed0300000000000001000000ff565758595a5b5c5d5e5f"
        "600000e803000000000000ffffff5b0100000000006114000000e803001000000000ffffffff02000000000062621300"
        "00000900000000000000d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1"
        "d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1ffffffff01000000000063")
    with pytest.raises(CorruptBatchError):
        fuzz_engine.check_engine_batches(data)


def test_fuzz_finding_a_header_name_that_is_not_utf8_is_corrupt_batch() -> None:
    # Found by `stratalog chaos fuzz` (engine_batch): UnicodeDecodeError escaped the reader.
    data = bytes.fromhex(
        "010100000000000000260000000001000000000001090000000000000000000000000000000000000000000000000000"
        "000000400000000000010000004f0000000500000000000000000000009ea7dc0a230000000500000000000031010400"
        "000400000100000002006b76010068010000060606060606060606060606060606068f06060606060606060606060606"
        "0606060606060606060606060606060606060606060606060606004f00000005000000")
    with pytest.raises(CorruptBatchError):
        fuzz_engine.check_engine_batches(data)


def test_fuzz_finding_a_header_name_length_past_the_batch_is_corrupt_batch() -> None:
    # Found by `stratalog chaos fuzz` (engine_batch): struct.error escaped the reader.
    data = bytes.fromhex(
        "0101000000000000000000000000000000010000004f0000000500000000000000000000009ea7dc0a23000000050000"
        "0000000000010400000100000002006b76010068010000007801006effffffff")
    with pytest.raises(CorruptBatchError):
        fuzz_engine.check_engine_batches(data)


def test_fuzz_finding_a_header_value_length_past_the_batch_is_corrupt_batch() -> None:
    # Found by `stratalog chaos fuzz` (engine_batch): struct.error escaped the reader.
    data = bytes.fromhex(
        "01030000000000000028000000000000000200000078000000ed0300000000000001000000ffd68b3a00000000000000"
        "2800000044ffffffff027d16979800000000000100000000000003e800000000000003edffffffffffffffffffffffff"
        "ffff0000000212000000026b0468690010000a020104796f0002000000000000000700000000000000030000006e0000"
        "00e803000000000000000000006eb8b0be13000000e803000000000000ffffffff0100000000006114000000e8030000"
        "00000000ffffffff0200000000006262130000000900000000000000ffffffff01000000ffffffff0200")
    with pytest.raises(CorruptBatchError):
        fuzz_engine.check_engine_batches(data)


def test_fuzz_finding_manifest_with_a_value_that_is_not_an_int_is_a_manifest_error() -> None:
    # Found by `stratalog chaos fuzz` (engine_manifest): ValueError escaped read_manifest.
    data = bytes.fromhex(
        "7b22666f726d6174223a20312c20226b696e64223a2022736e617073686f74222c2022736571223a20312c2022707274"
        "7265616d73223a205b7b226964223a20312c20226e616d65223a202261222c20227374617274223a20302c2022656e64"
        "223a2031307d5d2c2022736571223a2022646174612f32222c2022626c6f6373747265616d73223a205b7b226964223a"
        "20322c20226e616d65223a202261222c20227374617274223a20352c2022656e64223a20302c2022656e64223a20317d"
        "5d2c20226f626a65637473223a205b7b226b6579223a2022646174612f32222c2022626c6f636b73223a205b5b312c20"
        "31302c2032302c20302c2035302c2031302c302c20315d2c205b322c20302c20312c2035302c20392c20312c20352c20"
        "325d5d7d5d2c202272656d6f766564223a205b22646174612f31225d7d")
    with pytest.raises(ManifestError):
        fuzz_engine.check_manifest(data)


def test_fuzz_finding_manifest_with_a_field_of_the_wrong_type_is_a_manifest_error() -> None:
    # Found by `stratalog chaos fuzz` (engine_manifest): TypeError escaped read_manifest.
    data = bytes.fromhex(
        "7b22666f726d6174223a20312c20226b696e64223a2022736e617073686f74222c2022736571223a20312c2022707265"
        "76223a206e756c6c2c202273747265616d73223a205b7b226964223a2031302c20226e616d65223a202261222c202273"
        "74617274223a20302c2022656e64223a2031307d5d2c20226f626a65637473223a205b7b226b6579223a202264617461"
        "2f31222c2022626c6f6d65223a206e756c6c2c20227374617274223a20302c2022656e64223a20317d5d2c20226f626a"
        "65637473223a205b7b226b6579223a2022646174612f32222c2022626c6f636b73223a205b5b312c2031302c2032302c"
        "20302c2035302c2031302c20323030302c20315d2c205b322c2035302c20392c20312c20352c20325d5d7d5d2c202272"
        "656d6f766564223a205b22646174612f31225d7d")
    with pytest.raises(ManifestError):
        fuzz_engine.check_manifest(data)


def test_fuzz_finding_manifest_with_a_missing_field_is_a_manifest_error() -> None:
    # Found by `stratalog chaos fuzz` (engine_manifest): KeyError escaped read_manifest.
    data = bytes.fromhex(
        "7b22666f726d6174223a20312c20226b696e64223a2022736e617073686f74222c2022736571223a20312c2022707265"
        "76223a206e756c6c2c202273747265616d73223a205b7b226964223a20312c20226e616d65223a202261222c20227374"
        "617274223a20302c2022656e64223a2031307d5d2c20226f626a65635473223a205b7b226b6579223a2022646174612f"
        "31222c2022626c6f636b73223a205b5b312c20302c2031302c20302c203130302c2031302c20313030302c2031323334"
        "355d5d7d5d2c202272656d6f766564223a205b5d7d")
    with pytest.raises(ManifestError):
        fuzz_engine.check_manifest(data)


def test_fuzz_finding_manifest_with_bytes_that_are_not_utf8_is_a_manifest_error() -> None:
    # Found by `stratalog chaos fuzz` (engine_manifest): UnicodeDecodeError escaped read_manifest.
    data = bytes.fromhex(
        "7b22666f726d6174223a20312c20226b696e64223a2022736e617073686f74222c2022736571223a20312c2022707265"
        "76223a206e756c6c2c202273747265616d73223a205b7b226964223a20312c20226e616d65e23a202261222c20227374"
        "617274223a20302c2022656e64223a2031307d5d2c20226f626a65637473223a205b7b226b6579223a2022646174612f"
        "31222c2022626c6f636b73223a205b5b312c20302c2031302c20302c203130302c2031302c20313030302c2031323334"
        "355d5d7d5d2c202272656d6f766564223a205b5d7d130a7b22666f726d6174223a20312c20226b696e64223a20226465"
        "6c7461222c2022736571223a20322c202270726576223a20312c202273747265616d73223a205b7b226964223a20312c"
        "20226e616d65223a202261222c20227374617274223a20352c2022656e64223a2032307d2c207b226964223a20322c20"
        "226e616d65223a206e756c6c2c20227374617274223a20302c2022656e64223a20317d5d2c20226f626a65637473223a"
        "205b7b226b6579223a2022646174612f32222c2022626c6f636b73223a205b5b312c2031302c2032302c20302c203530"
        "2c2031302c20323030302c20312c20312c2035302c20392c20312c20352c20325d5d7d5d2c202272656d6f766564223a"
        "205b22646174612f31225d7d")
    with pytest.raises(ManifestError):
        fuzz_engine.check_manifest(data)


def test_fuzz_finding_manifest_with_an_empty_document_is_a_manifest_error() -> None:
    # Found by `stratalog chaos fuzz` (engine_manifest): JSONDecodeError escaped read_manifest.
    data = bytes.fromhex(
        "")
    with pytest.raises(ManifestError):
        fuzz_engine.check_manifest(data)


def test_fuzz_finding_manifest_with_block_fields_that_are_strings_is_a_manifest_error() -> None:
    # Found by `stratalog chaos fuzz` (engine_manifest): ContractViolationError escaped read_manifest.
    data = bytes.fromhex(
        "7b22666f726d6174223a20312c20226b696e64223a2022736e617073686f74222c2022736571223a20312c2022707265"
        "76223a206e756c6c2c202273747265616d73223a205b7b226964223a20322c20226e616d65223a20225e222c20227374"
        "617274223a20302c2022656e64223a2031307d5d2c20226f626a65637473223a205b7b226b6579223a2022646174612f"
        "31222c2022626c6f636b73223a205b5b312c20302c2031302c20302c203130302c2031302c20313030302c2031323334"
        "355d5d7d5d2c202272656d6f766564223a205b5d7d0a0a7b22666f726d6174223a20312c20226b696e64223a20226465"
        "6c7461222c2022736571223a20322c202270726576223a20312c202273747265616d73223a205b7b226964223a20312c"
        "20226e616d65223a202261222c20227374617274223a20352c2022656e64223a2032307d2c207b226964223a20322c20"
        "226e616d65223a206e756c6c2c20227374617274223a20302c2022656e64223a20317d5d2c20226f626a65637473223a"
        "205b7b226b6579223a2022646174612f32222c2022626c6f636b73223a205b5b312c2031302c2032302c20302c203530"
        "2c2031302c2032302e302c20315d2c205b322c20302c20312c2035302c20392c20312c20352c20325d5d7d5d2c202272"
        "656d6f766564223a205b22646174612f31225d7d")
    with pytest.raises(ManifestError):
        fuzz_engine.check_manifest(data)
