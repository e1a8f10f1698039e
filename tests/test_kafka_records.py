"""Kafka record batches, magic 2 (docs/formats/kafka-batch.md): golden bytes, agreement with
kafka-python's reader and builder, every codec, and refusal of damaged or hostile batches."""

from __future__ import annotations

import contextlib
import gzip
import struct
import tracemalloc
import warnings
from collections.abc import Sequence

import cramjam
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stratalog.kafka import records as kr
from stratalog.kafka.compaction import gap_batch
from stratalog.kafka.record_check import check_records
from stratalog.kafka.records import (
    HEADER_BYTES,
    BatchHeader,
    Compression,
    CorruptRecordError,
    InvalidRecordError,
    KafkaBatchError,
    RecordBatchTooLargeError,
    TimestampType,
    UnsupportedMagicError,
    decode_records,
    encode_batch,
    recompress,
    record_timestamps,
    split_batches,
    with_base_offset,
    write_base_offset,
)
from stratalog.records import Record
from stratalog.wal.format import crc32c

with warnings.catch_warnings():
    # kafka-python 3.0 reads its message schemas with importlib.resources.read_text, deprecated in 3.11.
    warnings.simplefilter("ignore", DeprecationWarning)
    import kafka.errors
    from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

BATCH_BYTES_MAX = 1 << 20
DECOMPRESSED_BYTES_MAX = 1 << 20
MIB = 1 << 20

Headers = Sequence[tuple[str, bytes | None]]
Fields = tuple[bytes | None, bytes | None, Headers, int]

#: The worked example of kafka-batch.md: two records, the second with a null key and a header.
GOLDEN_HEX = (
    "0000000000000000" "00000048" "ffffffff" "02" "301c09ed" "0000" "00000001" "00000000000003e8"
    "00000000000003ed" "ffffffffffffffff" "ffff" "ffffffff" "00000002"
    "12" "00" "00" "00" "026b" "046869" "00"
    "18" "00" "0a" "02" "01" "04796f" "02" "0268" "0276"
)
GOLDEN_RECORDS: list[Fields] = [(b"k", b"hi", (), 1000), (None, b"yo", (("h", b"v"),), 1005)]


# --- helpers: byte surgery and kafka-python ------------------------------------------------------


def reseal(batch: bytes | bytearray) -> bytes:
    """``batch`` with its batchLength and CRC made right again after surgery."""
    out = bytearray(batch)
    struct.pack_into(">i", out, kr.BATCH_LENGTH_POSITION, len(out) - kr.LOG_OVERHEAD_BYTES)
    struct.pack_into(">I", out, kr.CRC_POSITION, crc32c(bytes(out[kr.CRC_COVERS_FROM_POSITION:])))
    return bytes(out)


def patch(batch: bytes, position: int, fmt: str, value: int) -> bytes:
    """``batch`` with one header field replaced, CRC recomputed."""
    out = bytearray(batch)
    struct.pack_into(fmt, out, position, value)
    return reseal(out)


def with_payload(batch: bytes, codec: int, payload: bytes) -> bytes:
    """The header of ``batch`` over a different payload (compressed by the caller), resealed."""
    head = bytearray(batch[:HEADER_BYTES])
    attributes = struct.unpack_from(">h", head, kr.ATTRIBUTES_POSITION)[0]
    struct.pack_into(">h", head, kr.ATTRIBUTES_POSITION, (attributes & ~kr.COMPRESSION_MASK) | codec)
    return reseal(bytes(head) + payload)


def records_part(batch: bytes) -> bytes:
    return batch[HEADER_BYTES:]


def kp_build(records: Sequence[Fields], *, compression: int = 0, producer_id: int = -1,
             producer_epoch: int = -1, base_sequence: int = -1) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=compression, is_transactional=False,
                                        producer_id=producer_id, producer_epoch=producer_epoch,
                                        base_sequence=base_sequence, batch_size=1 << 30)
    for i, (key, value, headers, ts) in enumerate(records):
        assert builder.append(i, timestamp=ts, key=key, value=value, headers=list(headers)) is not None
    return bytes(builder.build())


def kp_read(batch: bytes) -> list[tuple[int, int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]]:
    reader = DefaultRecordBatch(batch)
    assert reader.validate_crc()
    return [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in reader]


def decode(batch: bytes | bytearray | memoryview, **kwargs: int) -> list[Record]:
    return list(decode_records(batch, decompressed_bytes_max=DECOMPRESSED_BYTES_MAX, **kwargs))


