"""StreamStore.commit_external_objects: objects written outside the store, registered atomically."""

from __future__ import annotations

from pathlib import Path

import pytest

from enginekit import MemoryStore, small_store_config
from stratalog.engine.batch import encode_batch
from stratalog.engine.manifest import read_manifest
from stratalog.engine.metadata import NewObject
from stratalog.engine.objformat import ObjectBuilder, StreamBatch
from stratalog.engine.store import StreamStore, object_key


def external_object(store: StreamStore, stream_id: int, base: int, values: list[bytes]) -> NewObject:
    data, max_ts = encode_batch(stream_id, base, values, now_ms=5)
    builder = ObjectBuilder()
    builder.add_stream(stream_id, [StreamBatch(base, len(values), max_ts, data)])
    raw = builder.finish()
    object_id = store.metadata.allocate_object_id()
    store.object_store.put(object_key(object_id), raw)
    return NewObject(object_id, object_key(object_id), len(raw), builder.entries)


def test_external_objects_extend_the_stream_and_the_manifest(tmp_path: Path) -> None:
    objects = MemoryStore()
    store = StreamStore.open(tmp_path, objects, small_store_config())
    s = store.create_stream("s")
    s.append([b"a", b"b"]).result()
    store.flush()
    assert store.commit_external_objects([external_object(store, s.stream_id, 2, [b"c", b"d"])]) is not None
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
    assert store.commit_external_objects([external_object(store, s.stream_id, 0, [b"x"])], marker=("m", 3))
    replay = external_object(store, s.stream_id, 1, [b"x"])
    assert store.commit_external_objects([replay], marker=("m", 3)) is None
    assert store.commit_external_objects([replay], marker=("m", 2)) is None
    assert s.end_offset == 1
    assert store.commit_external_objects([replay], marker=("m", 4)) is not None
    assert s.end_offset == 2 and store.metadata.get_meta("m") == 4
    store.close()


def test_refused_while_appends_wait_for_upload_or_when_not_at_the_end(tmp_path: Path) -> None:
    store = StreamStore.open(tmp_path, MemoryStore(), small_store_config())
    s = store.create_stream("s")
    s.append([b"a"]).result()
    with pytest.raises(ValueError, match="flush"):
        store.commit_external_objects([external_object(store, s.stream_id, 1, [b"x"])])
    store.flush()
    with pytest.raises(ValueError, match="does not follow"):
        store.commit_external_objects([external_object(store, s.stream_id, 5, [b"x"])])
    assert s.end_offset == 1
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
