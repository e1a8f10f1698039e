"""A Spark write's commit without a JVM: staged objects are registered where they lie, moved under ``data/``
unchanged, and read back with the stream ids and offsets metadata gives them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from enginekit import MemoryStore, small_store_config
from stratalog.engine.batch import BATCH_HEADER, check_batch
from stratalog.engine.manifest import read_manifest
from stratalog.engine.objformat import (
    FOOTER_BYTES,
    OBJECT_FORMAT_VERSION,
    BlockEntry,
    CorruptObjectError,
    check_block,
    decode_footer,
    decode_index,
    placed_batches,
)
from stratalog.engine.staging import STAGING_PREFIX, StagedObject, commit_staged
from stratalog.engine.store import DATA_PREFIX, StreamStore
from stratalog.objects.faulty import FaultyStore, InjectedFaultError, ObjectFaultPlan
from stratalog.objects.local import LocalDirStore
from stratalog.objects.store import ObjectStore
from stratalog.records import NewRecord
from stratalog.spark.plan import plan_partitions
from stratalog.spark.reader import read_partition
from stratalog.spark.write import StagingWriter, WriteMessage

PREFIX = f"{STAGING_PREFIX}w/"


class RecordingStore(MemoryStore):
    """A MemoryStore that notes every ranged get and every put."""

    def __init__(self) -> None:
        super().__init__()
        self.ranges: list[tuple[str, int, int | None]] = []
        self.puts: list[str] = []

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        self.ranges.append((key, start, end))
        return super().get(key, start, end)

    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        self.puts.append(key)
        super().put(key, data)


def stage(objects: ObjectStore, partition: int, rows: dict[str, list[NewRecord]],
          object_bytes: int = 1 << 20) -> WriteMessage:
    """What one task stages: ``rows`` per stream, in objects of about ``object_bytes``."""
    writer = StagingWriter(objects, f"{PREFIX}{partition:06d}-", object_bytes)
    for name, records in rows.items():
        for record in records:  # one batch per record: many batches per block
            writer.add(name, [record])
    return WriteMessage(partition, writer.finish())


def records(tag: str, count: int, ts_ms: int = 1000) -> list[NewRecord]:
    return [NewRecord(b"%s-%d" % (tag.encode(), i), key=b"k%d" % i, timestamp_ms=ts_ms + i) for i in range(count)]


def two_tasks(objects: ObjectStore) -> list[WriteMessage]:
    """Task 1 writes streams b and c, task 0 streams a and b: b's records of task 0 come first."""
    return [stage(objects, 1, {"c": records("c1", 20), "b": records("b1", 30, 5000)}, object_bytes=700),
            stage(objects, 0, {"b": records("b0", 25), "a": records("a0", 10)})]


def open_store(path: Path, objects: ObjectStore) -> StreamStore:
    return StreamStore.open(path, objects, small_store_config())


def with_existing_data(path: Path, objects: ObjectStore) -> StreamStore:
    """A store whose stream b already holds 5 records, so the write continues it at 5."""
    store = open_store(path, objects)
    store.create_stream("b").append(records("old", 5)).result()
    store.flush()
    return store


def values(store: StreamStore, name: str) -> list[tuple[int, bytes]]:
    return [(r.offset, r.value) for r in store.open_stream(name).fetch(0, max_bytes=1 << 30)]


EXPECTED = {
    "a": [(i, b"a0-%d" % i) for i in range(10)],
    "b": [*((i, b"old-%d" % i) for i in range(5)), *((5 + i, b"b0-%d" % i) for i in range(25)),
          *((30 + i, b"b1-%d" % i) for i in range(30))],
    "c": [(i, b"c1-%d" % i) for i in range(20)],
}


def test_commit_moves_staged_objects_unchanged_and_reads_none_of_their_blocks(tmp_path: Path) -> None:
    objects = RecordingStore()
    store = with_existing_data(tmp_path, objects)
    messages = two_tasks(objects)
    staged: list[StagedObject] = [o for m in messages for o in m.objects]
    assert len(staged) > 2, "the test wants a task with several staged objects"
    staged_bytes = sorted(objects.objects[o.key] for o in staged)
    index_positions = {o.key: decode_footer(objects.objects[o.key][-FOOTER_BYTES:], o.size_bytes).index_position
                       for o in staged}
    objects.ranges.clear()
    objects.puts.clear()

    result = commit_staged(store, messages)

    assert result.committed and result.records == 85 and result.objects == len(staged)
    assert not [key for key in objects.puts if key.startswith(DATA_PREFIX)], "the commit wrote object bytes"
    staged_gets = [(key, start) for key, start, _ in objects.ranges if key in index_positions]
    assert staged_gets, "the commit read no index"
    for key, start in staged_gets:
        assert start >= index_positions[key], f"the commit read data blocks of {key} (from {start})"
    committed = [o.key for o in store.metadata.objects()][1:]  # the first object holds the existing data
    assert sorted(objects.objects[key] for key in committed) == staged_bytes, "the bytes changed on the way"
    assert not list(objects.list(STAGING_PREFIX))
    for name, expected in EXPECTED.items():
        assert values(store, name) == expected
    store.close()


