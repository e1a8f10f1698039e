"""StreamStore.commit_external_objects: objects written outside the store, registered atomically."""

from __future__ import annotations

import threading
import warnings
from pathlib import Path

import pytest

from enginekit import MemoryStore, small_store_config
from stratalog.engine.batch import encode_batch
from stratalog.engine.manifest import read_manifest
from stratalog.engine.metadata import NewObject
from stratalog.engine.objformat import ObjectBuilder, StreamBatch
from stratalog.engine.store import BackpressureError, StreamStore, object_key

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.record.default_records import DefaultRecordBatchBuilder


def external_object(store: StreamStore, stream_id: int, base: int, values: list[bytes]) -> NewObject:
    data, max_ts = encode_batch(stream_id, base, values, now_ms=5)
    builder = ObjectBuilder()
    builder.add_stream(stream_id, [StreamBatch(base, len(values), max_ts, data)])
    raw = builder.finish()
    object_id = store.metadata.allocate_object_id()
    store.object_store.put(object_key(object_id), raw)
    return NewObject(object_id, object_key(object_id), len(raw), builder.entries)


def commit(store: StreamStore, stream_id: int, values: list[bytes], marker: tuple[str, int] | None = None,
           at: int | None = None) -> int | None:
    """Commit one external object of ``values`` at the stream's end (or at ``at``)."""
    return store.commit_external_objects(
        [stream_id], lambda ends: [external_object(store, stream_id, ends[stream_id] if at is None else at, values)],
        marker=marker)


def kafka_batch(count: int) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for i in range(count):
        assert builder.append(i, timestamp=1000 + i, key=None, value=b"k%d" % i, headers=[]) is not None
    return bytes(builder.build())


def test_external_objects_extend_the_stream_and_the_manifest(tmp_path: Path) -> None:
    objects = MemoryStore()
    store = StreamStore.open(tmp_path, objects, small_store_config())
    s = store.create_stream("s")
    s.append([b"a", b"b"]).result()
    store.flush()
    assert commit(store, s.stream_id, [b"c", b"d"]) is not None
    assert s.end_offset == 4
    assert s.append([b"e"]).result() == 4
    assert [r.value for r in s.fetch(0)] == [b"a", b"b", b"c", b"d", b"e"]
    assert read_manifest(objects).streams[s.stream_id].end_offset == 4
    store.close()
    store = StreamStore.open(tmp_path, objects, small_store_config())
    assert [r.value for r in store.open_stream("s").fetch(0)] == [b"a", b"b", b"c", b"d", b"e"]
    store.close()


def test_a_marker_makes_the_commit_happen_once_per_value(tmp_path: Path) -> None:
    store = StreamStore.open(tmp_path, MemoryStore(), small_store_config())
    s = store.create_stream("s")
    assert commit(store, s.stream_id, [b"x"], marker=("m", 3))
    assert commit(store, s.stream_id, [b"x"], marker=("m", 3)) is None
    assert commit(store, s.stream_id, [b"x"], marker=("m", 2)) is None
    assert s.end_offset == 1
    assert commit(store, s.stream_id, [b"x"], marker=("m", 4)) is not None
    assert s.end_offset == 2 and store.metadata.get_meta("m") == 4
    store.close()


def test_appends_not_yet_uploaded_are_uploaded_first_and_come_before(tmp_path: Path) -> None:
    store = StreamStore.open(tmp_path, MemoryStore(), small_store_config())
    s = store.create_stream("s")
    pending = s.append([b"a"])  # neither flushed nor perhaps durable yet
    assert commit(store, s.stream_id, [b"x", b"y"]) is not None
    assert pending.result() == 0
    assert s.uploaded_end_offset == s.end_offset == 3
    assert [r.value for r in s.fetch(0)] == [b"a", b"x", b"y"]
    store.close()


