"""The Spark source's columns from stored blocks: every encoding a batch is stored in (the store's own,
Kafka's as producers send it, compressed or not, as log compaction rewrites it, with gaps in its offsets
or no records left, and transactions' markers, mixed in one block) gives exactly the records the decoders
return at their offsets, over any offset range, with headers when asked; a marker gives no record."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stratalog.engine.batch import decode_records, encode_batch, read_batch_info, wrap_kafka_batch
from stratalog.engine.objformat import BlockEntry, CorruptObjectError
from stratalog.kafka.compaction import gap_batch, kafka_batch_records, rebuilt_batch
from stratalog.kafka.control_batch import MarkerType, marker_batch
from stratalog.kafka.records import Compression
from stratalog.kafka.records import encode_batch as encode_kafka
from stratalog.records import NewRecord
from stratalog.spark.columns import ColumnBuilder
from stratalog.wal.format import crc32c

RECORD = st.builds(NewRecord, st.binary(max_size=60), st.none() | st.binary(max_size=20),
                   st.integers(0, 1 << 44),
                   st.lists(st.tuples(st.text(max_size=6), st.none() | st.binary(max_size=10)), max_size=2).map(tuple))
#: "compacted": the batch as log compaction rewrites it, keeping the records its mask says (none: an empty
#: batch over its offsets).
ENCODINGS = st.sampled_from(["native", *(f"kafka-{codec.name}" for codec in Compression),
                             *(f"compacted-{codec.name}" for codec in Compression), "marker"])
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
Batch = tuple[str, list[NewRecord], list[bool]]
BATCHES = st.lists(st.tuples(ENCODINGS, st.lists(RECORD, min_size=1, max_size=6),
                             st.lists(st.booleans(), min_size=6, max_size=6)), min_size=1, max_size=5)


def stored(batches: list[Batch], stream_id: int, first: int) -> bytes:
    out, base = [], first
    for encoding, records, kept in batches:
        if encoding == "marker":   # a transaction's commit marker: one offset, no row
            marker = marker_batch(7, 0, MarkerType.COMMIT, coordinator_epoch=0, timestamp_ms=5, base_offset=base)
            out.append(wrap_kafka_batch(stream_id, base, 1, 5, marker))
            base += 1
            continue
        if encoding == "native":
            out.append(encode_batch(stream_id, base, records)[0])
        else:
            stamps = [r.timestamp_ms or 0 for r in records]  # RECORD gives every record a time
            kind, codec = encoding.split("-")
            kafka = encode_kafka([(r.key, r.value, r.headers, ts) for r, ts in zip(records, stamps, strict=True)],
                                 base_offset=base, compression=Compression[codec])
            if kind == "compacted":
                source = kafka_batch_records(kafka)
                chosen = [r for r, keep in zip(source.records, kept, strict=False) if keep]
                kafka = rebuilt_batch(source, chosen) if chosen else gap_batch(base, len(records))
            out.append(wrap_kafka_batch(stream_id, base, len(records), max(stamps), kafka))
        base += len(records)
    return b"".join(out)


@settings(max_examples=200, deadline=None)
@given(blocks=st.lists(BATCHES, min_size=1, max_size=3), cut=st.tuples(st.integers(0, 40), st.integers(0, 40)),
       gap=st.integers(0, 9), headers=st.booleans())
def test_columns_hold_the_decoded_records_of_every_encoding(blocks: list[list[Batch]], cut: tuple[int, int],
                                                            gap: int, headers: bool) -> None:
    buf = bytearray(b"\xee" * gap)  # a fetched range need not start at a block
    entries, expected, first = [], [], 100
    for number, batches in enumerate(blocks):
        data = stored(batches, number + 1, first)
        count = sum(1 if encoding == "marker" else len(records) for encoding, records, _ in batches)
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


def test_a_range_of_offsets_compaction_emptied_gives_no_rows() -> None:
    source = kafka_batch_records(encode_kafka([(b"k", b"%d" % i, (), 1000 + i) for i in range(4)], base_offset=14))
    kafka = rebuilt_batch(source, source.records[-1:])   # offset 17 only
    data = wrap_kafka_batch(1, 10, 4, -1, gap_batch(10, 4)) + wrap_kafka_batch(1, 14, 4, 1003, kafka)
    entry = BlockEntry(1, 10, 18, 0, len(data), 8, 1003, crc32c(data))
    for start, end, offsets in [(10, 14, []), (11, 17, []), (12, 18, [17]), (17, 18, [17])]:
        builder = ColumnBuilder()
        builder.add_block(data, 0, entry, "s", start, end)
        assert builder.finish(data, headers=True).column("offset").to_pylist() == offsets


def test_a_kafka_batch_over_other_offsets_than_the_stores_header_is_corrupt() -> None:
    kafka = encode_kafka([(b"k", b"v", (), 1000)] * 3, base_offset=0)
    data = wrap_kafka_batch(1, 0, 5, 1000, kafka)   # the store says 5 offsets, the batch spans 3
    builder = ColumnBuilder()
    with pytest.raises(CorruptObjectError, match="over 3 offsets where the store's header says 5"):
        builder.add_block(data, 0, BlockEntry(1, 0, 5, 0, len(data), 5, 1000, crc32c(data)), "s", 0, 5)


def test_a_marker_takes_an_offset_and_gives_no_record() -> None:
    data = stored([("kafka-NONE", [NewRecord(b"k", b"v", 1)], []), ("marker", [], []),
                   ("kafka-NONE", [NewRecord(b"k", b"w", 2)], [])], 1, 10)
    entry = BlockEntry(1, 10, 13, 0, len(data), 3, 5, crc32c(data))
    builder = ColumnBuilder()
    builder.add_block(data, 0, entry, "s", 10, 13)
    assert builder.finish(data, headers=False).column("offset").to_pylist() == [10, 12]
    at, offsets = 0, []
    while at < len(data):
        info = read_batch_info(data, at)
        offsets += [r.offset for r in decode_records(data, at, info)]
        at += info.batch_bytes
    assert offsets == [10, 12], "Stream.fetch's decoder skips it too"
