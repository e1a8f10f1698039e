"""The produce-time record check: every batch it accepts, the project's decoder reads whole; each way a
record can lie with a correct CRC is refused."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from examples import examples
from stratalog.kafka.record_check import check_records
from stratalog.kafka.records import (
    CRC_COVERS_FROM_POSITION,
    CRC_POSITION,
    RECORDS_POSITION,
    Compression,
    KafkaBatchError,
    check_batch,
    decode_records,
    encode_batch,
)
from stratalog.wal.format import crc32c

BOUND = 16 << 20


def check(batch: bytes) -> None:
    view = memoryview(batch)
    check_records(view, check_batch(view, 0, batch_bytes_max=BOUND), decompressed_bytes_max=BOUND)


def resign(batch: bytearray) -> bytes:
    """The batch with a right CRC again after surgery: only the records inside lie."""
    struct.pack_into(">I", batch, CRC_POSITION, crc32c(bytes(batch[CRC_COVERS_FROM_POSITION:])))
    return bytes(batch)


RECORDS = [(b"k", b"value", (("h", b"x"), ("n", None)), 1000), (None, b"", (), 1001), (b"", None, (), 999)]


@pytest.mark.parametrize("compression", list(Compression))
def test_batches_the_encoder_makes_pass(compression: Compression) -> None:
    check(encode_batch(RECORDS, base_offset=0, compression=compression))


def one_record_batch(value: bytes = b"value") -> bytearray:
    return bytearray(encode_batch([(b"k", value, (), 1000)], base_offset=0))


# Offsets inside the one record of one_record_batch(): length, attributes, timestampDelta, offsetDelta,
# keyLength, key, valueLength, value, headersCount.
LENGTH_AT = RECORDS_POSITION
OFFSET_DELTA_AT = RECORDS_POSITION + 3
KEY_LENGTH_AT = RECORDS_POSITION + 4
VALUE_LENGTH_AT = RECORDS_POSITION + 6


@pytest.mark.parametrize(("at", "byte", "named"), [
    (VALUE_LENGTH_AT, 0x7E, "runs past"),          # value length 63 in a 5-byte value
    (KEY_LENGTH_AT, 0x05, "key length -3"),        # key length -3
    (OFFSET_DELTA_AT, 0x02, "offsetDelta"),        # offsetDelta 1 for the first record
    (LENGTH_AT, 0x7E, "runs past the batch"),      # record length 63, past the batch
    (LENGTH_AT, 0x0C, "runs past the record"),     # record length 6: shorter than its parts
])
def test_a_record_that_lies_under_a_right_crc_is_refused(at: int, byte: int, named: str) -> None:
    batch = one_record_batch()
    batch[at] = byte
    with pytest.raises(KafkaBatchError, match=named):
        check(resign(batch))


def test_a_value_claiming_a_gibibyte_is_refused() -> None:
    batch = one_record_batch()
    # A 5-byte zigzag varint for 2^30 where the one-byte length was: shift the rest of the record right.
    claim = bytes([0x80, 0x80, 0x80, 0x80, 0x08])
    lying = batch[:VALUE_LENGTH_AT] + claim + batch[VALUE_LENGTH_AT + 1:]
    struct.pack_into(">i", lying, 8, len(lying) - 12)  # batchLength follows, so only the record lies
    lying[RECORDS_POSITION] += 2 * (len(claim) - 1)     # and so does the record's length
    with pytest.raises(KafkaBatchError, match="runs past"):
        check(resign(lying))


def test_bytes_after_the_last_record_are_refused() -> None:
    batch = one_record_batch() + b"\0"
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    with pytest.raises(KafkaBatchError, match="after the last record"):
        check(resign(batch))


def test_a_header_key_that_is_not_utf8_is_refused() -> None:
    batch = bytearray(encode_batch([(b"k", b"v", (("\u00e9", b"x"),), 1000)], base_offset=0))
    at = bytes(batch).index("\u00e9".encode())
    batch[at] = 0xFF
    with pytest.raises(KafkaBatchError, match="UTF-8"):
        check(resign(batch))


@settings(max_examples=examples(400), deadline=None)
@given(st.lists(st.tuples(st.none() | st.binary(max_size=70), st.none() | st.binary(max_size=200),
                          st.lists(st.tuples(st.text(max_size=5), st.none() | st.binary(max_size=5)), max_size=3),
                          st.integers(0, 10**6)), min_size=1, max_size=8),
       st.data())
def test_what_the_check_accepts_the_decoder_reads_whole(records: list[tuple[bytes | None, bytes | None,
                                                                              list[tuple[str, bytes | None]], int]],
                                                         data: st.DataObject) -> None:
    batch = bytearray(encode_batch([(k, v, tuple(h), t) for k, v, h, t in records], base_offset=0))
    check(bytes(batch))
    # Flip one byte of the records (the CRC made right again): the check and the decoder agree.
    at = data.draw(st.integers(RECORDS_POSITION, len(batch) - 1))
    batch[at] = data.draw(st.integers(0, 255))
    mutated = resign(batch)
    try:
        check(mutated)
    except KafkaBatchError:
        return
    assert len(list(decode_records(mutated, decompressed_bytes_max=BOUND))) == len(records)
