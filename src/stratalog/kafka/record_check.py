"""The records inside a Kafka batch, walked in one place: ``walk_fields`` reads each record's fields,
checks every length against the bytes left, and yields where each field lies. Everything that reads
records in Python goes through it: Produce's check (``check_records``, which only validates and counts)
and the decoders of ``records.py`` (which slice keys, values and headers from the positions), so what
Produce accepts, every reader of this project decodes, and every rule and error is written once.

Why Produce checks every record before storing a batch, as Kafka's broker does: the batch's CRC says only
that the bytes are the ones the producer sent; a producer (or an attacker) can send a batch with a correct
CRC whose records lie: a value length of 1 GiB in a 200-byte record, offset deltas out of order, header
keys that are not UTF-8. Stored as it came, such a batch stops every consumer of the partition at that
offset (librdkafka refetches it forever). The check builds nothing: no slices of keys or values, no header
tuples. A compressed batch is decompressed (bounded) to be walked, as Kafka does.

``walk_records`` is the reference of the compiled ``stratalog._native.walk_records`` (src/native/records.c):
same rules, same errors, same messages.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from stratalog.kafka.batch_compression import uncompressed_records
from stratalog.kafka.batch_format import (
    NULL_LENGTH,
    RECORD_BODY_BYTES_MIN,
    VARLONG_SHIFT_LIMIT,
    BatchHeader,
    CorruptRecordError,
    InvalidRecordError,
    KafkaBatchError,
)
from stratalog.native import native

__all__ = ["FieldPositions", "Headers", "check_records", "length_error", "read_varint", "walk_fields",
           "walk_headers", "walk_records"]

#: A record's headers: (key, value) pairs, a value None when null.
Headers = tuple[tuple[str, bytes | None], ...]
#: What ``walk_fields`` finds in one record: (record_end, timestamp_delta, offset_delta, key_position,
#: key_bytes, value_position, value_bytes, headers). A null key or value has -1 bytes; headers are () unless
#: asked for.
FieldPositions = tuple[int, int, int, int, int, int, int, Headers]
#: The error for a record whose length is short or runs past the records, given (length, index).
LengthError = Callable[[int, int], KafkaBatchError]


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
    return _walk(bytes(data), position, count)


_walk_records = native.walk_records if native is not None else walk_records


def _walk(data: bytes, p: int, count: int) -> int:
    for fields in walk_fields(data, p, count, length_error, False, None, True):
        return fields[0]
    return p  # no records


def length_error(length: int, index: int) -> KafkaBatchError:
    """A record length shorter than any record, or past the end of the records (Produce's wording)."""
    return CorruptRecordError(f"record {index}: length {length} " + (
        "is shorter than any record" if length < RECORD_BODY_BYTES_MIN else "runs past the batch"))


def walk_fields(data: bytes, p: int, count: int, bad_length: LengthError = length_error,
                headers_wanted: bool = False, gaps_up_to: int | None = None,
                last_only: bool = False) -> Iterator[FieldPositions]:
    """The ``count`` records at ``data[p:]``, each checked, every length against the bytes left, and
    yielded as where its fields lie (``FieldPositions``, with its headers when ``headers_wanted``); with
    ``last_only``, only the last record's, once every record is checked. Record i must have offsetDelta i
    (what a producer sends), or, with ``gaps_up_to`` (the batch's lastOffsetDelta), offset deltas that
    increase up to it (what log compaction leaves: stored batches are read so). Raises
    ``bad_length(length, index)`` for a record length that is short or runs past the data,
    CorruptRecordError or InvalidRecordError for anything else wrong."""
    # The hot loop of every Python read and check, one generator step a record (cheaper than a call):
    # one- and two-byte varints (most lengths and deltas) are decoded inline, longer ones by read_varint.
    # The try costs nothing until a varint runs off the end. last_only spares the check a tuple a record
    # (5% of its time on small records).
    end = len(data)
    previous_delta = -1
    try:
        for index in range(count):
            b = data[p]
            if b < 0x80:
                length = (b >> 1) ^ -(b & 1)
                p += 1
            elif data[p + 1] < 0x80:  # two bytes: records of 64 bytes to 8 KiB
                raw = (b & 0x7F) | (data[p + 1] << 7)
                length = (raw >> 1) ^ -(raw & 1)
                p += 2
            else:
                length, p = read_varint(data, p)
            record_end = p + length
            if length < RECORD_BODY_BYTES_MIN or record_end > end:
                raise bad_length(length, index)
            b = data[p + 1]  # after attributes: int8, no bits defined for records
            if b < 0x80:
                timestamp_delta = (b >> 1) ^ -(b & 1)
                p += 2
            elif data[p + 2] < 0x80:  # two bytes: up to 8 s after the first record
                raw = (b & 0x7F) | (data[p + 2] << 7)
                timestamp_delta = (raw >> 1) ^ -(raw & 1)
                p += 3
            else:
                timestamp_delta, p = read_varint(data, p + 1)
            b = data[p]
            if b < 0x80:
                offset_delta = (b >> 1) ^ -(b & 1)
                p += 1
            elif data[p + 1] < 0x80:  # two bytes: records 64 to 8191 of a batch
                raw = (b & 0x7F) | (data[p + 1] << 7)
                offset_delta = (raw >> 1) ^ -(raw & 1)
                p += 2
            else:
                offset_delta, p = read_varint(data, p)
            if gaps_up_to is None:
                if offset_delta != index:
                    raise InvalidRecordError(f"record {index} has offsetDelta {offset_delta}: offsets must be dense")
            elif not previous_delta < offset_delta <= gaps_up_to:
                raise InvalidRecordError(f"record {index} has offsetDelta {offset_delta}: offset deltas must "
                                         f"increase, up to the batch's lastOffsetDelta {gaps_up_to}")
            previous_delta = offset_delta
            b = data[p]
            if b < 0x80:
                key_bytes = (b >> 1) ^ -(b & 1)
                p += 1
            else:
                key_bytes, p = read_varint(data, p)
            key_position = p
            if key_bytes >= 0:
                p += key_bytes
            elif key_bytes != NULL_LENGTH:
                raise InvalidRecordError(f"record {index}: key length {key_bytes}")
            b = data[p]  # an IndexError here: the key ran past the data
            if b < 0x80:
                value_bytes = (b >> 1) ^ -(b & 1)
                p += 1
            elif data[p + 1] < 0x80:  # two bytes: values of 64 bytes to 8 KiB
                raw = (b & 0x7F) | (data[p + 1] << 7)
                value_bytes = (raw >> 1) ^ -(raw & 1)
                p += 2
            else:
                value_bytes, p = read_varint(data, p)
            value_position = p
            if value_bytes >= 0:
                p += value_bytes
            elif value_bytes != NULL_LENGTH:
                raise InvalidRecordError(f"record {index}: value length {value_bytes}")
            if p >= record_end:  # (headersCount is still to come)
                raise CorruptRecordError(f"record {index}: its key or value runs past the record")
            headers: Headers = ()
            if data[p]:
                header_count, p = read_varint(data, p)
                if not 0 <= header_count <= record_end - p:
                    raise CorruptRecordError(f"record {index}: {header_count} headers in {record_end - p} bytes")
                found: list[tuple[str, bytes | None]] | None = [] if headers_wanted else None
                p = walk_headers(data, p, record_end, header_count, index, found)
                if found:
                    headers = tuple(found)
            else:
                p += 1
            if p != record_end:
                raise CorruptRecordError(f"record {index}: its parts do not add up to its length")
            if not last_only:
                yield (record_end, timestamp_delta, offset_delta, key_position, key_bytes, value_position, value_bytes,
                       headers)
    except IndexError:  # a varint ran off the end of the data
        raise CorruptRecordError("a record runs past the end of the batch") from None
    if last_only and count > 0:
        yield record_end, timestamp_delta, offset_delta, key_position, key_bytes, value_position, value_bytes, headers


def walk_headers(data: bytes, p: int, record_end: int, count: int, index: int,
                 found: list[tuple[str, bytes | None]] | None) -> int:
    """The ``count`` headers of record ``index`` at ``data[p:]`` (after its headersCount); the position after
    them. Each is appended to ``found`` when it is a list."""
    for _ in range(count):
        b = data[p]
        if b < 0x80:
            length = (b >> 1) ^ -(b & 1)
            p += 1
        else:
            length, p = read_varint(data, p)
        q = p + length
        if length < 0 or q > record_end:
            raise CorruptRecordError(f"record {index}: a header key of length {length}")
        try:
            key = data[p:q].decode()
        except UnicodeDecodeError:
            raise CorruptRecordError(f"record {index}: a header key that is not UTF-8") from None
        b = data[q]
        if b < 0x80:
            length = (b >> 1) ^ -(b & 1)
            p = q + 1
        else:
            length, p = read_varint(data, q)
        if length >= 0:
            q = p + length
            if found is not None:
                found.append((key, data[p:q]))
            p = q
        elif length != NULL_LENGTH:
            raise InvalidRecordError(f"record {index}: header value length {length}")
        elif found is not None:
            found.append((key, None))
        if p > record_end:
            raise CorruptRecordError(f"record {index}: a header runs past the record")
    return p


def read_varint(data: bytes, p: int) -> tuple[int, int]:
    """The zigzag varint (or varlong) at ``data[p:]`` and the position after it; IndexError when it runs
    off the end of ``data``."""
    b = data[p]
    if b < 0x80:  # one byte: -64..63, most lengths and deltas
        return (b >> 1) ^ -(b & 1), p + 1
    raw = b & 0x7F
    shift = 7
    while True:
        p += 1
        b = data[p]
        raw |= (b & 0x7F) << shift
        if b < 0x80:
            return (raw >> 1) ^ -(raw & 1), p + 1
        shift += 7
        if shift >= VARLONG_SHIFT_LIMIT:
            raise CorruptRecordError(f"a varint longer than {VARLONG_SHIFT_LIMIT // 7} bytes at byte {p}")
