"""Queue reads of the Spark data source without a JVM: planning over a queue store's objects, the Arrow
batches of a task, and what a task does when its object is gone or changed."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql.datasource import EqualTo, In, IsNotNull, LessThan

from queuekit import small_queue_config
from stratalog.objects.local import LocalDirStore
from stratalog.objects.uri import LOCAL_DIR_NAME
from stratalog.queues import QueueStore
from stratalog.queues.format import U32, CorruptBulkError
from stratalog.queues.manifest import QueueManifest, QueueObjectRef
from stratalog.spark.columns import ARROW_SCHEMA
from stratalog.spark.plan import OffsetRange, UnknownStreamsError
from stratalog.spark.queues import (
    GAP_BYTES_MAX,
    ObjectLayout,
    QueueLayout,
    QueuePartition,
    QueueReadError,
    plan_queue_partitions,
    plan_queue_read,
    read_layout,
    read_queue_partition,
    select_streams,
)
from stratalog.spark.source import StratalogReader
from waiting import wait_until

Model = dict[str, list[bytes]]


def _fill(path: Path, queues: int, rounds: int, fanout: int = 0, piece_bytes_max: int | None = None) -> Model:
    """A queue store with one object per round (more queues each round); returns what each queue holds.
    With ``fanout``, the store is then opened once more and left until its merges settle; with
    ``piece_bytes_max``, they cut their results into pieces that small."""
    model: Model = {}
    # Each round in an open of its own, uploaded only by its close: an upload at idle could take a round's
    # new names alone, as an object of its own (a loaded machine split rounds so, and the tiers then merged
    # other objects, or none). The merges run in the last open alone, in a thread, so which objects merge,
    # and into how many pieces, is the same from run to run.
    once = {"upload_idle_s": 60.0, "upload_interval_s": 60.0}
    for r in range(rounds):
        with QueueStore.open(path, config=small_queue_config(compact_fanout=0, **once)) as qs:
            count = queues * (r + 1) // rounds
            names = [f"q{i:05d}" for i in range(count) if (i + r) % 3]
            messages = [b"%s-%d-%s" % (n.encode(), r, b"x" * (i % 17)) for i, n in enumerate(names)]
            qs.put_many(names, messages)
            for n, m in zip(names, messages, strict=True):
                model.setdefault(n, []).append(m)
    if fanout:
        pieces = {} if piece_bytes_max is None else {"compact_object_bytes_max": piece_bytes_max,
                                                     "upload_bytes_threshold": 16 << 10}
        # The tiers alone: a merge at rest would take several of them at once, and the layouts tested here
        # (pieces, merges planned around) come from the tiers.
        config = small_queue_config(compact_fanout=fanout, compact_idle_bytes_max=0, compact_in_worker=False,
                                    **once, **pieces)
        with QueueStore.open(path, config=config) as qs:
            wait_until(lambda: qs.compactions > 0 and not qs.compactor.retiring
                       and qs.compactor.plan(qs.log_cache.view.objects) is None,
                       "the merges to settle")
    return model


def _objects(path: Path) -> LocalDirStore:
    return LocalDirStore(path / LOCAL_DIR_NAME)


def _rows(batches: list[pa.RecordBatch]) -> list[tuple[str, int, bytes]]:
    table = pa.Table.from_batches(batches, schema=ARROW_SCHEMA)
    return list(zip(table.column("stream").to_pylist(), table.column("offset").to_pylist(),
                    table.column("value").to_pylist(), strict=True))


def _read_all(store: LocalDirStore, parts: list[QueuePartition]) -> list[tuple[str, int, bytes]]:
    rows: list[tuple[str, int, bytes]] = []
    for part in parts:
        batches = list(read_queue_partition(store, part))
        for batch in batches:
            assert batch.schema == ARROW_SCHEMA
            assert batch.column("timestamp").null_count == batch.num_rows
            assert batch.column("key").null_count == batch.num_rows
        got = _rows(batches)
        assert len(got) == part.rows
        rows.extend(got)
    return rows


def _expected(model: Model, offsets: OffsetRange | None = None) -> list[tuple[str, int, bytes]]:
    offsets = offsets or OffsetRange()
    return sorted((n, o, m) for n, ms in model.items() for o, m in enumerate(ms) if offsets.start <= o < offsets.end)


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Model]:
    path = tmp_path_factory.mktemp("queues")
    return path, _fill(path, 3000, 4)


def test_partitions_cover_every_message_exactly_once(filled: tuple[Path, Model]) -> None:
    path, model = filled
    store = _objects(path)
    layout = read_layout(store)
    assert len(layout.objects) >= 4  # one upload a round (two if an idle upload cut a round in two)
    parts = plan_queue_partitions(layout, select_streams(layout, "*", None), bytes_max=8 << 10)
    assert len(parts) > 8  # several slices of each object, never one per queue
    assert len(parts) < sum(len(ms) for ms in model.values()) // 20
    rows = _read_all(store, parts)
    assert len(rows) == len(set(rows))
    assert sorted(rows) == _expected(model)


def test_a_store_whose_merges_made_pieces_reads_every_message_once(tmp_path: Path) -> None:
    model = _fill(tmp_path, 3000, 4, fanout=2, piece_bytes_max=48 << 10)
    store = _objects(tmp_path)
    layout = read_layout(store)
    places = [ref.key.split("/")[-1].split("-")[0] for ref in layout.objects]
    assert len(set(places)) < len(places), "some merge made several pieces"
    rows = _read_all(store, plan_queue_partitions(layout, select_streams(layout, "*", None), bytes_max=8 << 10))
    assert len(rows) == len(set(rows))
    assert sorted(rows) == _expected(model)


def test_rows_per_partition_bounds_a_partition(filled: tuple[Path, Model]) -> None:
    path, _ = filled
    layout = read_layout(_objects(path))
    parts = plan_queue_partitions(layout, select_streams(layout, "*", None), rows_max=100)
    assert max(p.rows for p in parts) <= 100
    assert sum(p.rows for p in parts) == sum(int(o.ends.astype(np.int64).sum()) for o in layout.objects[-1:])


def test_queue_list_filters_and_offsets_narrow_the_read(filled: tuple[Path, Model]) -> None:
    path, model = filled
    store = _objects(path)
    window = OffsetRange(1, 3)
    parts = plan_queue_read(store, "q00001,q00002,q02999", frozenset({"q00002", "q02999", "nope"}), window,
                            rows_max=1000, bytes_max=1 << 20)
    wanted = {n: model[n] for n in ("q00002", "q02999")}
    assert sorted(_read_all(store, parts)) == _expected(wanted, window)
    assert sum(p.rows for p in parts) == len(_expected(wanted, window))


def test_unknown_queue_is_an_error(filled: tuple[Path, Model]) -> None:
    path, _ = filled
    with pytest.raises(UnknownStreamsError, match="'missing'"):
        plan_queue_read(_objects(path), "q00001,missing", None, OffsetRange(), 1000, 1 << 20)


def test_reader_takes_stream_and_offset_filters_but_leaves_timestamp_nulls_to_spark(filled: tuple[Path, Model]) -> None:
    path, model = filled
    reader = StratalogReader({"path": str(path / LOCAL_DIR_NAME), "queues": "*"})
    left = list(reader.pushFilters([In(("stream",), ("q00007", "q00008")), LessThan(("offset",), 2),
                                    IsNotNull(("timestamp",)), IsNotNull(("value",)), EqualTo(("key",), b"k")]))
    assert [type(f) for f in left] == [IsNotNull, EqualTo]  # timestamp and key are null in queue rows
    rows = _read_all(_objects(path), reader.plan())  # type: ignore[arg-type]
    assert sorted(rows) == _expected({n: model[n] for n in ("q00007", "q00008")}, OffsetRange(0, 2))


def test_queues_option_does_not_mix_with_streams(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="queues"):
        StratalogReader({"path": str(tmp_path), "queues": "*", "streams": "a"})


def test_a_gap_between_chosen_queues_cuts_the_partition() -> None:
    # Synthetic index: 3 streams, the middle run huge; reading the outer two must not fetch the middle.
    ends = np.array([1, 1, 1], U32)
    positions = np.array([0, 100, 100 + 2 * GAP_BYTES_MAX, 100 + 2 * GAP_BYTES_MAX + 100], U32)
    layout = QueueLayout(QueueManifest(1, 3, (QueueObjectRef("queues/a.slq", 0),)),
                         (ObjectLayout("queues/a.slq", 0, ends, positions),), pa.array(["a", "b", "c"]))
    parts = plan_queue_partitions(layout, np.array([True, False, True]))
    assert [(p.start, p.end) for p in parts] == [(0, 100), (100 + 2 * GAP_BYTES_MAX, 200 + 2 * GAP_BYTES_MAX)]


def test_partitions_stay_small_when_pickled_at_a_million_queues() -> None:
    # A synthetic index of 1 M queues (names q0000000 ...) over two objects of ~60 bytes a message.
    count = 1_000_000
    ends = [np.full(count, 3, U32), np.full(count, 6, U32)]
    positions = np.zeros(count + 1, np.int64)
    positions[1:] = np.cumsum(np.full(count, 4 + 3 * 4 + 3 * 58))
    names = pa.array([f"q{i:07d}" for i in range(count)], pa.string())
    objects = tuple(ObjectLayout(f"queues/{k}.slq", int(positions[-1]), e, positions.astype(U32))
                    for k, e in enumerate(ends))
    layout = QueueLayout(QueueManifest(1, count, ()), objects, names)
    parts = plan_queue_partitions(layout, select_streams(layout, "*", None))
    assert sum(p.rows for p in parts) == 6 * count
    per_queue = sum(len(pickle.dumps(p)) for p in parts) / (2 * count)
    assert per_queue < 4, per_queue  # bytes per queue per object once pickled (plain u32s: 32 + the name)
    assert max(len(pickle.dumps(p)) for p in parts) < 4 << 20


def test_a_task_planned_before_a_merge_reads_from_the_merged_object(tmp_path: Path) -> None:
    model = _fill(tmp_path, 400, 4)
    store = _objects(tmp_path)
    parts = plan_queue_read(store, "*", None, OffsetRange(), 10_000, 4 << 10)
    config = small_queue_config(compact_fanout=2, compact_retire_s=0.0, compact_idle_bytes_max=0)
    with QueueStore.open(tmp_path, config=config) as qs:
        wait_until(lambda: qs.compactions >= 2 and not qs.compactor.retiring, "two merges, their sources deleted")
    merged = read_layout(store)
    gone = {p.key for p in parts} - {o.key for o in merged.objects}
    assert len(gone) >= 2 and not any(list(store.list(key)) for key in gone)
    assert sorted(_read_all(store, parts)) == _expected(model)


def test_a_task_that_reads_a_merged_away_file_written_over_reads_from_the_merged_object(tmp_path: Path) -> None:
    # A local store keeps merged-away files as spares and writes newer objects over them: a task that
    # planned on the old manifest and was reading such a file meanwhile gets bytes that fail their CRCs.
    # As the newest manifest no longer names the object, the task reads the offsets where they are now.
    model = _fill(tmp_path, 400, 4)
    store = _objects(tmp_path)
    parts = plan_queue_read(store, "*", None, OffsetRange(), 10_000, 4 << 10)
    sizes = {p.key: (tmp_path / LOCAL_DIR_NAME / p.key).stat().st_size for p in parts}
    config = small_queue_config(compact_fanout=2, compact_retire_s=0.0, compact_idle_bytes_max=0)
    with QueueStore.open(tmp_path, config=config) as qs:
        wait_until(lambda: qs.compactions >= 2 and not qs.compactor.retiring, "two merges, their sources deleted")
    gone = {p.key for p in parts} - {o.key for o in read_layout(store).objects}
    assert len(gone) >= 2
    for key in gone:    # what the task's read found in the file: another object's bytes
        (tmp_path / LOCAL_DIR_NAME / key).write_bytes(bytes(range(256)) * (sizes[key] // 256 + 1))
    assert sorted(_read_all(store, parts)) == _expected(model)


def test_a_missing_object_the_manifest_still_lists_is_reported(tmp_path: Path) -> None:
    _fill(tmp_path, 100, 2)
    store = _objects(tmp_path)
    parts = plan_queue_read(store, "*", None, OffsetRange(), 10_000, 1 << 20)
    store.delete(parts[0].key)
    with pytest.raises(QueueReadError, match=r"is gone.*re-run"):
        list(read_queue_partition(store, parts[0]))


def test_a_changed_object_is_reported(tmp_path: Path) -> None:
    _fill(tmp_path, 100, 2)
    store = _objects(tmp_path)
    parts = plan_queue_read(store, "*", None, OffsetRange(), 10_000, 1 << 20)
    target = tmp_path / LOCAL_DIR_NAME / parts[0].key
    raw = bytearray(target.read_bytes())
    raw[parts[0].start + 40] ^= 0x20
    target.write_bytes(bytes(raw))
    with pytest.raises(CorruptBulkError, match=f"object {parts[0].key}: page 0 failed its CRC.*re-run"):
        list(read_queue_partition(store, parts[0]))
    target.write_bytes(bytes(raw[:parts[0].end - 10]))
    with pytest.raises(QueueReadError, match="shorter"):
        list(read_queue_partition(store, parts[0]))