def as_fields(records: Sequence[Record]) -> list[tuple[int, int, bytes | None, bytes, Headers]]:
    return [(r.offset, r.timestamp_ms, r.key, r.value, r.headers) for r in records]


def expected(records: Sequence[Fields], base_offset: int = 0) -> list[tuple[int, int, bytes | None, bytes, Headers]]:
    return [(base_offset + i, ts, key, value or b"", tuple(headers))
            for i, (key, value, headers, ts) in enumerate(records)]


SAMPLE: list[Fields] = [
    (b"key-0", b"value-0" * 20, (), 1_700_000_000_000),
    (None, b"", (("trace", b"abc"), ("empty", b""), ("none", None)), 1_700_000_000_005),
    (b"", b"\x00\xff" * 50, (("h\u00e9", b"\x01"),), 1_699_999_999_000),  # earlier than base: negative delta
    (b"k" * 200, b"v" * 300, (), 1_700_000_100_000),
]


# --- golden bytes ---------------------------------------------------------------------------------


def test_golden_batch_bytes_field_by_field() -> None:
    batch = encode_batch(GOLDEN_RECORDS, base_offset=0)
    assert batch.hex() == GOLDEN_HEX
    assert len(batch) == 84
    assert struct.unpack_from(">q", batch, kr.BASE_OFFSET_POSITION) == (0,)
    assert struct.unpack_from(">i", batch, kr.BATCH_LENGTH_POSITION) == (72,)
    assert struct.unpack_from(">i", batch, kr.PARTITION_LEADER_EPOCH_POSITION) == (-1,)
    assert batch[kr.MAGIC_POSITION] == 2
    assert struct.unpack_from(">I", batch, kr.CRC_POSITION) == (crc32c(batch[21:]),)
    assert struct.unpack_from(">I", batch, kr.CRC_POSITION) == (0x301C09ED,)
    assert struct.unpack_from(">h", batch, kr.ATTRIBUTES_POSITION) == (0,)
    assert struct.unpack_from(">i", batch, kr.LAST_OFFSET_DELTA_POSITION) == (1,)
    assert struct.unpack_from(">q", batch, kr.BASE_TIMESTAMP_POSITION) == (1000,)
    assert struct.unpack_from(">q", batch, kr.MAX_TIMESTAMP_POSITION) == (1005,)
    assert struct.unpack_from(">q", batch, kr.PRODUCER_ID_POSITION) == (-1,)
    assert struct.unpack_from(">h", batch, kr.PRODUCER_EPOCH_POSITION) == (-1,)
    assert struct.unpack_from(">i", batch, kr.BASE_SEQUENCE_POSITION) == (-1,)
    assert struct.unpack_from(">i", batch, kr.RECORDS_COUNT_POSITION) == (2,)

    ((position, header),) = split_batches(bytes.fromhex(GOLDEN_HEX), batch_bytes_max=BATCH_BYTES_MAX)
    assert position == 0
    assert header == BatchHeader(base_offset=0, batch_length=72, partition_leader_epoch=-1, magic=2,
                                 crc=0x301C09ED, attributes=0, last_offset_delta=1, base_timestamp_ms=1000,
                                 max_timestamp_ms=1005, producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                 record_count=2)
    assert header.batch_bytes == 84
    assert header.compression is Compression.NONE
    assert header.timestamp_type is TimestampType.CREATE_TIME
    assert not header.is_transactional and not header.is_control
    assert header.last_offset == 1
    assert decode(bytes.fromhex(GOLDEN_HEX)) == [
        Record(0, 1000, b"k", b"hi", ()), Record(1, 1005, None, b"yo", (("h", b"v"),))]


def test_golden_batch_appended_at_offset_40_keeps_its_crc() -> None:
    stored = with_base_offset(bytes.fromhex(GOLDEN_HEX), 40)
    assert stored.hex() == "0000000000000028" + GOLDEN_HEX[16:]
    ((_, header),) = split_batches(stored, batch_bytes_max=BATCH_BYTES_MAX)
    assert header.base_offset == 40
    assert [r.offset for r in decode(stored)] == [40, 41]


def test_a_kafka_python_batch_is_parsed_as_kafka_python_reads_it() -> None:
    batch = kp_build(SAMPLE, producer_id=7, producer_epoch=3, base_sequence=11)
    ((_, header),) = split_batches(batch, batch_bytes_max=BATCH_BYTES_MAX)
    reader = DefaultRecordBatch(batch)
    assert (header.base_offset, header.batch_bytes, header.partition_leader_epoch, header.magic, header.crc,
            header.attributes, header.last_offset_delta, header.base_timestamp_ms, header.max_timestamp_ms,
            header.producer_id, header.producer_epoch, header.base_sequence, header.record_count) == (
        reader.base_offset, reader.size_in_bytes, reader.leader_epoch, reader.magic, reader.crc,
        reader.attributes, reader.last_offset_delta, reader.first_timestamp, reader.max_timestamp,
        reader.producer_id, reader.producer_epoch, reader.base_sequence, reader.records_count)
    ours = [(r.offset, r.timestamp_ms, r.key, r.value, list(r.headers)) for r in decode(batch)]
    assert ours == [(o, t, k, v or b"", h) for o, t, k, v, h in kp_read(batch)]


