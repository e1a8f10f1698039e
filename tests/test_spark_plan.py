"""The Spark data source without a JVM: planning, decoding to Arrow, staging, stream offsets."""

from __future__ import annotations

import datetime
import pickle
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql.datasource import EqualTo, GreaterThan, GreaterThanOrEqual, In, LessThan, StringStartsWith
from pyspark.sql.pandas.types import to_arrow_schema

from enginekit import MemoryStore, small_store_config
from stratalog.engine.batch import BATCH_HEADER_BYTES, encode_batch
from stratalog.engine.manifest import BlockRef, Manifest, StreamInfo, read_manifest
from stratalog.engine.objformat import BlockEntry
from stratalog.engine.staging import assign_bases
from stratalog.engine.store import StreamStore
from stratalog.records import NewRecord
from stratalog.spark.columns import ARROW_SCHEMA, SCHEMA_DDL, SPARK_SCHEMA
from stratalog.spark.plan import (
    OffsetRange,
    ReadPartition,
    UnknownStreamsError,
    plan_fetches,
    plan_partitions,
    resolve_streams,
)
from stratalog.spark.reader import read_partition
from stratalog.spark.source import PushedFilters, StratalogReader
from stratalog.spark.stream import StratalogStreamReader, advance, decode_positions, encode_positions
from stratalog.spark.write import StagingWriter, WriteMessage


def synthetic_manifest(rows_per_stream: dict[int, int], block_rows: int = 100, rows_ts: int = 0) -> Manifest:
    """Streams whose blocks of ``block_rows`` rows each lie one after another in one object per stream."""
    manifest = Manifest(seq=1)
    position = 0
    for stream_id, rows in rows_per_stream.items():
        manifest.streams[stream_id] = StreamInfo(stream_id, f"s{stream_id}", 0, rows)
        refs = []
        for start in range(0, rows, block_rows):
            end = min(start + block_rows, rows)
            refs.append(BlockRef("data/shared.slo", BlockEntry(stream_id, start, end, position, 1000, end - start,
                                                               rows_ts, 0)))
            position += 1000
        manifest.blocks[stream_id] = refs
    return manifest


def covered(parts: list[ReadPartition]) -> dict[int, list[tuple[int, int]]]:
    out: dict[int, list[tuple[int, int]]] = {}
    for part in parts:
        for piece in part.slices:
            out.setdefault(piece.stream_id, []).append((piece.start_offset, piece.end_offset))
    return out


def test_many_small_streams_pack_into_few_partitions() -> None:
    manifest = synthetic_manifest({i: 10 for i in range(1, 1001)}, block_rows=10)
    parts = plan_partitions(manifest, sorted(manifest.streams), rows_max=2000, bytes_max=1 << 40)
    assert len(parts) == 5
    assert [p.rows for p in parts] == [2000] * 5
    assert covered(parts) == {i: [(0, 10)] for i in range(1, 1001)}


def test_a_large_stream_splits_at_block_boundaries_within_the_row_bound() -> None:
    manifest = synthetic_manifest({1: 10_000, 2: 50}, block_rows=100)
    parts = plan_partitions(manifest, [1, 2], rows_max=1000, bytes_max=1 << 40)
    assert all(p.rows <= 1000 for p in parts)
    assert len(parts) == 11
    spans = covered(parts)
    assert spans[1] == [(i, i + 1000) for i in range(0, 10_000, 1000)]
    assert spans[2] == [(0, 50)]


def test_rows_are_spread_evenly_over_the_partitions_rows_max_implies() -> None:
    manifest = synthetic_manifest({1: 1100}, block_rows=100)
    parts = plan_partitions(manifest, [1], rows_max=1000, bytes_max=1 << 40)
    assert [p.rows for p in parts] == [600, 500]  # not 1000 + 100: tasks of about equal length


def test_partitions_also_close_on_bytes() -> None:
    manifest = synthetic_manifest({1: 1000}, block_rows=100)  # 10 blocks of 1000 bytes
    parts = plan_partitions(manifest, [1], rows_max=1 << 40, bytes_max=3000)
    assert [p.rows for p in parts] == [300, 300, 300, 100]