def test_appends_to_the_streams_being_placed_wait_and_others_do_not(tmp_path: Path) -> None:
    store = StreamStore.open(tmp_path, MemoryStore(), small_store_config())
    placed, other = store.create_stream("placed"), store.create_stream("other")
    seen: list[str] = []

    def place(ends: dict[int, int]) -> list[NewObject]:
        with pytest.raises(BackpressureError, match="external objects"):
            placed.append_kafka(kafka_batch(2), 2, 1001, wait_s_max=0)
        assert other.append_kafka(kafka_batch(2), 2, 1001, wait_s_max=0).result() == 0
        seen.append("placed")
        return [external_object(store, placed.stream_id, ends[placed.stream_id], [b"x"])]

    assert store.commit_external_objects([placed.stream_id], place) is not None
    assert seen == ["placed"]
    assert placed.append_kafka(kafka_batch(2), 2, 1001, wait_s_max=0).result() == 1
    store.close()


def test_commits_interleave_with_a_steady_appender_and_offsets_stay_dense(tmp_path: Path) -> None:
    store = StreamStore.open(tmp_path, MemoryStore(), small_store_config())
    s = store.create_stream("s")
    stop = threading.Event()
    appended: list[int] = []

    def appender() -> None:
        i = 0
        while not stop.is_set():
            appended.append(s.append([b"p%d" % i]).result())
            i += 1

    thread = threading.Thread(target=appender)
    thread.start()
    try:
        for n in range(20):
            assert commit(store, s.stream_id, [b"e%d-%d" % (n, j) for j in range(3)]) is not None
    finally:
        stop.set()
        thread.join()
    values = [r.value for r in s.fetch(0, max_bytes=1 << 30)]
    assert [r.offset for r in s.fetch(0, max_bytes=1 << 30)] == list(range(len(values)))
    assert sorted(v for v in values if v.startswith(b"p")) == sorted(b"p%d" % i for i in range(len(appended)))
    externals = [i for i, v in enumerate(values) if v.startswith(b"e")]
    assert len(externals) == 60
    for n in range(20):  # each commit's records are contiguous, in commit order
        first = values.index(b"e%d-0" % n)
        assert values[first:first + 3] == [b"e%d-%d" % (n, j) for j in range(3)]
    store.close()


def test_refused_when_not_at_the_end_or_for_streams_not_fenced(tmp_path: Path) -> None:
    store = StreamStore.open(tmp_path, MemoryStore(), small_store_config())
    s, t = store.create_stream("s"), store.create_stream("t")
    s.append([b"a"]).result()
    with pytest.raises(ValueError, match="does not follow"):
        commit(store, s.stream_id, [b"x"], at=5)
    with pytest.raises(ValueError, match="not fenced"):
        store.commit_external_objects([s.stream_id], lambda ends: [external_object(store, t.stream_id, 0, [b"x"])])
    assert s.end_offset == 1 and t.end_offset == 0
    assert s.append([b"b"]).result() == 1, "appends go on after a refused commit"
    store.close()


def test_create_streams_makes_many_in_one_commit_or_none(tmp_path: Path) -> None:
    objects = MemoryStore()
    store = StreamStore.open(tmp_path, objects, small_store_config())
    store.create_stream("taken")
    seq = store.metadata.commit_seq
    made = store.create_streams([f"s{i}" for i in range(500)])
    assert [s.name for s in made] == [f"s{i}" for i in range(500)]
    assert store.metadata.commit_seq == seq + 1
    assert read_manifest(objects).stream_by_name("s499") is not None
    with pytest.raises(ValueError, match="taken"):
        store.create_streams(["fresh", "taken"])
    with pytest.raises(KeyError):
        store.open_stream("fresh")
    with pytest.raises(ValueError, match="'dup' is given twice"):
        store.create_streams(["dup", "other", "dup"])
    assert len(store.metadata.streams()) == 501
    assert [store.metadata.stream(s.stream_id).name for s in made[:3]] == ["s0", "s1", "s2"]
    assert store.open_stream("s499").stream_id == made[-1].stream_id == made[0].stream_id + 499
    assert made[7].append([b"x"]).result() == 0
    store.close()