def test_our_batch_is_kafka_pythons_byte_for_byte_and_reads_back() -> None:
    # kafka-python writes partitionLeaderEpoch 0 where the Java producer writes -1.
    ours = encode_batch(SAMPLE, base_offset=0, producer_id=7, producer_epoch=3, base_sequence=11,
                        partition_leader_epoch=0)
    assert ours == kp_build(SAMPLE, producer_id=7, producer_epoch=3, base_sequence=11)
    shifted = encode_batch(SAMPLE, base_offset=1234)
    assert kp_read(shifted) == [(1234 + i, ts, key, value, list(headers))
                                for i, (key, value, headers, ts) in enumerate(SAMPLE)]


def test_null_values_are_read_as_empty_and_written_as_null() -> None:
    batch = encode_batch([(b"k", None, (), 5)], base_offset=0)
    assert kp_read(batch)[0][3] is None
    assert decode(batch) == [Record(0, 5, b"k", b"", ())]


def test_engine_records_encode_with_dense_offsets() -> None:
    stored = [Record(100, 7, b"a", b"1", ()), Record(555, 9, None, b"2", (("x", None),))]
    batch = encode_batch(stored, base_offset=3)
    assert decode(batch) == [Record(3, 7, b"a", b"1", ()), Record(4, 9, None, b"2", (("x", None),))]


# --- round trips ------------------------------------------------------------------------------------

blobs = st.one_of(st.none(), st.binary(max_size=40))
headers_st = st.lists(st.tuples(st.text(max_size=8), blobs), max_size=4).map(tuple)
timestamps = st.integers(min_value=-(1 << 40), max_value=1 << 45)
fields_st = st.tuples(blobs, blobs, headers_st, timestamps)


@given(st.lists(fields_st, min_size=1, max_size=30), st.integers(min_value=0, max_value=1 << 62),
       st.sampled_from(list(Compression)))
@settings(max_examples=150, deadline=None)
def test_round_trip(records: list[Fields], base_offset: int, compression: Compression) -> None:
    batch = encode_batch(records, base_offset=base_offset, compression=compression)
    ((_, header),) = split_batches(batch, batch_bytes_max=BATCH_BYTES_MAX)
    assert header.compression is compression
    assert header.record_count == len(records)
    assert header.max_timestamp_ms == max(ts for *_, ts in records)
    assert as_fields(decode(batch)) == expected(records, base_offset)
    assert list(record_timestamps(batch, decompressed_bytes_max=DECOMPRESSED_BYTES_MAX)) == [
        (base_offset + i, ts) for i, (*_, ts) in enumerate(records)]
    if compression in (Compression.NONE, Compression.GZIP):  # the codecs kafka-python has here
        assert kp_read(batch) == [(base_offset + i, ts, key, value, list(headers))
                                  for i, (key, value, headers, ts) in enumerate(records)]


@given(st.lists(fields_st, min_size=1, max_size=30), st.sampled_from(list(Compression)),
       st.sampled_from(list(Compression)), st.integers(min_value=-1, max_value=1 << 40))
@settings(max_examples=150, deadline=None)
def test_recompression_changes_the_codec_and_nothing_a_reader_sees(
        records: list[Fields], sent: Compression, stored: Compression, producer_id: int) -> None:
    batch = encode_batch(records, base_offset=0, compression=sent, producer_id=producer_id, producer_epoch=3,
                         base_sequence=17, is_transactional=producer_id % 2 == 1)
    ((_, header),) = split_batches(batch, batch_bytes_max=BATCH_BYTES_MAX)
    again, new_header = recompress(memoryview(batch), header, stored, decompressed_bytes_max=DECOMPRESSED_BYTES_MAX)
    ((_, checked),) = split_batches(again, batch_bytes_max=BATCH_BYTES_MAX)  # bounds and CRC hold
    assert checked == new_header and new_header.compression is stored
    assert new_header._replace(batch_length=0, crc=0, attributes=0) == header._replace(
        batch_length=0, crc=0, attributes=0)
    assert new_header.attributes & ~kr.COMPRESSION_MASK == header.attributes & ~kr.COMPRESSION_MASK
    assert kp_read(again) == kp_read(batch)  # null keys and values (tombstones) stay null