def test_offset_window_clips_slices_to_exact_offsets() -> None:
    manifest = synthetic_manifest({1: 1000, 2: 1000}, block_rows=100)
    parts = plan_partitions(manifest, [1, 2], OffsetRange(150, 420))
    assert covered(parts) == {1: [(150, 420)], 2: [(150, 420)]}
    assert [r.entry.start_offset for r in parts[0].slices[0].blocks] == [100, 200, 300, 400]


def test_empty_window_or_streams_plan_nothing() -> None:
    manifest = synthetic_manifest({1: 100})
    assert plan_partitions(manifest, [1], OffsetRange(500, 600)) == []
    assert plan_partitions(manifest, []) == []


def test_adjacent_blocks_are_fetched_with_one_get_up_to_the_bound() -> None:
    manifest = synthetic_manifest({1: 30, 2: 30}, block_rows=10)  # six adjacent 1000-byte blocks
    parts = plan_partitions(manifest, [1, 2])
    fetches = plan_fetches(parts[0], fetch_bytes_max=4000)
    assert [(f.start, f.end) for f in fetches] == [(0, 4000), (4000, 6000)]
    assert [len(f.blocks) for f in fetches] == [4, 2]


def test_streams_option_takes_names_and_ids_and_rejects_unknown() -> None:
    manifest = synthetic_manifest({1: 10, 2: 10, 3: 10})
    assert resolve_streams(manifest, None) == [1, 2, 3]
    assert resolve_streams(manifest, "s3, 1") == [1, 3]
    with pytest.raises(UnknownStreamsError, match="nope"):
        resolve_streams(manifest, "s1,nope")


def test_pushed_filters_keep_what_they_cannot_apply() -> None:
    pushed = PushedFilters()
    kept = [f for f in [EqualTo(("stream",), "a"), In(("stream",), ("a", "b")), GreaterThanOrEqual(("offset",), 5),
                        LessThan(("offset",), 9), StringStartsWith(("stream",), "a"), EqualTo(("value",), b"x")]
            if not pushed.take(f)]
    assert kept == [StringStartsWith(("stream",), "a"), EqualTo(("value",), b"x")]
    assert pushed.labels == frozenset({"a"})
    assert pushed.offsets == OffsetRange(5, 9)


def test_a_time_bound_skips_blocks_whose_newest_record_is_older() -> None:
    manifest = synthetic_manifest({1: 500})
    newest = [10, 50, 20, 60, 70]  # max timestamp of each 100-row block
    manifest.blocks[1] = [BlockRef(r.key, BlockEntry(1, r.entry.start_offset, r.entry.end_offset, r.entry.position,
                                                     r.entry.size_bytes, r.entry.record_count, ts, 0))
                          for r, ts in zip(manifest.blocks[1], newest, strict=True)]
    parts = plan_partitions(manifest, [1], time_from_ms=40)
    assert covered(parts) == {1: [(100, 200), (300, 500)]}  # one slice per run of kept blocks
    assert covered(plan_partitions(manifest, [1], time_from_ms=71)) == {}
    assert covered(plan_partitions(manifest, [1])) == {1: [(0, 500)]}


def test_timestamp_filters_give_a_bound_and_stay_with_spark() -> None:
    at = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)
    at_ms = 1_704_067_200_000
    pushed = PushedFilters()
    assert not pushed.take(GreaterThanOrEqual(("timestamp",), at))
    assert pushed.time_from_ms == at_ms
    assert not pushed.take(GreaterThan(("timestamp",), at + datetime.timedelta(milliseconds=5)))
    assert pushed.time_from_ms == at_ms + 5  # the tighter of the two
    assert not pushed.take(LessThan(("timestamp",), at + datetime.timedelta(days=1)))
    assert not pushed.take(GreaterThan(("timestamp",), datetime.datetime(2030, 1, 1)))  # naive: ignored
    assert pushed.time_from_ms == at_ms + 5


def test_arrow_schema_is_what_spark_expects() -> None:
    assert SPARK_SCHEMA.simpleString() == f"struct<{SCHEMA_DDL.replace(' ', ':').replace(',:', ',')}>"
    assert to_arrow_schema(SPARK_SCHEMA, timezone="UTC") == ARROW_SCHEMA


