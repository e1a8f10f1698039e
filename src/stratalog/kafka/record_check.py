"""Every record of a produced batch checked before the batch is stored, as Kafka's broker does.

The batch's CRC says only that the bytes are the ones the producer sent; a producer (or an attacker)
can send a batch with a correct CRC whose records lie: a value length of 1 GiB in a 200-byte record,
offset deltas out of order, header keys that are not UTF-8. Stored as it came, such a batch stops every
consumer of the partition at that offset (librdkafka refetches it forever). So Produce walks each
record's fields, with the same rules as ``records.decode_records`` (anything it accepts, every reader
of this project decodes), but builds nothing: no slices of keys or values, no tuples. A compressed
batch is decompressed (bounded) to be walked, as Kafka does.
"""

from __future__ import annotations

from stratalog.kafka.records import (
    NULL_LENGTH,
    RECORD_BODY_BYTES_MIN,
    BatchHeader,
    CorruptRecordError,
    InvalidRecordError,
    _read_varint,
    uncompressed_records,
)
from stratalog.native import native


def check_records(view: memoryview, header: BatchHeader, *, decompressed_bytes_max: int) -> bytes | memoryview:
    """Check every record of the batch ``view`` holds (exactly one batch, its header checked by
    ``check_batch``); raises CorruptRecordError or InvalidRecordError naming the first record that is wrong.
    Returns the records it walked, uncompressed (a view of ``view`` when they were not compressed), for a
    caller that goes on with them (recompression) without decompressing again."""
    records = uncompressed_records(view, header, decompressed_bytes_max=decompressed_bytes_max)
    # The Python walk takes a copy: indexing bytes is twice as fast as indexing a memoryview, and it
    # indexes every field. The compiled one reads the view itself.
    data = records if native is not None or isinstance(records, bytes) else bytes(records)
    end = _walk_records(data, 0, header.record_count)
    if end != len(data):
        raise CorruptRecordError(f"{len(data) - end} bytes after the last record")
    return records


def walk_records(data: bytes | memoryview, position: int, count: int) -> int:
    """Check ``count`` records at ``data[position:]`` (uncompressed); the position after the last.
    The reference of the compiled ``stratalog._native.walk_records``: same rules, same errors."""
    if position < 0:
        raise ValueError("position must not be negative")
    try:
        return _walk(bytes(data), position, count)
    except IndexError:  # a varint ran off the end of the data
        raise CorruptRecordError("a record runs past the end of the batch") from None


_walk_records = native.walk_records if native is not None else walk_records


def _walk(data: bytes, p: int, count: int) -> int:
    # One-byte varints (lengths under 64, small deltas) are decoded inline; longer ones by _read_varint.
    end = len(data)
    read_varint = _read_varint
    for i in range(count):
        b = data[p]
        if b < 0x80:
            length = (b >> 1) ^ -(b & 1)
            p += 1
        else:
            length, p = read_varint(data, p)
        record_end = p + length
        if length < RECORD_BODY_BYTES_MIN or record_end > end:
            raise CorruptRecordError(f"record {i}: length {length} " + (
                "is shorter than any record" if length < RECORD_BODY_BYTES_MIN else "runs past the batch"))
        p += 1  # attributes
        b = data[p]
        if b < 0x80:
            p += 1  # timestampDelta: any value
        elif data[p + 1] < 0x80:
            p += 2
        else:
            _, p = read_varint(data, p)
        b = data[p]
        if b < 0x80:
            offset_delta = (b >> 1) ^ -(b & 1)
            p += 1
        else:
            offset_delta, p = read_varint(data, p)
        if offset_delta != i:
            raise InvalidRecordError(f"record {i} has offsetDelta {offset_delta}: offsets must be dense")
        b = data[p]
        if b < 0x80:
            size = (b >> 1) ^ -(b & 1)
            p += 1
        else:
            size, p = read_varint(data, p)
        if size >= 0:
            p += size
        elif size != NULL_LENGTH:
            raise InvalidRecordError(f"record {i}: key length {size}")
        b = data[p]  # an IndexError here: the key ran past the data
        if b < 0x80:
            size = (b >> 1) ^ -(b & 1)
            p += 1
        elif data[p + 1] < 0x80:  # two bytes: values of 64 bytes to 8 KiB
            raw = (b & 0x7F) | (data[p + 1] << 7)
            size = (raw >> 1) ^ -(raw & 1)
            p += 2
        else:
            size, p = read_varint(data, p)
        if size >= 0:
            p += size
        elif size != NULL_LENGTH:
            raise InvalidRecordError(f"record {i}: value length {size}")
        if p >= record_end:
            raise CorruptRecordError(f"record {i}: its key or value runs past the record")
        if data[p]:
            p = _walk_headers(data, p, record_end, i)
        else:
            p += 1
        if p != record_end:
            raise CorruptRecordError(f"record {i}: its parts do not add up to its length")
    return p


def _walk_headers(data: bytes, p: int, record_end: int, index: int) -> int:
    count, p = _read_varint(data, p)
    if not 0 <= count <= record_end - p:
        raise CorruptRecordError(f"record {index}: {count} headers in {record_end - p} bytes")
    for _ in range(count):
        length, p = _read_varint(data, p)
        if length < 0 or p + length > record_end:
            raise CorruptRecordError(f"record {index}: a header key of length {length}")
        try:
            data[p:p + length].decode()
        except UnicodeDecodeError:
            raise CorruptRecordError(f"record {index}: a header key that is not UTF-8") from None
        p += length
        length, p = _read_varint(data, p)
        if length >= 0:
            p += length
        elif length != NULL_LENGTH:
            raise InvalidRecordError(f"record {index}: header value length {length}")
        if p > record_end:
            raise CorruptRecordError(f"record {index}: a header runs past the record")
    return p