def test_committed_objects_read_by_their_placement_everywhere(tmp_path: Path) -> None:
    objects = MemoryStore()
    store = with_existing_data(tmp_path, objects)
    commit_staged(store, two_tasks(objects))
    b = store.open_stream("b")
    # The timestamp lookup walks a block by its placement: b1's records carry timestamps 5000...
    assert b.offset_for_timestamp(5003) == 33
    assert b.fetch(31, 33) and [r.offset for r in b.fetch(31, 33)] == [31, 32]
    manifest = read_manifest(objects)
    parts = plan_partitions(manifest, sorted(manifest.streams))
    table = pa.Table.from_batches([batch for part in parts for batch in read_partition(objects, part)])
    by_stream: dict[str, list[tuple[int, bytes]]] = {}
    for row in table.to_pylist():
        by_stream.setdefault(row["stream"], []).append((row["offset"], row["value"]))
    assert {name: sorted(rows) for name, rows in by_stream.items()} == EXPECTED
    store.close()
    again = open_store(tmp_path, objects)  # recovery and orphan cleanup keep the moved objects
    assert again.recovery.orphan_objects_deleted == 0
    for name, expected in EXPECTED.items():
        assert values(again, name) == expected
    again.close()


def test_staged_objects_say_their_ids_are_provisional_and_metadata_places_them(tmp_path: Path) -> None:
    objects = MemoryStore()
    store = open_store(tmp_path, objects)
    (message,) = [stage(objects, 0, {"x": records("x", 3), "y": records("y", 2)})]
    commit_staged(store, [message])
    x, y = store.open_stream("x"), store.open_stream("y")
    rows = store.metadata.ranges(y.stream_id, 0)
    data = objects.get(rows[0].key)
    footer = decode_footer(data[-FOOTER_BYTES:], len(data))
    assert footer.provisional and footer.version == OBJECT_FORMAT_VERSION
    in_object = decode_index(data[footer.index_position:footer.index_position + footer.index_bytes], footer)
    assert [(e.stream_id, e.start_offset) for e in in_object] == [(0, 0), (1, 0)], "provisional ids, as staged"
    assert (rows[0].stream_id, rows[0].position) == (y.stream_id, in_object[1].position)
    block = check_block(data[rows[0].position:rows[0].position + rows[0].size_bytes], rows[0].entry())
    assert [(i.stream_id, i.base_offset) for _, i in placed_batches(block, rows[0].entry())] == [
        (y.stream_id, 0), (y.stream_id, 1)]
    assert BATCH_HEADER.unpack_from(block)[0] == 1, "the header keeps the provisional id"
    assert x.stream_id != 1 or y.stream_id != 1
    store.close()


def test_a_block_whose_batches_disagree_with_its_placement_is_refused() -> None:
    objects = MemoryStore()
    (staged,) = stage(objects, 0, {"x": records("x", 3)}).objects
    data = objects.get(staged.key)
    footer = decode_footer(data[-FOOTER_BYTES:], len(data))
    (entry,) = decode_index(data[footer.index_position:footer.index_position + footer.index_bytes], footer)
    block = check_block(data[:entry.size_bytes], entry)
    wrong = BlockEntry(9, 100, 104, entry.position, entry.size_bytes, 4, entry.max_timestamp_ms, entry.crc)
    with pytest.raises(CorruptObjectError, match="3 records"):
        list(placed_batches(block, wrong))


def data_and_staged(objects: MemoryStore) -> set[str]:
    """Keys of data and staged objects (manifests come and go with commits that create streams)."""
    return {key for key in objects.objects if key.startswith((DATA_PREFIX, STAGING_PREFIX))}


def fail_the_metadata_commit(store: StreamStore, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: Any, **__: Any) -> int:
        raise ValueError("the metadata commit failed")

    monkeypatch.setattr(store, "commit_external_objects", refuse)


class FenceRefusedError(Exception):
    """Stands for a cluster's fence refusing the metadata commit (the partition moved to another broker)."""