def test_recompression_is_bounded_as_decompression_is() -> None:
    batch = encode_batch([(None, b"\0" * (DECOMPRESSED_BYTES_MAX + 1), (), 0)], base_offset=0,
                         compression=Compression.ZSTD)
    ((_, header),) = split_batches(batch, batch_bytes_max=BATCH_BYTES_MAX)
    with pytest.raises(CorruptRecordError, match="more than"):
        recompress(memoryview(batch), header, Compression.LZ4, decompressed_bytes_max=DECOMPRESSED_BYTES_MAX)


@given(st.lists(fields_st, min_size=1, max_size=10), st.integers(min_value=0, max_value=12))
@settings(max_examples=50, deadline=None)
def test_start_offset_skips_the_records_before_it(records: list[Fields], start: int) -> None:
    batch = encode_batch(records, base_offset=2)
    assert as_fields(decode(batch, start_offset=start)) == [
        r for r in expected(records, 2) if r[0] >= start]


def test_bytearray_and_memoryview_inputs() -> None:
    batch = encode_batch(SAMPLE, base_offset=9)
    want = decode(batch)
    assert decode(bytearray(batch)) == want
    assert decode(memoryview(batch)) == want
    assert decode(memoryview(b"xx" + batch)[2:]) == want


# --- compression ----------------------------------------------------------------------------------

COMPRESSIBLE: list[Fields] = [(b"key-%d" % i, b"the same words again " * 30, (("n", b"%d" % i),), 1000 + i)
                              for i in range(40)]


def xerial(data: bytes, block_bytes: int, *, little_endian_version: bool = False) -> bytes:
    """Snappy in the Java client's framing, built here independently of records.py."""
    order = "<" if little_endian_version else ">"
    out = [b"\x82SNAPPY\x00", struct.pack(order + "ii", 1, 1)]
    for at in range(0, len(data), block_bytes):
        block = bytes(cramjam.snappy.compress_raw(data[at:at + block_bytes]))
        out += [struct.pack(">i", len(block)), block]
    return b"".join(out)


def lz4_frame(data: bytes, *, block_linked: bool) -> bytes:
    compressor = cramjam.lz4.Compressor(block_linked=block_linked)
    compressor.compress(data)
    return bytes(compressor.finish())


PLAIN = kp_build(COMPRESSIBLE)
RECORDS_BYTES = records_part(PLAIN)
CODEC_PAYLOADS = {
    "gzip": (Compression.GZIP, gzip.compress(RECORDS_BYTES)),
    "gzip two members": (Compression.GZIP, gzip.compress(RECORDS_BYTES[:500]) + gzip.compress(RECORDS_BYTES[500:])),
    "snappy raw (librdkafka)": (Compression.SNAPPY, bytes(cramjam.snappy.compress_raw(RECORDS_BYTES))),
    "snappy xerial (Java)": (Compression.SNAPPY, xerial(RECORDS_BYTES, 1024)),
    "snappy xerial, little-endian version": (Compression.SNAPPY,
                                             xerial(RECORDS_BYTES, 4096, little_endian_version=True)),
    "lz4 independent blocks": (Compression.LZ4, lz4_frame(RECORDS_BYTES, block_linked=False)),
    "lz4 linked blocks": (Compression.LZ4, lz4_frame(RECORDS_BYTES, block_linked=True)),
    "zstd": (Compression.ZSTD, bytes(cramjam.zstd.compress(RECORDS_BYTES))),
    "zstd two frames": (Compression.ZSTD, bytes(cramjam.zstd.compress(RECORDS_BYTES[:700]))
                        + bytes(cramjam.zstd.compress(RECORDS_BYTES[700:]))),
}


@pytest.mark.parametrize("name", sorted(CODEC_PAYLOADS))
def test_each_codec_decodes(name: str) -> None:
    codec, payload = CODEC_PAYLOADS[name]
    batch = with_payload(PLAIN, codec, payload)
    ((_, header),) = split_batches(batch, batch_bytes_max=BATCH_BYTES_MAX)
    assert header.compression is codec
    assert as_fields(decode(batch)) == expected(COMPRESSIBLE)
    assert [t for _, t in record_timestamps(batch, decompressed_bytes_max=DECOMPRESSED_BYTES_MAX)] == [
        ts for *_, ts in COMPRESSIBLE]