def test_partitions_and_readers_pickle() -> None:
    manifest = synthetic_manifest({1: 500, 2: 5})
    parts = plan_partitions(manifest, [1, 2], rows_max=200)
    assert pickle.loads(pickle.dumps(parts)) == parts
    assert len(pickle.dumps(parts[0])) < 2000
    reader = StratalogReader({"path": "file:///x", "streams": "a"})
    reader.pushed.take(EqualTo(("stream",), "a"))
    again = pickle.loads(pickle.dumps(reader))
    assert again.pushed.labels == frozenset({"a"}) and again.uri == "file:///x"
    stream_reader = StratalogStreamReader({"path": "file:///x", "maxrowspertrigger": "7"})
    assert pickle.loads(pickle.dumps(stream_reader)).rows_per_trigger == 7


def fill_store(tmp_path: Path, objects: MemoryStore) -> StreamStore:
    store = StreamStore.open(tmp_path / "d", objects, small_store_config())
    for n in range(3):
        s = store.create_stream(f"s{n}")
        for i in range(0, 300, 30):
            s.append([NewRecord(b"v%d-%d" % (n, j), key=None if j % 3 == 0 else b"k%d" % j, timestamp_ms=1000 + j)
                      for j in range(i, i + 30)]).result()
    store.flush()
    return store


def test_read_partition_yields_exactly_the_planned_records(tmp_path: Path) -> None:
    objects = MemoryStore()
    store = fill_store(tmp_path, objects)
    try:
        manifest = read_manifest(objects)
        parts = plan_partitions(manifest, sorted(manifest.streams), OffsetRange(7, 250), rows_max=100)
        table = pa.Table.from_batches([b for p in parts for b in read_partition(objects, p)], schema=ARROW_SCHEMA)
        assert table.num_rows == 3 * 243
        for n in range(3):
            rows = table.filter(pa.compute.equal(table["stream"], f"s{n}")).to_pylist()
            expected = store.open_stream(f"s{n}").fetch(7, 250, max_bytes=1 << 30)
            assert [r["offset"] for r in rows] == [r.offset for r in expected]
            assert [r["value"] for r in rows] == [r.value for r in expected]
            assert [r["key"] for r in rows] == [r.key for r in expected]
            assert [round(r["timestamp"].timestamp() * 1000) for r in rows] == [r.timestamp_ms for r in expected]
    finally:
        store.close()


def test_failed_task_deletes_what_it_staged() -> None:
    objects = MemoryStore()
    writer = StagingWriter(objects, "spark-staging/t/", object_bytes=100)
    writer.add("a", [NewRecord(b"x" * 200)])
    assert list(objects.list("spark-staging/"))
    writer.discard()
    assert not list(objects.list("spark-staging/"))


def test_tasks_get_dense_bases_in_partition_order() -> None:
    from stratalog.spark.write import StagedObject, StagedStream

    def message(partition: int, *counts: tuple[str, int]) -> WriteMessage:
        return WriteMessage(partition, (StagedObject(f"k{partition}", 1, tuple(StagedStream(n, 0, c)
                                                                               for n, c in counts)),))

    shifts = assign_bases([message(2, ("a", 5)), message(0, ("a", 3), ("b", 1)), message(1, ("b", 4))],
                          {"a": 10, "b": 0})
    assert shifts == {(0, "a"): 10, (0, "b"): 0, (1, "b"): 1, (2, "a"): 13}


def test_batches_encode_the_same_after_a_new_placement() -> None:
    data, _ = encode_batch(0, 0, [b"x"])
    from stratalog.engine.batch import check_batch, with_placement

    info = check_batch(with_placement(data, 0, 9, 77))
    assert (info.stream_id, info.base_offset, info.count) == (9, 77, 1)
    assert with_placement(data, 0, 0, 0) == data


def test_positions_round_trip_compactly() -> None:
    positions = {i: i * 3 for i in range(1, 100_001)}
    data = encode_positions(positions)
    assert decode_positions(data) == positions
    assert len(data) < 1_600_000 / 2


def test_advance_respects_the_row_limit_and_rotates_the_cursor() -> None:
    manifest = synthetic_manifest({1: 100, 2: 100, 3: 100})
    first = advance(manifest, [1, 2, 3], {}, 0, 150)
    assert first.positions == {1: 100, 2: 50} and first.rows == 150 and first.cursor == 3
    second = advance(manifest, [1, 2, 3], first.positions, first.cursor, 150)
    assert second.positions == {1: 100, 2: 100, 3: 100} and second.rows == 150
    assert advance(manifest, [1, 2, 3], second.positions, second.cursor, 150).rows == 0


