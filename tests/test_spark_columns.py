"""The Spark source's columns from stored blocks: every encoding a batch is stored in (the store's own,
Kafka's as producers send it, compressed or not, mixed in one block) gives exactly the records the
decoders return, over any offset range, with headers when asked."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from stratalog.engine.batch import decode_records, encode_batch, read_batch_info, wrap_kafka_batch
from stratalog.engine.objformat import BlockEntry
from stratalog.kafka.records import Compression
from stratalog.kafka.records import encode_batch as encode_kafka
from stratalog.records import NewRecord
from stratalog.spark.columns import ColumnBuilder
from stratalog.wal.format import crc32c

RECORD = st.builds(NewRecord, st.binary(max_size=60), st.none() | st.binary(max_size=20),
                   st.integers(0, 1 << 44),
                   st.lists(st.tuples(st.text(max_size=6), st.none() | st.binary(max_size=10)), max_size=2).map(tuple))
ENCODINGS = st.sampled_from(["native", *(f"kafka-{codec.name}" for codec in Compression)])
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
BATCHES = st.lists(st.tuples(ENCODINGS, st.lists(RECORD, min_size=1, max_size=6)), min_size=1, max_size=5)


def stored(batches: list[tuple[str, list[NewRecord]]], stream_id: int, first: int) -> bytes:
    out, base = [], first
    for encoding, records in batches:
        if encoding == "native":
            out.append(encode_batch(stream_id, base, records)[0])
        else:
            stamps = [r.timestamp_ms or 0 for r in records]  # RECORD gives every record a time
            kafka = encode_kafka([(r.key, r.value, r.headers, ts) for r, ts in zip(records, stamps, strict=True)],
                                 base_offset=base, compression=Compression[encoding.removeprefix("kafka-")])
            out.append(wrap_kafka_batch(stream_id, base, len(records), max(stamps), kafka))
        base += len(records)
    return b"".join(out)


@settings(max_examples=200, deadline=None)
@given(blocks=st.lists(BATCHES, min_size=1, max_size=3), cut=st.tuples(st.integers(0, 40), st.integers(0, 40)),
       gap=st.integers(0, 9), headers=st.booleans())
def test_columns_hold_the_decoded_records_of_every_encoding(blocks: list[list[tuple[str, list[NewRecord]]]],
                                                            cut: tuple[int, int], gap: int, headers: bool) -> None:
    buf = bytearray(b"\xee" * gap)  # a fetched range need not start at a block
    entries, expected, first = [], [], 100
    for number, batches in enumerate(blocks):
        data = stored(batches, number + 1, first)
        count = sum(len(records) for _, records in batches)
        entries.append((len(buf), BlockEntry(number + 1, first, first + count, len(buf), len(data), count, 0,
                                             crc32c(data))))
        at = 0
        while at < len(data):
            info = read_batch_info(data, at)
            expected += [(f"s{number}", r) for r in decode_records(data, at, info)]
            at += info.batch_bytes
        buf += data
        first += count
    start, end = 100 + min(cut), 100 + max(cut)
    builder = ColumnBuilder()
    for number, (at, entry) in enumerate(entries):
        builder.add_block(bytes(buf), at, entry, f"s{number}", start, end)
    table = builder.finish(bytes(buf), headers).to_pylist()
    wanted = [(name, r) for name, r in expected if start <= r.offset < end]
    assert [(row["stream"], row["offset"], row["key"], row["value"]) for row in table] == \
        [(name, r.offset, r.key, r.value) for name, r in wanted]
    assert [(row["timestamp"] - EPOCH) // timedelta(milliseconds=1) for row in table] == \
        [r.timestamp_ms for _, r in wanted]
    if headers:
        assert [tuple((h["key"], h["value"]) for h in row["headers"]) for row in table] == \
            [r.headers for _, r in wanted]