def test_kafka_pythons_gzip_batch_decodes() -> None:
    batch = kp_build(COMPRESSIBLE, compression=Compression.GZIP)
    assert batch[kr.ATTRIBUTES_POSITION + 1] & kr.COMPRESSION_MASK == Compression.GZIP
    assert as_fields(decode(batch)) == expected(COMPRESSIBLE)


@pytest.mark.parametrize("codec", [Compression.LZ4, Compression.ZSTD])
def test_frames_larger_than_the_first_buffer_guess_decode(codec: Compression) -> None:
    # 2 MiB of one byte compresses ~1000x: the buffer must grow from its first guess several times.
    records: list[Fields] = [(None, b"z" * (2 * MIB), (), 1)]
    batch = encode_batch(records, base_offset=0, compression=codec)
    assert len(batch) < 20_000
    (record,) = decode_records(batch, decompressed_bytes_max=3 * MIB)
    assert record.value == b"z" * (2 * MIB)


@pytest.mark.parametrize("codec", [c for c in Compression if c != Compression.NONE])
def test_decompression_bomb_is_refused_within_the_bound(codec: Compression) -> None:
    bomb = encode_batch([(None, bytes(16 * MIB), (), 1)], base_offset=0, compression=codec)
    assert len(bomb) < 1 * MIB
    tracemalloc.start()
    try:
        with pytest.raises(CorruptRecordError, match="more than"):
            decode_records(bomb, decompressed_bytes_max=MIB)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * MIB


@pytest.mark.parametrize("codec", [c for c in Compression if c != Compression.NONE])
def test_the_decompression_bound_is_exact(codec: Compression) -> None:
    batch = encode_batch([(None, bytes(100_000), (), 1)], base_offset=0, compression=codec)
    size = len(records_part(encode_batch([(None, bytes(100_000), (), 1)], base_offset=0)))
    assert len(list(decode_records(batch, decompressed_bytes_max=size))) == 1
    with pytest.raises(CorruptRecordError):
        decode_records(batch, decompressed_bytes_max=size - 1)


def test_log_append_time_gives_every_record_the_max_timestamp() -> None:
    batch = encode_batch(SAMPLE, base_offset=0)
    attributes = struct.unpack_from(">h", batch, kr.ATTRIBUTES_POSITION)[0] | kr.TIMESTAMP_TYPE_BIT
    batch = patch(batch, kr.ATTRIBUTES_POSITION, ">h", attributes)
    batch = patch(batch, kr.MAX_TIMESTAMP_POSITION, ">q", 42)
    ((_, header),) = split_batches(batch, batch_bytes_max=BATCH_BYTES_MAX)
    assert header.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert [r.timestamp_ms for r in decode(batch)] == [42] * len(SAMPLE)
    assert list(record_timestamps(batch, decompressed_bytes_max=0)) == [(i, 42) for i in range(len(SAMPLE))]


def test_attribute_flags() -> None:
    batch = encode_batch(SAMPLE, base_offset=0, producer_id=1, producer_epoch=0, base_sequence=0,
                         is_transactional=True)
    ((_, header),) = split_batches(batch, batch_bytes_max=BATCH_BYTES_MAX)
    assert header.is_transactional and not header.is_control
    control = patch(batch, kr.ATTRIBUTES_POSITION, ">h", kr.TRANSACTIONAL_BIT | kr.CONTROL_BIT)
    ((_, header),) = split_batches(control, batch_bytes_max=BATCH_BYTES_MAX)
    assert header.is_control


# --- many batches, base offsets -------------------------------------------------------------------


def test_split_batches_finds_each_batch_of_a_produce_request() -> None:
    batches = [encode_batch(SAMPLE[:n], base_offset=0, compression=c)
               for n, c in ((1, Compression.NONE), (4, Compression.ZSTD), (2, Compression.GZIP))]
    field = b"".join(batches)
    found = split_batches(memoryview(field), batch_bytes_max=BATCH_BYTES_MAX)
    assert [p for p, _ in found] == [0, len(batches[0]), len(batches[0]) + len(batches[1])]
    assert [h.record_count for _, h in found] == [1, 4, 2]
    assert split_batches(b"", batch_bytes_max=BATCH_BYTES_MAX) == []


def test_write_base_offset_in_place_keeps_every_crc() -> None:
    field = bytearray(encode_batch(SAMPLE, base_offset=0) + encode_batch(SAMPLE[:2], base_offset=0))
    next_offset = 1000
    for position, header in split_batches(field, batch_bytes_max=BATCH_BYTES_MAX):
        write_base_offset(field, position, next_offset)
        next_offset += header.record_count
    found = split_batches(field, batch_bytes_max=BATCH_BYTES_MAX)
    assert [h.base_offset for _, h in found] == [1000, 1004]
    position, header = found[1]
    assert [r.offset for r in decode(field[position:position + header.batch_bytes])] == [1004, 1005]