def test_advance_stops_at_a_fixed_target() -> None:
    manifest = synthetic_manifest({1: 100, 2: 100})
    moved = advance(manifest, [1, 2], {}, 0, None, ends={1: 60})
    assert moved.positions == {1: 60} and moved.rows == 60


def test_compaction_takes_shared_objects_and_repeated_small_stream_objects() -> None:
    from stratalog.spark.jobs import compaction_candidates, plan_compaction

    def ref(key: str, stream_id: int, start: int, end: int, size: int = 100) -> BlockRef:
        return BlockRef(key, BlockEntry(stream_id, start, end, 0, size, end - start, 0, 0))

    blocks = {
        1: [ref("shared-a", 1, 0, 10), ref("shared-b", 1, 10, 20), ref("own-1", 1, 20, 30, 10_000)],
        2: [ref("shared-a", 2, 0, 5), ref("shared-b", 2, 5, 9)],
        3: [ref("small-3a", 3, 0, 5), ref("small-3b", 3, 5, 9)],
        4: [ref("small-4", 4, 0, 5)],  # one small object of its own: nothing to merge it with
    }
    keys = compaction_candidates(blocks, small_bytes_max=1000)
    assert keys == {"shared-a", "shared-b", "small-3a", "small-3b"}
    runs = plan_compaction(blocks, keys, object_bytes_max=150)
    assert [[(r.key, r.entry.start_offset) for r in run] for run in runs] == [
        [("shared-a", 0)], [("shared-b", 10)],        # 200 bytes would pass the bound
        [("shared-a", 0)], [("shared-b", 5)],
        [("small-3a", 0)], [("small-3b", 5)],
    ]
    assert len(plan_compaction(blocks, keys, object_bytes_max=1 << 20)) == 3


def test_compaction_in_a_cluster_sends_each_broker_the_objects_of_its_own_partitions() -> None:
    from stratalog.spark.jobs import split_by_leader

    def ref(key: str, stream_id: int) -> BlockRef:
        return BlockRef(key, BlockEntry(stream_id, 0, 10, 0, 100, 10, 0, 0))

    blocks = {
        1: [ref("b1-upload", 1), ref("before-failover", 1)],
        2: [ref("b1-upload", 2), ref("before-failover", 2), ref("no-leader", 2)],
        3: [ref("b2-upload", 3), ref("no-leader", 3), ref("not-a-candidate", 3)],
        4: [ref("not-a-partition", 4)],
    }
    keys = {"b1-upload", "before-failover", "b2-upload", "no-leader", "not-a-partition"}
    leader_of = {1: "b1:9092", 2: "b2:9092", 3: "b2:9092", 4: None}
    leader_of_before = {**leader_of, 2: "b1:9092"}
    del leader_of_before[3]   # its partition has no leader: left out of Metadata while it moves
    groups, skipped = split_by_leader(blocks, keys, leader_of_before)
    assert groups == {"b1:9092": {"b1-upload", "before-failover"}}
    assert skipped == {"b2-upload", "no-leader", "not-a-partition"}
    # After partition 2 moved to broker 2: the objects of 1 and 2 together are no one broker's to swap, and
    # the one of 2 and 3 is broker 2's now that 3 has it as leader too.
    groups, skipped = split_by_leader(blocks, keys, leader_of)
    assert groups == {"b2:9092": {"b2-upload", "no-leader"}}
    assert skipped == {"b1-upload", "before-failover", "not-a-partition"}
    assert split_by_leader(blocks, set(), leader_of) == ({}, set())


def test_vectorized_encoding_matches_the_engine_encoder_byte_for_byte() -> None:
    from datetime import UTC, datetime

    from stratalog.spark.write import encode_rows

    stamps = [datetime.fromtimestamp(i, UTC) if i % 5 else None for i in range(1, 401)]
    batch = pa.RecordBatch.from_pydict({
        "stream": [("a", "b", "c")[i % 3] for i in range(400)],
        "key": [None if i % 4 == 0 else b"k%d" % i for i in range(400)],
        "value": [f"v{i}" * (i % 7) for i in range(400)],  # strings, some empty
        "timestamp": pa.array(stamps, pa.timestamp("us", tz="UTC")),
        "offset": list(range(400)),  # ignored
    })
    groups = dict(encode_rows(batch, now_ms=77, batch_bytes_target=600))
    assert sorted(groups) == ["a", "b", "c"]
    for n, name in enumerate(("a", "b", "c")):
        rows = range(n, 400, 3)
        records = [NewRecord((f"v{i}" * (i % 7)).encode(), None if i % 4 == 0 else b"k%d" % i,
                             (i + 1) * 1000 if (i + 1) % 5 else 77) for i in rows]
        encoded = groups[name]
        assert len(encoded) > 1 and sum(b.count for b in encoded) == len(records)
        at = 0
        for b in encoded:
            expected, max_ts = encode_batch(0, 0, records[at:at + b.count])
            assert bytes(b.frame[BATCH_HEADER_BYTES:]) == expected[BATCH_HEADER_BYTES:]
            assert b.max_timestamp_ms == max_ts
            assert b.crc == int.from_bytes(expected[BATCH_HEADER_BYTES - 4:BATCH_HEADER_BYTES], "little")
            at += b.count


