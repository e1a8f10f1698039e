"""Where each record of a batch in the store's own encoding keeps its fields: the same index as
``stratalog.kafka.record_index`` gives for Kafka batches (its docstring describes the layout), so a
reader gathers columns from either encoding alike. The store's batches are never compacted in place
(the cleaner rewrites them as Kafka batches): their offsets are dense, OFFSET_DELTA is the row's number.

``index_native_records`` is the reference of the compiled ``stratalog._native.index_native_records``:
every length is checked against the batch before it is used, and a record's key and value must fit in
the record's own length (docs/formats/object.md gives the encoding).
"""

from __future__ import annotations

from stratalog.engine.batch import RECORD_HEAD, CorruptBatchError
from stratalog.kafka.record_index import as_index
from stratalog.native import native

#: What a record's length counts besides its key, value and headers: timestamp, key and value lengths,
#: header count.
_FIXED_BYTES = RECORD_HEAD.size - 4


def index_native_records(data: bytes | memoryview, position: int, end: int, count: int) -> bytes:
    """The index of the ``count`` records at ``data[position:end]`` (the body of one batch, its records
    ending at ``end``). Raises CorruptBatchError where a record runs past the batch, where its key and
    value do not fit its length, or where bytes follow the last record; ValueError for a range outside
    the data."""
    if not 0 <= position <= end <= len(data):
        raise ValueError(f"the range [{position}, {end}) is not within the data's {len(data)} bytes")
    if count < 0:
        raise ValueError("count must not be negative")
    if count > (end - position) // RECORD_HEAD.size:
        raise CorruptBatchError(f"{count} records cannot fit in {end - position} bytes")
    rows: list[tuple[int, ...]] = []
    note = rows.append
    unpack = RECORD_HEAD.unpack_from
    at = position
    for i in range(count):
        if RECORD_HEAD.size > end - at:
            raise CorruptBatchError(f"record {i} runs past its batch")
        record_bytes, timestamp_ms, key_bytes, value_bytes, header_count = unpack(data, at)
        next_at = at + 4 + record_bytes
        if next_at > end:
            raise CorruptBatchError(f"record {i} runs past its batch")
        if key_bytes < -1 or value_bytes < 0 or _FIXED_BYTES + max(key_bytes, 0) + value_bytes > record_bytes:
            raise CorruptBatchError(f"record {i}: a key of {key_bytes} and a value of {value_bytes} bytes do not "
                                    f"fit its length of {record_bytes}")
        key_start = at + RECORD_HEAD.size
        value_start = key_start + max(key_bytes, 0)
        note((timestamp_ms, key_start, key_bytes, value_start, value_bytes, value_start + value_bytes, header_count,
              i))
        at = next_at
    if at != end:
        raise CorruptBatchError(f"{end - at} bytes after the last record")
    return as_index(rows)


#: The compiled index where the core is built, else its twin.
index_records = native.index_native_records if native is not None else index_native_records