def test_base_offsets_out_of_range_are_refused() -> None:
    batch = encode_batch(SAMPLE, base_offset=0)
    for bad in (-1, 1 << 63):
        with pytest.raises(ValueError, match="base offset"):
            with_base_offset(batch, bad)
        with pytest.raises(ValueError, match="base offset"):
            encode_batch(SAMPLE, base_offset=bad)
    with pytest.raises(CorruptRecordError):
        with_base_offset(batch[:HEADER_BYTES - 1], 5)


def test_encode_refuses_what_the_format_cannot_hold() -> None:
    with pytest.raises(ValueError, match="at least one record"):
        encode_batch([], base_offset=0)
    with pytest.raises(ValueError, match="out of range"):
        encode_batch(SAMPLE, base_offset=0, producer_epoch=1 << 15)
    with pytest.raises(ValueError, match="int64"):
        encode_batch([(None, b"", (), 1 << 63)], base_offset=0)


# --- refusals, one per rule -------------------------------------------------------------------------


def test_error_codes_are_kafkas() -> None:
    assert CorruptRecordError.error_code == kafka.errors.CorruptRecordError.errno == 2
    assert UnsupportedMagicError.error_code == kafka.errors.UnsupportedForMessageFormatError.errno == 43
    assert InvalidRecordError.error_code == kafka.errors.InvalidRecordError.errno == 87
    assert RecordBatchTooLargeError.error_code == kafka.errors.MessageSizeTooLargeError.errno == 10


def refused(batch: bytes, error: type[KafkaBatchError], match: str | None = None) -> None:
    with pytest.raises(error, match=match):
        split_batches(batch, batch_bytes_max=BATCH_BYTES_MAX)
    with pytest.raises(error, match=match):
        decode(batch)


def records_refused(batch: bytes, error: type[KafkaBatchError], match: str | None = None) -> None:
    """Refused when its records are read (split_batches reads headers only and takes it)."""
    split_batches(batch, batch_bytes_max=BATCH_BYTES_MAX)
    with pytest.raises(error, match=match):
        decode(batch)


GOLDEN = bytes.fromhex(GOLDEN_HEX)


def test_magic_0_and_1_are_unsupported() -> None:
    for magic in (0, 1, 3):
        refused(patch(GOLDEN, kr.MAGIC_POSITION, ">b", magic), UnsupportedMagicError, "magic")


def test_bad_crc_is_corrupt() -> None:
    damaged = bytearray(GOLDEN)
    damaged[-1] ^= 0x40
    refused(bytes(damaged), CorruptRecordError, "CRC")


def test_no_records_is_invalid_produced_and_read_as_none_stored() -> None:
    batch = patch(patch(GOLDEN, kr.RECORDS_COUNT_POSITION, ">i", 0), kr.LAST_OFFSET_DELTA_POSITION, ">i", -1)
    refused(batch, InvalidRecordError, "0 records|recordsCount 0")
    emptied = gap_batch(10, 5)   # what compaction leaves of batches that lost every record
    with pytest.raises(InvalidRecordError, match="holds 0 records"):
        split_batches(emptied, batch_bytes_max=BATCH_BYTES_MAX)
    assert decode(emptied) == []
    assert list(record_timestamps(emptied, decompressed_bytes_max=DECOMPRESSED_BYTES_MAX)) == []


def test_count_disagreeing_with_last_offset_delta_is_invalid_produced_and_a_gap_stored() -> None:
    wider = patch(GOLDEN, kr.LAST_OFFSET_DELTA_POSITION, ">i", 5)   # 2 records over 6 offsets: compacted
    with pytest.raises(InvalidRecordError, match="lastOffsetDelta"):
        split_batches(wider, batch_bytes_max=BATCH_BYTES_MAX)
    assert as_fields(decode(wider)) == expected(GOLDEN_RECORDS)
    refused(patch(GOLDEN, kr.LAST_OFFSET_DELTA_POSITION, ">i", 0), InvalidRecordError, "lastOffsetDelta")


def test_more_records_than_the_bytes_can_hold_is_corrupt() -> None:
    batch = patch(patch(GOLDEN, kr.RECORDS_COUNT_POSITION, ">i", 4), kr.LAST_OFFSET_DELTA_POSITION, ">i", 3)
    refused(batch, CorruptRecordError, "cannot fit")