def test_a_commit_refused_by_a_kept_error_puts_the_staged_objects_back(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    memory = MemoryStore()
    store = with_existing_data(tmp_path, memory)
    messages = two_tasks(memory)
    before = data_and_staged(memory)
    commit = store.commit_external_objects

    def refuse(*_: Any, **__: Any) -> int:
        raise FenceRefusedError("the partition moved")

    monkeypatch.setattr(store, "commit_external_objects", refuse)
    with pytest.raises(FenceRefusedError):
        commit_staged(store, messages, keep_staged_on=(FenceRefusedError,))
    assert data_and_staged(memory) == before, "each object back at its staged key, nothing moved left"
    monkeypatch.setattr(store, "commit_external_objects", commit)
    result = commit_staged(store, messages, keep_staged_on=(FenceRefusedError,))   # sent again: it commits
    assert result.committed and result.records == 85
    assert {name: values(store, name) for name in EXPECTED} == EXPECTED
    assert not {key for key in memory.objects if key.startswith(STAGING_PREFIX)}
    store.close()


@pytest.mark.parametrize("failure", ["metadata commit", "rename answer lost", "rename refused"])
def test_a_failed_commit_leaves_neither_staged_nor_moved_objects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 failure: str) -> None:
    plan = ObjectFaultPlan()
    if failure == "rename answer lost":
        plan = ObjectFaultPlan(fail_after={"rename": {2}})
    elif failure == "rename refused":
        plan = ObjectFaultPlan(fail_before={"rename": {2}})
    memory = MemoryStore()
    objects = FaultyStore(memory, plan=plan)
    store = with_existing_data(tmp_path, objects)
    before = data_and_staged(memory)
    messages = two_tasks(objects)
    if failure == "metadata commit":
        fail_the_metadata_commit(store, monkeypatch)
    with pytest.raises((ValueError, InjectedFaultError)):
        commit_staged(store, messages)
    assert data_and_staged(memory) == before, "a failed commit left objects behind"
    for name in ("a", "c"):
        assert store.open_stream(name).end_offset == 0
    assert store.open_stream("b").end_offset == 5
    store.close()


def test_a_crash_between_moving_and_committing_leaves_objects_the_next_open_deletes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    objects = MemoryStore()
    store = with_existing_data(tmp_path, objects)
    before = set(objects.objects)

    class Crash(BaseException):
        pass

    def die(*_: Any, **__: Any) -> int:
        raise Crash

    monkeypatch.setattr(store, "commit_external_objects", die)
    monkeypatch.setattr("stratalog.engine.staging._delete_unregistered", lambda *_: None)  # dead: nothing runs
    monkeypatch.setattr(objects, "delete", lambda key: None)
    messages = two_tasks(objects)
    with pytest.raises(Crash):
        commit_staged(store, messages)
    monkeypatch.undo()
    moved = {key for key in set(objects.objects) - before if key.startswith(DATA_PREFIX)}
    assert len(moved) == sum(len(m.objects) for m in messages)
    store.close()
    again = open_store(tmp_path, objects)
    assert again.recovery.orphan_objects_deleted == len(moved)
    assert not moved & set(objects.objects)
    assert values(again, "b") == EXPECTED["b"][:5]
    again.close()


def test_a_replayed_batch_moves_nothing_even_when_it_races_the_marker(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    objects = MemoryStore()
    store = open_store(tmp_path, objects)
    marker = ("spark.sink.copy", 4)
    assert commit_staged(store, [stage(objects, 0, {"e": records("e", 5)})], marker).committed
    after_first = data_and_staged(objects)
    # The replay as a plain check sees it ...
    assert not commit_staged(store, [stage(objects, 0, {"e": records("e", 5)})], marker).committed
    # ... and when the check passes (the marker landed in between), the metadata transaction refuses it.
    monkeypatch.setattr(store.metadata, "get_meta", lambda key, default=0: -1)
    result = commit_staged(store, [stage(objects, 0, {"e": records("e", 5)})], marker)
    assert not result.committed and result.records == 0
    monkeypatch.undo()
    assert data_and_staged(objects) == after_first, "a replayed batch left objects"
    assert store.open_stream("e").end_offset == 5
    store.close()


def test_a_staged_object_that_does_not_match_its_message_stops_the_commit_before_any_move(tmp_path: Path) -> None:
    objects = MemoryStore()
    store = open_store(tmp_path, objects)
    message = stage(objects, 0, {"x": records("x", 3)})
    (staged,) = message.objects
    lying = WriteMessage(0, (StagedObject(staged.key, staged.size_bytes,
                                          (type(staged.streams[0])("x", 0, 4),)),))
    with pytest.raises(CorruptObjectError, match="reported"):
        commit_staged(store, [lying])
    assert not list(objects.list(DATA_PREFIX))
    assert store.open_stream("x").end_offset == 0
    store.close()


def test_compaction_gives_moved_blocks_their_real_headers(tmp_path: Path) -> None:
    from stratalog.spark.jobs import CompactionOutput, write_compacted

    root = tmp_path / "objects"
    objects = LocalDirStore(root)
    store = open_store(tmp_path / "d", objects)
    commit_staged(store, [stage(objects, 0, {"x": records("x", 3), "y": records("y", 4)})])
    y = store.open_stream("y")
    manifest = read_manifest(objects)
    output = CompactionOutput(999, "data/compacted.slo", y.stream_id, tuple(manifest.blocks[y.stream_id]))
    (new,) = write_compacted(str(root), [output])
    data = objects.get(new.key)
    footer = decode_footer(data[-FOOTER_BYTES:], len(data))
    assert not footer.provisional and footer.version == OBJECT_FORMAT_VERSION
    (entry,) = new.blocks
    block = check_block(data[entry.position:entry.position + entry.size_bytes], entry)
    at, headers = 0, []
    while at < len(block):
        info = check_batch(block, at)
        headers.append((info.stream_id, info.base_offset))
        at += info.batch_bytes
    assert headers == [(y.stream_id, i) for i in range(4)]
    store.close()