def test_vectorized_encoding_refuses_null_streams_and_values() -> None:
    from stratalog.spark.write import encode_rows

    with pytest.raises(ValueError, match="stream"):
        list(encode_rows(pa.RecordBatch.from_pydict({"stream": [None], "value": [b"x"]}), 0))
    with pytest.raises(ValueError, match="null value"):
        list(encode_rows(pa.RecordBatch.from_pydict({"stream": ["a"], "value": pa.array([None], pa.binary())}), 0))


def test_a_plan_made_before_compaction_still_reads_after_the_old_objects_are_deleted(tmp_path: Path) -> None:
    from stratalog.engine.store import object_key
    from stratalog.spark.jobs import CompactionOutput, compaction_candidates, plan_compaction, write_compacted
    from stratalog.spark.reader import _stores

    objects = MemoryStore()
    store = fill_store(tmp_path, objects)
    store.flush()
    manifest = read_manifest(objects)
    stale = plan_partitions(manifest, sorted(manifest.streams), OffsetRange(5, 290), rows_max=100)
    expected = pa.Table.from_batches([b for p in stale for b in read_partition(objects, p)]).to_pylist()
    # Compact into per-stream objects, swap them in, and delete the old objects at once (no grace).
    keys = compaction_candidates(manifest.blocks) | {r.key for refs in manifest.blocks.values() for r in refs}
    outputs = []
    for run in plan_compaction(manifest.blocks, keys):
        object_id = store.metadata.allocate_object_id()
        outputs.append(CompactionOutput(object_id, object_key(object_id), run[0].entry.stream_id, tuple(run)))
    _stores["mem://test"] = objects
    try:
        written = list(write_compacted("mem://test", outputs))
    finally:
        del _stores["mem://test"]
    ids = {o.key: o.object_id for o in store.metadata.objects()}
    store.replace_objects(sorted(ids[k] for k in keys), written)
    assert store.delete_unreferenced() == len(keys)
    assert not keys & {info.key for info in objects.list("data/")}
    again = pa.Table.from_batches([b for p in stale for b in read_partition(objects, p)]).to_pylist()
    assert sorted(again, key=lambda r: (r["stream"], r["offset"])) == sorted(
        expected, key=lambda r: (r["stream"], r["offset"]))
    store.close()


def test_headers_column_matches_spark_and_the_engine(tmp_path: Path) -> None:
    from stratalog.spark.columns import ARROW_SCHEMA_WITH_HEADERS, SPARK_SCHEMA_WITH_HEADERS

    assert to_arrow_schema(SPARK_SCHEMA_WITH_HEADERS, timezone="UTC") == ARROW_SCHEMA_WITH_HEADERS
    objects = MemoryStore()
    store = StreamStore.open(tmp_path / "d", objects, small_store_config())
    s = store.create_stream("h")
    s.append([NewRecord(b"v%d" % i, headers=[("a", b"1"), ("b", None)] if i % 3 == 0 else ())
              for i in range(40)]).result()
    store.flush()
    manifest = read_manifest(objects)
    (part,) = plan_partitions(manifest, [s.stream_id], OffsetRange(2, 40))
    rows = pa.Table.from_batches(list(read_partition(objects, part, headers=True))).to_pylist()
    expected = s.fetch(2, max_bytes=1 << 30)
    assert [[(h["key"], h["value"]) for h in r["headers"]] for r in rows] == [list(r.headers) for r in expected]
    assert [r["value"] for r in rows] == [r.value for r in expected]
    store.close()