def test_unknown_codec_is_corrupt() -> None:
    refused(patch(GOLDEN, kr.ATTRIBUTES_POSITION, ">h", 5), CorruptRecordError, "codec")


def test_batch_larger_than_the_bound_is_too_large() -> None:
    with pytest.raises(RecordBatchTooLargeError):
        split_batches(GOLDEN, batch_bytes_max=len(GOLDEN) - 1)
    assert split_batches(GOLDEN, batch_bytes_max=len(GOLDEN))


def test_batch_length_below_a_header_is_corrupt() -> None:
    short = bytearray(GOLDEN)
    struct.pack_into(">i", short, kr.BATCH_LENGTH_POSITION, kr.BATCH_LENGTH_MIN - 1)
    refused(bytes(short), CorruptRecordError, "batchLength")
    struct.pack_into(">i", short, kr.BATCH_LENGTH_POSITION, -5)
    refused(bytes(short), CorruptRecordError, "batchLength")


def test_a_batch_claiming_2_gib_is_refused_without_allocating() -> None:
    claim = bytearray(GOLDEN)
    struct.pack_into(">i", claim, kr.BATCH_LENGTH_POSITION, 0x7FFF_FFFF)
    tracemalloc.start()
    try:
        with pytest.raises(RecordBatchTooLargeError):
            split_batches(claim, batch_bytes_max=BATCH_BYTES_MAX)
        with pytest.raises(CorruptRecordError, match="truncated"):
            split_batches(claim, batch_bytes_max=kr.BATCH_BYTES_LIMIT)
        with pytest.raises(CorruptRecordError, match="truncated"):
            decode(claim)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024


def test_bytes_after_a_batch_are_refused_by_the_readers() -> None:
    with pytest.raises(CorruptRecordError, match="followed by"):
        decode(GOLDEN + b"\x00")
    with pytest.raises(CorruptRecordError):  # as a second batch, they are a truncated header
        split_batches(GOLDEN + b"\x00", batch_bytes_max=BATCH_BYTES_MAX)


def test_truncation_at_every_length_is_refused() -> None:
    batch = encode_batch(SAMPLE, base_offset=0)
    field = GOLDEN + batch
    for n in range(1, len(field)):
        if n == len(GOLDEN):
            continue  # a whole first batch: a clean cut between batches
        with pytest.raises(CorruptRecordError):
            split_batches(field[:n], batch_bytes_max=BATCH_BYTES_MAX)
    for n in range(len(batch)):
        with pytest.raises(CorruptRecordError):
            decode(batch[:n])


def test_every_single_bit_flip_is_refused() -> None:
    # baseOffset and partitionLeaderEpoch are written by the broker, outside the CRC: flips there are
    # taken as they are (the broker overwrites the first; the second is only carried).
    uncovered = set(range(kr.BASE_OFFSET_POSITION, kr.BATCH_LENGTH_POSITION)) | set(
        range(kr.PARTITION_LEADER_EPOCH_POSITION, kr.MAGIC_POSITION))
    for batch in (GOLDEN, encode_batch(SAMPLE[:2], base_offset=0, compression=Compression.ZSTD)):
        for bit in range(len(batch) * 8):
            flipped = bytearray(batch)
            flipped[bit // 8] ^= 1 << (bit % 8)
            if bit // 8 in uncovered:
                split_batches(flipped, batch_bytes_max=BATCH_BYTES_MAX)
                continue
            with pytest.raises(KafkaBatchError):
                split_batches(flipped, batch_bytes_max=BATCH_BYTES_MAX)


def test_record_parts_that_do_not_add_up_are_corrupt() -> None:
    body = bytearray(records_part(GOLDEN))
    body[0] = 0x14  # record 0 claims 10 bytes, holds 9
    records_refused(with_payload(GOLDEN, 0, bytes(body)), CorruptRecordError)
    body = bytearray(records_part(GOLDEN))
    body[4] = 0x20  # key length 16 runs past the record
    records_refused(with_payload(GOLDEN, 0, bytes(body)), CorruptRecordError, "runs past")


def test_bytes_after_the_last_record_are_corrupt() -> None:
    records_refused(with_payload(GOLDEN, 0, records_part(GOLDEN) + b"\x00"), CorruptRecordError, "after the last")


def test_offsets_with_gaps_are_invalid_produced_and_read_at_their_offsets_stored() -> None:
    body = bytearray(records_part(GOLDEN))
    body[13] = 0x04  # record 1's offsetDelta 2
    gapped = patch(with_payload(GOLDEN, 0, bytes(body)), kr.LAST_OFFSET_DELTA_POSITION, ">i", 2)
    header = split_batches(with_payload(GOLDEN, 0, bytes(body)), batch_bytes_max=BATCH_BYTES_MAX)[0][1]
    with pytest.raises(InvalidRecordError, match="dense"):
        check_records(memoryview(with_payload(GOLDEN, 0, bytes(body))), header,
                      decompressed_bytes_max=DECOMPRESSED_BYTES_MAX)
    assert [r.offset for r in decode(patch(gapped, kr.BASE_OFFSET_POSITION, ">q", 100))] == [100, 102]
    assert [o for o, _ in record_timestamps(gapped, decompressed_bytes_max=DECOMPRESSED_BYTES_MAX)] == [0, 2]
    # Past lastOffsetDelta, or not increasing: damage, whether produced or stored.
    records_refused(with_payload(GOLDEN, 0, bytes(body)), InvalidRecordError, "increase")
    body[13] = 0x00  # record 1's offsetDelta 0, as record 0's
    with pytest.raises(InvalidRecordError, match="increase"):
        decode(patch(with_payload(GOLDEN, 0, bytes(body)), kr.LAST_OFFSET_DELTA_POSITION, ">i", 2))


def test_negative_lengths_are_invalid() -> None:
    body = bytearray(records_part(GOLDEN))
    body[4] = 0x03  # key length -2
    records_refused(with_payload(GOLDEN, 0, bytes(body)), InvalidRecordError, "key length")
    body = bytearray(records_part(GOLDEN))
    body[0] = 0x01  # record length -1
    records_refused(with_payload(GOLDEN, 0, bytes(body)), InvalidRecordError, "negative length")


def test_header_key_that_is_not_utf8_is_corrupt() -> None:
    batch = encode_batch([(None, b"v", (("h", b"v"),), 1)], base_offset=0)
    at = batch.index(b"\x02h\x02v") + 1
    records_refused(reseal(batch[:at] + b"\xff" + batch[at + 1:]), CorruptRecordError, "UTF-8")


def test_a_varint_longer_than_ten_bytes_is_corrupt() -> None:
    batch = encode_batch([(None, b"v" * 20, (), 1)], base_offset=0)
    body = bytearray(records_part(batch))
    body[2:13] = b"\xff" * 11  # timestampDelta: eleven bytes with continuation bits
    records_refused(with_payload(batch, 0, bytes(body)), CorruptRecordError, "varint")


def test_damaged_compressed_payloads_are_corrupt() -> None:
    for codec, payload in CODEC_PAYLOADS.values():
        for damaged in (payload[:len(payload) // 2], payload[:8] + bytes(len(payload) - 8)):
            with pytest.raises(CorruptRecordError):
                decode(with_payload(PLAIN, codec, damaged))


# --- arbitrary input ---------------------------------------------------------------------------------


@given(st.binary(max_size=300))
@settings(max_examples=300)
def test_garbage_raises_only_batch_errors(garbage: bytes) -> None:
    for attempt in (lambda: split_batches(garbage, batch_bytes_max=BATCH_BYTES_MAX), lambda: decode(garbage)):
        with contextlib.suppress(KafkaBatchError):
            attempt()


@given(st.binary(max_size=200), st.integers(min_value=1, max_value=8), st.sampled_from(list(Compression)))
@settings(max_examples=400)
def test_garbage_records_under_a_valid_header_raise_only_batch_errors(payload: bytes, count: int,
                                                                     codec: Compression) -> None:
    # A right CRC and counts, so the record parser and the decompressors see the garbage.
    head = patch(patch(GOLDEN, kr.RECORDS_COUNT_POSITION, ">i", count), kr.LAST_OFFSET_DELTA_POSITION, ">i", count - 1)
    batch = with_payload(head, codec, payload)
    with contextlib.suppress(KafkaBatchError):
        decode(batch)
    with contextlib.suppress(KafkaBatchError):
        list(record_timestamps(batch, decompressed_bytes_max=DECOMPRESSED_BYTES_MAX))


@given(st.lists(fields_st, min_size=1, max_size=5), st.data())
@settings(max_examples=200)
def test_mutated_record_bytes_raise_only_batch_errors(records: list[Fields], data: st.DataObject) -> None:
    batch = bytearray(encode_batch(records, base_offset=0))
    for _ in range(data.draw(st.integers(min_value=1, max_value=4))):
        position = data.draw(st.integers(min_value=HEADER_BYTES, max_value=len(batch) - 1))
        batch[position] = data.draw(st.integers(min_value=0, max_value=255))
    with contextlib.suppress(KafkaBatchError):
        decode(reseal(batch))
